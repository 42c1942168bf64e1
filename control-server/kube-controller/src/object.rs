//! The controller's part of an object it reconciles: its status and its
//! finalizer, each written only when it changes.

use anyhow::Context;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde::Serialize;

/// Writes `new` as the status of `name` unless it equals `old`.
pub async fn write_status<K, S>(api: &Api<K>, name: &str, old: &S, new: &S) -> anyhow::Result<()>
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
        .with_context(|| format!("write {} {name} status", K::kind(&K::DynamicType::default())))?;
    Ok(())
}

/// Adds (`on`) or removes `finalizer`; guarded by the object's
/// resourceVersion, so a concurrent change makes it wait for the next pass.
pub async fn set_finalizer<K>(api: &Api<K>, obj: &K, finalizer: &str, on: bool) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut f: Vec<String> = obj.finalizers().to_vec();
    f.retain(|x| x != finalizer);
    if on {
        f.push(finalizer.to_string());
    }
    let patch = serde_json::json!({
        "metadata": { "finalizers": f, "resourceVersion": obj.resource_version() }
    });
    api.patch(&obj.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| {
            format!(
                "{} finalizer of {}",
                if on { "add" } else { "remove" },
                obj.name_any()
            )
        })?;
    Ok(())
}
