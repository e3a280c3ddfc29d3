//! Building blocks of the datapath tests: ADD/CHECK/DEL that must succeed, a node
//! wired to an external host through its uplink, waiting for BPF links to go.
use std::{
    net::IpAddr,
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;
use sluice_testbed::Uplink;

use crate::{
    err,
    host::Host,
    look,
    schema::{check_add_result, Added},
    with_prev_result, Node, Pod, Result,
};

/// ADD of `cid`/`eth0` into `pod`: must succeed with a well-formed result.
#[track_caller]
pub fn add(node: &Node, conf: &Value, cid: &str, pod: &Pod) -> Added {
    let out = match node.cni("ADD", conf, cid, "eth0", Some(pod), &[]) {
        Ok(o) => o,
        Err(e) => panic!("ADD {cid}: {e}"),
    };
    let version = conf["cniVersion"].as_str().unwrap_or("1.0.0");
    check_add_result(&out.result(), version, "eth0", pod)
}

/// CHECK of an attachment with its ADD result as prevResult: must pass.
#[track_caller]
pub fn check(node: &Node, conf: &Value, cid: &str, pod: &Pod, added: &Added) {
    let with_prev = with_prev_result(conf, &added.result);
    match node.cni("CHECK", &with_prev, cid, "eth0", Some(pod), &[]) {
        Ok(o) => o.ok_silent(),
        Err(e) => panic!("CHECK {cid}: {e}"),
    }
}

/// DEL of `cid`/`eth0`: must succeed.
#[track_caller]
pub fn del(node: &Node, conf: &Value, cid: &str, pod: &Pod) {
    match node.cni("DEL", conf, cid, "eth0", Some(pod), &[]) {
        Ok(o) => o.ok_silent(),
        Err(e) => panic!("DEL {cid}: {e}"),
    }
}

/// The IPv6 address of an ADD result.
#[track_caller]
pub fn ipv6(a: &Added) -> IpAddr {
    match a.ips.iter().find(|(ip, _)| ip.is_ipv6()) {
        Some((ip, _)) => *ip,
        None => panic!("no IPv6 address in {:#}", a.result),
    }
}

/// The node's uplink in [`external_host`]'s topology.
pub const UPLINK: &str = sluice_testbed::world::NODE_IF;
/// The external host's end of the wire.
pub const EXT_IF: &str = "ext0";
/// The node's address on the wire.
pub const NODE_IP: &str = "192.168.50.1";
/// The external host's address.
pub const EXT_IP: &str = "192.168.50.2";

/// The uplink of the tests' nodes: the node's `up0` at [`NODE_IP`]/24 to
/// [`EXT_IF`] at [`EXT_IP`]/24 (`ext_if` names the other end).
pub fn uplink(ext_if: &str) -> Uplink {
    Uplink::subnet(50, ext_if)
}

/// An external host wired to `node`: the node's `up0` (192.168.50.1/24, default
/// route via the host) to the host's `ext0` (192.168.50.2/24, a route to
/// `pod_cidr` via the node). Made before the first ADD, so that the plugin finds
/// the uplink.
pub fn external_host(node: &Node, pod_cidr: &str) -> Result<Host> {
    let ext = Host::new()?;
    uplink(EXT_IF).connect(node.name(), ext.name(), Some(pod_cidr))?;
    Ok(ext)
}

/// Waits until none of the BPF links `ids` is listed by `bpftool link show`
/// (the kernel frees a link whose last reference went, its pin, on a work queue),
/// at most `timeout`.
pub fn wait_links_gone(ids: &[u32], timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let listed: Vec<u64> = look::bpf_links()?
            .iter()
            .filter_map(|l| l["id"].as_u64())
            .collect();
        let left: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|id| listed.contains(&u64::from(*id)))
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(err!("BPF links {left:?} still exist after {timeout:?}"));
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Sets every key of the object `extra` at the top level of `conf` (a test's
/// additions to a world's base config); anything but an object adds nothing.
pub fn merge_keys(conf: &mut Value, extra: &Value) {
    if let Some(o) = extra.as_object() {
        for (k, v) in o {
            conf[k] = v.clone();
        }
    }
}

/// `sluice datapath reload --pin-root P` of `binary`, in the node namespace:
/// must succeed; what it printed (`before`, `after`: each with `objectHash`).
#[track_caller]
pub fn reload_datapath(node: &Node, binary: &std::path::Path) -> Value {
    let root = node.pin_root().display().to_string();
    let out = match node.run(binary, &["datapath", "reload", "--pin-root", &root]) {
        Ok(o) => o,
        Err(e) => panic!("reload: {e}"),
    };
    assert!(out.success(), "reload failed: {out}");
    match serde_json::from_str(out.stdout.trim()) {
        Ok(v) => v,
        Err(e) => panic!("reload printed no JSON ({e}): {out}"),
    }
}
