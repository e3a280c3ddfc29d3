//! Pod-to-pod routing on one node: `from_pod` sees a packet for another pod of
//! the node, rewrites it and hands it straight to that pod (`bpf_redirect_peer`),
//! so the node's IP stack never forwards it. Real TCP both ways, then what the
//! datapath counted and what the node's kernel did not.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::Duration,
};

use serde_json::{json, Value};
use sluice_tests::{
    fixtures::{add, check, del, ipv6},
    kernel, look,
    masq::udp_socket,
    raw::{
        ethernet, is_udp_to, l2_l3, parse_mac, send_frames, udp, udp_send, Capture, Ipv4,
        UdpReceiver, ETH_P_IP,
    },
    traffic::{tcp_echo, tcp_echo_via},
    Node, NETWORK,
};

/// Bytes of each echo (sent one way, then echoed back).
const BYTES: usize = 384 << 10;
/// Fewest packets a 384 KiB echo can take through `from_pod`, even as 64 KiB
/// GSO segments: 2 * 384 KiB / 64 KiB.
const MIN_PACKETS: u64 = 12;

/// (fromPodPackets, fromPodBytes, toPodPackets, toPodBytes) of `ip`.
fn endpoint_counters(eps: &[Value], ip: IpAddr) -> [u64; 4] {
    let ip = ip.to_string();
    let Some(ep) = eps.iter().find(|e| e["ip"] == ip.as_str()) else {
        panic!("sluicectl does not list {ip}: {eps:?}");
    };
    [
        "fromPodPackets",
        "fromPodBytes",
        "toPodPackets",
        "toPodBytes",
    ]
    .map(|k| {
        ep[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{k} of {ip} is not a number: {ep}"))
    })
}

/// The kernel counter of forwarded packets of `family` ("Ip.ForwDatagrams" or
/// "`Ip6OutForwDatagrams`").
fn forwarded(node: &Node, counter: &str) -> u64 {
    let snmp = node.snmp().unwrap();
    match snmp.get(counter) {
        Some(n) => *n,
        None => panic!("no {counter} in the node's SNMP counters: {snmp:?}"),
    }
}

/// Two pods on a node made with `conf`; TCP echo a -> b and b -> a over the
/// addresses `pick` chooses from each ADD result; asserts the redirect counter
/// rose, the node's `forward_counter` did not, and both endpoints counted.
fn pod_to_pod(
    conf: &Value,
    pick: fn(&sluice_tests::schema::Added) -> IpAddr,
    forward_counter: &str,
) {
    let node = Node::new().unwrap();
    let a = node.pod("a").unwrap();
    let b = node.pod("b").unwrap();
    let conf = {
        let mut c = conf.clone();
        c["pinRoot"] = json!(node.pin_root());
        c["stateDir"] = json!(node.state_dir());
        c["ipam"]["dataDir"] = json!(node.ipam_dir());
        c
    };
    let added_a = add(&node, &conf, "route-a", &a);
    let added_b = add(&node, &conf, "route-b", &b);
    let (ip_a, ip_b) = (pick(&added_a), pick(&added_b));
    let device = kernel::pod_device(&conf);
    for added in [&added_a, &added_b] {
        kernel::assert_device_kind(&node, &added.host_veth, device);
    }

    let c0 = node.counters().unwrap();
    let fwd0 = forwarded(&node, forward_counter);
    let e0 = node.endpoints().unwrap();
    // Each pod counts in a counter slot of its own (an array index: the
    // programs look it up without hashing).
    let slot = |ip: IpAddr| {
        let ip = ip.to_string();
        e0.iter()
            .find(|e| e["ip"] == ip.as_str())
            .and_then(|e| e["slot"].as_u64())
            .unwrap_or_else(|| panic!("{ip} has no counter slot: {e0:?}"))
    };
    assert_ne!(slot(ip_a), slot(ip_b), "two pods share a counter slot");

    let seen = tcp_echo(&b, ip_b, &a, BYTES).unwrap();
    assert_eq!(seen.ip(), ip_a, "pod traffic must not be translated");
    let seen = tcp_echo(&a, ip_a, &b, BYTES).unwrap();
    assert_eq!(seen.ip(), ip_b, "pod traffic must not be translated");

    let c1 = node.counters().unwrap();
    let fwd1 = forwarded(&node, forward_counter);
    let e1 = node.endpoints().unwrap();
    let d = c1.since(&c0);
    assert!(
        d.get("from_pod_to_local_pod") >= MIN_PACKETS,
        "from_pod_to_local_pod rose by {}, expected at least {MIN_PACKETS}; counters that rose: {d}",
        d.get("from_pod_to_local_pod")
    );
    // Nothing of it took the FIB path. (`from_pod_not_forwarded` may rise: a new pod
    // interface sends IPv6 router solicitations and MLD reports to the node.)
    for r in [
        "from_pod_fib_redirect",
        "from_pod_fib_neigh",
        "drop_malformed",
    ] {
        assert_eq!(d.get(r), 0, "{r} rose; counters that rose: {d}");
    }
    assert_eq!(
        fwd1,
        fwd0,
        "the node's kernel forwarded {} packets ({forward_counter}) during pod-to-pod \
         traffic: the host stack was not bypassed (datapath: {d})",
        fwd1.saturating_sub(fwd0)
    );
    // The datapath's deliveries are not counted again where the kernel's
    // path into the pod counts (`to_pod`; for netkit, `from_netkit_pod` hands
    // it the packet).
    assert!(
        d.get("to_pod_from_kernel") < MIN_PACKETS,
        "to_pod_from_kernel rose by {} during pod-to-pod traffic: {d}",
        d.get("to_pod_from_kernel")
    );
    // Each pod sent and received 2 * BYTES of payload (and not twice that:
    // counted once).
    for (name, ip) in [("a", ip_a), ("b", ip_b)] {
        let (before, after) = (endpoint_counters(&e0, ip), endpoint_counters(&e1, ip));
        let got = after[3].saturating_sub(before[3]);
        assert!(
            got < 3 * BYTES as u64,
            "pod {name} ({ip}) was counted {got} bytes in for 2 x {BYTES}: counted twice?"
        );
        let want = [
            MIN_PACKETS / 2,
            2 * BYTES as u64,
            MIN_PACKETS / 2,
            2 * BYTES as u64,
        ];
        for i in 0..4 {
            let rose = after[i].saturating_sub(before[i]);
            assert!(
                rose >= want[i],
                "endpoint counter {i} of pod {name} ({ip}) rose by {rose}, expected at least {} \
                 (before {before:?}, after {after:?})",
                want[i]
            );
        }
    }

    // The datapath is still what CHECK expects.
    check(&node, &conf, "route-a", &a, &added_a);
    check(&node, &conf, "route-b", &b, &added_b);
    del(&node, &conf, "route-a", &a);
    del(&node, &conf, "route-b", &b);
    node.assert_clean(NETWORK);
}

fn v4_conf(subnet: &str) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "sluice",
        "ipam": {
            "type": "sluice",
            "subnet": subnet,
            "routes": [{"dst": "0.0.0.0/0"}],
        },
    })
}

#[test]
fn pod_to_pod_tcp_is_redirected_past_the_host_stack() {
    pod_to_pod(
        &v4_conf("10.90.0.0/24"),
        sluice_tests::schema::Added::ip,
        "Ip.ForwDatagrams",
    );
}

#[test]
fn pod_to_pod_tcp_is_redirected_past_the_host_stack_with_tcx() {
    let mut conf = v4_conf("10.90.1.0/24");
    conf["podAttach"] = json!("tcx");
    pod_to_pod(&conf, sluice_tests::schema::Added::ip, "Ip.ForwDatagrams");
}

/// `podDevice: auto`: netkit pairs where the kernel has them (Linux 6.7+), whose
/// `from_netkit_pod` hands the packet to the other pod's host device with
/// `bpf_redirect` (no `bpf_redirect_peer` outside tc ingress); veth elsewhere.
/// Dual stack, both families.
#[test]
fn netkit_pods_route_to_each_other_past_the_host_stack() {
    let conf = json!({
        "cniVersion": "1.1.0",
        "name": NETWORK,
        "type": "sluice",
        "podDevice": "auto",
        "ipam": {
            "type": "sluice",
            "ranges": [[{"subnet": "10.90.4.0/24"}], [{"subnet": "fd00:90:4::/64"}]],
        },
    });
    pod_to_pod(&conf, sluice_tests::schema::Added::ip, "Ip.ForwDatagrams");
    pod_to_pod(&conf, ipv6, "Ip6OutForwDatagrams");
}

#[test]
fn pod_to_pod_ipv6_is_redirected_past_the_host_stack() {
    let conf = json!({
        "cniVersion": "1.1.0",
        "name": NETWORK,
        "type": "sluice",
        "ipam": {
            "type": "sluice",
            "ranges": [[{"subnet": "10.90.2.0/24"}], [{"subnet": "fd00:90:2::/64"}]],
        },
    });
    pod_to_pod(&conf, ipv6, "Ip6OutForwDatagrams");
}

#[test]
fn dual_stack_pods_route_ipv4_past_the_host_stack_too() {
    let conf = json!({
        "cniVersion": "1.1.0",
        "name": NETWORK,
        "type": "sluice",
        "podAttach": "tcx",
        "ipam": {
            "type": "sluice",
            "ranges": [[{"subnet": "10.90.3.0/24"}], [{"subnet": "fd00:90:3::/64"}]],
        },
    });
    pod_to_pod(&conf, sluice_tests::schema::Added::ip, "Ip.ForwDatagrams");
}

/// A pod talking to the node itself (its gateway address): the FIB says local,
/// `from_pod` leaves the packets to the kernel, and the node's answers reach the
/// pod through the kernel (seen by `to_pod`).
#[test]
fn pod_to_node_traffic_is_left_to_the_kernel() {
    let node = Node::new().unwrap();
    let a = node.pod("a").unwrap();
    let mut conf = v4_conf("10.90.4.0/24");
    conf["pinRoot"] = json!(node.pin_root());
    conf["stateDir"] = json!(node.state_dir());
    conf["ipam"]["dataDir"] = json!(node.ipam_dir());
    let added = add(&node, &conf, "route-host", &a);
    let gw = added.gateway4().unwrap();
    let c0 = node.counters().unwrap();
    let seen = tcp_echo_via(
        &node.netns_path(),
        SocketAddr::new(gw, 0),
        &a.path,
        SocketAddr::new(gw, 0),
        BYTES,
    )
    .unwrap();
    assert_eq!(seen.ip(), added.ip());
    let d = node.counters().unwrap().since(&c0);
    assert!(d.get("from_pod_not_forwarded") >= MIN_PACKETS, "{d}");
    assert!(d.get("to_pod_from_kernel") >= MIN_PACKETS, "{d}");
    assert_eq!(d.get("from_pod_to_local_pod"), 0, "{d}");
    del(&node, &conf, "route-host", &a);
}

/// A UDP frame from `pod` (ADD result `a`) to `dst`, sent raw to the host veth.
fn udp_frame_to(a: &sluice_tests::schema::Added, dst: Ipv4Addr) -> Vec<u8> {
    let IpAddr::V4(src) = a.ip() else {
        panic!("no IPv4 address: {:#}", a.result);
    };
    ethernet(
        parse_mac(&a.host_mac).unwrap(),
        parse_mac(&a.pod_mac).unwrap(),
        ETH_P_IP,
        &Ipv4::new(src, dst, udp(40000, 9, b"where to?")).build(),
    )
}

/// Destinations the node's FIB has an unreachable, blackhole or prohibit route
/// for: `from_pod` leaves them to the kernel (which answers with ICMP) and counts
/// `from_pod_fib_no_route`.
#[test]
fn unroutable_destinations_are_left_to_the_kernel() {
    let node = Node::new().unwrap();
    let a = node.pod("a").unwrap();
    let mut conf = v4_conf("10.90.5.0/24");
    conf["pinRoot"] = json!(node.pin_root());
    conf["stateDir"] = json!(node.state_dir());
    conf["ipam"]["dataDir"] = json!(node.ipam_dir());
    let added = add(&node, &conf, "route-none", &a);
    for (kind, cidr) in [
        ("unreachable", "10.99.1.0/24"),
        ("blackhole", "10.99.2.0/24"),
        ("prohibit", "10.99.3.0/24"),
    ] {
        sluice_tests::host::ip(node.name(), &["route", "add", kind, cidr]).unwrap();
    }
    let frames = [[10, 99, 1, 1], [10, 99, 2, 1], [10, 99, 3, 1]]
        .map(|d| udp_frame_to(&added, Ipv4Addr::from(d)))
        .to_vec();
    let c0 = node.counters().unwrap();
    send_frames(&a.path, "eth0", frames).unwrap();
    let d = node.counters().unwrap().since(&c0);
    assert_eq!(d.get("from_pod_fib_no_route"), 3, "{d}");
    // The three frames were not counted there; a new pod's own IPv6 router
    // solicitations and MLD reports may be.
    assert!(d.get("from_pod_not_forwarded") < 3, "{d}");
    del(&node, &conf, "route-none", &a);
}

/// A destination the node has no route to at all (no default route either):
/// `bpf_fib_lookup` cannot tell that from a local destination (both are
/// `NOT_FWDED`), so `from_pod` counts `from_pod_not_forwarded` and leaves it to the
/// kernel, which answers the pod "network unreachable".
#[test]
fn destinations_without_any_route_are_left_to_the_kernel() {
    let node = Node::new().unwrap();
    let a = node.pod("a").unwrap();
    let mut conf = v4_conf("10.90.6.0/24");
    conf["pinRoot"] = json!(node.pin_root());
    conf["stateDir"] = json!(node.state_dir());
    conf["ipam"]["dataDir"] = json!(node.ipam_dir());
    let added = add(&node, &conf, "route-void", &a);
    let c0 = node.counters().unwrap();
    let icmp0 = look::snmp(&a.path).unwrap()["Icmp.InDestUnreachs"];
    send_frames(
        &a.path,
        "eth0",
        vec![udp_frame_to(&added, Ipv4Addr::new(10, 99, 4, 1))],
    )
    .unwrap();
    let d = node.counters().unwrap().since(&c0);
    // The frame itself, plus maybe the new pod's own IPv6 router solicitations
    // and MLD reports (also not forwarded) that happen to go out meanwhile.
    assert!(
        (1..=3).contains(&d.get("from_pod_not_forwarded")),
        "a packet to a destination without any route; counters that rose: {d}"
    );
    for r in [
        "from_pod_fib_redirect",
        "from_pod_fib_neigh",
        "from_pod_to_local_pod",
    ] {
        assert_eq!(d.get(r), 0, "{d}");
    }
    let icmp = look::snmp(&a.path).unwrap()["Icmp.InDestUnreachs"] - icmp0;
    assert_eq!(icmp, 1, "the pod got no unreachable answer ({d})");
    del(&node, &conf, "route-void", &a);
}

/// What the receiving pod sees of a redirected packet: the Ethernet header of its
/// own link (its MAC as destination, its host veth's as source), the TTL one
/// lower, a valid IPv4 header checksum (and so the datagram delivered).
#[test]
fn redirected_packets_carry_the_pod_link_macs_and_a_decremented_ttl() {
    let node = Node::new().unwrap();
    let a = node.pod("a").unwrap();
    let b = node.pod("b").unwrap();
    let mut conf = v4_conf("10.90.7.0/24");
    conf["pinRoot"] = json!(node.pin_root());
    conf["stateDir"] = json!(node.state_dir());
    conf["ipam"]["dataDir"] = json!(node.ipam_dir());
    let added_a = add(&node, &conf, "rewrite-a", &a);
    let added_b = add(&node, &conf, "rewrite-b", &b);
    let rx = UdpReceiver::start(
        &b.path,
        SocketAddr::new(added_b.ip(), 0),
        1,
        Duration::from_secs(5),
    )
    .unwrap();
    let port = rx.addr.port();
    let cap = Capture::start(
        &b.path,
        "eth0",
        1,
        Duration::from_secs(5),
        Box::new(move |f| is_udp_to(f, port)),
    )
    .unwrap();
    let c0 = node.counters().unwrap();
    udp_send(
        &a.path,
        SocketAddr::new(added_a.ip(), 0),
        SocketAddr::new(added_b.ip(), port),
        b"rewritten?",
    )
    .unwrap();
    let frames = cap.finish().unwrap();
    let got = rx.finish().unwrap();
    let d = node.counters().unwrap().since(&c0);
    assert_eq!(d.get("from_pod_to_local_pod"), 1, "{d}");
    assert_eq!(frames.len(), 1, "pod b captured {} frames", frames.len());
    let (dst, src, ttl, csum_ok) = l2_l3(&frames[0]).unwrap();
    assert_eq!(dst, parse_mac(&added_b.pod_mac).unwrap(), "destination MAC");
    assert_eq!(src, parse_mac(&added_b.host_mac).unwrap(), "source MAC");
    assert_eq!(ttl, 63, "TTL (sent with 64)");
    assert!(
        csum_ok,
        "the IPv4 header checksum is wrong after the TTL update"
    );
    assert_eq!(got, vec![b"rewritten?".to_vec()]);
    del(&node, &conf, "rewrite-a", &a);
    del(&node, &conf, "rewrite-b", &b);
}

/// Rounds of [`the_first_datagrams_after_add_arrive`].
const FIRST_ROUNDS: usize = 8;
/// How long it waits for each first datagram after sending it.
const FIRST_WAIT: Duration = Duration::from_secs(3);

/// The first datagram a pod sends, right after its ADD returns, reaches
/// another pod, in both families: a runtime starts the container as soon as
/// ADD answers, and a lost first packet (a DNS query) costs the application
/// a retry timeout. Each round adds two fresh pods, the receiver listening in
/// pod b's namespace before its ADD, and pod a sends as soon as its own ADD
/// returns: one datagram per family, no retry.
#[test]
fn the_first_datagrams_after_add_arrive() {
    let node = Node::new().unwrap();
    let mut conf = node.conf("1.1.0", "10.90.9.0/24");
    conf["ipam"] = json!({
        "type": "sluice",
        "ranges": [[{"subnet": "10.90.9.0/24"}], [{"subnet": "fd00:90:9::/64"}]],
        "dataDir": node.ipam_dir(),
    });
    let v4_any = IpAddr::from(Ipv4Addr::UNSPECIFIED);
    let v6_any = IpAddr::from(Ipv6Addr::UNSPECIFIED);
    let mut lost = Vec::new();
    for round in 0..FIRST_ROUNDS {
        let (ca, cb) = (format!("first-a{round}"), format!("first-b{round}"));
        let a = node.pod(&ca).unwrap();
        let b = node.pod(&cb).unwrap();
        // Bound before the ADDs (the first one of a node loads the datapath,
        // seconds under emulation); read from after the sends.
        let rx4 = udp_socket(&b.path, SocketAddr::new(v4_any, 0)).unwrap();
        let rx6 = udp_socket(&b.path, SocketAddr::new(v6_any, 0)).unwrap();
        let added_b = add(&node, &conf, &cb, &b);
        add(&node, &conf, &ca, &a);
        let (b4, b6) = (added_b.ip(), ipv6(&added_b));
        for (dst, rx, bind) in [(b4, &rx4, v4_any), (b6, &rx6, v6_any)] {
            let port = rx.local_addr().unwrap().port();
            let u = udp_socket(&a.path, SocketAddr::new(bind, 0)).unwrap();
            u.send_to(b"first", SocketAddr::new(dst, port)).unwrap();
        }
        for (family, rx) in [("IPv4", rx4), ("IPv6", rx6)] {
            rx.set_read_timeout(Some(FIRST_WAIT)).unwrap();
            let mut buf = [0u8; 16];
            if rx.recv(&mut buf).is_err() {
                lost.push(format!(
                    "round {round}: {family}; counters: {}",
                    node.counters().unwrap()
                ));
            }
        }
        del(&node, &conf, &ca, &a);
        del(&node, &conf, &cb, &b);
    }
    assert!(lost.is_empty(), "first datagrams lost: {lost:#?}");
}
