//! `sluice-node install` and `uninstall`: what a DaemonSet's init container
//! does on every node (and again on every upgrade).
//!
//! Order matters: the binary first, then the conflist. A runtime acts on a
//! conflist as soon as it appears, so the plugin it names must already be there.
use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use ipnetwork::IpNetwork;
use nix::errno::Errno;
use sluice_host::bpffs::{self, is_bpffs};

use crate::{
    atomic::{self, Outcome},
    cluster,
    conflist::{self, Spec},
    error::{Error, Result},
    log, services,
};

/// The plugin's file name (the conflist's `type`).
const PLUGIN: &str = "sluice";
/// How often the Node is read again while it has no pod CIDRs.
const CIDR_POLL: Duration = Duration::from_secs(2);

pub(crate) struct Options {
    /// Where the `sluice` binary to install is.
    pub(crate) from: PathBuf,
    pub(crate) cni_bin_dir: PathBuf,
    pub(crate) cni_conf_dir: PathBuf,
    pub(crate) conflist_name: String,
    /// The conflist, but for `pod_cidrs` when they come from the API, and
    /// `service_cidrs` when they do.
    pub(crate) spec: Spec,
    /// Read the ServiceCIDR objects' ranges when `spec.service_cidrs` is
    /// empty (none given).
    pub(crate) service_cidrs_from_api: bool,
    /// Read `spec.podCIDRs` of this Node when `spec.pod_cidrs` is empty.
    pub(crate) node_name: Option<String>,
    /// How long a Node without pod CIDRs is waited for.
    pub(crate) wait: Duration,
    /// Where bpffs should be mounted (`None`: not looked at).
    pub(crate) bpffs: Option<PathBuf>,
}

pub(crate) async fn install(mut o: Options) -> Result<()> {
    let src = o.from.join(PLUGIN);
    let bytes = fs::read(&src).map_err(|e| Error::io(format!("reading {}", src.display()), e))?;
    let dst = o.cni_bin_dir.join(PLUGIN);
    report(atomic::replace(&dst, &bytes, 0o755)?, &dst);

    if o.spec.pod_cidrs.is_empty() {
        let name = o.node_name.as_deref().ok_or_else(|| {
            Error::invalid(
                "--node-name",
                "",
                "needed to read the Node's spec.podCIDRs (or give --pod-cidrs)",
            )
        })?;
        o.spec.pod_cidrs = node_pod_cidrs(name, o.wait).await?;
    }
    if o.spec.service_cidrs.is_empty() && o.service_cidrs_from_api {
        o.spec.service_cidrs = api_service_cidrs().await?;
    }
    let list = conflist::render(&o.spec)?;
    let mut text = serde_json::to_string_pretty(&list)
        .map_err(|e| Error::invalid("conflist", "", e.to_string()))?;
    text.push('\n');
    let path = o.cni_conf_dir.join(&o.conflist_name);
    report(atomic::replace(&path, text.as_bytes(), 0o644)?, &path);
    warn_if_shadowed(&o.cni_conf_dir, &o.conflist_name);

    if let Some(b) = &o.bpffs {
        ensure_bpffs(b);
    }
    Ok(())
}

fn report(outcome: Outcome, path: &Path) {
    log(&match outcome {
        Outcome::Written => format!("wrote {}", path.display()),
        Outcome::Unchanged => format!("{} already up to date", path.display()),
    });
}

/// The Node's pod CIDRs, waiting up to `wait` for the controller manager to
/// allocate them (a Node that just registered has none yet).
async fn node_pod_cidrs(name: &str, wait: Duration) -> Result<Vec<IpNetwork>> {
    let client = cluster::client().await?;
    let start = Instant::now();
    loop {
        let node = cluster::get_node(&client, name).await?;
        if !node.pod_cidrs.is_empty() {
            log(&format!(
                "Node {name:?} spec.podCIDRs: {}",
                node.pod_cidrs
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            return Ok(node.pod_cidrs);
        }
        if start.elapsed() >= wait {
            return Err(Error::invalid(
                format!("Node {name:?} spec.podCIDRs"),
                "",
                format!(
                    "still empty after {} s (is the controller manager's --allocate-node-cidrs on?)",
                    wait.as_secs()
                ),
            ));
        }
        tokio::time::sleep(CIDR_POLL).await;
    }
}

/// The ranges of the cluster's ServiceCIDR objects (Kubernetes 1.33+). None
/// where there is no such API or no API configured at all (`--pod-cidrs`
/// given, outside a cluster): route-sync then writes each ClusterIP.
async fn api_service_cidrs() -> Result<Vec<IpNetwork>> {
    let client = match cluster::client().await {
        Ok(c) => c,
        Err(e) => {
            log(&format!(
                "service CIDRs: none given, and no Kubernetes API to read ServiceCIDRs from ({e}); the conflist gets none"
            ));
            return Ok(Vec::new());
        }
    };
    match services::list_ranges(&client).await? {
        Some(r) if !r.is_empty() => {
            log(&format!(
                "ServiceCIDRs: {}",
                r.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            Ok(r)
        }
        _ => {
            log("service CIDRs: none given or listed: the conflist gets none (route-sync writes each ClusterIP)");
            Ok(Vec::new())
        }
    }
}

/// Runtimes use the first conflist by name: one sorting before ours wins.
fn warn_if_shadowed(dir: &Path, ours: &str) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut earlier: Vec<String> = entries
        .filter_map(std::result::Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| {
            !n.starts_with('.')
                && [".conf", ".conflist", ".json"]
                    .iter()
                    .any(|s| n.ends_with(s))
                && n.as_str() < ours
        })
        .collect();
    earlier.sort();
    if !earlier.is_empty() {
        log(&format!(
            "warning: {} sorts before {ours} in {}: the runtime uses that network, not Sluice's",
            earlier.join(", "),
            dir.display()
        ));
    }
}

/// Mounts bpffs at `path` if it is not there. Without the right to (no
/// `CAP_SYS_ADMIN`, or no bidirectional mount propagation) it says so and goes
/// on: the plugin mounts it at its first ADD, in the host's mount namespace.
fn ensure_bpffs(path: &Path) {
    if is_bpffs(path) {
        log(&format!("bpffs is mounted at {}", path.display()));
        return;
    }
    match bpffs::mount_at(path) {
        Ok(()) => log(&format!("mounted bpffs at {}", path.display())),
        Err(e @ (Errno::EPERM | Errno::EACCES)) => log(&format!(
            "bpffs is not mounted at {} and mounting it here was refused ({e}); the plugin mounts it at the first ADD",
            path.display()
        )),
        Err(e) => log(&format!("mounting bpffs at {}: {e}", path.display())),
    }
}

/// Removes the conflist (only one [`install`] wrote for `network`) and the
/// binary. Pods still attached keep their datapath but can no longer be torn
/// down through CNI: delete them first (docs/kubernetes.md).
pub(crate) fn uninstall(
    cni_bin_dir: &Path,
    cni_conf_dir: &Path,
    conflist_name: &str,
    network: &str,
) -> Result<()> {
    let path = cni_conf_dir.join(conflist_name);
    match fs::read(&path) {
        Ok(b) => {
            let ours = serde_json::from_slice(&b).is_ok_and(|v| conflist::is_ours(&v, network));
            if !ours {
                return Err(Error::invalid(
                    "conflist",
                    path.display(),
                    format!(
                        "is not the one sluice-node writes for network {network:?}; left in place"
                    ),
                ));
            }
            remove(&path)?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(format!("reading {}", path.display()), e)),
    }
    remove(&cni_bin_dir.join(PLUGIN))
}

fn remove(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => {
            log(&format!("removed {}", path.display()));
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("removing {}", path.display()), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conflist::test_spec as spec;

    #[tokio::test(flavor = "current_thread")]
    async fn install_then_uninstall_with_given_ranges() {
        let d = tempfile::tempdir().unwrap();
        let (from, bin, conf) = (
            d.path().join("img"),
            d.path().join("bin"),
            d.path().join("conf"),
        );
        for p in [&from, &bin, &conf] {
            fs::create_dir(p).unwrap();
        }
        fs::write(from.join("sluice"), b"#!/bin/true\n").unwrap();
        let o = || Options {
            from: from.clone(),
            cni_bin_dir: bin.clone(),
            cni_conf_dir: conf.clone(),
            conflist_name: "10-sluice.conflist".into(),
            spec: spec(&["10.244.7.0/24"]),
            service_cidrs_from_api: false,
            node_name: None,
            wait: Duration::ZERO,
            bpffs: None,
        };
        install(o()).await.unwrap();
        install(o()).await.unwrap();
        let list: serde_json::Value =
            serde_json::from_slice(&fs::read(conf.join("10-sluice.conflist")).unwrap()).unwrap();
        assert_eq!(
            list["plugins"][0]["ipam"]["ranges"][0][0]["subnet"],
            "10.244.7.0/24"
        );
        assert_eq!(fs::read(bin.join("sluice")).unwrap(), b"#!/bin/true\n");

        // Someone else's conflist of that name is not removed.
        let e = uninstall(&bin, &conf, "10-sluice.conflist", "other").unwrap_err();
        assert!(e.to_string().contains("left in place"), "{e}");
        uninstall(&bin, &conf, "10-sluice.conflist", "sluice").unwrap();
        assert!(fs::read_dir(&conf).unwrap().next().is_none());
        assert!(fs::read_dir(&bin).unwrap().next().is_none());
        uninstall(&bin, &conf, "10-sluice.conflist", "sluice").unwrap();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn without_ranges_a_node_name_is_needed() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("sluice"), b"x").unwrap();
        fs::create_dir(d.path().join("bin")).unwrap();
        let e = install(Options {
            from: d.path().into(),
            cni_bin_dir: d.path().join("bin"),
            cni_conf_dir: d.path().into(),
            conflist_name: "10-sluice.conflist".into(),
            spec: spec(&[]),
            service_cidrs_from_api: false,
            node_name: None,
            wait: Duration::ZERO,
            bpffs: None,
        })
        .await
        .unwrap_err();
        assert!(e.to_string().contains("--node-name"), "{e}");
        // No conflist without ranges (the binary alone is harmless).
        assert!(!d.path().join("10-sluice.conflist").exists());
    }
}
