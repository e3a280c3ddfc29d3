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
    let [sluice, sluicectl, node] = build_named(ws, object, release, BINS)?;
    Ok(Binaries {
        sluice,
        sluicectl,
        node,
    })
}

/// `cargo build --bin <name>...` with `SLUICE_EBPF_OBJECT=object`: the paths
/// of `names`, in order.
pub(crate) fn build_named<const N: usize>(
    ws: &Workspace,
    object: &Path,
    release: bool,
    names: [&str; N],
) -> Result<[PathBuf; N]> {
    let mut c = Command::new("cargo");
    c.arg("build");
    if release {
        c.arg("--release");
    }
    for bin in names {
        c.args(["--bin", bin]);
    }
    cmd::run(c.current_dir(&ws.root).env("SLUICE_EBPF_OBJECT", object))?;
    let paths = names.map(|name| ws.bin(release, name));
    for bin in &paths {
        ensure!(
            bin.is_file(),
            "cargo build did not produce {}",
            bin.display()
        );
        println!("binary: {}", bin.display());
    }
    Ok(paths)
}

/// Everything the suite runs, from one `cargo build --workspace --all-targets`
/// (one feature resolution, so no crate is compiled twice for the unit tests,
/// the binaries and the integration tests).
pub(crate) struct Built {
    pub bins: Binaries,
    /// Unit test executables: (package/target, executable, package directory).
    pub unit: Vec<TestExe>,
    /// The integration test binaries of `tests/` (package `sluice-tests`).
    pub integration: Vec<TestExe>,
}

/// One libtest executable.
#[derive(Clone, Debug)]
pub(crate) struct TestExe {
    /// The target's name (`masquerade`; `sluice-cni` for a library's tests).
    pub name: String,
    pub exe: PathBuf,
    /// Its package's directory: cargo runs tests there.
    pub dir: PathBuf,
}

/// The integration tests' package.
const INTEGRATION_PACKAGE: &str = "sluice-tests";

pub(crate) fn build_all(ws: &Workspace, object: &Path) -> Result<Built> {
    let out = cmd::stdout_json(
        Command::new("cargo")
            .args([
                "build",
                "--workspace",
                "--all-targets",
                "--message-format=json-render-diagnostics",
            ])
            .current_dir(&ws.root)
            .env("SLUICE_EBPF_OBJECT", object),
    )?;
    let mut built = Built {
        bins: Binaries {
            sluice: PathBuf::new(),
            sluicectl: PathBuf::new(),
            node: PathBuf::new(),
        },
        unit: Vec::new(),
        integration: Vec::new(),
    };
    for line in out.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(name), Some(exe)) = (msg["target"]["name"].as_str(), msg["executable"].as_str())
        else {
            continue;
        };
        let exe = PathBuf::from(exe);
        if msg["profile"]["test"].as_bool() == Some(true) {
            let dir = msg["manifest_path"]
                .as_str()
                .and_then(|m| Path::new(m).parent())
                .map_or_else(|| ws.root.clone(), Path::to_path_buf);
            let package = msg["package_id"].as_str().unwrap_or_default();
            let is_integration = package.contains(&format!("#{INTEGRATION_PACKAGE}@"));
            let t = TestExe {
                name: name.to_string(),
                exe,
                dir,
            };
            if is_integration {
                built.integration.push(t);
            } else {
                built.unit.push(t);
            }
        } else {
            match name {
                "sluice" => built.bins.sluice = exe,
                "sluicectl" => built.bins.sluicectl = exe,
                "sluice-node" => built.bins.node = exe,
                _ => {}
            }
        }
    }
    for (name, bin) in
        BINS.iter()
            .zip([&built.bins.sluice, &built.bins.sluicectl, &built.bins.node])
    {
        ensure!(bin.is_file(), "cargo build produced no binary {name}");
        println!("binary: {}", bin.display());
    }
    ensure!(
        !built.integration.is_empty(),
        "cargo build --all-targets listed no integration test binaries (package {INTEGRATION_PACKAGE})"
    );
    built.unit.sort_by(|a, b| a.name.cmp(&b.name));
    built.integration.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(built)
}
