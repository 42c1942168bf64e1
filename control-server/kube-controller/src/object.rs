//! The controller's part of an object it reconciles: its status, written
//! only when it changes. (Its finalizer is kube-rs'
//! [`kube::runtime::finalizer`].)

use kube::api::{Api, Patch, PatchParams};
use serde::Serialize;

use crate::context::Error;

/// Writes `new` as the status of `name` unless it equals `old`.
pub async fn write_status<K, S>(api: &Api<K>, name: &str, old: &S, new: &S) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
    S: Serialize + PartialEq,
{
    if old == new {
        return Ok(());
    }
    let patch = serde_json::json!({ "status": new });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| {
            Error::kube(
                format!("write {} {name} status", K::kind(&K::DynamicType::default())),
                e,
            )
        })?;
    Ok(())
}
