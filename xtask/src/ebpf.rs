//! `cargo xtask build-ebpf [--check]`: the eBPF programs crate, built (or linted)
//! with nightly and `-Z build-std=core` for bpfel-unknown-none.
use std::{env, ffi::OsString, fs, path::PathBuf, process::Command};

use anyhow::{Context, Result};

use crate::{cli::BuildEbpfArgs, cmd, setup, ws::Workspace};

/// Debug info makes bpf-linker emit BTF; `--btf` asks it to.
const RUSTFLAGS: &str = "-C debuginfo=2 -C link-arg=--btf";

pub(crate) fn run(ws: &Workspace, args: &BuildEbpfArgs) -> Result<()> {
    if args.check {
        clippy(ws)
    } else {
        build(ws).map(drop)
    }
}

/// Builds the object and returns its path.
pub(crate) fn build(ws: &Workspace) -> Result<PathBuf> {
    cmd::run(&mut nightly_cargo(
        ws,
        "build",
        &ws.ebpf_target_dir(),
        RUSTFLAGS,
    )?)?;
    report(ws.ebpf_object())
}

/// Builds a second object from the same sources with another crate metadata
/// seed: the same instructions, other symbol names (and so other bytes and a
/// different hash). The upgrade test embeds it in a
/// second `sluice` to replace the pinned programs under live traffic.
pub(crate) fn build_variant(ws: &Workspace) -> Result<PathBuf> {
    let dir = ws.target.join("ebpf-next");
    cmd::run(&mut nightly_cargo(ws, "build", &dir, VARIANT_RUSTFLAGS)?)?;
    report(
        dir.join(crate::ws::EBPF_TARGET)
            .join("release")
            .join("sluice-ebpf"),
    )
}

/// What [`build_variant`] changes: `-C metadata`, which goes into every mangled
/// symbol name. Not the optimisation level: at opt-level 2 LLVM spills the
/// context at `uplink_out`'s entry and the call chain passes the verifier's
/// 512-byte stack limit; not the debug info either: the NAT sweeper's
/// `bpf_for_each_map_elem` callback needs the full BTF `func_info` that only
/// `debuginfo=2` gives. Identical instructions also mean the variant passes the
/// verifier wherever the shipped object does.
const VARIANT_RUSTFLAGS: &str = "-C debuginfo=2 -C link-arg=--btf -C metadata=sluice-next";

fn report(object: PathBuf) -> Result<PathBuf> {
    let size = fs::metadata(&object)
        .with_context(|| format!("the eBPF build produced no {}", object.display()))?
        .len();
    println!("eBPF object: {} ({size} bytes)", object.display());
    Ok(object)
}

/// `cargo +nightly clippy ... -- -D warnings` on the eBPF crate.
pub(crate) fn clippy(ws: &Workspace) -> Result<()> {
    cmd::run(
        nightly_cargo(ws, "clippy", &ws.ebpf_target_dir(), RUSTFLAGS)?
            .args(["--", "-D", "warnings"]),
    )
}

fn nightly_cargo(
    ws: &Workspace,
    subcommand: &str,
    target_dir: &std::path::Path,
    rustflags: &str,
) -> Result<Command> {
    let linker = setup::find_bpf_linker()?
        .context("bpf-linker is not installed (neither on PATH nor in $CARGO_HOME/bin); run `cargo xtask setup`")?;
    let mut c = Command::new("cargo");
    c.args(["+nightly", subcommand, "--release", "--target"])
        .arg(crate::ws::EBPF_TARGET)
        .args(["-Z", "build-std=core", "--target-dir"])
        .arg(target_dir)
        .current_dir(ws.ebpf_crate())
        // With --target, RUSTFLAGS reach only the eBPF crates, not build scripts.
        .env("RUSTFLAGS", rustflags)
        // Would take precedence over RUSTFLAGS.
        .env_remove("CARGO_ENCODED_RUSTFLAGS");
    // rustc runs `bpf-linker` from PATH; make sure the one setup installed is there.
    if let Some(dir) = linker.parent() {
        if crate::host::which("bpf-linker").is_none() {
            let mut path = OsString::from(dir);
            if let Some(old) = env::var_os("PATH") {
                path.push(":");
                path.push(old);
            }
            c.env("PATH", path);
        }
    }
    Ok(c)
}
