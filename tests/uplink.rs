//! A node wired to an external host through its uplink (`up0`, a veth), for each
//! `xdp` setting: TCP from the external host into a pod and from a pod out to the
//! external host, and which program carried it. Into the pod: `uplink_xdp`
//! (`xdp_to_pod`) or `uplink_in` (`uplink_to_pod`); out of the pod: `from_pod`'s
//! FIB lookup (`from_pod_fib_redirect` / `from_pod_fib_neigh`). Neither way does
//! the node's IP stack forward anything. Without the uplink programs the kernel
//! still routes everything.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use serde_json::{json, Value};
use sluice_tests::{
    fixtures::{add, check, del, external_host, wait_links_gone, EXT_IF, EXT_IP, UPLINK},
    host::tx_checksum_off,
    kernel, look,
    raw::{
        ethernet, is_udp_to, l2_l3, parse_mac, send_frames, udp, udp_send, Capture, Ipv4,
        UdpReceiver, ETH_P_IP,
    },
    traffic::tcp_echo_via,
    Counters, Host, Node, Pod, NETWORK,
};

/// Bytes of each echo (sent one way, then echoed back).
const BYTES: usize = 384 << 10;
/// Fewest packets an echo can take in one direction, even as 64 KiB GSO segments.
const MIN_PACKETS: u64 = 6;

/// The XDP attachment of `dev` as the kernel reports it (`ip -d -j link`):
/// (mode name, program id), `None` without one.
fn xdp_of(netns: &str, dev: &str) -> Option<(String, u64)> {
    let link = look::link(netns, dev).unwrap()?;
    let xdp = link.get("xdp")?;
    let mode = match xdp["mode"].as_u64() {
        Some(1) => "native",
        Some(2) => "generic",
        Some(3) => "offload",
        _ => "?",
    };
    Some((mode.to_string(), xdp["prog"]["id"].as_u64().unwrap_or(0)))
}

fn ext_ip() -> IpAddr {
    EXT_IP.parse().unwrap()
}

/// TCP echo from the external host to the pod at `ip`.
fn echo_in(ext: &Host, pod: &Pod, ip: IpAddr) {
    let seen = tcp_echo_via(
        &pod.path,
        SocketAddr::new(ip, 0),
        &ext.netns_path(),
        SocketAddr::new(ip, 0),
        BYTES,
    )
    .unwrap();
    assert_eq!(seen.ip(), ext_ip(), "the pod must see the external address");
}

/// TCP echo from the pod to the external host.
fn echo_out(ext: &Host, pod: &Pod, ip: IpAddr) {
    let seen = tcp_echo_via(
        &ext.netns_path(),
        SocketAddr::new(ext_ip(), 0),
        &pod.path,
        SocketAddr::new(ext_ip(), 0),
        BYTES,
    )
    .unwrap();
    assert_eq!(seen.ip(), ip, "pod traffic must leave untranslated");
}

fn forwarded(node: &Node) -> u64 {
    node.snmp().unwrap()["Ip.ForwDatagrams"]
}

/// What the uplink's status must say: its ifindex and MAC, the XDP mode.
fn assert_status(node: &Node, xdp: &str) -> Value {
    let st = node.status().unwrap();
    let up = &st["uplink"];
    assert_eq!(
        up["ifindex"],
        look::ifindex(node.name(), UPLINK).unwrap(),
        "status uplink: {st:#}"
    );
    assert!(
        up["mac"]
            .as_str()
            .is_some_and(|m| m.eq_ignore_ascii_case(&look::mac(node.name(), UPLINK).unwrap())),
        "status uplink MAC: {st:#}"
    );
    assert_eq!(up["xdp"], xdp, "status uplink XDP mode: {st:#}");
    st
}

/// The pinned `uplink_in`/`uplink_out` are what runs on the uplink's tc hooks.
#[track_caller]
fn assert_uplink_tc(node: &Node) {
    let ifindex = look::ifindex(node.name(), UPLINK).unwrap();
    let prefix = format!("uplink{ifindex}");
    let (tc_in, tc_out) =
        kernel::tc_programs(node, UPLINK, &prefix, "uplink_in", "uplink_out").unwrap();
    let pinned = |p: &str| look::pinned_prog_id(&node.pin_root().join("progs").join(p)).unwrap();
    assert_eq!(tc_in, pinned("uplink_in"), "uplink_in on {UPLINK}");
    assert_eq!(tc_out, pinned("uplink_out"), "uplink_out on {UPLINK}");
}

/// Link pins of the uplink a node has: tc ingress and egress (tcx only) and XDP.
fn uplink_link_count(xdp: bool) -> usize {
    usize::from(xdp) + if kernel::tcx() { 2 } else { 0 }
}

/// The uplink's link pins (`links/uplink*`).
fn uplink_pins(node: &Node) -> Vec<String> {
    node.all_link_pins()
        .unwrap()
        .into_iter()
        .filter(|p| p.starts_with("uplink"))
        .collect()
}

/// One `xdp` setting end to end. `xdp`: the config value (`None`: left out, and
/// the uplink left to the default route too); `mode`: what status must report.
fn uplink_traffic(subnet: &str, xdp: Option<&str>, mode: &str) {
    let node = Node::new().unwrap();
    let ext = external_host(&node, subnet).unwrap();
    if mode == "native" {
        // See `tx_checksum_off`: a physical NIC delivers complete checksums.
        tx_checksum_off(&ext.netns_path(), EXT_IF).unwrap();
    }
    let pod = node.pod("a").unwrap();
    let mut conf = node.conf("1.0.0", subnet);
    if let Some(x) = xdp {
        conf["xdp"] = json!(x);
        conf["uplink"] = json!(UPLINK);
    }
    let added = add(&node, &conf, "uplink-a", &pod);
    let ip = added.ip();

    // The uplink is attached as configured, and the kernel agrees: the pinned
    // tc programs on its hooks (tcx links, or cls_bpf filters without tcx).
    let st = assert_status(&node, mode);
    let ifindex = look::ifindex(node.name(), UPLINK).unwrap();
    let pins = uplink_pins(&node);
    assert_uplink_tc(&node);
    let xdp_pin = format!("uplink{ifindex}-uplink_xdp");
    let kernel_xdp = xdp_of(node.name(), UPLINK);
    if mode == "off" {
        assert!(!pins.contains(&xdp_pin), "{xdp_pin} with xdp off: {pins:?}");
        assert_eq!(kernel_xdp, None, "XDP on {UPLINK} with xdp off");
    } else {
        assert!(pins.contains(&xdp_pin), "no {xdp_pin} in {pins:?}: {st:#}");
        let pinned = look::pinned_prog_id(&node.pin_root().join("progs/uplink_xdp")).unwrap();
        assert_eq!(
            kernel_xdp,
            Some((mode.to_string(), pinned)),
            "the kernel's XDP attachment of {UPLINK}"
        );
    }

    // External host -> pod.
    let c0 = node.counters().unwrap();
    let fwd0 = forwarded(&node);
    echo_in(&ext, &pod, ip);
    let c1 = node.counters().unwrap();
    let d = c1.since(&c0);
    eprintln!("xdp {mode}: external -> pod: {d}");
    let (xdp_in, tc_in) = (d.get("xdp_to_pod"), d.get("uplink_to_pod"));
    match mode {
        "native" => assert!(
            xdp_in >= MIN_PACKETS,
            "native XDP: xdp_to_pod rose by {xdp_in}; counters that rose: {d}"
        ),
        "generic" => assert!(
            xdp_in + tc_in >= MIN_PACKETS,
            "generic XDP: xdp_to_pod + uplink_to_pod rose by {}; counters that rose: {d}",
            xdp_in + tc_in
        ),
        _ => {
            assert!(
                tc_in >= MIN_PACKETS,
                "xdp off: uplink_to_pod rose by {tc_in}; counters that rose: {d}"
            );
            assert_eq!(xdp_in, 0, "xdp off, yet xdp_to_pod rose: {d}");
            assert_eq!(d.get("xdp_pass_to_tc"), 0, "xdp off, yet XDP ran: {d}");
        }
    }
    // The pod's answers left by FIB lookup.
    assert!(
        d.sum(&["from_pod_fib_redirect", "from_pod_fib_neigh"]) >= MIN_PACKETS,
        "the pod's answers did not leave through from_pod's FIB redirect: {d}"
    );

    // Pod -> external host.
    echo_out(&ext, &pod, ip);
    let c2 = node.counters().unwrap();
    let d = c2.since(&c1);
    eprintln!("xdp {mode}: pod -> external: {d}");
    assert!(
        d.sum(&["from_pod_fib_redirect", "from_pod_fib_neigh"]) >= MIN_PACKETS,
        "pod -> external: from_pod_fib_redirect + from_pod_fib_neigh rose by {}; \
         counters that rose: {d}",
        d.sum(&["from_pod_fib_redirect", "from_pod_fib_neigh"])
    );
    assert!(
        d.sum(&["xdp_to_pod", "uplink_to_pod"]) >= MIN_PACKETS,
        "the external host's answers did not come in through the uplink programs: {d}"
    );
    if mode == "off" {
        assert_eq!(d.get("xdp_to_pod"), 0, "xdp off, yet xdp_to_pod rose: {d}");
    }
    let fwd = forwarded(&node) - fwd0;
    assert!(
        fwd <= kernel::kernel_forwarding_allowed(&c2.since(&c0)),
        "the node's kernel forwarded {fwd} packets: uplink traffic was not kept off \
         the host stack (datapath: {})",
        c2.since(&c0)
    );

    check(&node, &conf, "uplink-a", &pod, &added);
    assert_status(&node, mode);
    del(&node, &conf, "uplink-a", &pod);
    // The uplink stays attached for the next pod (its pins are the node's, not
    // the pod's); everything of the pod is gone.
    assert!(node.host_veths().unwrap().is_empty());
    assert!(node.records(NETWORK).unwrap().is_empty());
    assert!(node.endpoints().unwrap().is_empty());
}

#[test]
fn xdp_native_carries_external_traffic_into_the_pod() {
    uplink_traffic("10.91.1.0/24", Some("native"), kernel::xdp_mode("native"));
}

#[test]
fn xdp_generic_carries_external_traffic_into_the_pod() {
    uplink_traffic("10.91.2.0/24", Some("generic"), "generic");
}

#[test]
fn xdp_off_leaves_external_traffic_to_the_tc_program() {
    uplink_traffic("10.91.3.0/24", Some("off"), "off");
}

/// On a veth uplink `auto` attaches no XDP: native would break partial
/// checksums, generic would copy every GRO'd skb; tc alone is faster.
#[test]
fn xdp_auto_on_a_veth_uplink_found_by_the_default_route_is_off() {
    uplink_traffic("10.91.4.0/24", None, "off");
}

#[test]
fn xdp_auto_written_out_is_off_on_a_veth_uplink() {
    uplink_traffic("10.91.5.0/24", Some("auto"), "off");
}

/// With the uplink's links unpinned (so detached), the kernel routes external
/// traffic into the pod by itself; the next ADD attaches the uplink again.
#[test]
fn pods_stay_reachable_with_the_uplink_programs_detached() {
    let subnet = "10.91.6.0/24";
    let node = Node::new().unwrap();
    let ext = external_host(&node, subnet).unwrap();
    let a = node.pod("a").unwrap();
    let mut conf = node.conf("1.0.0", subnet);
    // Explicit: `auto` attaches no XDP on this veth uplink, and both hooks are
    // to be detached here.
    conf["xdp"] = serde_json::json!("generic");
    let added_a = add(&node, &conf, "detach-a", &a);
    let ip_a = added_a.ip();
    echo_in(&ext, &a, ip_a);

    // Detach: drop the pins, the links' last references (and, without tcx, the
    // uplink's cls_bpf filters).
    let pins = uplink_pins(&node);
    assert_eq!(
        pins.len(),
        uplink_link_count(true),
        "expected the uplink's tc ingress, tc egress (tcx) and XDP links: {pins:?}"
    );
    let mut ids = Vec::new();
    for p in &pins {
        let path = node.pin_root().join("links").join(p);
        ids.push(look::pinned_link_ids(&path).unwrap().0);
        std::fs::remove_file(&path).unwrap();
    }
    if !kernel::tcx() {
        kernel::remove_tc_filters(&node.netns_path(), UPLINK).unwrap();
    }
    wait_links_gone(&ids, Duration::from_secs(10)).unwrap();
    assert_eq!(xdp_of(node.name(), UPLINK), None, "XDP still on {UPLINK}");

    let c0 = node.counters().unwrap();
    let fwd0 = forwarded(&node);
    echo_in(&ext, &a, ip_a);
    echo_out(&ext, &a, ip_a);
    let d = node.counters().unwrap().since(&c0);
    let fwd = forwarded(&node) - fwd0;
    eprintln!("detached: {d}; forwarded by the kernel: {fwd}");
    for r in [
        "xdp_to_pod",
        "xdp_pass_to_tc",
        "uplink_to_pod",
        "uplink_pass",
    ] {
        assert_eq!(
            d.get(r),
            0,
            "{r} rose with the uplink programs detached: {d}"
        );
    }
    assert!(
        d.get("to_pod_from_kernel") >= MIN_PACKETS,
        "the kernel's deliveries into the pod were not seen by to_pod: {d}"
    );
    assert!(
        fwd >= MIN_PACKETS,
        "the node's kernel forwarded only {fwd} packets with the uplink programs detached"
    );
    // The pod's own programs still handle its packets: a connection's first
    // by FIB lookup, the rest handed to the stack, which delivered the
    // replies: with the uplink's programs gone, what the stack delivers into a
    // pod cannot be told from what it translated (kube-proxy's), so those
    // flows stay on the stack's path both ways (`kernel_nat`).
    assert!(
        d.sum(&["from_pod_fib_redirect", "from_pod_fib_neigh"]) >= 1,
        "{d}"
    );
    assert!(d.get("from_pod_kernel_flow") >= MIN_PACKETS, "{d}");
    check(&node, &conf, "detach-a", &a, &added_a);
    node.status().unwrap();

    // The next ADD finds the uplink unattached and attaches it again.
    let b = node.pod("b").unwrap();
    let added_b = add(&node, &conf, "detach-b", &b);
    assert_eq!(
        uplink_pins(&node).len(),
        uplink_link_count(true),
        "{:?}",
        node.all_link_pins()
    );
    assert_uplink_tc(&node);
    assert_status(&node, "generic");
    let c1 = node.counters().unwrap();
    echo_in(&ext, &b, added_b.ip());
    echo_in(&ext, &a, ip_a);
    let d: Counters = node.counters().unwrap().since(&c1);
    assert!(
        d.sum(&["xdp_to_pod", "uplink_to_pod"]) >= 2 * MIN_PACKETS,
        "after re-attaching, external traffic did not go through the uplink programs: {d}"
    );
    del(&node, &conf, "detach-a", &a);
    del(&node, &conf, "detach-b", &b);
    assert!(node.endpoints().unwrap().is_empty());
}

/// `ethtool -k <dev>` in `netns`: whether generic-receive-offload is on.
fn gro_on(netns: &std::path::Path, dev: &str) -> bool {
    let out = sluice_tests::exec::tool(Some(netns), "ethtool", &["-k", dev]).unwrap();
    out.lines()
        .any(|l| l.trim().starts_with("generic-receive-offload: on"))
}

/// ADD turns GRO on in the pod (veth NAPI, so XDP may redirect into it), and the
/// XDP program redirects only frames that fit the pod's MTU: a bigger one is
/// passed to `uplink_in`, which delivers it.
#[test]
fn xdp_leaves_frames_bigger_than_the_pod_mtu_to_tc() {
    let subnet = "10.91.7.0/24";
    let node = Node::new().unwrap();
    let ext = external_host(&node, subnet).unwrap();
    tx_checksum_off(&ext.netns_path(), EXT_IF).unwrap();
    let a = node.pod("a").unwrap();
    let mut conf = node.conf("1.0.0", subnet);
    conf["mtu"] = json!(1400);
    conf["uplink"] = json!(UPLINK);
    conf["xdp"] = json!("native");
    let added = add(&node, &conf, "mtu-a", &a);
    assert!(gro_on(&a.path, "eth0"), "GRO is off on the pod's eth0");
    assert_eq!(node.status().unwrap()["podMtu"], 1400);
    let IpAddr::V4(pod_ip) = added.ip() else {
        panic!("no IPv4 address")
    };
    let rx = UdpReceiver::start(
        &a.path,
        SocketAddr::new(added.ip(), 0),
        2,
        Duration::from_secs(5),
    )
    .unwrap();
    let port = rx.addr.port();
    let frame = |len: usize| {
        ethernet(
            parse_mac(&look::mac(node.name(), UPLINK).unwrap()).unwrap(),
            parse_mac(&look::mac(ext.name(), EXT_IF).unwrap()).unwrap(),
            ETH_P_IP,
            &Ipv4::new(
                EXT_IP.parse().unwrap(),
                pod_ip,
                udp(40000, port, &vec![7u8; len - 28]),
            )
            .build(),
        )
    };
    // 1000 bytes fit the pod's 1400; 1450 do not (but fit the uplink's 1500).
    // Without native XDP (before 5.13) tc delivers both.
    let native = kernel::xdp_mode("native") == "native";
    let c0 = node.counters().unwrap();
    send_frames(&ext.netns_path(), EXT_IF, vec![frame(1000)]).unwrap();
    let d = node.counters().unwrap().since(&c0);
    let fits = if native {
        "xdp_to_pod"
    } else {
        "uplink_to_pod"
    };
    assert_eq!(d.get(fits), 1, "a frame that fits: {d}");
    let c1 = node.counters().unwrap();
    send_frames(&ext.netns_path(), EXT_IF, vec![frame(1450)]).unwrap();
    let d = node.counters().unwrap().since(&c1);
    assert_eq!(
        d.get("xdp_to_pod"),
        0,
        "a frame bigger than the pod MTU: {d}"
    );
    assert_eq!(
        d.get("xdp_pass_to_tc"),
        u64::from(native),
        "a frame bigger than the pod MTU: {d}"
    );
    assert_eq!(
        d.get("uplink_to_pod"),
        1,
        "a frame bigger than the pod MTU: {d}"
    );
    let got = rx.finish().unwrap();
    let sizes: Vec<usize> = got.iter().map(Vec::len).collect();
    assert!(
        sizes.contains(&(1000 - 28)),
        "the pod received datagrams of {sizes:?}"
    );
    del(&node, &conf, "mtu-a", &a);
}

/// A pod on an uplink with a smaller MTU than its own (1500 over 1280): an
/// oversized packet with DF is left to the kernel (`from_pod_fib_frag_needed`),
/// which answers the pod with "fragmentation needed".
fn frag_needed(subnet: &str, resolve_first: bool) {
    let node = Node::new().unwrap();
    let ext = external_host(&node, subnet).unwrap();
    sluice_tests::host::ip(node.name(), &["link", "set", UPLINK, "mtu", "1280"]).unwrap();
    ext.ip(&["link", "set", EXT_IF, "mtu", "1280"]).unwrap();
    let a = node.pod("a").unwrap();
    let mut conf = node.conf("1.0.0", subnet);
    conf["mtu"] = json!(1500);
    let added = add(&node, &conf, "frag-a", &a);
    let ip = added.ip();
    if resolve_first {
        // TCP works across the smaller MTU (MSS), and the node learns the next hop.
        echo_out(&ext, &a, ip);
    }
    let IpAddr::V4(src) = ip else {
        panic!("no IPv4 address")
    };
    let mut big = Ipv4::new(src, EXT_IP.parse().unwrap(), udp(40000, 9, &[1u8; 1372]));
    big.frag = 0x4000; // DF
    let frame = ethernet(
        parse_mac(&added.host_mac).unwrap(),
        parse_mac(&added.pod_mac).unwrap(),
        ETH_P_IP,
        &big.build(),
    );
    let c0 = node.counters().unwrap();
    let pod_icmp0 = look::snmp(&a.path).unwrap()["Icmp.InDestUnreachs"];
    send_frames(&a.path, "eth0", vec![frame]).unwrap();
    let d = node.counters().unwrap().since(&c0);
    let pod_icmp = look::snmp(&a.path).unwrap()["Icmp.InDestUnreachs"] - pod_icmp0;
    // Without bpf_check_mtu (before 5.12) a next hop not resolved yet leaves
    // the packet to the kernel whatever its size; the kernel answers the same.
    let counted = if kernel::has("check_mtu") || resolve_first {
        "from_pod_fib_frag_needed"
    } else {
        "from_pod_fib_pass"
    };
    assert_eq!(
        d.get(counted),
        1,
        "a 1400-byte packet with DF for a 1280-byte uplink; counters that rose: {d}"
    );
    assert_eq!(
        pod_icmp, 1,
        "the pod got no fragmentation-needed answer ({d})"
    );
    del(&node, &conf, "frag-a", &a);
}

#[test]
fn oversized_packets_are_left_to_the_kernel_for_frag_needed() {
    frag_needed("10.91.8.0/24", true);
}

#[test]
fn oversized_packets_to_an_unresolved_next_hop_are_left_to_the_kernel_for_frag_needed() {
    frag_needed("10.91.9.0/24", false);
}

/// Dual-stack pods and an IPv6 uplink: IPv6 TCP between the external host and a
/// pod goes through the uplink programs and `from_pod`'s FIB lookup, and the node
/// forwards nothing.
#[test]
fn ipv6_external_traffic_goes_through_the_uplink_programs() {
    let node = Node::new().unwrap();
    let ext = external_host(&node, "10.91.10.0/24").unwrap();
    let pod_cidr6 = "fd00:91:10::/64";
    let (node6, ext6) = ("fd00:50::1", "fd00:50::2");
    sluice_tests::host::ip(
        node.name(),
        &[
            "addr",
            "add",
            &format!("{node6}/64"),
            "dev",
            UPLINK,
            "nodad",
        ],
    )
    .unwrap();
    ext.ip(&["addr", "add", &format!("{ext6}/64"), "dev", EXT_IF, "nodad"])
        .unwrap();
    sluice_tests::host::ip(node.name(), &["-6", "route", "add", "default", "via", ext6]).unwrap();
    ext.ip(&["-6", "route", "add", pod_cidr6, "via", node6])
        .unwrap();
    let a = node.pod("a").unwrap();
    let mut conf = node.conf("1.1.0", "unused");
    conf["ipam"] = json!({
        "type": "sluice",
        "ranges": [[{"subnet": "10.91.10.0/24"}], [{"subnet": pod_cidr6}]],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
        "dataDir": node.ipam_dir(),
    });
    let added = add(&node, &conf, "v6-a", &a);
    let ip6 = sluice_tests::fixtures::ipv6(&added);
    let ext_ip6: IpAddr = ext6.parse().unwrap();
    let fwd = |n: &Node| n.snmp().unwrap()["Ip6OutForwDatagrams"];
    let c0 = node.counters().unwrap();
    let f0 = fwd(&node);
    let seen = tcp_echo_via(
        &a.path,
        SocketAddr::new(ip6, 0),
        &ext.netns_path(),
        SocketAddr::new(ip6, 0),
        BYTES,
    )
    .unwrap();
    assert_eq!(seen.ip(), ext_ip6);
    let seen = tcp_echo_via(
        &ext.netns_path(),
        SocketAddr::new(ext_ip6, 0),
        &a.path,
        SocketAddr::new(ext_ip6, 0),
        BYTES,
    )
    .unwrap();
    assert_eq!(seen.ip(), ip6);
    let d = node.counters().unwrap().since(&c0);
    eprintln!("IPv6 through the uplink: {d}");
    assert!(
        d.sum(&["xdp_to_pod", "uplink_to_pod"]) >= 2 * MIN_PACKETS,
        "{d}"
    );
    assert!(
        d.sum(&["from_pod_fib_redirect", "from_pod_fib_neigh"]) >= 2 * MIN_PACKETS,
        "{d}"
    );
    assert_eq!(fwd(&node) - f0, 0, "the node forwarded IPv6 packets ({d})");
    check(&node, &conf, "v6-a", &a, &added);
    del(&node, &conf, "v6-a", &a);
}

/// The frame a UDP datagram `from` -> `to` becomes, captured on `cap_if` in
/// `cap_ns`, which also receives it on `to`: (dst MAC, src MAC, TTL, checksum ok).
fn one_udp(
    from_ns: &std::path::Path,
    from: IpAddr,
    cap_ns: &std::path::Path,
    cap_if: &str,
    to: IpAddr,
) -> ([u8; 6], [u8; 6], u8, bool) {
    let rx = UdpReceiver::start(cap_ns, SocketAddr::new(to, 0), 1, Duration::from_secs(5)).unwrap();
    let port = rx.addr.port();
    let cap = Capture::start(
        cap_ns,
        cap_if,
        1,
        Duration::from_secs(5),
        Box::new(move |f| is_udp_to(f, port)),
    )
    .unwrap();
    udp_send(
        from_ns,
        SocketAddr::new(from, 0),
        SocketAddr::new(to, port),
        b"hop",
    )
    .unwrap();
    let frames = cap.finish().unwrap();
    assert_eq!(
        rx.finish().unwrap(),
        vec![b"hop".to_vec()],
        "{from} -> {to}"
    );
    assert_eq!(
        frames.len(),
        1,
        "{from} -> {to}: captured {} frames",
        frames.len()
    );
    l2_l3(&frames[0]).unwrap()
}

/// Into the pod through XDP or tc, and out of it by FIB redirect, a packet gets
/// the Ethernet header of the link it goes out on and its TTL one lower.
fn uplink_rewrites(subnet: &str, xdp: &str) {
    let mode = kernel::xdp_mode(xdp);
    let node = Node::new().unwrap();
    let ext = external_host(&node, subnet).unwrap();
    if xdp == "native" {
        tx_checksum_off(&ext.netns_path(), EXT_IF).unwrap();
    }
    let a = node.pod("a").unwrap();
    let mut conf = node.conf("1.0.0", subnet);
    conf["uplink"] = json!(UPLINK);
    conf["xdp"] = json!(xdp);
    let added = add(&node, &conf, "rw-a", &a);
    let mac = |ns: &str, dev: &str| parse_mac(&look::mac(ns, dev).unwrap()).unwrap();

    let c0 = node.counters().unwrap();
    let (dst, src, ttl, ok) = one_udp(&ext.netns_path(), ext_ip(), &a.path, "eth0", added.ip());
    let d = node.counters().unwrap().since(&c0);
    let via = if mode == "off" {
        "uplink_to_pod"
    } else {
        "xdp_to_pod"
    };
    assert_eq!(d.get(via), 1, "external -> pod: {d}");
    assert_eq!(
        dst,
        parse_mac(&added.pod_mac).unwrap(),
        "external -> pod: destination MAC"
    );
    assert_eq!(
        src,
        parse_mac(&added.host_mac).unwrap(),
        "external -> pod: source MAC"
    );
    assert_eq!(ttl, 63, "external -> pod: TTL (sent with 64)");
    assert!(ok, "external -> pod: IPv4 header checksum");

    let c0 = node.counters().unwrap();
    let (dst, src, ttl, ok) = one_udp(&a.path, added.ip(), &ext.netns_path(), EXT_IF, ext_ip());
    let d = node.counters().unwrap().since(&c0);
    assert_eq!(
        d.sum(&["from_pod_fib_redirect", "from_pod_fib_neigh"]),
        1,
        "pod -> external: {d}"
    );
    assert_eq!(
        dst,
        mac(ext.name(), EXT_IF),
        "pod -> external: destination MAC"
    );
    assert_eq!(src, mac(node.name(), UPLINK), "pod -> external: source MAC");
    assert_eq!(ttl, 63, "pod -> external: TTL (sent with 64)");
    assert!(ok, "pod -> external: IPv4 header checksum");
    del(&node, &conf, "rw-a", &a);
}

#[test]
fn uplink_paths_rewrite_macs_and_ttl_native_xdp() {
    uplink_rewrites("10.91.11.0/24", "native");
}

#[test]
fn uplink_paths_rewrite_macs_and_ttl_generic_xdp() {
    uplink_rewrites("10.91.12.0/24", "generic");
}

#[test]
fn uplink_paths_rewrite_macs_and_ttl_without_xdp() {
    uplink_rewrites("10.91.13.0/24", "off");
}

/// A changed `xdp` takes effect at the next ADD: the uplink is re-attached in the
/// new mode (and XDP detached for `off`).
#[test]
fn changing_xdp_takes_effect_at_the_next_add() {
    let subnet = "10.91.7.0/24";
    let node = Node::new().unwrap();
    let _ext = external_host(&node, subnet).unwrap();
    let mut conf = node.conf("1.0.0", subnet);
    let steps = [
        ("generic", "generic"),
        ("off", "off"),
        ("native", kernel::xdp_mode("native")),
        ("auto", "off"),
    ];
    for (i, (mode, want)) in steps.iter().enumerate() {
        conf["xdp"] = json!(mode);
        let pod = node.pod(&format!("x{i}")).unwrap();
        add(&node, &conf, &format!("xdp-{i}"), &pod);
        let st = node.status().unwrap();
        assert_eq!(st["uplink"]["xdp"], *want, "after xdp={mode}: {st:#}");
        assert_eq!(
            xdp_of(node.name(), UPLINK).is_some(),
            *want != "off",
            "kernel XDP state after xdp={mode}"
        );
    }
}
