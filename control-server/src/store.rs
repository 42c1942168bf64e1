//! The store, as the server's modules name it: the rows, rules and traits
//! of `lks-store` at `crate::store::*`, and the two backends (`SqliteStore`
//! from `lks-store-sqlite`, `EtcdStore` from `lks-store-etcd`, each also
//! whole at `store::sqlite` / `store::etcd`). Nothing here decides
//! anything; the store crates do.

pub use lks_store::*;
pub use lks_store_etcd::{EtcdConfig, EtcdStore};
pub use lks_store_sqlite::SqliteStore;

/// The SQLite backend.
pub mod sqlite {
    pub use lks_store_sqlite::*;
}

/// The etcd backend.
pub mod etcd {
    pub use lks_store_etcd::*;
}

/// A throwaway etcd for the tests of modules that run on etcd, on ports
/// the end-to-end harness picks.
#[cfg(test)]
pub fn test_etcd() -> etcd::testing::TestEtcd {
    etcd::testing::TestEtcd::start_with(|| lks_e2e::free_addr().port())
}
