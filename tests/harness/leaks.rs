//! Everything a pod can leave on a node, counted from the kernel and the disk:
//! interfaces of the node namespace, attachment records (every file, temporary
//! ones included), IPAM files, pinned pod links, and the entries of every
//! per-pod map (`bpftool map dump pinned ... -j`). The churn and crash tests
//! take an [`Inventory`] when no pod is attached and require it to be empty.
use std::{collections::BTreeMap, path::Path};

use serde_json::Value;

use crate::{err, exec, look, Node, Result};

/// The maps holding per-pod entries, both families: endpoints (by address),
/// the per-interface owner, counters and drops, hostPort mappings and their
/// connection tracking (IPv4 and IPv6), bandwidth buckets and EDT slots,
/// masqueraded flows both ways (IPv4 and IPv6) and the per-pod flow counts.
/// With no pod attached and every pod's flows gone (DEL flushes them), all
/// are empty. Not here: the arrays (every slot always exists), the node's
/// settings, and the LRU tables keyed by socket or by kernel flow
/// (`sl_hp_sock*`, `sl_kflows`), which age out rather than go with a pod.
pub const POD_MAPS: [&str; 15] = [
    "sl_endpoints",
    "sl_ep_info",
    "sl_ep_stats",
    "sl_ep_drops",
    "sl_ports",
    "sl_ports6",
    "sl_hp_ct",
    "sl_hp_ct6",
    "sl_bw",
    "sl_edt",
    "sl_nat_fwd",
    "sl_nat_rev",
    "sl_nat6_fwd",
    "sl_nat6_rev",
    "sl_nat_pods",
];
/// Files of the IPAM directory of a network that are not reservations and
/// stay when no pod is left: the lock and the last reserved address per range
/// set (host-local's layout).
pub fn is_ipam_bookkeeping(name: &str) -> bool {
    name == "lock" || name.starts_with("last_reserved_ip.")
}

/// Directories where the plugin keeps retired files for reuse (the IPAM
/// store's and the records'), as `<dir>/<name>` relative paths show them.
const SPARE_DIRS: [&str; 2] = [".sluice-spare", ".spare"];

/// Whether `rel` (a file under `root`) is a spare: in a spares directory and
/// empty. A spare that still holds bytes names a pod no longer there, and is
/// reported like any other leftover.
pub fn is_empty_spare(root: &Path, rel: &str) -> bool {
    let p = Path::new(rel);
    p.parent()
        .and_then(Path::file_name)
        .and_then(|d| d.to_str())
        .is_some_and(|d| SPARE_DIRS.contains(&d))
        && std::fs::metadata(root.join(p)).is_ok_and(|m| m.len() == 0)
}

/// Entries of the map `name` pinned under `node`'s pin root
/// (`bpftool map dump pinned <pin root>/maps/<name> -j`).
pub fn map_entries(node: &Node, name: &str) -> Result<Vec<Value>> {
    let pin = node.pin_root().join("maps").join(name);
    let p = pin.display().to_string();
    let out = exec::tool(None, "bpftool", &["map", "dump", "pinned", &p, "-j"])?;
    let v: Value =
        serde_json::from_str(&out).map_err(|e| err!("bpftool map dump {p}: {e}: {out}"))?;
    v.as_array()
        .cloned()
        .ok_or_else(|| err!("bpftool map dump {p} printed no JSON array: {out}"))
}

/// Entries of every map of [`POD_MAPS`] that is pinned. A load pins every
/// map before its first program, so where `from_pod` is pinned all of them
/// must be (a misspelt or renamed map fails here instead of going unchecked);
/// a load cut short before may have pinned only some.
pub fn pod_map_counts(node: &Node) -> Result<BTreeMap<&'static str, usize>> {
    let maps = node.pin_root().join("maps");
    let loaded = node.pin_root().join("progs").join("from_pod").exists();
    let mut m = BTreeMap::new();
    for name in POD_MAPS {
        if maps.join(name).exists() {
            m.insert(name, map_entries(node, name)?.len());
        } else if loaded {
            return Err(err!(
                "per-pod map {name} is not pinned under {}",
                maps.display()
            ));
        }
    }
    Ok(m)
}

/// Every file under `dir`, recursively, as paths relative to it (sorted); a
/// missing directory has none.
pub fn files_under(dir: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    // Bounded: the directories of a test node hold a few levels at most.
    let mut seen = 0;
    while let Some(d) = todo.pop() {
        seen += 1;
        if seen > 10_000 {
            return Err(err!("more than 10000 directories under {}", dir.display()));
        }
        let rd = match std::fs::read_dir(&d) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(err!("listing {}: {e}", d.display())),
        };
        for entry in rd.filter_map(std::result::Result::ok) {
            let p = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap_or(&p);
                out.push(rel.display().to_string());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// What is on a node besides what it had before any pod: see [`Inventory::take`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inventory {
    /// Interfaces of the node namespace not in the baseline.
    pub links: Vec<String>,
    /// Files under the state directory (records, temporary records, anything)
    /// but empty spares.
    pub state_files: Vec<String>,
    /// Files of the network's IPAM directory other than its bookkeeping
    /// ([`is_ipam_bookkeeping`]): reservations and temporary files.
    pub ipam_files: Vec<String>,
    /// Pinned pod links (`<pin root>/links/sl*`).
    pub link_pins: Vec<String>,
    /// Non-zero entry counts of [`POD_MAPS`].
    pub maps: BTreeMap<&'static str, usize>,
}

impl Inventory {
    /// Looks at `node` for network `network`; `baseline_links` are the node
    /// namespace's interfaces before the first pod (`lo`, the uplink).
    pub fn take(node: &Node, network: &str, baseline_links: &[String]) -> Result<Self> {
        let links = look::link_names(node.name())?
            .into_iter()
            .filter(|l| !baseline_links.contains(l))
            .collect();
        let ipam_dir = node.ipam_dir().join(network);
        let ipam_files = files_under(&ipam_dir)?
            .into_iter()
            .filter(|f| !is_ipam_bookkeeping(f) && !is_empty_spare(&ipam_dir, f))
            .collect();
        let state_dir = node.state_dir();
        let state_files = files_under(&state_dir)?
            .into_iter()
            .filter(|f| !is_empty_spare(&state_dir, f))
            .collect();
        let maps = pod_map_counts(node)?
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .collect();
        Ok(Self {
            links,
            state_files,
            ipam_files,
            link_pins: node.link_pins()?,
            maps,
        })
    }

    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}
