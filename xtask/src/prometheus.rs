//! Debian's Prometheus for the metrics tests: the `prometheus` package's .deb
//! downloaded with the machine's apt sources and unpacked with `dpkg -x` under
//! `target/tools/prometheus`, never installed (installing it would start a
//! machine-wide service). Its two binaries need only libc.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{ensure, Context, Result};

use crate::{cmd, ws::Workspace};

/// `prometheus` and `promtool`, unpacked.
pub(crate) struct Prometheus {
    pub server: PathBuf,
    pub promtool: PathBuf,
}

/// The unpacked binaries, fetched once.
pub(crate) fn fetch(ws: &Workspace) -> Result<Prometheus> {
    let dir = ws.target.join("tools").join("prometheus");
    let bin = dir.join("root/usr/bin");
    let p = Prometheus {
        server: bin.join("prometheus"),
        promtool: bin.join("promtool"),
    };
    if p.server.is_file() && p.promtool.is_file() {
        return Ok(p);
    }
    fs::create_dir_all(&dir)?;
    let download = |dir: &Path| {
        cmd::run(
            Command::new("apt-get")
                .args(["download", "prometheus"])
                .current_dir(dir)
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )
    };
    if download(&dir).is_err() {
        // A fresh machine may have no package lists yet.
        cmd::run(Command::new("apt-get").arg("update"))?;
        download(&dir)?;
    }
    let deb = fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.extension().is_some_and(|e| e == "deb")
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("prometheus_"))
        })
        .context("apt-get download left no prometheus_*.deb")?;
    cmd::run(
        Command::new("dpkg")
            .arg("-x")
            .arg(&deb)
            .arg(dir.join("root")),
    )?;
    ensure!(
        p.server.is_file() && p.promtool.is_file(),
        "{} holds no usr/bin/prometheus and promtool",
        deb.display()
    );
    Ok(p)
}
