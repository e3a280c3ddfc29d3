//! Masquerade (SNAT to the node's address) with real traffic: a node wired to an
//! external host that has no route to the pods, so that only masquerade can bring
//! replies home. TCP, UDP and ICMP echo leave with the node's address and a NAT
//! port and come back (through `uplink_in`, or `uplink_xdp` in native mode); what
//! is inside `nonMasqueradeCIDRs` keeps the pod's address; colliding source ports
//! get distinct NAT ports; idle flows expire; ICMP errors (fragmentation needed,
//! time exceeded) find the pod; DEL and
//! `sluicectl nat flush` remove flows; fragments and port-less protocols never
//! leave untranslated; bad settings are refused with the right code.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
#![expect(
    clippy::cast_possible_truncation,
    reason = "test packets and ports: values fit"
)]
use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket},
    ops::RangeInclusive,
    os::fd::AsRawFd,
    thread,
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use sluice_tests::{
    exec,
    fixtures::{add, check, del, merge_keys, EXT_IF, EXT_IP, NODE_IP, UPLINK},
    host::{self, tx_checksum_off},
    kernel, look,
    masq::{
        checksums_ok, in_netns, ipv4_addrs, ipv4_of, masq_external_host, nat_list, path_mtu,
        payload, routed_external_host, sweep_agent, sysctl, tcp_abort, tcp_accept, tcp_connect,
        tcp_echo_on, tcp_listen, tcp_send_over, udp_echo_on, udp_socket, wait_for, EchoServer,
        Pinger, FAR_IP,
    },
    raw::{ethernet, parse_mac, send_frames, udp, Capture, Ipv4},
    schema::Added,
    sluice_next_bin, sockopt,
    stream::Stream,
    Counters, Host, Node, Pod, NETWORK,
};

/// Bytes of each TCP echo (sent one way, then echoed back).
const BYTES: usize = 256 << 10;
/// Fewest packets an echo can take in one direction, even as 64 KiB GSO segments.
const MIN_PACKETS: u64 = 6;
/// NAT ports with the kernel's default `ip_local_port_range` (32768 60999):
/// every port from 1024 up outside it.
const NAT_PORTS: [RangeInclusive<u16>; 2] = [1024..=32767, 61000..=65535];
/// ICMP echo identifier the pods use.
const ICMP_ID: u16 = 0x5a5a;
/// Every counter of a masquerade drop.
const DROPS: [&str; 5] = [
    "drop_masq_fragment",
    "drop_masq_proto",
    "drop_masq_no_port",
    "drop_masq_map_full",
    "drop_masq_malformed",
];

fn is_nat_port(p: u16) -> bool {
    NAT_PORTS.iter().any(|r| r.contains(&p))
}

fn ext_ip() -> Ipv4Addr {
    EXT_IP.parse().unwrap()
}

fn node_ip() -> Ipv4Addr {
    NODE_IP.parse().unwrap()
}

fn sa(ip: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(ip), port)
}

/// A node with masquerade on, wired to an external host with no route to the pods.
struct World {
    node: Node,
    ext: Host,
    conf: Value,
}

/// A pod `ADDed` to a [`World`].
struct P {
    pod: Pod,
    cid: String,
    added: Added,
    ip: Ipv4Addr,
}

impl P {
    fn sock(&self, port: u16) -> SocketAddr {
        sa(self.ip, port)
    }
}

impl World {
    /// `xdp` as configured (`native` also turns off the external side's TX
    /// checksum offload, see [`tx_checksum_off`]); `extra` keys are merged into
    /// the config.
    fn new(subnet: &str, xdp: &str, extra: &Value) -> Self {
        let node = Node::new().unwrap();
        let ext = masq_external_host(&node).unwrap();
        if xdp == "native" {
            tx_checksum_off(&ext.netns_path(), EXT_IF).unwrap();
        }
        let mut conf = node.conf("1.0.0", subnet);
        conf["ipMasq"] = json!(true);
        conf["uplink"] = json!(UPLINK);
        conf["xdp"] = json!(xdp);
        merge_keys(&mut conf, extra);
        Self { node, ext, conf }
    }

    fn add(&self, name: &str, cid: &str) -> P {
        self.add_with(&self.conf, name, cid)
    }

    fn add_with(&self, conf: &Value, name: &str, cid: &str) -> P {
        let pod = self.node.pod(name).unwrap();
        let added = add(&self.node, conf, cid, &pod);
        let ip = ipv4_of(added.ip()).unwrap();
        P {
            pod,
            cid: cid.to_string(),
            added,
            ip,
        }
    }

    fn del(&self, p: &P) {
        del(&self.node, &self.conf, &p.cid, &p.pod);
    }

    fn counters(&self) -> Counters {
        self.node.counters().unwrap()
    }

    /// An echo server on the external host (TCP and UDP on one port).
    fn server(&self) -> EchoServer {
        EchoServer::start(&self.ext.netns_path(), sa(ext_ip(), 0)).unwrap()
    }

    fn flows(&self, filters: &[&str]) -> Vec<Value> {
        nat_list(&self.node, filters).unwrap()
    }

    fn flows_of(&self, p: &P) -> Vec<Value> {
        self.flows(&["--pod", &p.ip.to_string()])
    }

    fn host_ifindex(&self, p: &P) -> u64 {
        look::ifindex(self.node.name(), &p.added.host_veth).unwrap()
    }

    fn forwarded(&self) -> u64 {
        self.node.snmp().unwrap()["Ip.ForwDatagrams"]
    }
}

/// The flow of `proto` from `pod_port` in `flows`; panics without exactly one.
#[track_caller]
fn flow<'a>(flows: &'a [Value], proto: &str, pod_port: u16) -> &'a Value {
    let found: Vec<&Value> = flows
        .iter()
        .filter(|f| f["proto"] == proto && f["podPort"] == pod_port)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected one {proto} flow from pod port {pod_port}: {flows:#?}"
    );
    found[0]
}

#[track_caller]
fn nat_port(f: &Value) -> u16 {
    f["natPort"]
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .unwrap_or_else(|| panic!("no natPort in {f}"))
}

/// A flow as `nat list --json` must show it.
#[track_caller]
fn assert_flow(f: &Value, pod: &P, dst: SocketAddr, state: &str, ifindex: u64) {
    assert_eq!(f["podIp"], pod.ip.to_string(), "{f:#}");
    assert_eq!(f["natIp"], NODE_IP, "{f:#}");
    assert!(is_nat_port(nat_port(f)), "NAT port out of range: {f:#}");
    assert_eq!(f["dstIp"], dst.ip().to_string(), "{f:#}");
    assert_eq!(f["dstPort"], dst.port(), "{f:#}");
    assert_eq!(f["state"], state, "{f:#}");
    assert_eq!(f["hostIfindex"], ifindex, "{f:#}");
    assert!(
        f["idleSeconds"].as_u64().is_some_and(|s| s <= 30),
        "idleSeconds: {f:#}"
    );
}

#[track_caller]
fn assert_no_drops(d: &Counters) {
    for r in DROPS {
        assert_eq!(d.get(r), 0, "{r} rose: {d}");
    }
}

/// A capture on the external host's `ext0` of every frame whose IPv4 source is
/// `src` (stopped by the caller).
fn capture_from(ext: &Host, src: Ipv4Addr) -> Capture {
    Capture::start(
        &ext.netns_path(),
        EXT_IF,
        usize::MAX,
        Duration::from_mins(2),
        Box::new(move |f| ipv4_addrs(f).is_some_and(|(s, _)| s == src)),
    )
    .unwrap()
}

// --- 1. TCP, UDP and ICMP echo are masqueraded --------------------------------

fn masqueraded_echoes(subnet: &str, xdp: &str, extra: &Value) {
    let w = World::new(subnet, xdp, extra);
    let a = w.add("a", "masq-echo-a");
    let device = kernel::pod_device(extra);
    kernel::assert_device_kind(&w.node, &a.added.host_veth, device);
    let st = w.node.status().unwrap();
    let mode = if xdp == "native" {
        kernel::xdp_mode("native")
    } else {
        "off"
    };
    assert_eq!(st["uplink"]["xdp"], mode, "{st:#}");
    let server = w.server();
    let leak = capture_from(&w.ext, a.ip);
    let c0 = w.counters();
    let fwd0 = w.forwarded();

    let tcp = tcp_connect(&a.pod.path, None, server.addr).unwrap();
    let tcp_port = tcp.local_addr().unwrap().port();
    tcp_echo_on(&tcp, BYTES, 1).unwrap();
    let u = udp_socket(&a.pod.path, a.sock(0)).unwrap();
    let udp_port = u.local_addr().unwrap().port();
    for i in 0..5u8 {
        udp_echo_on(
            &u,
            server.addr,
            &payload(100 + usize::from(i), i),
            3,
            Duration::from_secs(2),
        )
        .unwrap();
    }
    let pinger = Pinger::new(&a.pod.path).unwrap();
    for seq in 1..=3 {
        pinger
            .ping(ext_ip(), ICMP_ID, seq, 3, Duration::from_secs(2))
            .unwrap();
    }
    let d = w.counters().since(&c0);
    let fwd = w.forwarded() - fwd0;
    eprintln!("xdp {xdp}: masqueraded echoes: {d}");
    let leaked = leak.stop().unwrap();
    assert!(
        leaked.is_empty(),
        "{} frames with the pod's address {} reached the external host",
        leaked.len(),
        a.ip
    );

    // The external host saw the node's address and a NAT port.
    let peers = server.peers();
    assert_eq!(peers.tcp.len(), 1, "{peers:?}");
    let tcp_peer = peers.tcp[0];
    assert_eq!(tcp_peer.ip(), node_ip(), "TCP peer seen by the server");
    assert!(is_nat_port(tcp_peer.port()), "TCP peer {tcp_peer}");
    let udp_peers = peers.udp_sources();
    assert_eq!(udp_peers.len(), 1, "UDP sources seen: {udp_peers:?}");
    let udp_peer = *udp_peers.iter().next().unwrap();
    assert_eq!(udp_peer.ip(), node_ip(), "UDP peer seen by the server");
    assert!(is_nat_port(udp_peer.port()), "UDP peer {udp_peer}");

    // The flows, as sluicectl shows them.
    let ifindex = w.host_ifindex(&a);
    let flows = w.flows(&[]);
    assert_eq!(flows.len(), 3, "{flows:#?}");
    let t = flow(&flows, "tcp", tcp_port);
    assert_flow(t, &a, server.addr, "established", ifindex);
    assert_eq!(nat_port(t), tcp_peer.port(), "TCP NAT port: {t:#}");
    let u_flow = flow(&flows, "udp", udp_port);
    assert_flow(u_flow, &a, server.addr, "udp", ifindex);
    assert_eq!(
        nat_port(u_flow),
        udp_peer.port(),
        "UDP NAT port: {u_flow:#}"
    );
    let i = flow(&flows, "icmp", ICMP_ID);
    assert_flow(i, &a, sa(ext_ip(), 0), "icmp", ifindex);
    // Filters.
    let only_tcp = w.flows(&["--proto", "tcp"]);
    assert_eq!(only_tcp.len(), 1, "{only_tcp:#?}");
    assert_eq!(only_tcp[0]["proto"], "tcp");
    assert_eq!(w.flows(&["--proto", "icmp"]).len(), 1);
    assert_eq!(w.flows(&["--dst", EXT_IP]).len(), 3);
    assert!(w.flows(&["--dst", "192.0.2.1"]).is_empty());
    assert_eq!(w.flows_of(&a).len(), 3);
    assert_eq!(
        w.flows(&["--pod", "masq-echo"]).len(),
        3,
        "container prefix"
    );
    let table = w.node.sluicectl(&["nat", "list"]).unwrap();
    assert!(table.success(), "{table}");
    assert!(
        table.stdout.contains(&format!("{}:{tcp_port}", a.ip))
            && table
                .stdout
                .contains(&format!("{NODE_IP}:{}", tcp_peer.port())),
        "{table}"
    );

    // Counters.
    assert_eq!(d.get("masq_new_flow"), 3, "{d}");
    assert!(d.get("masq_snat") >= MIN_PACKETS + 5 + 3, "{d}");
    if mode == "native" {
        assert!(
            d.get("xdp_masq_dnat") >= MIN_PACKETS + 5 + 3,
            "native XDP: replies not translated in XDP: {d}"
        );
    } else {
        assert!(d.get("masq_dnat") >= MIN_PACKETS + 5 + 3, "{d}");
        assert_eq!(d.get("xdp_masq_dnat"), 0, "{d}");
    }
    assert_no_drops(&d);
    assert!(
        fwd <= kernel::kernel_forwarding_allowed(&d),
        "the node's kernel forwarded {fwd} packets ({d})"
    );

    check(&w.node, &w.conf, &a.cid, &a.pod, &a.added);
    drop(tcp);
    w.del(&a);
    assert!(w.flows(&[]).is_empty(), "{:#?}", w.flows(&[]));
    w.node.assert_clean(NETWORK);
}

#[test]
fn tcp_udp_and_icmp_echo_leave_with_the_node_address() {
    masqueraded_echoes("10.96.1.0/24", "auto", &json!({}));
}

/// The same from a netkit pod where the kernel has netkit (`podDevice: auto`):
/// `from_netkit_pod` translates and redirects out of the uplink from the pod
/// device's transmit; replies go into the pod with `bpf_redirect_peer`, which
/// netkit supports as veth does.
#[test]
fn netkit_pods_masquerade_tcp_udp_and_icmp() {
    masqueraded_echoes("10.96.30.0/24", "auto", &json!({"podDevice": "auto"}));
}

#[test]
fn tcp_udp_and_icmp_echo_leave_with_the_node_address_native_xdp() {
    masqueraded_echoes("10.96.2.0/24", "native", &json!({}));
}

/// In native XDP mode the replies' TCP flags must drive the flow's state as in
/// tc: an open connection whose replies carry no FIN or RST stays established,
/// so it outlives a short `tcpClosing` and the server can still reach the pod
/// after an idle while.
#[test]
fn native_xdp_replies_keep_an_open_tcp_flow_established() {
    let w = World::new(
        "10.96.3.0/24",
        "native",
        &json!({"natTimeouts": {"tcpClosing": 2}}),
    );
    let a = w.add("a", "masq-xdpst-a");
    let l = tcp_listen(&w.ext.netns_path(), sa(ext_ip(), 0)).unwrap();
    idle_open_connection_survives(&w, &a, &l, None, kernel::xdp_mode("native") == "native");
}

/// The same through tc (xdp auto: no XDP on a veth uplink).
#[test]
fn an_idle_open_tcp_connection_stays_reachable_from_the_server() {
    let w = World::new(
        "10.96.21.0/24",
        "auto",
        &json!({"natTimeouts": {"tcpClosing": 2, "udp": 2, "icmp": 2, "tcpSyn": 2}}),
    );
    let a = w.add("a", "masq-idle-a");
    let l = tcp_listen(&w.ext.netns_path(), sa(ext_ip(), 0)).unwrap();
    idle_open_connection_survives(&w, &a, &l, None, false);
}

/// An open connection (from pod `a` to the listener `l` on the external host,
/// from `from` when given): data both ways with many sequence numbers, then
/// idle longer than `tcpClosing` (2 s) and a sweep, then the server sends first:
/// the pod must get it on the same NAT port, the flow must have stayed
/// established. `xdp`: the replies must have gone through XDP.
fn idle_open_connection_survives(
    w: &World,
    a: &P,
    l: &std::net::TcpListener,
    from: Option<SocketAddr>,
    xdp: bool,
) {
    let to = l.local_addr().unwrap();
    let client = tcp_connect(&a.pod.path, from, to).unwrap();
    let server = tcp_accept(l).unwrap();
    let port = client.local_addr().unwrap().port();
    let c0 = w.counters();
    for i in 0..20u8 {
        let n = 1000 + 37 * usize::from(i);
        tcp_send_over(&client, &server, &payload(n, i)).unwrap();
        tcp_send_over(&server, &client, &payload(n, i + 1)).unwrap();
    }
    let d = w.counters().since(&c0);
    if xdp {
        assert!(d.get("xdp_masq_dnat") >= 20, "{d}");
    }
    let f = w.flows_of(a);
    let f = flow(&f, "tcp", port);
    let (nat, state) = (nat_port(f), f["state"].clone());
    thread::sleep(Duration::from_secs(5));
    let pushed = tcp_send_over(&server, &client, b"after an idle while");
    let d = w.counters().since(&c0);
    assert!(
        pushed.is_ok(),
        "the server could not reach the pod after 5 s idle: {pushed:?}; the flow was {state} \
         before; counters: {d}"
    );
    assert_eq!(state, "established", "{d}");
    assert_eq!(
        d.get("nat_expired"),
        0,
        "the open connection's flow expired: {d}"
    );
    assert_eq!(nat_port(flow(&w.flows_of(a), "tcp", port)), nat);
    tcp_send_over(&client, &server, b"and back").unwrap();
}

/// A connection reset and opened again at once on the same 4-tuple (the pod
/// binds its port again): the new connection's flow is established, not left
/// closing from the old one, so it outlives a short `tcpClosing` idle.
#[test]
fn a_connection_reopened_on_the_same_tuple_is_tracked_as_established() {
    let w = World::new(
        "10.96.20.0/24",
        "auto",
        &json!({"natTimeouts": {"tcpClosing": 2}}),
    );
    let a = w.add("a", "masq-reuse-a");
    let l = tcp_listen(&w.ext.netns_path(), sa(ext_ip(), 0)).unwrap();
    let to = l.local_addr().unwrap();
    let from = a.sock(40002);
    let client = tcp_connect(&a.pod.path, Some(from), to).unwrap();
    let server = tcp_accept(&l).unwrap();
    tcp_send_over(&client, &server, b"first").unwrap();
    tcp_abort(client).unwrap();
    drop(server);
    let f = w.flows_of(&a);
    assert_eq!(flow(&f, "tcp", 40002)["state"], "closing", "{f:#?}");
    // The same pod port to the same server port, at once.
    idle_open_connection_survives(&w, &a, &l, Some(from), false);
}

/// With complete checksums on both ends (TX checksum offload off in the pod
/// and on the external host), every translated frame arrives with a right IPv4,
/// TCP, UDP or ICMP checksum, checked on the captured frames and by the
/// receiving kernels; a UDP datagram without checksum (0) keeps none.
fn translated_checksums(subnet: &str, xdp: &str) {
    let w = World::new(subnet, xdp, &json!({}));
    tx_checksum_off(&w.ext.netns_path(), EXT_IF).unwrap();
    let a = w.add("a", "masq-csum-a");
    tx_checksum_off(&a.pod.path, "eth0").unwrap();
    let server = w.server();
    let cap = |ns: &std::path::Path, dev: &str, src: Ipv4Addr| {
        Capture::start(
            ns,
            dev,
            usize::MAX,
            Duration::from_mins(2),
            Box::new(move |f| ipv4_addrs(f).is_some_and(|(s, _)| s == src)),
        )
        .unwrap()
    };
    let out_cap = cap(&w.ext.netns_path(), EXT_IF, node_ip());
    let in_cap = cap(&a.pod.path, "eth0", ext_ip());
    let csum_errors = |ns: &std::path::Path| -> u64 {
        let m = look::snmp(ns).unwrap();
        ["Tcp.InCsumErrors", "Udp.InCsumErrors", "Icmp.InCsumErrors"]
            .iter()
            .map(|k| m.get(*k).copied().unwrap_or(0))
            .sum()
    };
    let (pod0, ext0) = (csum_errors(&a.pod.path), csum_errors(&w.ext.netns_path()));

    let s = tcp_connect(&a.pod.path, None, server.addr).unwrap();
    tcp_echo_on(&s, BYTES, 17).unwrap();
    let u = udp_socket(&a.pod.path, a.sock(40003)).unwrap();
    for i in 0..5u8 {
        udp_echo_on(&u, server.addr, &payload(333, i), 3, Duration::from_secs(2)).unwrap();
    }
    let pinger = Pinger::new(&a.pod.path).unwrap();
    for seq in 1..=3 {
        pinger
            .ping(ext_ip(), ICMP_ID, seq, 3, Duration::from_secs(2))
            .unwrap();
    }
    // A datagram without checksum, from the UDP socket's port: its echo comes
    // back to that socket.
    let data = b"no checksum here".to_vec();
    let frame = ethernet(
        parse_mac(&a.added.host_mac).unwrap(),
        parse_mac(&a.added.pod_mac).unwrap(),
        0x0800,
        &Ipv4::new(a.ip, ext_ip(), udp(40003, server.addr.port(), &data)).build(),
    );
    send_frames(&a.pod.path, "eth0", vec![frame]).unwrap();
    u.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut buf = [0u8; 64];
    let (n, from) = u.recv_from(&mut buf).unwrap();
    assert_eq!((from, &buf[..n]), (server.addr, &data[..]));

    thread::sleep(Duration::from_millis(200));
    let (sent, received) = (out_cap.stop().unwrap(), in_cap.stop().unwrap());
    for (what, frames) in [("leaving", &sent), ("into the pod", &received)] {
        // Bigger than the MTU: merged by GRO, with the first segment's checksum.
        let single: Vec<&Vec<u8>> = frames.iter().filter(|f| f.len() <= 1514).collect();
        let bad = single
            .iter()
            .filter(|f| checksums_ok(f) == Some(false))
            .count();
        let checked = single.iter().filter(|f| checksums_ok(f).is_some()).count();
        eprintln!("xdp {xdp}: {what}: {checked} frames checked, {bad} bad");
        assert_eq!(
            bad, 0,
            "{what}: {bad} of {checked} translated frames have a wrong checksum"
        );
        assert!(
            checked as u64 >= 2 * MIN_PACKETS,
            "{what}: only {checked} frames checked"
        );
    }
    // The UDP checksums of the frames that carried it (IPv4 header length 20
    // is what `Ipv4::new` builds and the translation keeps).
    let carried: Vec<[u8; 2]> = sent
        .iter()
        .filter(|f| f.len() >= 14 + 28 && f[14 + 9] == 17 && f.ends_with(&data))
        .map(|f| [f[14 + 20 + 6], f[14 + 20 + 7]])
        .collect();
    assert!(
        carried.contains(&[0, 0]),
        "the datagram without checksum did not leave without one: the frames \
         with its data left with UDP checksums {carried:02x?} ({} frames captured \
         from the node)",
        sent.len()
    );
    assert_eq!(
        csum_errors(&a.pod.path),
        pod0,
        "checksum errors counted in the pod"
    );
    assert_eq!(
        csum_errors(&w.ext.netns_path()),
        ext0,
        "checksum errors counted on the external host"
    );
    drop(s);
    w.del(&a);
}

#[test]
fn translated_frames_carry_right_checksums() {
    translated_checksums("10.96.23.0/24", "auto");
}

#[test]
fn translated_frames_carry_right_checksums_native_xdp() {
    translated_checksums("10.96.24.0/24", "native");
}

// --- 2. Not masqueraded --------------------------------------------------------

/// Pod to pod on the node and pod to another node's pod range (`nodes`) keep the
/// pod's address; the external host itself is still reached masqueraded.
#[test]
fn pods_here_and_on_other_nodes_are_reached_with_the_pod_address() {
    let subnet = "10.96.4.0/24";
    let remote = "10.96.104.0/24";
    let remote_pod: Ipv4Addr = "10.96.104.7".parse().unwrap();
    let w = World::new(
        subnet,
        "auto",
        &json!({"nodes": [{"podCIDR": remote, "nodeIP": EXT_IP}]}),
    );
    // The external host plays the other node: it has a "pod" of its range and,
    // as a node of the cluster, a route to this node's pods.
    w.ext
        .ip(&["addr", "add", &format!("{remote_pod}/32"), "dev", "lo"])
        .unwrap();
    w.ext.ip(&["route", "add", subnet, "via", NODE_IP]).unwrap();
    let a = w.add("a", "masq-nm-a");
    let b = w.add("b", "masq-nm-b");
    let c0 = w.counters();

    // Pod to pod.
    let in_b = EchoServer::start(&b.pod.path, b.sock(0)).unwrap();
    let s = tcp_connect(&a.pod.path, None, in_b.addr).unwrap();
    tcp_echo_on(&s, BYTES, 2).unwrap();
    let u = udp_socket(&a.pod.path, a.sock(0)).unwrap();
    udp_echo_on(&u, in_b.addr, b"pod to pod", 3, Duration::from_secs(2)).unwrap();
    let peers = in_b.peers();
    assert_eq!(peers.tcp, vec![s.local_addr().unwrap()], "pod to pod");
    assert_eq!(peers.udp, vec![u.local_addr().unwrap()], "pod to pod");

    // Pod to another node's pod.
    let other = EchoServer::start(&w.ext.netns_path(), sa(remote_pod, 0)).unwrap();
    let s2 = tcp_connect(&a.pod.path, None, other.addr).unwrap();
    tcp_echo_on(&s2, BYTES, 3).unwrap();
    udp_echo_on(
        &u,
        other.addr,
        b"to another node",
        3,
        Duration::from_secs(2),
    )
    .unwrap();
    let peers = other.peers();
    assert_eq!(
        peers.tcp,
        vec![s2.local_addr().unwrap()],
        "to another node's pod"
    );
    assert_eq!(
        peers.udp,
        vec![u.local_addr().unwrap()],
        "to another node's pod"
    );

    let d = w.counters().since(&c0);
    eprintln!("not masqueraded: {d}");
    assert_eq!(d.get("masq_snat"), 0, "{d}");
    assert_eq!(d.get("masq_new_flow"), 0, "{d}");
    assert_no_drops(&d);
    assert!(w.flows(&[]).is_empty(), "{:#?}", w.flows(&[]));

    // The external host's own address is outside the cluster: masqueraded.
    let server = w.server();
    let s3 = tcp_connect(&a.pod.path, None, server.addr).unwrap();
    tcp_echo_on(&s3, BYTES, 4).unwrap();
    assert_eq!(server.peers().tcp[0].ip(), node_ip());
    assert_eq!(w.flows(&[]).len(), 1, "{:#?}", w.flows(&[]));
    drop((s, s2, s3));
    w.del(&a);
    w.del(&b);
}

/// An explicit `nonMasqueradeCIDRs` entry covering the external host: it sees
/// the pod's address (and routes back to the pods); an address outside is still
/// masqueraded.
#[test]
fn explicit_non_masquerade_cidrs_keep_the_pod_address() {
    let subnet = "10.96.5.0/24";
    let outside: Ipv4Addr = "198.51.100.5".parse().unwrap();
    let w = World::new(
        subnet,
        "auto",
        &json!({"nonMasqueradeCIDRs": [subnet, "192.168.50.0/24"]}),
    );
    w.ext.ip(&["route", "add", subnet, "via", NODE_IP]).unwrap();
    w.ext
        .ip(&["addr", "add", &format!("{outside}/32"), "dev", "lo"])
        .unwrap();
    let a = w.add("a", "masq-explicit-a");
    let server = w.server();
    let c0 = w.counters();
    let s = tcp_connect(&a.pod.path, None, server.addr).unwrap();
    tcp_echo_on(&s, BYTES, 5).unwrap();
    let u = udp_socket(&a.pod.path, a.sock(0)).unwrap();
    udp_echo_on(&u, server.addr, b"inside", 3, Duration::from_secs(2)).unwrap();
    Pinger::new(&a.pod.path)
        .unwrap()
        .ping(ext_ip(), ICMP_ID, 1, 3, Duration::from_secs(2))
        .unwrap();
    let peers = server.peers();
    assert_eq!(peers.tcp, vec![s.local_addr().unwrap()]);
    assert_eq!(peers.udp, vec![u.local_addr().unwrap()]);
    let d = w.counters().since(&c0);
    assert_eq!(d.get("masq_snat"), 0, "{d}");
    assert!(w.flows(&[]).is_empty(), "{:#?}", w.flows(&[]));

    let far = EchoServer::start(&w.ext.netns_path(), sa(outside, 0)).unwrap();
    udp_echo_on(&u, far.addr, b"outside", 3, Duration::from_secs(2)).unwrap();
    let src = far.peers().udp[0];
    assert_eq!(
        src.ip(),
        node_ip(),
        "outside nonMasqueradeCIDRs: masqueraded"
    );
    let flows = w.flows(&[]);
    assert_eq!(flows.len(), 1, "{flows:#?}");
    assert_eq!(flows[0]["dstIp"], outside.to_string());
    drop(s);
    w.del(&a);
}

/// With a route from the external host to the pods (routed pod addresses, as
/// with BGP or a load balancer sending to pod IPs), connections the outside
/// opens to a pod are answered from the pod's address: masquerade is for flows
/// the pods open, not for replies.
#[test]
fn connections_from_outside_are_answered_from_the_pod_address() {
    let subnet = "10.96.19.0/24";
    let w = World::new(subnet, "auto", &json!({}));
    w.ext.ip(&["route", "add", subnet, "via", NODE_IP]).unwrap();
    let a = w.add("a", "masq-in-a");
    let in_a = EchoServer::start(&a.pod.path, a.sock(0)).unwrap();
    let c0 = w.counters();
    let ext_ns = w.ext.netns_path();
    let udp = udp_socket(&ext_ns, sa(ext_ip(), 0)).unwrap();
    let udp_r = udp_echo_on(&udp, in_a.addr, b"from outside", 2, Duration::from_secs(1));
    let ping_r = Pinger::new(&ext_ns)
        .unwrap()
        .ping(a.ip, ICMP_ID, 1, 2, Duration::from_secs(1));
    let tcp_r = tcp_connect(&ext_ns, None, in_a.addr).and_then(|s| tcp_echo_on(&s, BYTES, 16));
    let d = w.counters().since(&c0);
    eprintln!("from outside: {d}; flows: {:#?}", w.flows(&[]));
    assert!(
        tcp_r.is_ok() && udp_r.is_ok() && ping_r.is_ok(),
        "TCP: {tcp_r:?}\nUDP: {udp_r:?}\nICMP echo: {ping_r:?}\ncounters: {d}"
    );
    assert_eq!(in_a.peers().tcp[0].ip(), ext_ip());
    // Tracked as inbound (so the answers are not masqueraded), never as a
    // flow the pod opened.
    let flows = w.flows(&[]);
    assert!(flows.iter().all(|f| f["origin"] == "outside"), "{flows:#?}");
    w.del(&a);
}

/// A changed `masqueradeAddress` (written at the next ADD, as when the uplink's
/// address changes): a flow open before keeps working, and no reverse entry is
/// left behind once the flows are flushed.
#[test]
fn a_changed_masquerade_address_keeps_flows_working_and_leaves_nothing() {
    let second: Ipv4Addr = "192.168.50.9".parse().unwrap();
    let w = World::new("10.96.22.0/24", "auto", &json!({}));
    host::ip(
        w.node.name(),
        &["addr", "add", &format!("{second}/24"), "dev", UPLINK],
    )
    .unwrap();
    let a = w.add("a", "masq-chaddr-a");
    let server = w.server();
    let u = udp_socket(&a.pod.path, a.sock(0)).unwrap();
    udp_echo_on(&u, server.addr, b"before", 3, Duration::from_secs(2)).unwrap();
    let mut conf = w.conf.clone();
    conf["masqueradeAddress"] = json!(second.to_string());
    let b = w.add_with(&conf, "b", "masq-chaddr-b");
    let after = udp_echo_on(&u, server.addr, b"after", 3, Duration::from_secs(1));
    let flush = w.node.sluicectl(&["nat", "flush", "--all"]).unwrap();
    assert!(flush.success(), "{flush}");
    let rev = map_entries(&w.node, "sl_nat_rev");
    assert!(
        after.is_ok(),
        "a flow opened before the change: {after:?} (peers seen: {:?}; {rev} reverse \
         entries left after nat flush --all)",
        server.peers().udp
    );
    assert_eq!(rev, 0, "reverse entries left after nat flush --all");
    del(&w.node, &conf, &b.cid, &b.pod);
    w.del(&a);
}

// --- 3. Collisions ---------------------------------------------------------------

/// A node process and a pod use the same source port to the same server port at
/// the same time: both work, the pod's flow gets a NAT port of its own.
#[test]
fn a_node_process_and_a_pod_share_source_port_and_server() {
    let w = World::new("10.96.6.0/24", "auto", &json!({}));
    let a = w.add("a", "masq-node-a");
    let server = w.server();
    let port = 40000;
    let node_ns = w.node.netns_path();
    let from_node = tcp_connect(&node_ns, Some(sa(node_ip(), port)), server.addr).unwrap();
    let from_pod = tcp_connect(&a.pod.path, Some(a.sock(port)), server.addr).unwrap();
    let t = thread::spawn(move || tcp_echo_on(&from_node, BYTES, 6).map(|()| from_node));
    tcp_echo_on(&from_pod, BYTES, 7).unwrap();
    let from_node = t.join().unwrap().unwrap();

    let un = udp_socket(&node_ns, sa(node_ip(), port)).unwrap();
    let up = udp_socket(&a.pod.path, a.sock(port)).unwrap();
    for i in 0..10u8 {
        udp_echo_on(&un, server.addr, &payload(64, i), 3, Duration::from_secs(2)).unwrap();
        udp_echo_on(&up, server.addr, &payload(64, i), 3, Duration::from_secs(2)).unwrap();
    }
    let peers = server.peers();
    let flows = w.flows_of(&a);
    let (tn, un_nat) = (
        nat_port(flow(&flows, "tcp", port)),
        nat_port(flow(&flows, "udp", port)),
    );
    assert_ne!(tn, port);
    assert_ne!(un_nat, port);
    let tcp: BTreeSet<SocketAddr> = peers.tcp.iter().copied().collect();
    assert_eq!(
        tcp,
        BTreeSet::from([sa(node_ip(), port), sa(node_ip(), tn)]),
        "TCP peers seen by the server"
    );
    assert_eq!(
        peers.udp_sources(),
        BTreeSet::from([sa(node_ip(), port), sa(node_ip(), un_nat)]),
        "UDP sources seen by the server"
    );
    drop((from_node, from_pod));
    w.del(&a);
}

/// A node's own ping may take any identifier (ping sockets hand out all 65535):
/// one equal to a pod flow's NAT identifier, to the same destination, must still
/// get its own reply.
#[test]
fn a_node_ping_with_a_pod_flows_nat_identifier_gets_its_reply() {
    let w = World::new("10.96.7.0/24", "auto", &json!({}));
    let a = w.add("a", "masq-ping-a");
    Pinger::new(&a.pod.path)
        .unwrap()
        .ping(ext_ip(), ICMP_ID, 1, 3, Duration::from_secs(2))
        .unwrap();
    let nat_id = nat_port(flow(&w.flows_of(&a), "icmp", ICMP_ID));
    Pinger::new(&w.node.netns_path())
        .unwrap()
        .ping(ext_ip(), nat_id, 1, 3, Duration::from_secs(1))
        .unwrap();
}

/// Two pods with the same source port to the same server at the same time:
/// both work, with different NAT ports.
#[test]
fn two_pods_with_the_same_source_port_get_different_nat_ports() {
    let w = World::new("10.96.8.0/24", "auto", &json!({}));
    let a = w.add("a", "masq-same-a");
    let b = w.add("b", "masq-same-b");
    let server = w.server();
    let port = 40000;
    let sa_ = tcp_connect(&a.pod.path, Some(a.sock(port)), server.addr).unwrap();
    let sb = tcp_connect(&b.pod.path, Some(b.sock(port)), server.addr).unwrap();
    let t = thread::spawn(move || tcp_echo_on(&sa_, BYTES, 8).map(|()| sa_));
    tcp_echo_on(&sb, BYTES, 9).unwrap();
    let sa_ = t.join().unwrap().unwrap();
    let ua = udp_socket(&a.pod.path, a.sock(port)).unwrap();
    let ub = udp_socket(&b.pod.path, b.sock(port)).unwrap();
    for i in 0..10u8 {
        udp_echo_on(&ua, server.addr, &payload(80, i), 3, Duration::from_secs(2)).unwrap();
        udp_echo_on(&ub, server.addr, &payload(80, i), 3, Duration::from_secs(2)).unwrap();
    }
    // The same ICMP identifier from both pods.
    let (pa, pb) = (
        Pinger::new(&a.pod.path).unwrap(),
        Pinger::new(&b.pod.path).unwrap(),
    );
    for seq in 1..=3 {
        pa.ping(ext_ip(), ICMP_ID, seq, 3, Duration::from_secs(2))
            .unwrap();
        pb.ping(ext_ip(), ICMP_ID, seq, 3, Duration::from_secs(2))
            .unwrap();
    }
    let peers = server.peers();
    let (fa, fb) = (w.flows_of(&a), w.flows_of(&b));
    assert_ne!(
        nat_port(flow(&fa, "icmp", ICMP_ID)),
        nat_port(flow(&fb, "icmp", ICMP_ID)),
        "both pods' pings got the same NAT identifier"
    );
    for proto in ["tcp", "udp"] {
        let (na, nb) = (
            nat_port(flow(&fa, proto, port)),
            nat_port(flow(&fb, proto, port)),
        );
        assert_ne!(na, nb, "{proto}: both pods got NAT port {na}");
        let seen: BTreeSet<SocketAddr> = if proto == "tcp" {
            peers.tcp.iter().copied().collect()
        } else {
            peers.udp_sources()
        };
        assert_eq!(
            seen,
            BTreeSet::from([sa(node_ip(), na), sa(node_ip(), nb)]),
            "{proto} peers seen by the server"
        );
    }
    drop((sa_, sb));
    w.del(&a);
    w.del(&b);
}

/// With two NAT ports, two pods' flows to one destination take both; a third
/// is dropped (`drop_masq_no_port`) while a flow to another destination port
/// still gets one; once a port is freed (`nat flush`), the third gets it.
#[test]
fn a_two_port_range_serves_two_flows_per_destination() {
    let w = World::new(
        "10.96.9.0/24",
        "auto",
        &json!({"masqueradePorts": "62000-62001"}),
    );
    let pods: Vec<P> = ["a", "b", "c"]
        .iter()
        .map(|n| w.add(n, &format!("masq-two-{n}")))
        .collect();
    let server = w.server();
    let other = EchoServer::start(&w.ext.netns_path(), sa(ext_ip(), 0)).unwrap();
    let socks: Vec<UdpSocket> = pods
        .iter()
        .map(|p| udp_socket(&p.pod.path, p.sock(40000)).unwrap())
        .collect();
    let wait = Duration::from_secs(2);
    udp_echo_on(&socks[0], server.addr, b"a", 3, wait).unwrap();
    udp_echo_on(&socks[1], server.addr, b"b", 3, wait).unwrap();
    let c0 = w.counters();
    let third = udp_echo_on(&socks[2], server.addr, b"c", 1, Duration::from_millis(500));
    assert!(third.is_err(), "a third flow with two NAT ports: {third:?}");
    let d = w.counters().since(&c0);
    assert_eq!(d.get("drop_masq_no_port"), 1, "{d}");
    udp_echo_on(&socks[2], other.addr, b"c elsewhere", 3, wait).unwrap();
    let nat: BTreeSet<u16> = w
        .flows(&["--dst", EXT_IP])
        .iter()
        .filter(|f| f["dstPort"] == server.addr.port())
        .map(nat_port)
        .collect();
    assert_eq!(nat, BTreeSet::from([62000, 62001]));
    let out = w
        .node
        .sluicectl(&["nat", "flush", "--pod", &pods[0].ip.to_string()])
        .unwrap();
    assert!(out.success(), "{out}");
    udp_echo_on(&socks[2], server.addr, b"c", 3, wait).unwrap();
    let seen: BTreeSet<u16> = server.peers().udp.iter().map(SocketAddr::port).collect();
    assert_eq!(seen, BTreeSet::from([62000, 62001]));
    for p in &pods {
        w.del(p);
    }
}

/// The default NAT ports are those from 1024 up outside the node namespace's
/// `ip_local_port_range`; `masqueradePorts` replaces them at the next ADD.
#[test]
fn nat_ports_follow_the_node_port_range_or_the_config() {
    let w = World::new("10.96.10.0/24", "auto", &json!({}));
    sysctl(
        &w.node.netns_path(),
        "net.ipv4.ip_local_port_range",
        "30000 50000",
    )
    .unwrap();
    let a = w.add("a", "masq-range-a");
    let server = w.server();
    let ua = udp_socket(&a.pod.path, a.sock(0)).unwrap();
    udp_echo_on(&ua, server.addr, b"default", 3, Duration::from_secs(2)).unwrap();
    let n = server.peers().udp[0].port();
    assert!(
        (1024..=29999).contains(&n) || (50001..=65535).contains(&n),
        "NAT port {n} with node range 30000-50000"
    );

    let mut conf = w.conf.clone();
    conf["masqueradePorts"] = json!("20000-20999");
    let b = w.add_with(&conf, "b", "masq-range-b");
    let ub = udp_socket(&b.pod.path, b.sock(0)).unwrap();
    udp_echo_on(&ub, server.addr, b"configured", 3, Duration::from_secs(2)).unwrap();
    let n = server.peers().udp[1].port();
    assert!(
        (20000..=20999).contains(&n),
        "NAT port {n} with masqueradePorts 20000-20999"
    );
    del(&w.node, &conf, &b.cid, &b.pod);
    w.del(&a);
}

// --- 4. Expiry -------------------------------------------------------------------

/// With short timeouts, idle UDP, ICMP and closed TCP flows disappear within a
/// bounded wait (`nat_expired`), an open TCP connection's flow stays, and a later
/// datagram of the same UDP 5-tuple starts a new flow.
#[test]
fn idle_flows_expire_and_come_back_as_new_flows() {
    let w = World::new(
        "10.96.11.0/24",
        "auto",
        &json!({"natTimeouts": {"udp": 2, "tcpClosing": 2, "icmp": 2, "tcpSyn": 2}}),
    );
    let a = w.add("a", "masq-exp-a");
    let server = w.server();
    let wait = Duration::from_secs(2);
    let u = udp_socket(&a.pod.path, a.sock(40001)).unwrap();
    udp_echo_on(&u, server.addr, b"first", 3, wait).unwrap();
    Pinger::new(&a.pod.path)
        .unwrap()
        .ping(ext_ip(), ICMP_ID, 1, 3, wait)
        .unwrap();
    // A connection closed by both ends.
    let closed = tcp_connect(&a.pod.path, None, server.addr).unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    tcp_echo_on(&closed, 4096, 10).unwrap();
    closed.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    std::io::Read::read_to_end(&mut &closed, &mut rest).unwrap();
    drop(closed);
    // A connection left open (tcpEstablished: the default six hours).
    let open = tcp_connect(&a.pod.path, None, server.addr).unwrap();
    let open_port = open.local_addr().unwrap().port();
    tcp_echo_on(&open, 4096, 11).unwrap();

    let flows = w.flows_of(&a);
    assert_eq!(flows.len(), 4, "{flows:#?}");
    assert_eq!(flow(&flows, "tcp", closed_port)["state"], "closing");
    let open_nat = nat_port(flow(&flows, "tcp", open_port));
    if !kernel::has("sweeper") {
        // No sweeper (before 5.15): a flow expires when a packet meets it.
        thread::sleep(Duration::from_secs(3));
        let c1 = w.counters();
        udp_echo_on(&u, server.addr, b"again", 3, wait).unwrap();
        let d = w.counters().since(&c1);
        assert_eq!(d.get("nat_expired"), 1, "{d}");
        assert_eq!(d.get("masq_new_flow"), 1, "{d}");
        tcp_echo_on(&open, 4096, 12).unwrap();
        assert_eq!(nat_port(flow(&w.flows_of(&a), "tcp", open_port)), open_nat);
        drop(open);
        w.del(&a);
        return;
    }
    let c0 = w.counters();
    let started = Instant::now();
    let gone = wait_for(Duration::from_secs(15), || {
        let f = w.flows_of(&a);
        f.len() == 1 && f[0]["podPort"] == open_port
    });
    let flows = w.flows_of(&a);
    assert!(gone, "after {:?}: {flows:#?}", started.elapsed());
    eprintln!("idle flows went after {:?}", started.elapsed());
    let d = w.counters().since(&c0);
    assert_eq!(d.get("nat_expired"), 3, "{d}");
    assert_eq!(flows[0]["state"], "established", "{flows:#?}");

    // The open connection still works, on its NAT port.
    tcp_echo_on(&open, 4096, 12).unwrap();
    assert_eq!(nat_port(flow(&w.flows_of(&a), "tcp", open_port)), open_nat);
    // The same UDP 5-tuple again: a new flow.
    let c1 = w.counters();
    udp_echo_on(&u, server.addr, b"again", 3, wait).unwrap();
    let d = w.counters().since(&c1);
    assert_eq!(d.get("masq_new_flow"), 1, "{d}");
    let flows = w.flows_of(&a);
    assert_flow(
        flow(&flows, "udp", 40001),
        &a,
        server.addr,
        "udp",
        w.host_ifindex(&a),
    );
    drop(open);
    w.del(&a);
}

/// `sluice-node sweep`, the NAT sweep from process context: it takes the
/// lease (`sluicectl status`: `natSweep.by` is `agent`), an idle flow goes
/// within the same bounded wait as with the in-kernel sweeper, and the agent
/// removed it (its count grows, the datapath's `nat_expired` does not). On
/// SIGTERM it gives the lease back at once; killed with SIGKILL, its lease runs out.
/// Either way the in-kernel sweeper removes the next idle flow.
#[test]
fn the_node_agent_sweeps_idle_flows_and_hands_back_when_it_stops() {
    let w = World::new("10.96.14.0/24", "auto", &json!({"natTimeouts": {"udp": 2}}));
    let a = w.add("a", "masq-agent-a");
    let server = w.server();
    let wait = Duration::from_secs(2);
    let sweep = |w: &World| w.node.status().unwrap()["natSweep"].clone();
    let idle_flow_goes = |port: u16| {
        let u = udp_socket(&a.pod.path, a.sock(port)).unwrap();
        udp_echo_on(&u, server.addr, b"idle", 3, wait).unwrap();
        assert_eq!(w.flows_of(&a).len(), 1, "{:#?}", w.flows_of(&a));
        let started = Instant::now();
        let gone = wait_for(Duration::from_secs(15), || w.flows_of(&a).is_empty());
        assert!(gone, "after {:?}: {:#?}", started.elapsed(), w.flows_of(&a));
    };

    let mut agent = sweep_agent(&w.node).unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || sweep(&w)["by"] == "agent"),
        "{}",
        sweep(&w)
    );
    let (c0, n0) = (w.counters(), sweep(&w)["agentExpired"].as_u64().unwrap());
    idle_flow_goes(40001);
    let d = w.counters().since(&c0);
    assert_eq!(d.get("nat_expired"), 0, "the datapath expired it: {d}");
    assert_eq!(sweep(&w)["agentExpired"].as_u64().unwrap(), n0 + 1);
    let m = w.node.sluicectl(&["metrics"]).unwrap();
    assert!(m.success(), "{m}");
    for line in [
        "sluice_nat_sweep_by_agent 1".to_string(),
        format!("sluice_nat_agent_expired_total {}", n0 + 1),
    ] {
        assert!(
            m.stdout.lines().any(|l| l == line),
            "no {line:?} in\n{}",
            m.stdout
        );
    }

    // SIGTERM: the lease goes back at once.
    let pid = i32::try_from(agent.pid().unwrap()).unwrap();
    // SAFETY: a signal to our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let out = agent.wait(Duration::from_secs(10)).unwrap();
    assert!(out.success(), "{out}");
    assert!(out.stderr.contains("sweeping"), "{out}");
    let s = sweep(&w);
    assert_eq!(s["agentLeaseSeconds"], 0.0, "{s}");
    if !kernel::has("sweeper") {
        w.del(&a);
        return;
    }
    assert_eq!(s["by"], "kernel", "{s}");
    let c1 = w.counters();
    idle_flow_goes(40002);
    assert_eq!(w.counters().since(&c1).get("nat_expired"), 1);

    // SIGKILL: the lease runs out by itself.
    agent = sweep_agent(&w.node).unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || sweep(&w)["by"] == "agent"),
        "{}",
        sweep(&w)
    );
    agent.kill().unwrap();
    drop(agent);
    let c2 = w.counters();
    idle_flow_goes(40003);
    assert_eq!(w.counters().since(&c2).get("nat_expired"), 1);
    assert_eq!(sweep(&w)["by"], "kernel");
    w.del(&a);
}

// --- 5. ICMP errors: path MTU discovery, time exceeded -------------------------

fn set_int_opt(s: &impl AsRawFd, level: i32, name: i32, v: i32) {
    sockopt::set(
        s,
        level,
        name,
        &v,
        &format!("(level {level}, {name}) = {v}"),
    )
    .unwrap();
}

/// Takes the pending error of a socket (`SO_ERROR`).
fn so_error(s: &impl AsRawFd) -> i32 {
    let mut e: i32 = 0;
    sockopt::get(s, libc::SOL_SOCKET, libc::SO_ERROR, &mut e, "SO_ERROR").unwrap();
    e
}

/// Behind a router whose far link has a 1280 MTU, a pod with MTU 1500 sends a
/// multi-MB TCP echo: the router's "fragmentation needed" goes to the masquerade
/// address, is translated back into the pod (`masq_icmp_error`), whose TCP
/// lowers its path MTU, and the transfer completes. A DF datagram of another pod
/// gets the same; a datagram with TTL 2 dies at the router, whose "time
/// exceeded" reaches the pod too.
#[test]
fn icmp_errors_reach_the_pod_and_path_mtu_discovery_works() {
    let subnet = "10.96.12.0/24";
    let node = Node::new().unwrap();
    let routed = routed_external_host(&node, 1280).unwrap();
    sysctl(&routed.router.netns_path(), "net.ipv4.icmp_ratelimit", "0").unwrap();
    let mut conf = node.conf("1.0.0", subnet);
    conf["ipMasq"] = json!(true);
    conf["mtu"] = json!(1500);
    let pa = node.pod("a").unwrap();
    let added_a = add(&node, &conf, "masq-pmtu-a", &pa);
    let pb = node.pod("b").unwrap();
    let added_b = add(&node, &conf, "masq-pmtu-b", &pb);
    let far: Ipv4Addr = FAR_IP.parse().unwrap();
    let server = EchoServer::start(&routed.far.netns_path(), sa(far, 0)).unwrap();
    let snmp = |p: &Pod, k: &str| look::snmp(&p.path).unwrap()[k];

    // TCP.
    let c0 = node.counters().unwrap();
    let unreach0 = snmp(&pa, "Icmp.InDestUnreachs");
    let s = tcp_connect(&pa.path, None, server.addr).unwrap();
    tcp_echo_on(&s, 4 << 20, 13).unwrap();
    let mtu = path_mtu(&s).unwrap();
    let d = node.counters().unwrap().since(&c0);
    eprintln!("PMTU, TCP: path MTU {mtu}; {d}");
    assert_eq!(mtu, 1280, "the pod's path MTU to {far} ({d})");
    assert!(d.get("masq_icmp_error") >= 1, "{d}");
    assert!(
        snmp(&pa, "Icmp.InDestUnreachs") > unreach0,
        "no ICMP error reached the pod"
    );
    assert_eq!(server.peers().tcp[0].ip(), node_ip());
    drop(s);

    // A DF datagram from a pod that has not learnt the path MTU yet.
    let ip_b = ipv4_of(added_b.ip()).unwrap();
    let c1 = node.counters().unwrap();
    let u = udp_socket(&pb.path, sa(ip_b, 0)).unwrap();
    set_int_opt(
        &u,
        libc::IPPROTO_IP,
        libc::IP_MTU_DISCOVER,
        libc::IP_PMTUDISC_DO,
    );
    u.connect(server.addr).unwrap();
    u.send(&payload(1400, 1)).unwrap();
    let learnt = wait_for(Duration::from_secs(5), || {
        path_mtu(&u).is_ok_and(|m| m == 1280)
    });
    let d = node.counters().unwrap().since(&c1);
    assert!(
        learnt,
        "the pod's UDP socket did not learn the path MTU: {:?} ({d})",
        path_mtu(&u)
    );
    assert!(d.get("masq_icmp_error") >= 1, "{d}");
    // The error reached the very socket (its quoted ports were translated back):
    // a connected UDP socket holds it as its pending error.
    assert_eq!(so_error(&u), libc::EMSGSIZE, "the socket's pending error");
    let again = u.send(&payload(1400, 2));
    assert!(
        again
            .as_ref()
            .is_err_and(|e| e.raw_os_error() == Some(libc::EMSGSIZE)),
        "a second 1400-byte DF datagram: {again:?}"
    );
    u.send(&payload(1000, 3)).unwrap();

    // Time exceeded: TTL 2 leaves the node with 1 and dies at the router. The
    // quoted packet must be the pod's again: a connected UDP socket asking for
    // errors (IP_RECVERR) gets EHOSTUNREACH, a raw socket sees its identifier.
    let ip_a = ipv4_of(added_a.ip()).unwrap();
    let c2 = node.counters().unwrap();
    let exceeded0 = snmp(&pa, "Icmp.InTimeExcds");
    let t = udp_socket(&pa.path, sa(ip_a, 0)).unwrap();
    set_int_opt(&t, libc::IPPROTO_IP, libc::IP_TTL, 2);
    set_int_opt(&t, libc::IPPROTO_IP, libc::IP_RECVERR, 1);
    t.connect(server.addr).unwrap();
    t.send(b"short-lived").unwrap();
    let mut err = 0;
    let got = wait_for(Duration::from_secs(5), || {
        err = so_error(&t);
        err != 0
    });
    let d = node.counters().unwrap().since(&c2);
    assert!(got, "the UDP socket got no error ({d})");
    assert_eq!(err, libc::EHOSTUNREACH, "the UDP socket's error ({d})");
    let pinger = Pinger::new(&pa.path).unwrap();
    set_int_opt(&pinger, libc::IPPROTO_IP, libc::IP_TTL, 2);
    pinger.send(far, ICMP_ID, 7).unwrap();
    let quoted = pinger.recv_matching(Duration::from_secs(5), |p| {
        // Type 11; the quoted IPv4 header at 8, its ICMP echo after it.
        p.get(usize::from(p[0] & 0x0f) * 4..)
            .is_some_and(|icmp| icmp.len() >= 8 + 20 + 8 && icmp[0] == 11 && icmp[8 + 9] == 1)
    });
    let d = node.counters().unwrap().since(&c2);
    let Some(q) = quoted else {
        panic!("no time exceeded for the pod's echo request ({d})")
    };
    let icmp = &q[usize::from(q[0] & 0x0f) * 4..];
    let inner = &icmp[8..];
    let inner_l4 = &inner[usize::from(inner[0] & 0x0f) * 4..];
    assert_eq!(inner[12..16], ip_a.octets(), "quoted source");
    assert_eq!(inner_l4[4..6], ICMP_ID.to_be_bytes(), "quoted identifier");
    assert_eq!(d.get("masq_icmp_error"), 2, "{d}");
    assert_eq!(snmp(&pa, "Icmp.InTimeExcds") - exceeded0, 2, "{d}");

    del(&node, &conf, "masq-pmtu-a", &pa);
    del(&node, &conf, "masq-pmtu-b", &pb);
    drop(routed);
}

// --- 6. Many flows, a full table --------------------------------------------------

/// 500 UDP flows open at once from one pod: every one gets its answer and a NAT
/// port of its own.
#[test]
fn five_hundred_concurrent_udp_flows_get_distinct_nat_ports() {
    const FLOWS: usize = 500;
    let w = World::new("10.96.13.0/24", "auto", &json!({}));
    let a = w.add("a", "masq-many-a");
    let server = w.server();
    let bind = a.sock(0);
    let socks: Vec<UdpSocket> = in_netns(&a.pod.path, move || {
        (0..FLOWS)
            .map(|_| UdpSocket::bind(bind).map_err(sluice_tests::Error::from))
            .collect()
    })
    .unwrap();
    let c0 = w.counters();
    // All at once, then the answers.
    for (i, s) in socks.iter().enumerate() {
        s.send_to(&payload(32, i as u8), server.addr).unwrap();
    }
    let mut buf = [0u8; 64];
    for (i, s) in socks.iter().enumerate() {
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let answered = matches!(s.recv_from(&mut buf), Ok((32, from)) if from == server.addr && buf[..32] == payload(32, i as u8));
        if !answered {
            // Lost somewhere: the same flow again, a bounded number of times.
            udp_echo_on(
                s,
                server.addr,
                &payload(32, i as u8),
                3,
                Duration::from_secs(2),
            )
            .unwrap_or_else(|e| panic!("flow {i}: {e}"));
        }
    }
    let d = w.counters().since(&c0);
    eprintln!("{FLOWS} UDP flows: {d}");
    assert_eq!(d.get("masq_new_flow"), FLOWS as u64, "{d}");
    assert_no_drops(&d);
    let sources = server.peers().udp_sources();
    assert_eq!(sources.len(), FLOWS, "distinct sources seen by the server");
    assert!(sources
        .iter()
        .all(|s| s.ip() == node_ip() && is_nat_port(s.port())));
    let flows = w.flows(&["--proto", "udp"]);
    assert_eq!(flows.len(), FLOWS);
    let nat: BTreeSet<u16> = flows.iter().map(nat_port).collect();
    assert_eq!(nat.len(), FLOWS, "distinct NAT ports");
    let pod_ports: BTreeSet<u64> = flows.iter().filter_map(|f| f["podPort"].as_u64()).collect();
    assert_eq!(pod_ports.len(), FLOWS, "distinct pod ports");
    drop(socks);
    w.del(&a);
}

/// `bpftool map show pinned <pin root>/maps/<name>`: its `max_entries`.
fn max_entries(node: &Node, map: &str) -> u64 {
    let p = node.pin_root().join("maps").join(map);
    let out = exec::tool(
        None,
        "bpftool",
        &["map", "show", "pinned", &p.display().to_string(), "-j"],
    )
    .unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    v["max_entries"].as_u64().unwrap()
}

/// How many entries the pinned map `map` holds (`bpftool map dump`).
fn map_entries(node: &Node, map: &str) -> usize {
    let p = node.pin_root().join("maps").join(map);
    let out = exec::tool(
        None,
        "bpftool",
        &["map", "dump", "pinned", &p.display().to_string(), "-j"],
    )
    .unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    v.as_array().map_or(0, Vec::len)
}

// --- 7. DEL, nat flush, config errors ----------------------------------------------

/// Flows of one pod: a UDP echo, a ping and a TCP echo (connection left open).
fn make_flows(w: &World, p: &P, server: &EchoServer) -> (UdpSocket, std::net::TcpStream) {
    let u = udp_socket(&p.pod.path, p.sock(0)).unwrap();
    udp_echo_on(&u, server.addr, b"flow", 3, Duration::from_secs(2)).unwrap();
    Pinger::new(&p.pod.path)
        .unwrap()
        .ping(ext_ip(), ICMP_ID, 1, 3, Duration::from_secs(2))
        .unwrap();
    let t = tcp_connect(&p.pod.path, None, server.addr).unwrap();
    tcp_echo_on(&t, 4096, 14).unwrap();
    assert_eq!(w.flows_of(p).len(), 3, "{:#?}", w.flows_of(p));
    (u, t)
}

#[track_caller]
fn flush(w: &World, args: &[&str], expect: &str) {
    let mut all = vec!["nat", "flush"];
    all.extend_from_slice(args);
    let out = w.node.sluicectl(&all).unwrap();
    assert!(out.success(), "{out}");
    assert_eq!(out.stdout.trim(), expect, "{out}");
}

#[test]
fn del_and_nat_flush_remove_flows() {
    let w = World::new("10.96.15.0/24", "auto", &json!({}));
    let server = w.server();
    let pods: Vec<P> = ["a", "b", "c"]
        .iter()
        .map(|n| w.add(n, &format!("masq-flush-{n}")))
        .collect();
    let keep: Vec<_> = pods.iter().map(|p| make_flows(&w, p, &server)).collect();
    let (a, b, c) = (&pods[0], &pods[1], &pods[2]);

    // DEL takes the pod's flows, only those.
    w.del(a);
    assert!(w.flows(&[]).iter().all(|f| f["podIp"] != a.ip.to_string()));
    assert_eq!(w.flows(&[]).len(), 6);

    // By address, by container id prefix.
    let b_ip = b.ip.to_string();
    flush(
        &w,
        &["--pod", &b_ip],
        &format!("deleted 3 masqueraded flows of {b_ip}"),
    );
    assert!(w.flows_of(b).is_empty());
    assert_eq!(w.flows_of(c).len(), 3);
    flush(
        &w,
        &["--pod", "masq-flush-c"],
        "deleted 3 masqueraded flows of masq-flush-c",
    );
    assert!(w.flows(&[]).is_empty(), "{:#?}", w.flows(&[]));

    // A flushed flow's next datagram starts a new flow; --all takes everything.
    let (ub, _) = &keep[1];
    let c0 = w.counters();
    udp_echo_on(ub, server.addr, b"again", 3, Duration::from_secs(2)).unwrap();
    assert_eq!(w.counters().since(&c0).get("masq_new_flow"), 1);
    Pinger::new(&c.pod.path)
        .unwrap()
        .ping(ext_ip(), ICMP_ID, 2, 3, Duration::from_secs(2))
        .unwrap();
    assert_eq!(w.flows(&[]).len(), 2);
    flush(&w, &["--all"], "deleted 2 masqueraded flows");
    assert!(w.flows(&[]).is_empty());
    flush(&w, &["--all"], "deleted 0 masqueraded flows");

    // Misuse.
    let out = w.node.sluicectl(&["nat", "flush"]).unwrap();
    assert!(!out.success(), "flush without --pod or --all: {out}");
    let out = w
        .node
        .sluicectl(&["nat", "flush", "--pod", "no-such-pod"])
        .unwrap();
    assert!(!out.success(), "{out}");
    assert!(out.stderr.contains("no-such-pod"), "{out}");
    drop(keep);
    w.del(b);
    w.del(c);
    w.node.assert_clean(NETWORK);
}

/// Bad masquerade settings: refused with the right code and the key named, and
/// nothing left behind.
#[test]
fn bad_masquerade_settings_are_refused() {
    let w = World::new("10.96.16.0/24", "auto", &json!({}));
    let pod = w.node.pod("a").unwrap();
    let cases: Vec<(Value, u64, Vec<&str>)> = vec![
        (
            json!({"masqueradePorts": "60000-62000"}),
            7,
            vec!["masqueradePorts", "60000-62000"],
        ),
        (
            json!({"masqueradePorts": "32768-32768"}),
            7,
            vec!["masqueradePorts"],
        ),
        (
            json!({"nonMasqueradeCIDRs": ["10.0.0.0/8", "fd00::/129"]}),
            7,
            vec!["nonMasqueradeCIDRs[1]", "fd00::/129"],
        ),
        (json!({"natMaxFlows": 100}), 7, vec!["natMaxFlows"]),
        (
            json!({"natTimeouts": {"udp": 0}}),
            7,
            vec!["natTimeouts.udp"],
        ),
        (
            json!({"masqueradeAddress": ["fd00::1", "fd00::2"]}),
            7,
            vec!["masqueradeAddress[1]", "fd00::2"],
        ),
        (
            json!({"masqueradeAddress": "node"}),
            7,
            vec!["masqueradeAddress", "node"],
        ),
    ];
    for (extra, code, words) in cases {
        let mut conf = w.conf.clone();
        merge_keys(&mut conf, &extra);
        let out = w
            .node
            .cni("ADD", &conf, "masq-bad", "eth0", Some(&pod), &[])
            .unwrap();
        eprintln!("{extra}: {}", out.out.stdout.trim());
        out.error(code).assert_names(&words);
        w.node.assert_clean(NETWORK);
    }
    // The node's own range 1500-65000 leaves too few ports from 1024 up outside
    // it (476 below, 535 above).
    sysctl(
        &w.node.netns_path(),
        "net.ipv4.ip_local_port_range",
        "1500 65000",
    )
    .unwrap();
    let out = w
        .node
        .cni("ADD", &w.conf, "masq-bad", "eth0", Some(&pod), &[])
        .unwrap();
    out.error(7)
        .assert_names(&["masqueradePorts", "1500-65000"]);
    w.node.assert_clean(NETWORK);
    // A range below the node's is fine.
    let mut conf = w.conf.clone();
    conf["masqueradePorts"] = json!("1024-1499");
    add(&w.node, &conf, "masq-bad", &pod);
    del(&w.node, &conf, "masq-bad", &pod);
}

/// `ipMasq: false` at a later ADD turns masquerade off on the node: pod traffic
/// leaves untranslated, and the flows there were go (the sweeper), both
/// directions, leaving nothing in the NAT maps.
#[test]
fn turning_masquerade_off_stops_it_and_leaves_no_flows() {
    let w = World::new("10.96.25.0/24", "auto", &json!({}));
    let a = w.add("a", "masq-off-a");
    let server = w.server();
    let keep = make_flows(&w, &a, &server);
    let mut off = w.conf.clone();
    off["ipMasq"] = json!(false);
    let b = w.add_with(&off, "b", "masq-off-b");
    let from_pod = Capture::start(
        &w.ext.netns_path(),
        EXT_IF,
        1,
        Duration::from_secs(5),
        Box::new(move |f| ipv4_addrs(f).is_some_and(|(s, _)| s == a.ip)),
    )
    .unwrap();
    let r = udp_echo_on(&keep.0, server.addr, b"off", 1, Duration::from_millis(300));
    assert!(r.is_err(), "masquerade off, no route back: {r:?}");
    assert_eq!(from_pod.finish().unwrap().len(), 1, "untranslated datagram");
    let gone = wait_for(Duration::from_secs(10), || w.flows(&[]).is_empty());
    assert!(gone, "{:#?}", w.flows(&[]));
    let rev = map_entries(&w.node, "sl_nat_rev");
    assert_eq!(rev, 0, "reverse entries left in sl_nat_rev");
    drop(keep);
    del(&w.node, &off, &b.cid, &b.pod);
    w.del(&a);
}

/// Flows live in pinned maps: a datapath upgrade (`sluice datapath reload` of
/// another object) and a later ADD with another `natMaxFlows` keep them, and the
/// maps' size; a TCP stream through masquerade goes on across both.
#[test]
fn flows_survive_a_datapath_upgrade() {
    let w = World::new("10.96.26.0/24", "auto", &json!({"natMaxFlows": 2048}));
    let a = w.add("a", "masq-upg-a");
    let server = w.server();
    let u = udp_socket(&a.pod.path, a.sock(0)).unwrap();
    udp_echo_on(&u, server.addr, b"before", 3, Duration::from_secs(2)).unwrap();
    let stream = Stream::start(
        &w.ext.netns_path(),
        sa(ext_ip(), 0),
        &a.pod.path,
        IpAddr::V4(ext_ip()),
    )
    .unwrap();
    stream
        .wait_received(1 << 20, Duration::from_secs(20))
        .unwrap();
    let before: BTreeSet<(String, u64)> = w
        .flows(&[])
        .iter()
        .map(|f| (f["proto"].to_string(), f["natPort"].as_u64().unwrap()))
        .collect();
    assert_eq!(before.len(), 2, "{before:?}");

    let root = w.node.pin_root().display().to_string();
    let out = w
        .node
        .run(
            &sluice_next_bin().unwrap(),
            &["datapath", "reload", "--pin-root", &root],
        )
        .unwrap();
    assert!(out.success(), "reload: {out}");
    let at = stream.received();
    stream
        .wait_received(at + (1 << 20), Duration::from_secs(20))
        .unwrap();
    let c0 = w.counters();
    udp_echo_on(&u, server.addr, b"after", 3, Duration::from_secs(2)).unwrap();
    assert_eq!(w.counters().since(&c0).get("masq_new_flow"), 0);

    let mut bigger = w.conf.clone();
    bigger["natMaxFlows"] = json!(4096);
    let b = w.add_with(&bigger, "b", "masq-upg-b");
    let at = stream.received();
    stream
        .wait_received(at + (1 << 20), Duration::from_secs(20))
        .unwrap();
    let report = stream.finish().unwrap();
    eprintln!("stream across the upgrade and back: {report:?}");
    for m in ["sl_nat_fwd", "sl_nat_rev"] {
        assert_eq!(max_entries(&w.node, m), 2048, "{m}");
    }
    // The Service flow tables: two entries a flow, natMaxFlows flows.
    for m in ["sl_lb_ct", "sl_lb_ct6"] {
        assert_eq!(max_entries(&w.node, m), 4096, "{m}");
    }
    let after: BTreeSet<(String, u64)> = w
        .flows(&[])
        .iter()
        .map(|f| (f["proto"].to_string(), f["natPort"].as_u64().unwrap()))
        .collect();
    assert!(
        after.is_superset(&before),
        "before {before:?}, after {after:?}"
    );
    let ub = udp_socket(&b.pod.path, b.sock(0)).unwrap();
    udp_echo_on(&ub, server.addr, b"b", 3, Duration::from_secs(2)).unwrap();
    assert_eq!(server.peers().udp.last().unwrap().ip(), node_ip());
    del(&w.node, &bigger, &b.cid, &b.pod);
    w.del(&a);
}

// --- 8. Fragments and port-less protocols --------------------------------------------

/// A datagram bigger than the MTU, both ways: the pod's kernel fragments the
/// 3000-byte request (DF off), the external host's kernel the 3000-byte echo.
/// Every fragment is translated (the first by its ports, the later ones like
/// their first) and the whole datagram arrives, at the server from the node's
/// address and back in the pod.
#[test]
fn fragmented_datagrams_are_translated_both_ways() {
    let w = World::new("10.96.17.0/24", "auto", &json!({}));
    let a = w.add("a", "masq-frag-a");
    let server = w.server();
    let c0 = w.counters();
    let u = udp_socket(&a.pod.path, a.sock(0)).unwrap();
    set_int_opt(
        &u,
        libc::IPPROTO_IP,
        libc::IP_MTU_DISCOVER,
        libc::IP_PMTUDISC_DONT,
    );
    let big = payload(3000, 7);
    let r = udp_echo_on(&u, server.addr, &big, 3, Duration::from_secs(2));
    let d = w.counters().since(&c0);
    assert!(r.is_ok(), "{r:?}: {d}");
    let peers = server.peers();
    assert_eq!(peers.udp_sources().len(), 1, "{peers:?}");
    assert!(
        peers.udp_sources().iter().all(|s| s.ip() == node_ip()),
        "{peers:?}"
    );
    // 3 fragments each way per try (1500-byte MTU).
    assert!(d.get("masq_fragment") >= 4, "{d}");
    assert_eq!(d.get("drop_masq_fragment"), 0, "{d}");
    let frags = map_entries(&w.node, "sl_nat_frag");
    assert!(frags >= 2, "{frags} fragment entries");
    w.del(&a);
    assert_eq!(
        map_entries(&w.node, "sl_nat_frag"),
        0,
        "DEL leaves fragment entries"
    );
}

/// A later fragment whose first was never seen (it cannot be matched to a flow),
/// protocols without ports and a truncated UDP header, from a pod to an external
/// address: all dropped on the uplink and counted; nothing reaches the external
/// host, with the pod's address or any other.
#[test]
fn stray_fragments_and_portless_protocols_never_leave() {
    let w = World::new("10.96.28.0/24", "auto", &json!({}));
    let a = w.add("a", "masq-stray-a");
    let server = w.server();
    let from_node = capture_from(&w.ext, node_ip());
    let from_pod = capture_from(&w.ext, a.ip);

    // Hand-made: a later fragment, GRE, an ICMP timestamp request, a UDP
    // header cut after 2 bytes.
    let dst = ext_ip();
    let ip = |proto: u8, frag: u16, payload: Vec<u8>| {
        let mut p = Ipv4::new(a.ip, dst, payload);
        p.proto = proto;
        p.frag = frag;
        p.build()
    };
    let mut timestamp = vec![13, 0, 0, 0, 0x12, 0x34, 0, 1];
    timestamp.extend_from_slice(&[0; 12]);
    let c = sluice_tests::raw::checksum(&timestamp);
    timestamp[2..4].copy_from_slice(&c.to_be_bytes());
    let packets = [
        ("stray later fragment", ip(17, 9, vec![2; 64])),
        ("GRE", ip(47, 0, vec![0; 24])),
        ("ICMP timestamp", ip(1, 0, timestamp)),
        ("truncated UDP", ip(17, 0, vec![0x9c, 0x40])),
    ];
    let (host_mac, pod_mac) = (
        parse_mac(&a.added.host_mac).unwrap(),
        parse_mac(&a.added.pod_mac).unwrap(),
    );
    let c1 = w.counters();
    for (what, p) in packets {
        let before = w.counters();
        send_frames(
            &a.pod.path,
            "eth0",
            vec![ethernet(host_mac, pod_mac, 0x0800, &p)],
        )
        .unwrap();
        eprintln!("{what}: {}", w.counters().since(&before));
    }
    let d = w.counters().since(&c1);
    assert_eq!(d.get("drop_masq_fragment"), 1, "{d}");
    assert_eq!(d.get("drop_masq_proto"), 2, "{d}");
    assert_eq!(d.get("drop_masq_malformed"), 1, "{d}");
    assert_eq!(d.get("masq_snat"), 0, "{d}");

    // Nothing arrived, translated or not.
    thread::sleep(Duration::from_millis(300));
    let (n, p) = (from_node.stop().unwrap(), from_pod.stop().unwrap());
    assert!(
        p.is_empty(),
        "{} frames left with the pod's address",
        p.len()
    );
    assert!(
        n.is_empty(),
        "{} frames left with the node's address",
        n.len()
    );
    assert!(server.peers().udp.is_empty(), "{:?}", server.peers());
    assert!(w.flows(&[]).is_empty(), "{:#?}", w.flows(&[]));
    w.del(&a);
}

/// A reply bigger than the path MTU arrives in fragments (a large UDP answer to
/// a small request, as DNS over UDP with EDNS): it must reach the pod, as it
/// does through conntrack-based masquerade, which reassembles first.
#[test]
fn a_fragmented_reply_reaches_the_pod() {
    let w = World::new("10.96.27.0/24", "auto", &json!({}));
    let a = w.add("a", "masq-fragin-a");
    let ext = udp_socket(&w.ext.netns_path(), sa(ext_ip(), 0)).unwrap();
    let to = ext.local_addr().unwrap();
    let u = udp_socket(&a.pod.path, a.sock(0)).unwrap();
    u.send_to(b"a small question", to).unwrap();
    ext.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut buf = vec![0u8; 65536];
    let (_, from) = ext.recv_from(&mut buf).unwrap();
    assert_eq!(from.ip(), node_ip());
    let c0 = w.counters();
    let unreach = || look::snmp(&w.node.netns_path()).unwrap()["Icmp.OutDestUnreachs"];
    let unreach0 = unreach();
    let big = payload(3000, 42);
    ext.send_to(&big, from).unwrap();
    u.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let got = u.recv_from(&mut buf);
    let d = w.counters().since(&c0);
    let node_unreach = unreach() - unreach0;
    assert!(
        matches!(got, Ok((3000, f)) if f == to && buf[..3000] == big[..]),
        "the pod got {got:?} ({d}; the node sent {node_unreach} ICMP unreachables)"
    );
    w.del(&a);
}

/// `masqueradeAddress` given: flows leave with it (the uplink has it as a second
/// address, so the replies come back to the node).
#[test]
fn a_configured_masquerade_address_is_used() {
    let extra: Ipv4Addr = "192.168.50.9".parse().unwrap();
    let w = World::new(
        "10.96.18.0/24",
        "auto",
        &json!({"masqueradeAddress": extra.to_string()}),
    );
    host::ip(
        w.node.name(),
        &["addr", "add", &format!("{extra}/24"), "dev", UPLINK],
    )
    .unwrap();
    let a = w.add("a", "masq-addr-a");
    let server = w.server();
    let s = tcp_connect(&a.pod.path, None, server.addr).unwrap();
    tcp_echo_on(&s, BYTES, 15).unwrap();
    let u = udp_socket(&a.pod.path, a.sock(0)).unwrap();
    udp_echo_on(&u, server.addr, b"addr", 3, Duration::from_secs(2)).unwrap();
    let peers = server.peers();
    assert_eq!(peers.tcp[0].ip(), IpAddr::V4(extra));
    assert_eq!(peers.udp[0].ip(), IpAddr::V4(extra));
    assert!(w.flows(&[]).iter().all(|f| f["natIp"] == extra.to_string()));
    drop(s);
    w.del(&a);
}
