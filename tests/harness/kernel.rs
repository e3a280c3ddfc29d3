//! What the kernel under test offers, so that tests expect the attachment the
//! plugin makes here: pinned tcx links (Linux 6.6+), or cls_bpf filters on a
//! clsact qdisc where tcx is missing or the run disables it
//! (`SLUICE_DISABLE_FEATURES=tcx`, passed on to the plugin by [`crate::exec`]).
use std::path::Path;

use crate::{exec, look, Node, Result};

/// (major, minor) of the running kernel.
pub fn version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut it = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

/// Whether the plugin attaches tc programs as tcx links in this run.
pub fn tcx() -> bool {
    let disabled = std::env::var(exec::DISABLE_FEATURES).unwrap_or_default();
    !disabled.split(',').any(|d| d.trim() == "tcx") && version() >= (6, 6)
}

/// The programs on `dev`'s tc hooks in `node` that are the pinned `ingress` and
/// `egress` programs: tcx links pinned as `<prefix>-<program>` (checked against
/// the interface and direction), or Sluice's cls_bpf filters. Returns their
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

/// Removes Sluice's cls_bpf filters from `dev` (what a tcx link pin's removal
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
