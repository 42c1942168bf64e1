use super::*;

#[test]
fn keys_round_trip_through_the_entry_format() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys");
    let pairs = vec![
        ("identity".to_string(), b"{\"ca\":1}".to_vec()),
        ("drive/r1".to_string(), Vec::new()),
        ("nodes/n\u{e9}".to_string(), vec![0u8, 255, 10]),
    ];
    let mut w = Vec::new();
    for (k, v) in &pairs {
        write_pair(&mut w, k.as_bytes(), v).unwrap();
    }
    std::fs::write(&path, &w).unwrap();
    assert_eq!(read_pairs(&path).unwrap(), pairs);
    std::fs::write(&path, &w[..w.len() - 1]).unwrap();
    let e = read_pairs(&path).unwrap_err().to_string();
    assert!(e.contains("ends inside a value"), "{e}");
}
