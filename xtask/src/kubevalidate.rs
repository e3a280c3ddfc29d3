//! `kubernetes-validate` (PyPI) for the manifest test: the Kubernetes OpenAPI
//! schemas of every release it knows, bundled, so the validation runs offline.
//! Installed with pip into a virtualenv under `target/tools/kubernetes-validate`
//! (nothing machine-wide). The virtualenv's `python` (with PyYAML, which the
//! validator needs anyway) is what the test reads the manifest with.
use std::{path::PathBuf, process::Command};

use anyhow::{ensure, Result};

use crate::{cmd, ws::Workspace};

/// The release pinned (bundles schemas up to Kubernetes 1.37).
const VERSION: &str = "1.37.0";

/// The `kubernetes-validate` executable, installed once.
pub(crate) fn fetch(ws: &Workspace) -> Result<PathBuf> {
    let venv = ws.target.join("tools").join("kubernetes-validate");
    let bin = venv.join("bin");
    let exe = bin.join("kubernetes-validate");
    if exe.is_file() {
        return Ok(exe);
    }
    cmd::run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    cmd::run(
        Command::new(bin.join("pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .arg(format!("kubernetes-validate=={VERSION}")),
    )?;
    ensure!(exe.is_file(), "pip left no {}", exe.display());
    Ok(exe)
}
