//! Where things are in the workspace.
use std::{
    env,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

/// Target triple of the eBPF programs.
pub(crate) const EBPF_TARGET: &str = "bpfel-unknown-none";
/// The userspace binaries `cargo xtask build` produces.
pub(crate) const BINS: [&str; 3] = ["sluice", "sluicectl", "sluice-node"];

pub(crate) struct Workspace {
    /// The repository root (the workspace `Cargo.toml`).
    pub root: PathBuf,
    /// The userspace target directory (`$CARGO_TARGET_DIR` or `<root>/target`).
    pub target: PathBuf,
}

impl Workspace {
    pub(crate) fn locate() -> Result<Self> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .context("xtask's manifest dir has no parent")?
            .to_path_buf();
        let target = match env::var_os("CARGO_TARGET_DIR") {
            Some(dir) if !dir.is_empty() => root.join(dir),
            _ => root.join("target"),
        };
        Ok(Self { root, target })
    }

    /// The eBPF programs crate (its own workspace).
    pub(crate) fn ebpf_crate(&self) -> PathBuf {
        self.root.join("ebpf").join("sluice-ebpf")
    }

    /// `<root>/target/ebpf`: where `cni-plugin/build.rs` looks by default.
    pub(crate) fn ebpf_target_dir(&self) -> PathBuf {
        self.root.join("target").join("ebpf")
    }

    pub(crate) fn ebpf_object(&self) -> PathBuf {
        self.ebpf_target_dir()
            .join(EBPF_TARGET)
            .join("release")
            .join("sluice-ebpf")
    }

    pub(crate) fn bin(&self, release: bool, name: &str) -> PathBuf {
        let profile = if release { "release" } else { "debug" };
        self.target.join(profile).join(name)
    }
}
