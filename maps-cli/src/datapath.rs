//! `sluicectl datapath version|reload`: compare and swap the loaded programs.
//! The programs live in the `sluice` binary, so this runs its maintenance
//! command (`sluice datapath ...`) against the same pin root.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::{
    args::{DatapathCommand, SluiceBin, Target},
    target::Datapath,
};

pub(crate) fn execute(t: &Target, c: &DatapathCommand) -> Result<()> {
    let dp = Datapath::open(t)?;
    match c {
        DatapathCommand::Version(b) => {
            let v = run_sluice(b, "version", &dp.pin_root)?;
            let embedded = v["embeddedObjectHash"].as_str().unwrap_or_default();
            let pinned = v["pinned"]["objectHash"].as_str().unwrap_or_default();
            println!(
                "pinned:   {pinned} (map layout v{})",
                v["pinned"]["layoutVersion"]
            );
            println!("embedded: {embedded}");
            if embedded == pinned {
                println!("the pinned programs are this sluice's");
            } else {
                println!(
                    "differs: the next ADD (or `sluicectl datapath reload`) replaces the programs"
                );
            }
        }
        DatapathCommand::DetachAll(d) => {
            if !d.yes {
                let links = dp.root.pins(sluice_common::pin_dirs::LINKS)?;
                let pods = sluice_maps::endpoint::Endpoints::open(&dp.root)?
                    .rows()?
                    .iter()
                    .filter_map(|r| r.owner.as_ref().map(|o| crate::table::text(&o.host_ifname)))
                    .collect::<std::collections::BTreeSet<_>>();
                println!(
                    "would detach the programs of {} pod interfaces ({}) and {} pinned links ({}); pods would keep kernel routing without masquerade, hostPorts or bandwidth limits",
                    pods.len(),
                    pods.into_iter().collect::<Vec<_>>().join(", "),
                    links.len(),
                    links.join(", ")
                );
                println!("run again with --yes to detach");
                return Ok(());
            }
            let v = run_sluice(&d.sluice, "detach-all", &dp.pin_root)?;
            let gone: Vec<&str> = v["detached"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            println!(
                "detached from {}: {} attachments",
                dp.pin_root.display(),
                gone.len()
            );
            for g in gone {
                println!("  {g}");
            }
            println!("maps and programs stay pinned; the next ADD attaches the uplink again");
        }
        DatapathCommand::Reload(b) => {
            let v = run_sluice(b, "reload", &dp.pin_root)?;
            println!(
                "reloaded {}: object {} -> {}",
                dp.pin_root.display(),
                v["before"]["objectHash"].as_str().unwrap_or("none"),
                v["after"]["objectHash"].as_str().unwrap_or("none"),
            );
        }
    }
    Ok(())
}

fn find_sluice(b: &SluiceBin) -> Result<PathBuf> {
    if let Some(p) = &b.sluice {
        return Ok(p.clone());
    }
    let mut candidates = vec![
        PathBuf::from("/opt/cni/bin/sluice"),
        PathBuf::from("/usr/lib/cni/sluice"),
    ];
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("sluice")));
    }
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .context("no sluice binary in /opt/cni/bin, /usr/lib/cni or PATH; pass --sluice")
}

fn run_sluice(b: &SluiceBin, verb: &str, pin_root: &Path) -> Result<Value> {
    let bin = find_sluice(b)?;
    let out = Command::new(&bin)
        .args(["datapath", verb, "--pin-root"])
        .arg(pin_root)
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    if !out.status.success() {
        bail!(
            "{} datapath {verb} failed: {}",
            bin.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("reading the answer of {} datapath {verb}", bin.display()))
}
