//! `cargo xtask build [--release]`: the eBPF object, then `sluice` and `sluicectl`
//! with that object embedded.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{ensure, Context, Result};

use crate::{
    cli::BuildArgs,
    cmd, ebpf,
    ws::{Workspace, BINS},
};

/// Absolute paths of the built binaries.
pub(crate) struct Binaries {
    pub sluice: PathBuf,
    pub sluicectl: PathBuf,
    /// `sluice-node`, the node agent.
    pub node: PathBuf,
}

pub(crate) fn run(ws: &Workspace, args: &BuildArgs) -> Result<()> {
    let object = ebpf::build(ws)?;
    build_bins(ws, &object, args.release).map(drop)
}

/// A second `sluice` embedding `next_object`, copied to `sluice-next` next to the
/// normal one; the normal binary is rebuilt afterwards (only the plugin crate
/// recompiles: its build script depends on `SLUICE_EBPF_OBJECT`).
pub(crate) fn build_next_sluice(
    ws: &Workspace,
    next_object: &Path,
    object: &Path,
) -> Result<PathBuf> {
    let plugin = |obj: &Path| -> Result<()> {
        cmd::run(
            Command::new("cargo")
                .args(["build", "--bin", "sluice"])
                .current_dir(&ws.root)
                .env("SLUICE_EBPF_OBJECT", obj),
        )
    };
    plugin(next_object)?;
    let next = ws.bin(false, "sluice-next");
    std::fs::copy(ws.bin(false, "sluice"), &next)
        .with_context(|| format!("copying the variant plugin to {}", next.display()))?;
    plugin(object)?;
    println!("binary: {}", next.display());
    Ok(next)
}

/// `cargo build --bin sluice --bin sluicectl --bin sluice-node` with `SLUICE_EBPF_OBJECT=object`.
pub(crate) fn build_bins(ws: &Workspace, object: &Path, release: bool) -> Result<Binaries> {
    let mut c = Command::new("cargo");
    c.arg("build");
    if release {
        c.arg("--release");
    }
    for bin in BINS {
        c.args(["--bin", bin]);
    }
    cmd::run(c.current_dir(&ws.root).env("SLUICE_EBPF_OBJECT", object))?;
    let [sluice, sluicectl, node] = BINS.map(|name| ws.bin(release, name));
    for bin in [&sluice, &sluicectl, &node] {
        ensure!(
            bin.is_file(),
            "cargo build did not produce {}",
            bin.display()
        );
        println!("binary: {}", bin.display());
    }
    Ok(Binaries {
        sluice,
        sluicectl,
        node,
    })
}
