//! What etcd gives in one response: the largest this server reads
//! (gRPC's 4 MiB default is too small for a region's node ranges). A
//! rollout's decisions stay under etcd's request limits by writing only the
//! rows they change, in steps (`rollouts.rs`).

use etcd_client::Client;

/// The largest response taken from etcd. The client's default, 4 MiB,
/// is gRPC's; etcd itself sends up to 2 GiB, and kube-apiserver takes as
/// much. A range of every node document passes 4 MiB at about 7,500 nodes
/// (the scale-out benchmark failed on it at 10,000), so the limit is far
/// above any range this server reads (30,000 nodes: ~16 MiB).
pub const MAX_RESPONSE_BYTES: usize = 1 << 30;

/// A KV client of `client` that takes responses up to
/// [`MAX_RESPONSE_BYTES`].
pub(crate) fn kv_of(client: &Client) -> etcd_client::KvClient {
    client.kv_client().max_decoding_message_size(MAX_RESPONSE_BYTES)
}

/// A watch client of `client` that takes responses up to
/// [`MAX_RESPONSE_BYTES`].
pub(crate) fn watch_of(client: &Client) -> etcd_client::WatchClient {
    client
        .watch_client()
        .max_decoding_message_size(MAX_RESPONSE_BYTES)
}

/// The smallest key after every key that starts with `prefix`: the end of
/// a range over that prefix.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_ends_at_the_next_key() {
        assert_eq!(prefix_end(b"/lks/"), b"/lks0".to_vec());
        assert_eq!(prefix_end(b"/lks/blobs/"), b"/lks/blobs0".to_vec());
        assert_eq!(prefix_end(&[b'a', 0xff]), b"b".to_vec());
        assert_eq!(prefix_end(&[0xff]), vec![0]);
    }
}
