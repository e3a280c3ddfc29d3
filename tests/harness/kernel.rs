//! What the kernel under test offers, so that tests expect the attachment the
//! plugin makes here: pinned tcx links (Linux 6.6+), or `cls_bpf` filters on a
//! clsact qdisc where tcx is missing or the run disables it
//! (`SLUICE_DISABLE_FEATURES=tcx`, passed on to the plugin by [`crate::exec`]).
use std::path::Path;

use crate::{exec, look, Node, Result};

/// Whether this kernel can make `fq` a root qdisc (`sch_fq` built in or
/// loadable), found by trying it on a veth in a namespace of the test's own
/// (the way the plugin finds it: its ADD tries the same). Asked once.
pub fn has_sch_fq() -> bool {
    static FQ: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FQ.get_or_init(|| {
        let probe = || -> Result<bool> {
            let ns = crate::Host::new()?;
            ns.ip(&["link", "add", "fq0", "type", "veth", "peer", "name", "fq1"])?;
            Ok(exec::tool(
                Some(&ns.netns_path()),
                "tc",
                &["qdisc", "replace", "dev", "fq0", "root", "fq"],
            )
            .is_ok())
        };
        match probe() {
            Ok(fq) => fq,
            Err(e) => panic!("cannot probe for sch_fq: {e}"),
        }
    })
}

/// Whether the plugin makes netkit pairs in this run: it loads the netkit
/// programs ([`has`]`("netkit")`: Linux 6.7, not disabled) and the kernel makes
/// the device (`CONFIG_NETKIT`, built in or loadable), found by making one in a
/// namespace of the test's own, as the plugin's ADD does. Asked once.
pub fn has_netkit() -> bool {
    static NETKIT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *NETKIT.get_or_init(|| {
        has("netkit")
            && match crate::Host::new() {
                Ok(ns) => ns.makes_netkit(),
                Err(e) => panic!("cannot probe for netkit: {e}"),
            }
    })
}

/// The kind of the pod's host-side device a config's `podDevice` makes here:
/// with `auto`, netkit where the plugin makes it, else (and by default) veth.
pub fn pod_device(conf: &serde_json::Value) -> &'static str {
    match conf["podDevice"].as_str() {
        Some("auto" | "netkit") if has_netkit() => "netkit",
        _ => "veth",
    }
}

/// Asserts that `node`'s host-side device `dev` is a `want` (`veth`, `netkit`).
#[track_caller]
pub fn assert_device_kind(node: &Node, dev: &str, want: &str) {
    let link = match look::link(node.name(), dev) {
        Ok(Some(l)) => l,
        Ok(None) => panic!("{dev} is not on the node"),
        Err(e) => panic!("cannot look at {dev}: {e}"),
    };
    assert_eq!(look::kind(&link), Some(want), "kind of {dev}: {link}");
}

/// (major, minor) of the running kernel.
pub fn version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut it = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

/// The kernel features the plugin falls back without (its
/// `datapath/features.rs`), and the kernel that brought each.
const FEATURES: [(&str, (u32, u32)); 7] = [
    ("tcx", (6, 6)),
    ("ktime_coarse", (5, 11)),
    ("check_mtu", (5, 12)),
    ("veth_xdp", (5, 13)),
    ("netns_cookie", (5, 14)),
    ("sweeper", (5, 15)),
    ("netkit", (6, 7)),
];

/// Whether the plugin uses `feature` in this run: the kernel has it and the
/// run does not disable it (`SLUICE_DISABLE_FEATURES`).
pub fn has(feature: &str) -> bool {
    let disabled = std::env::var(exec::DISABLE_FEATURES).unwrap_or_default();
    let since = FEATURES
        .iter()
        .find(|(f, _)| *f == feature)
        .map_or((0, 0), |(_, v)| *v);
    !disabled.split(',').any(|d| d.trim() == feature) && version() >= since
}

/// The XDP mode the plugin uses for the configured `xdp` (on a non-default
/// setting): `native` is `off` where a veth cannot take XDP frames without a
/// program on its peer (before 5.13).
pub fn xdp_mode(configured: &str) -> &str {
    if configured == "native" && !has("veth_xdp") {
        "off"
    } else {
        configured
    }
}

/// Whether the plugin attaches tc programs as tcx links in this run.
pub fn tcx() -> bool {
    has("tcx")
}

/// The programs on `dev`'s tc hooks in `node` that are the pinned `ingress` and
/// `egress` programs: tcx links pinned as `<prefix>-<program>` (checked against
/// the interface and direction), or Sluice's `cls_bpf` filters. Returns their
/// program ids.
pub fn tc_programs(
    node: &Node,
    dev: &str,
    pin_prefix: &str,
    ingress: &str,
    egress: &str,
) -> Result<(u64, u64)> {
    if tcx() {
        let pin = |p: &str| {
            node.pin_root()
                .join("links")
                .join(format!("{pin_prefix}-{p}"))
        };
        let ifindex = look::ifindex(node.name(), dev)?;
        let mut ids = Vec::new();
        for (name, is_ingress) in [(ingress, true), (egress, false)] {
            let l = look::tcx_link(&pin(name))?;
            if u64::from(l.ifindex) != ifindex || l.ingress != is_ingress {
                return Err(crate::err!(
                    "{name}'s tcx link is on ifindex {} ({}), not {dev}",
                    l.ifindex,
                    if l.ingress { "ingress" } else { "egress" }
                ));
            }
            ids.push(u64::from(l.prog_id));
        }
        return Ok((ids[0], ids[1]));
    }
    let one = |is_ingress: bool, name: &str| -> Result<u64> {
        let filters = look::tc_bpf_filters(&node.netns_path(), dev, is_ingress)?;
        match filters.as_slice() {
            [(n, id)] if n == name => Ok(*id),
            other => Err(crate::err!(
                "{dev}: expected one {name} filter, found {other:?}"
            )),
        }
    };
    Ok((one(true, ingress)?, one(false, egress)?))
}

/// Removes Sluice's `cls_bpf` filters from `dev` (what a tcx link pin's removal
/// is to tcx).
pub fn remove_tc_filters(netns: &Path, dev: &str) -> Result<()> {
    for hook in ["ingress", "egress"] {
        exec::tool(
            Some(netns),
            "tc",
            &["filter", "del", "dev", dev, hook, "pref", "1"],
        )?;
    }
    Ok(())
}

/// Packets the node's kernel may forward in a test where the datapath carries
/// all: none, but without `bpf_check_mtu` (before 5.12) the first packets to
/// a next hop not resolved yet are the kernel's (`from_pod_fib_pass`).
pub fn kernel_forwarding_allowed(d: &crate::Counters) -> u64 {
    if has("check_mtu") {
        0
    } else {
        d.get("from_pod_fib_pass")
    }
}
