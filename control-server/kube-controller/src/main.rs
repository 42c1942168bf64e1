//! `lks-kube-controller`: the custom resources kube0 declares lksadmin
//! with. `crds` prints (or writes) their manifests; the controller that
//! reconciles them with the admin API is issue [kube-front], item 2.

#![forbid(unsafe_code)]

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "lks-kube-controller", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print the CustomResourceDefinitions (LksCluster, LksNode, LksRollout,
    /// LksBundleVersion) as YAML, or write one file each into --out.
    Crds {
        /// Write PLURAL.GROUP.yaml files into this directory.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Crds { out } => {
            for c in lks_kube_controller::crds() {
                let text = lks_kube_controller::file_text(&c).context("serialise a CRD")?;
                match &out {
                    None => print!("---\n{text}"),
                    Some(dir) => {
                        let p = dir.join(lks_kube_controller::file_name(&c));
                        std::fs::write(&p, text).with_context(|| format!("write {}", p.display()))?;
                    }
                }
            }
        }
    }
    Ok(())
}
