//! Upgrading the datapath under live traffic: a long TCP stream runs while
//! another eBPF object (`SLUICE_NEXT_BIN`) replaces the programs, either through
//! `sluice datapath reload` or through an ADD made by the new binary. The stream
//! must end with every byte received and no error; afterwards the pinned object
//! is the new one, the attachments run new programs (`cls_bpf` filters replaced in
//! place, pinned tcx/XDP links updated keeping their ids), and the maps kept
//! their contents.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    path::Path,
    thread,
    time::Duration,
};

use serde_json::{json, Value};
use sluice_tests::{
    attached::pod_programs,
    cni::CniOutput,
    fixtures::{add, check, external_host, reload_datapath, EXT_IF, UPLINK},
    host::tx_checksum_off,
    kernel, look,
    schema::{check_add_result, Added},
    sluice_bin, sluice_next_bin,
    stream::Stream,
    traffic::tcp_echo,
    with_prev_result, Counters, Node, Pod,
};

/// The stream must have moved this far before the upgrade starts, and this much
/// more after it finished, so that it spans the upgrade.
const PROGRESS: u64 = 256 << 10;
/// And it runs at least this long in all.
const MIN_STREAM: Duration = Duration::from_secs(3);
const WAIT: Duration = Duration::from_secs(20);

fn embedded_hash(binary: &Path) -> String {
    sluice_tests::embedded_object_hash(binary).unwrap()
}

/// The object hashes of the binary under test and of the next one, which must differ.
fn hashes() -> (String, String) {
    let cur = embedded_hash(&sluice_bin().unwrap());
    let next = embedded_hash(&sluice_next_bin().unwrap());
    assert_ne!(
        cur, next,
        "SLUICE_NEXT_BIN embeds the same object as SLUICE_BIN: no upgrade to test"
    );
    (cur, next)
}

/// The pinned object's hash, as `status --json` and `datapath version` of the
/// next binary report it (they must agree).
fn pinned_hash(node: &Node) -> String {
    let st = node.status().unwrap();
    let root = node.pin_root().display().to_string();
    let out = node
        .run(
            &sluice_next_bin().unwrap(),
            &["datapath", "version", "--pin-root", &root],
        )
        .unwrap();
    assert!(out.success(), "{out}");
    let v: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(
        v["pinned"]["objectHash"], st["objectHash"],
        "datapath version and status disagree: {v} / {st:#}"
    );
    st["objectHash"].as_str().unwrap_or_default().to_string()
}

/// The pinned programs' ids by name (`progs/*`).
fn pinned_programs(node: &Node) -> BTreeMap<String, u64> {
    [
        "from_pod",
        "from_netkit_pod",
        "to_pod",
        "to_netkit_pod",
        "uplink_in",
        "uplink_out",
        "uplink_xdp",
        "nat_sweep",
    ]
    .iter()
    // No NAT sweeper before 5.15, no netkit program before 6.7 (not loaded).
    .filter(|n| **n != "nat_sweep" || kernel::has("sweeper"))
    .filter(|n| !n.contains("netkit") || kernel::has("netkit"))
    .map(|n| {
        let id = look::pinned_prog_id(&node.pin_root().join("progs").join(n)).unwrap();
        ((*n).to_string(), id)
    })
    .collect()
}

/// (`from_pod`, `to_pod`) program ids attached to the pod's host veth.
fn attached(node: &Node, a: &Added) -> (u64, u64) {
    let ifindex = look::ifindex(node.name(), &a.host_veth).unwrap();
    pod_programs(node, &a.host_veth, ifindex)
}

/// The programs of pod `a` (what it sends, what goes to it): the netkit ones
/// on a netkit pod.
fn pod_program_names(node: &Node, a: &Added) -> (&'static str, &'static str) {
    let link = look::link(node.name(), &a.host_veth).unwrap().unwrap();
    if look::kind(&link) == Some("netkit") {
        ("from_netkit_pod", "to_netkit_pod")
    } else {
        ("from_pod", "to_pod")
    }
}

/// Every link pin but the NAT sweeper's: name -> (link id, program id). (A
/// perf-event link cannot be updated in place; an upgrade replaces it.)
fn link_ids(node: &Node) -> BTreeMap<String, (u32, u32)> {
    node.all_link_pins()
        .unwrap()
        .into_iter()
        .filter(|p| p != "nat_sweep")
        .map(|p| {
            let ids = look::pinned_link_ids(&node.pin_root().join("links").join(&p)).unwrap();
            (p, ids)
        })
        .collect()
}

/// Endpoint entries by IP: (hostIfname, fromPodBytes + toPodBytes).
fn endpoints(node: &Node) -> BTreeMap<String, (String, u64)> {
    node.endpoints()
        .unwrap()
        .iter()
        .map(|e| {
            let bytes =
                e["fromPodBytes"].as_u64().unwrap_or(0) + e["toPodBytes"].as_u64().unwrap_or(0);
            (
                e["ip"].as_str().unwrap_or_default().to_string(),
                (
                    e["hostIfname"].as_str().unwrap_or_default().to_string(),
                    bytes,
                ),
            )
        })
        .collect()
}

/// Runs `upgrade` while a stream from `client_ns` to `server_ns` (`ip`) flows;
/// the stream must span the upgrade and end complete.
fn stream_across(
    server_ns: &Path,
    ip: IpAddr,
    client_ns: &Path,
    upgrade: impl FnOnce(),
) -> sluice_tests::stream::Report {
    let stream = Stream::start(server_ns, SocketAddr::new(ip, 0), client_ns, ip).unwrap();
    stream.wait_received(PROGRESS, WAIT).unwrap();
    let started = std::time::Instant::now();
    upgrade();
    let at = stream.received();
    eprintln!(
        "upgrade took {:?}; {at} bytes of the stream received by then",
        started.elapsed()
    );
    stream.wait_received(at + PROGRESS, WAIT).unwrap();
    if let Some(left) = MIN_STREAM.checked_sub(stream.elapsed()) {
        thread::sleep(left);
    }
    let report = stream.finish().unwrap();
    eprintln!("stream across the upgrade: {report:?}");
    assert!(report.received > at, "{report:?}");
    report
}

/// `sluice datapath reload --pin-root P` of the next binary, in the node namespace.
fn reload_next(node: &Node, cur: &str, next: &str) {
    let v = reload_datapath(node, &sluice_next_bin().unwrap());
    assert_eq!(v["before"]["objectHash"], cur, "{v}");
    assert_eq!(v["after"]["objectHash"], next, "{v}");
}

/// What must hold after an upgrade of a node with pods `pods` (ADD results) whose
/// programs were `before` (per pod) and whose maps held `eps`/`counters`.
#[track_caller]
fn assert_upgraded(
    node: &Node,
    next: &str,
    pods: &[&Added],
    before: &[(u64, u64)],
    eps: &BTreeMap<String, (String, u64)>,
    counters: &Counters,
) {
    assert_eq!(
        pinned_hash(node),
        next,
        "the pinned object is not the next one"
    );
    let progs = pinned_programs(node);
    for (a, (from0, to0)) in pods.iter().zip(before) {
        let (from, to) = pod_program_names(node, a);
        let (from1, to1) = attached(node, a);
        assert_ne!(from1, *from0, "{}: {from} was not replaced", a.host_veth);
        assert_ne!(to1, *to0, "{}: {to} was not replaced", a.host_veth);
        assert_eq!(
            from1, progs[from],
            "{}: {from} is not the pinned one",
            a.host_veth
        );
        assert_eq!(
            to1, progs[to],
            "{}: {to} is not the pinned one",
            a.host_veth
        );
        for (id, name) in [(from1, from), (to1, to)] {
            assert_eq!(look::bpf_prog(id).unwrap()["name"], name);
        }
    }
    // The maps are the same maps: every endpoint is there, with its counters.
    let now = endpoints(node);
    for (ip, (host, bytes)) in eps {
        let Some((host1, bytes1)) = now.get(ip) else {
            panic!("endpoint {ip} is gone after the upgrade: {now:?}");
        };
        assert_eq!(host1, host, "endpoint {ip} moved");
        assert!(
            bytes1 >= bytes,
            "endpoint {ip}'s counters were reset: {bytes} -> {bytes1}"
        );
    }
    let c = node.counters().unwrap();
    c.assert_not_reset(counters);
}

fn del_with(node: &Node, binary: &Path, conf: &Value, cid: &str, pod: &Pod, a: &Added) {
    let c = with_prev_result(conf, &a.result);
    node.cni_with(binary, "DEL", &c, cid, "eth0", Some(pod), &[])
        .unwrap()
        .ok_silent();
}

/// Two pods with a stream between them: the upgrade `how` happens mid-stream.
/// `pod_attach`: `tc`, `tcx`, or `netkit` for `podDevice: auto` (netkit
/// where the kernel has it).
fn pods_across_an_upgrade(subnet: &str, pod_attach: &str, via_add: bool) {
    let (cur, next) = hashes();
    let next_bin = sluice_next_bin().unwrap();
    let node = Node::new().unwrap();
    let a = node.pod("a").unwrap();
    let b = node.pod("b").unwrap();
    let mut conf = node.conf("1.0.0", subnet);
    if pod_attach == "netkit" {
        conf["podDevice"] = json!("auto");
    } else {
        conf["podAttach"] = json!(pod_attach);
    }
    let added_a = add(&node, &conf, "up-a", &a);
    let added_b = add(&node, &conf, "up-b", &b);
    assert_eq!(pinned_hash(&node), cur);
    // Some traffic first, so the maps have counts to keep.
    tcp_echo(&b, added_b.ip(), &a, 64 << 10).unwrap();
    let before = [attached(&node, &added_a), attached(&node, &added_b)];
    let eps = endpoints(&node);
    let c0 = node.counters().unwrap();
    assert!(c0.get("from_pod_to_local_pod") > 0, "{c0}");

    let c = node.pod("c").unwrap();
    let mut added_c = None;
    let report = stream_across(&b.path, added_b.ip(), &a.path, || {
        if via_add {
            // The new binary's first ADD replaces the programs.
            let out: CniOutput = node
                .cni_with(&next_bin, "ADD", &conf, "up-c", "eth0", Some(&c), &[])
                .unwrap();
            added_c = Some(check_add_result(&out.result(), "1.0.0", "eth0", &c));
        } else {
            reload_next(&node, &cur, &next);
        }
    });

    assert_upgraded(&node, &next, &[&added_a, &added_b], &before, &eps, &c0);
    let c1 = node.counters().unwrap();
    let d = c1.since(&c0);
    assert!(
        d.get("from_pod_to_local_pod") > 0,
        "the stream ({report:?}) was not redirected: {d}"
    );
    // Traffic after the upgrade, and CHECK by the new binary.
    tcp_echo(&a, added_a.ip(), &b, 64 << 10).unwrap();
    for (cid, pod, added) in [("up-a", &a, &added_a), ("up-b", &b, &added_b)] {
        let with_prev = with_prev_result(&conf, &added.result);
        node.cni_with(&next_bin, "CHECK", &with_prev, cid, "eth0", Some(pod), &[])
            .unwrap()
            .ok_silent();
    }
    if let Some(added_c) = &added_c {
        let (from_c, _) = attached(&node, added_c);
        assert_eq!(
            from_c,
            pinned_programs(&node)[pod_program_names(&node, added_c).0]
        );
        tcp_echo(&c, added_c.ip(), &a, 64 << 10).unwrap();
        del_with(&node, &next_bin, &conf, "up-c", &c, added_c);
    }
    del_with(&node, &next_bin, &conf, "up-a", &a, &added_a);
    del_with(&node, &next_bin, &conf, "up-b", &b, &added_b);
    assert!(node.endpoints().unwrap().is_empty());
}

#[test]
fn reload_mid_stream_replaces_cls_bpf_programs_and_keeps_the_maps() {
    pods_across_an_upgrade("10.93.1.0/24", "tc", false);
}

#[test]
fn reload_mid_stream_replaces_tcx_programs_and_keeps_the_maps() {
    pods_across_an_upgrade("10.93.2.0/24", "tcx", false);
}

#[test]
fn add_by_the_next_binary_mid_stream_replaces_the_programs() {
    pods_across_an_upgrade("10.93.3.0/24", "tc", true);
}

/// netkit pods (where the kernel has netkit): their links are updated in
/// place like tcx links.
#[test]
fn reload_mid_stream_replaces_netkit_programs_and_keeps_the_maps() {
    pods_across_an_upgrade("10.93.20.0/24", "netkit", false);
}

#[test]
fn add_by_the_next_binary_mid_stream_replaces_tcx_programs() {
    pods_across_an_upgrade("10.93.4.0/24", "tcx", true);
}

/// With the uplink attached: a stream from the external host into a pod spans
/// the upgrade (a reload, or with `via_add` an ADD of another pod by the next
/// binary); every pinned link (uplink tcx and XDP, pod tcx) keeps its id and runs
/// the new program.
fn uplink_across_an_upgrade(subnet: &str, xdp: &str, via_add: bool) {
    let (cur, next) = hashes();
    let node = Node::new().unwrap();
    let ext = external_host(&node, subnet).unwrap();
    if xdp == "native" {
        tx_checksum_off(&ext.netns_path(), EXT_IF).unwrap();
    }
    let a = node.pod("a").unwrap();
    let mut conf = node.conf("1.0.0", subnet);
    conf["podAttach"] = json!("tcx");
    conf["uplink"] = json!(UPLINK);
    conf["xdp"] = json!(xdp);
    let added_a = add(&node, &conf, "upl-a", &a);
    let ip = added_a.ip();
    let links0 = link_ids(&node);
    let ifindex = look::ifindex(node.name(), UPLINK).unwrap();
    // tcx: every program on a pinned link; without tcx the tc programs are
    // cls_bpf filters (replaced in place by the upgrade) and only XDP is a link
    // (none where native XDP falls back to off, before 5.13).
    let mode = kernel::xdp_mode(xdp);
    let mut tc_links = if kernel::tcx() {
        vec!["uplink_in", "uplink_out"]
    } else {
        vec![]
    };
    if mode != "off" {
        tc_links.push("uplink_xdp");
    }
    for p in &tc_links {
        let pin = format!("uplink{ifindex}-{p}");
        assert!(links0.contains_key(&pin), "no {pin}: {links0:?}");
    }
    let pod_links = if kernel::tcx() { 2 } else { 0 };
    assert_eq!(
        links0.len(),
        tc_links.len() + pod_links,
        "uplink tc in/out (tcx) + XDP, pod from/to (tcx): {links0:?}"
    );
    let uplink_tc0 = kernel::tc_programs(
        &node,
        UPLINK,
        &format!("uplink{ifindex}"),
        "uplink_in",
        "uplink_out",
    )
    .unwrap();
    let progs0 = pinned_programs(&node);
    let before = [attached(&node, &added_a)];
    let eps = endpoints(&node);
    let c0 = node.counters().unwrap();

    let b = node.pod("b").unwrap();
    let report = stream_across(&a.path, ip, &ext.netns_path(), || {
        if via_add {
            let out = node
                .cni_with(
                    &sluice_next_bin().unwrap(),
                    "ADD",
                    &conf,
                    "upl-b",
                    "eth0",
                    Some(&b),
                    &[],
                )
                .unwrap();
            check_add_result(&out.result(), "1.0.0", "eth0", &b);
        } else {
            reload_next(&node, &cur, &next);
        }
    });

    assert_upgraded(&node, &next, &[&added_a], &before, &eps, &c0);
    let progs1 = pinned_programs(&node);
    let links1 = link_ids(&node);
    // `bpftool link show -j`: link id -> program id.
    let listed: BTreeMap<u64, u64> = look::bpf_links()
        .unwrap()
        .iter()
        .filter_map(|l| Some((l["id"].as_u64()?, l["prog_id"].as_u64()?)))
        .collect();
    // The same pins (and, after an ADD, the new pod's two).
    assert_eq!(
        links1.len(),
        links0.len() + if via_add { pod_links } else { 0 },
        "link pins: {links0:?} -> {links1:?}"
    );
    // The uplink's tc hooks run the new programs.
    let uplink_tc1 = kernel::tc_programs(
        &node,
        UPLINK,
        &format!("uplink{ifindex}"),
        "uplink_in",
        "uplink_out",
    )
    .unwrap();
    assert_eq!(
        uplink_tc1,
        (progs1["uplink_in"], progs1["uplink_out"]),
        "the uplink's tc programs after the upgrade (before: {uplink_tc0:?})"
    );
    assert_ne!(
        uplink_tc1, uplink_tc0,
        "the uplink still runs the old tc programs"
    );
    for (pin, (link0, prog0)) in &links0 {
        let Some(&(link1, prog1)) = links1.get(pin) else {
            panic!("{pin} is gone after the upgrade: {links1:?}");
        };
        let name = pin.rsplit_once('-').map_or("", |(_, n)| n);
        assert_eq!(
            link1, *link0,
            "{pin}: the link was replaced instead of updated"
        );
        assert_eq!(
            listed.get(&u64::from(link1)),
            Some(&u64::from(prog1)),
            "{pin}: bpftool link show does not list link {link1} with program {prog1}: {listed:?}"
        );
        assert_ne!(prog1, *prog0, "{pin}: still runs the old program");
        assert_eq!(
            u64::from(*prog0),
            progs0[name],
            "{pin} ran a program not pinned before"
        );
        assert_eq!(
            u64::from(prog1),
            progs1[name],
            "{pin} runs a program not pinned now"
        );
    }
    let link = look::link(node.name(), UPLINK).unwrap().unwrap();
    if mode != "off" {
        assert_eq!(
            link["xdp"]["prog"]["id"].as_u64(),
            Some(progs1["uplink_xdp"]),
            "the kernel's XDP program on {UPLINK}: {link}"
        );
    }
    assert_eq!(node.status().unwrap()["uplink"]["xdp"], mode);
    let d = node.counters().unwrap().since(&c0);
    assert!(
        d.sum(&["xdp_to_pod", "uplink_to_pod"]) > 0,
        "the stream ({report:?}) did not come in through the uplink programs: {d}"
    );
    check(&node, &conf, "upl-a", &a, &added_a);
}

#[test]
fn reload_keeps_the_uplink_links_generic_xdp() {
    uplink_across_an_upgrade("10.93.5.0/24", "generic", false);
}

#[test]
fn reload_keeps_the_uplink_links_native_xdp() {
    uplink_across_an_upgrade("10.93.6.0/24", "native", false);
}

#[test]
fn add_by_the_next_binary_keeps_the_uplink_links() {
    uplink_across_an_upgrade("10.93.7.0/24", "generic", true);
}
