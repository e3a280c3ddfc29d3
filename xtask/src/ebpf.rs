//! `cargo xtask build-ebpf [--check]`: the eBPF programs crate, built (or linted)
//! with nightly and `-Z build-std=core` for bpfel-unknown-none.
use std::{
    env,
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

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

/// A second object for the upgrade tests: the shipped one with [`VARIANT_TAIL`]
/// appended after its last byte. ELF readers (aya's included) find everything
/// through the header's offsets, and none points at the appended bytes, so it
/// is the same object to the kernel (the same programs, maps and BTF,
/// passing the verifier wherever the shipped one does), with other bytes and
/// so another hash: the upgrade test embeds it in a second `sluice` to replace
/// the pinned programs under live traffic. (A second build with another `-C
/// metadata` seed did the same and cost CI a minute.)
pub(crate) fn build_variant(ws: &Workspace, object: &Path) -> Result<PathBuf> {
    let dir = ws.target.join("ebpf-next");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut bytes = fs::read(object).with_context(|| format!("reading {}", object.display()))?;
    bytes.extend_from_slice(VARIANT_TAIL);
    let variant = dir.join("sluice-ebpf");
    fs::write(&variant, bytes).with_context(|| format!("writing {}", variant.display()))?;
    report(variant)
}

/// What [`build_variant`] appends.
const VARIANT_TAIL: &[u8] = b"\0sluice-next\0\0\0";

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
