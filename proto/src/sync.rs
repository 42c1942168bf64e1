//! A std lock taken even after a thread panicked holding it.
//!
//! Turning a poisoned lock into "nothing there" (an empty map, `None`, a
//! skipped update) silently loses the data under it. Where every section
//! under a lock is one update that a panic cannot leave half done (a map
//! insert, remove or lookup; one slot written), the data is whole after a
//! panic, and these take it as it is. A lock whose sections could leave
//! it inconsistent takes `lock()` and handles the error instead. Each user
//! says beside its lock why its sections leave the data whole.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// `m` locked, poisoned or not.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `l` read-locked, poisoned or not.
pub fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

/// `l` write-locked, poisoned or not.
pub fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, RwLock};

    #[test]
    fn a_poisoned_lock_still_holds_its_data() {
        let m = Arc::new(Mutex::new(HashMap::from([("a", 1)])));
        let l = Arc::new(RwLock::new(vec![1, 2]));
        let (m2, l2) = (m.clone(), l.clone());
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            let _w = l2.write().unwrap();
            panic!("poison both");
        })
        .join();
        assert!(m.lock().is_err() && l.read().is_err(), "poisoned");
        assert_eq!(super::lock(&m).get("a"), Some(&1), "not an empty map");
        super::lock(&m).insert("b", 2);
        assert_eq!(super::lock(&m).len(), 2);
        assert_eq!(*super::read(&l), [1, 2]);
        super::write(&l).push(3);
        assert_eq!(super::read(&l).len(), 3);
    }
}
