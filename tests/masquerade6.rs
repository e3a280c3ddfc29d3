//! IPv6 masquerade with real traffic on dual-stack namespaces: a node whose
//! uplink has an IPv4 and a global IPv6 address, wired to an external host with
//! no route to the pods. TCP, UDP and ICMPv6 echo from a dual-stack pod leave
//! with the node's IPv6 address and a NAT port and come back; what is inside
//! `nonMasqueradeCIDRs` keeps the pod's address; connections from outside to a
//! routed pod address are answered from it; a packet with a fragment header
//! never leaves with the pod's address, one with a destination options header
//! is translated; a router's Packet Too Big reaches the pod (path MTU discovery
//! through a 1280-byte hop); two pods with the same source port to the same
//! server get distinct NAT ports, and `sluicectl monitor` shows their new flows
//! with the node's IPv6 address; a node's ping with a pod flow's NAT
//! identifier gets its own reply; idle flows expire (`nat_expired`) and come
//! back as new flows while an open connection's flow stays; DEL leaves no flow
//! behind.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use std::{
    collections::BTreeSet,
    io::{Read, Write},
    net::{IpAddr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use sluice_tests::{
    ctl::{wait_lease, CtlChild},
    fixtures::{add, del, merge_keys, EXT_IF, UPLINK},
    host, kernel, look,
    masq::{
        in_netns, masq_external_host, nat_list, path_mtu6, payload, routed_external_host6,
        set_dstopts, sweep_agent, tcp_connect, tcp_echo_on, udp_echo_on, udp_socket, wait_for,
        EchoServer, Pinger6, FAR6_IP, NODE6_ROUTED, ROUTER6_IP,
    },
    Host, Node, Pod, NETWORK,
};

/// The uplink's IPv6 subnet: the node is `::1`, the external host `::2`.
const NODE_IP6: &str = "fd00:5a::1";
const EXT_IP6: &str = "fd00:5a::2";
/// The pods' IPv6 range.
const PODS6: &str = "fd00:7a::/64";
const BYTES: usize = 128 << 10;
const ICMP_ID: u16 = 0x6a6a;
/// Longest wait for a `--count` monitor to end once its events were made.
const MONITOR_END: Duration = Duration::from_secs(10);

fn ext6() -> Ipv6Addr {
    EXT_IP6.parse().unwrap()
}

fn node6() -> Ipv6Addr {
    NODE_IP6.parse().unwrap()
}

/// A dual-stack node with masquerade on, wired to an external host that has no
/// route to the pods (IPv4 and IPv6).
struct World {
    node: Node,
    ext: Host,
    conf: Value,
}

/// A dual-stack pod `ADDed` to a [`World`].
struct P {
    pod: Pod,
    cid: String,
    ip6: Ipv6Addr,
    host_veth: String,
}

impl P {
    fn sock(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.ip6.into(), port)
    }
}

impl World {
    fn new(extra: &Value) -> Self {
        let node = Node::new().unwrap();
        let ext = masq_external_host(&node).unwrap();
        host::ip(
            node.name(),
            &[
                "addr",
                "add",
                &format!("{NODE_IP6}/64"),
                "dev",
                UPLINK,
                "nodad",
            ],
        )
        .unwrap();
        ext.ip(&[
            "addr",
            "add",
            &format!("{EXT_IP6}/64"),
            "dev",
            EXT_IF,
            "nodad",
        ])
        .unwrap();
        host::ip(
            node.name(),
            &["-6", "route", "add", "default", "via", EXT_IP6],
        )
        .unwrap();
        let mut conf = node.conf("1.1.0", "unused");
        conf["ipam"] = json!({
            "type": "sluice",
            "ranges": [[{"subnet": "10.78.0.0/24"}], [{"subnet": PODS6}]],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
            "dataDir": node.ipam_dir(),
        });
        conf["ipMasq"] = json!(true);
        conf["uplink"] = json!(UPLINK);
        merge_keys(&mut conf, extra);
        Self { node, ext, conf }
    }

    fn add(&self, name: &str, cid: &str) -> P {
        let pod = self.node.pod(name).unwrap();
        let added = add(&self.node, &self.conf, cid, &pod);
        let ip6 = added
            .ips
            .iter()
            .find_map(|(ip, _)| match ip {
                IpAddr::V6(v6) => Some(*v6),
                IpAddr::V4(_) => None,
            })
            .unwrap_or_else(|| panic!("no IPv6 address: {:#}", added.result));
        P {
            pod,
            cid: cid.to_string(),
            ip6,
            host_veth: added.host_veth,
        }
    }

    /// [`Self::add`] where the kernel has IPv6 masquerade; elsewhere the
    /// routed fallback is checked with the pod instead, everything removed,
    /// and `None` returned (the test has nothing more to check there).
    fn add_masq6(&self, name: &str, cid: &str) -> Option<P> {
        let p = self.add(name, cid);
        if masq6_kernel() {
            return Some(p);
        }
        assert_routed_fallback(self, &p);
        self.del(&p);
        self.node.assert_clean(NETWORK);
        None
    }

    fn del(&self, p: &P) {
        del(&self.node, &self.conf, &p.cid, &p.pod);
    }

    fn server(&self) -> EchoServer {
        EchoServer::start(&self.ext.netns_path(), SocketAddr::new(ext6().into(), 0)).unwrap()
    }

    fn flows(&self, filters: &[&str]) -> Vec<Value> {
        nat_list(&self.node, filters).unwrap()
    }

    fn flows_of(&self, p: &P) -> Vec<Value> {
        self.flows(&["--pod", &p.ip6.to_string()])
    }

    fn host_ifindex(&self, p: &P) -> u64 {
        look::ifindex(self.node.name(), &p.host_veth).unwrap()
    }
}

/// A TCP connection from the pod to `to` (IPv6), made inside the pod.
fn tcp6(p: &P, to: SocketAddr) -> TcpStream {
    tcp_connect(&p.pod.path, None, to).unwrap()
}

#[track_caller]
fn flow<'a>(flows: &'a [Value], proto: &str) -> &'a Value {
    let m: Vec<&Value> = flows.iter().filter(|f| f["proto"] == proto).collect();
    assert_eq!(m.len(), 1, "{proto} flows: {flows:#?}");
    m[0]
}

/// The flow of `proto` from `pod_port`; panics without exactly one.
#[track_caller]
fn flow_from<'a>(flows: &'a [Value], proto: &str, pod_port: u16) -> &'a Value {
    let m: Vec<&Value> = flows
        .iter()
        .filter(|f| f["proto"] == proto && f["podPort"] == pod_port)
        .collect();
    assert_eq!(m.len(), 1, "{proto} flows from {pod_port}: {flows:#?}");
    m[0]
}

#[track_caller]
fn nat_port(f: &Value) -> u16 {
    f["natPort"]
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .unwrap_or_else(|| panic!("no natPort in {f}"))
}

/// IPv6 masquerade needs the kernels with the NAT sweeper (5.15); before,
/// IPv6 stays routed (README, "Masquerade").
fn masq6_kernel() -> bool {
    kernel::has("sweeper")
}

/// On a kernel without IPv6 masquerade: STATUS says it is off, and the pod's
/// IPv6 traffic is routed with its own address (the external host, given a
/// route to the pods, sees it), no flow tracked.
fn assert_routed_fallback(w: &World, p: &P) {
    let st = w.node.status().unwrap();
    assert_eq!(st["masquerade"]["ipv6"]["enabled"], false, "{st:#}");
    w.ext
        .ip(&["-6", "route", "replace", PODS6, "via", NODE_IP6])
        .unwrap();
    let server = w.server();
    let tcp = tcp6(p, server.addr);
    tcp_echo_on(&tcp, 4096, 1).unwrap();
    assert_eq!(server.peers().tcp[0].ip(), IpAddr::V6(p.ip6));
    assert!(w.flows(&[]).is_empty(), "{:#?}", w.flows(&[]));
    eprintln!("this kernel has no NAT sweeper: IPv6 is routed, not masqueraded (checked)");
}

fn is_nat_port(p: u16) -> bool {
    (1024..=32767).contains(&p) || (61000..=65535).contains(&p)
}

#[test]
fn ipv6_tcp_udp_and_echo_leave_with_the_node_ipv6_address() {
    let w = World::new(&json!({}));
    let Some(a) = w.add_masq6("m6", "masq6-echo") else {
        return;
    };
    let st = w.node.status().unwrap();
    assert_eq!(st["masquerade"]["ipv6"]["enabled"], true, "{st:#}");
    assert_eq!(st["masquerade"]["ipv6"]["address"], NODE_IP6, "{st:#}");
    let server = w.server();
    let c0 = w.node.counters().unwrap();

    let tcp = tcp6(&a, server.addr);
    let tcp_port = tcp.local_addr().unwrap().port();
    tcp_echo_on(&tcp, BYTES, 3).unwrap();
    let u = udp_socket(&a.pod.path, SocketAddr::new(a.ip6.into(), 0)).unwrap();
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
    let pinger = Pinger6::new(&a.pod.path).unwrap();
    for seq in 1..=3 {
        pinger
            .ping(ext6(), ICMP_ID, seq, 3, Duration::from_secs(2))
            .unwrap();
    }
    let d = w.node.counters().unwrap().since(&c0);
    eprintln!("IPv6 masquerade: {d}");

    // The external host saw the node's IPv6 address and NAT ports.
    let peers = server.peers();
    assert_eq!(peers.tcp.len(), 1, "{peers:?}");
    assert_eq!(peers.tcp[0].ip(), IpAddr::V6(node6()), "{peers:?}");
    assert!(is_nat_port(peers.tcp[0].port()), "{peers:?}");
    let udp = peers.udp_sources();
    assert_eq!(udp.len(), 1, "{udp:?}");
    let udp_peer = *udp.iter().next().unwrap();
    assert_eq!(udp_peer.ip(), IpAddr::V6(node6()));
    assert!(d.get("masq_snat") > 0 && d.get("masq_dnat") > 0, "{d}");

    // The flows, as sluicectl shows them.
    let flows = w.flows(&["--pod", &a.ip6.to_string()]);
    assert_eq!(flows.len(), 3, "{flows:#?}");
    let t = flow(&flows, "tcp");
    assert_eq!(t["podIp"], a.ip6.to_string());
    assert_eq!(t["podPort"], tcp_port);
    assert_eq!(t["natIp"], NODE_IP6);
    assert_eq!(t["natPort"], peers.tcp[0].port());
    assert_eq!(t["dstIp"], EXT_IP6);
    assert_eq!(t["state"], "established");
    assert_eq!(t["origin"], "pod");
    assert_eq!(flow(&flows, "udp")["natPort"], udp_peer.port());
    let i = flow(&flows, "icmpv6");
    assert_eq!(i["podPort"], ICMP_ID);
    assert_eq!(w.flows(&["--dst", EXT_IP6]).len(), 3);
    assert_eq!(w.flows(&["--proto", "icmpv6"]).len(), 1);
    let table = w.node.sluicectl(&["nat", "list"]).unwrap();
    assert!(
        table.stdout.contains(&format!("[{}]:{tcp_port}", a.ip6)),
        "{table}"
    );

    // IPv4 still masquerades beside it (the same pod, the same server host).
    let v4 = EchoServer::start(
        &w.ext.netns_path(),
        SocketAddr::new(sluice_tests::fixtures::EXT_IP.parse().unwrap(), 0),
    )
    .unwrap();
    let s4 = sluice_tests::masq::tcp_connect(&a.pod.path, None, v4.addr).unwrap();
    tcp_echo_on(&s4, 4096, 5).unwrap();
    assert_eq!(
        v4.peers().tcp[0].ip().to_string(),
        sluice_tests::fixtures::NODE_IP
    );
    drop((tcp, u, s4));

    // DEL forgets the pod's flows of both families.
    w.del(&a);
    assert!(w.flows(&[]).is_empty(), "{:#?}", w.flows(&[]));
    w.node.assert_clean(NETWORK);
}

#[test]
fn ipv6_inside_non_masquerade_cidrs_keeps_the_pod_address() {
    // The external host's subnet is "inside": it must route the pods itself.
    let w = World::new(&json!({"nonMasqueradeCIDRs": ["fd00:5a::/64"]}));
    w.ext
        .ip(&["-6", "route", "add", PODS6, "via", NODE_IP6])
        .unwrap();
    let a = w.add("n6", "masq6-nonmasq");
    let server = w.server();
    let tcp = tcp6(&a, server.addr);
    tcp_echo_on(&tcp, 4096, 7).unwrap();
    assert_eq!(server.peers().tcp[0].ip(), IpAddr::V6(a.ip6));
    // The list named no IPv4 prefix: IPv4 keeps its default (the pod range),
    // so nothing IPv6 and nothing in the pod range is tracked.
    assert!(w.flows(&[]).is_empty(), "{:#?}", w.flows(&[]));
    drop(tcp);
    w.del(&a);
    w.node.assert_clean(NETWORK);
}

#[test]
fn an_ipv6_connection_from_outside_is_answered_from_the_pod_address() {
    let w = World::new(&json!({}));
    w.ext
        .ip(&["-6", "route", "add", PODS6, "via", NODE_IP6])
        .unwrap();
    let Some(a) = w.add_masq6("i6", "masq6-inbound") else {
        return;
    };
    let bind = SocketAddr::new(a.ip6.into(), 0);
    let listener = in_netns(&a.pod.path, move || Ok(TcpListener::bind(bind)?)).unwrap();
    let at = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, peer) = listener.accept().unwrap();
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).unwrap();
        s.write_all(&buf).unwrap();
        peer
    });
    let mut c = in_netns(&w.ext.netns_path(), move || {
        Ok(TcpStream::connect_timeout(&at, Duration::from_secs(5))?)
    })
    .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"hello").unwrap();
    let mut back = [0u8; 5];
    c.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"hello");
    assert_eq!(server.join().unwrap().ip(), IpAddr::V6(ext6()));
    let flows = w.flows(&[]);
    let t = flow(&flows, "tcp");
    assert_eq!(t["origin"], "outside", "{flows:#?}");
    assert_eq!(t["podIp"], a.ip6.to_string());
    drop(c);
    w.del(&a);
    w.node.assert_clean(NETWORK);
}

#[test]
fn an_ipv6_fragment_from_a_pod_never_leaves_with_its_address() {
    let w = World::new(&json!({}));
    let Some(a) = w.add_masq6("f6", "masq6-frag") else {
        return;
    };
    let server = w.server();
    // A UDP datagram larger than the path (the pod's MTU) leaves fragmented:
    // the kernel adds a fragment header, which masquerade cannot translate.
    let u: UdpSocket = udp_socket(&a.pod.path, SocketAddr::new(a.ip6.into(), 0)).unwrap();
    // One small datagram first: the neighbours are resolved and the flow is
    // open, so the fragments meet the datapath's redirect, not a queue.
    udp_echo_on(&u, server.addr, &payload(64, 1), 3, Duration::from_secs(2)).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let before = server.peers().udp.len();
    let c0 = w.node.counters().unwrap();
    u.send_to(&payload(3000, 9), server.addr).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let d = w.node.counters().unwrap().since(&c0);
    assert!(d.get("drop_masq_fragment") >= 2, "{d}");
    // Nothing more reached the server, and what did came from the node.
    let peers = server.peers();
    assert_eq!(peers.udp.len(), before, "{peers:?}");
    assert!(
        peers.udp.iter().all(|p| p.ip() == IpAddr::V6(node6())),
        "{peers:?}"
    );
    drop(u);
    w.del(&a);
    w.node.assert_clean(NETWORK);
}

#[test]
fn ipv6_with_a_destination_options_header_is_translated() {
    let w = World::new(&json!({}));
    let Some(a) = w.add_masq6("o6", "masq6-dstopts") else {
        return;
    };
    let server = w.server();
    let u = udp_socket(&a.pod.path, SocketAddr::new(a.ip6.into(), 0)).unwrap();
    set_dstopts(&u).unwrap();
    let c0 = w.node.counters().unwrap();
    udp_echo_on(&u, server.addr, &payload(200, 3), 3, Duration::from_secs(2)).unwrap();
    let d = w.node.counters().unwrap().since(&c0);
    let udp = server.peers().udp_sources();
    assert_eq!(udp.len(), 1, "{udp:?}");
    assert_eq!(udp.iter().next().unwrap().ip(), IpAddr::V6(node6()), "{d}");
    assert!(d.get("masq_snat") >= 1, "{d}");
    assert_eq!(
        d.get("drop_masq_proto") + d.get("drop_masq_malformed"),
        0,
        "{d}"
    );
    drop(u);
    w.del(&a);
    w.node.assert_clean(NETWORK);
}

#[test]
fn icmpv6_packet_too_big_reaches_the_pod_and_path_mtu_discovery_works() {
    let node = Node::new().unwrap();
    let routed = routed_external_host6(&node, 1280).unwrap();
    let mut conf = node.conf("1.1.0", "unused");
    conf["ipam"] = json!({
        "type": "sluice",
        "ranges": [[{"subnet": "10.79.0.0/24"}], [{"subnet": PODS6}]],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
        "dataDir": node.ipam_dir(),
    });
    conf["ipMasq"] = json!(true);
    conf["uplink"] = json!(UPLINK);
    conf["mtu"] = json!(1500);
    let w = World {
        node,
        ext: routed.router,
        conf,
    };
    let a = w.add("p6", "masq6-pmtu");
    let masq = masq6_kernel();
    if !masq {
        // Routed instead: the far host and the router reach the pods, and the
        // router's Packet Too Big goes to the pod's own address.
        w.ext
            .ip(&["-6", "route", "add", PODS6, "via", NODE6_ROUTED])
            .unwrap();
        routed
            .far
            .ip(&[
                "-6",
                "route",
                "add",
                PODS6,
                "via",
                "fd00:51::1",
                "advmss",
                "1440",
            ])
            .unwrap();
    }
    let far: Ipv6Addr = FAR6_IP.parse().unwrap();
    let server =
        EchoServer::start(&routed.far.netns_path(), SocketAddr::new(far.into(), 0)).unwrap();
    let too_big = || look::snmp(&a.pod.path).unwrap()["Icmp6InPktTooBigs"];
    let c0 = w.node.counters().unwrap();
    let tb0 = too_big();
    let s = tcp6(&a, server.addr);
    tcp_echo_on(&s, 4 << 20, 17).unwrap();
    let mtu = path_mtu6(&s).unwrap();
    let d = w.node.counters().unwrap().since(&c0);
    eprintln!("IPv6 PMTU, TCP: path MTU {mtu}; {d}");
    assert_eq!(mtu, 1280, "the pod's path MTU to {far} ({d})");
    assert!(too_big() > tb0, "no Packet Too Big reached the pod ({d})");
    let seen = server.peers().tcp[0].ip();
    if masq {
        assert!(d.get("masq_icmp_error") >= 1, "{d}");
        assert_eq!(seen, NODE6_ROUTED.parse::<IpAddr>().unwrap());
    } else {
        assert_eq!(seen, IpAddr::V6(a.ip6));
    }
    eprintln!("router {ROUTER6_IP}: Packet Too Big translated back to the pod");
    drop(s);
    w.del(&a);
    w.node.assert_clean(NETWORK);
}

/// A node's own ping may take any identifier (ping sockets hand out all 65535):
/// one equal to a pod flow's NAT identifier, to the same destination, must still
/// get its own reply. The node's echo is a flow of its own (origin "node"),
/// leaving with another identifier.
#[test]
fn a_node_ipv6_ping_with_a_pod_flows_nat_identifier_gets_its_reply() {
    let w = World::new(&json!({}));
    let Some(a) = w.add_masq6("np6", "masq6-node-ping") else {
        return;
    };
    Pinger6::new(&a.pod.path)
        .unwrap()
        .ping(ext6(), ICMP_ID, 1, 3, Duration::from_secs(2))
        .unwrap();
    let nat_id = nat_port(flow(&w.flows_of(&a), "icmpv6"));
    Pinger6::new(&w.node.netns_path())
        .unwrap()
        .ping(ext6(), nat_id, 1, 3, Duration::from_secs(1))
        .unwrap();
    let flows = w.flows(&["--proto", "icmpv6"]);
    let node: Vec<&Value> = flows.iter().filter(|f| f["origin"] == "node").collect();
    assert_eq!(node.len(), 1, "{flows:#?}");
    assert_eq!(node[0]["podIp"], NODE_IP6, "{flows:#?}");
    assert_eq!(node[0]["podPort"], nat_id, "{flows:#?}");
    assert_ne!(nat_port(node[0]), nat_id, "{flows:#?}");
    w.del(&a);
    w.node.assert_clean(NETWORK);
}

// --- NAT port collisions ---------------------------------------------------------

/// Two dual-stack pods bind the same source port and reach the same external
/// `[address]:port` over TCP and UDP (and ICMPv6 echo with one identifier):
/// every flow works and gets its own NAT port on the node's IPv6 address, as
/// `nat list` and the server see them. `sluicectl monitor` shows the four new
/// TCP and UDP flows with the node's IPv6 address and those NAT ports.
#[test]
fn two_ipv6_pods_with_the_same_source_port_get_different_nat_ports() {
    let w = World::new(&json!({}));
    let a = w.add("s6a", "masq6-same-a");
    let b = w.add("s6b", "masq6-same-b");
    if !masq6_kernel() {
        assert_routed_fallback(&w, &a);
        assert_routed_fallback(&w, &b);
        w.del(&a);
        w.del(&b);
        w.node.assert_clean(NETWORK);
        return;
    }
    let server = w.server();
    let port = 40000;
    let m = CtlChild::monitor(&w.node, &["--json", "--type", "nat", "--count", "4"]).unwrap();
    wait_lease(&w.node, true, Duration::from_secs(5)).unwrap();
    let ta = tcp_connect(&a.pod.path, Some(a.sock(port)), server.addr).unwrap();
    let tb = tcp_connect(&b.pod.path, Some(b.sock(port)), server.addr).unwrap();
    assert_eq!(ta.local_addr().unwrap(), a.sock(port));
    assert_eq!(tb.local_addr().unwrap(), b.sock(port));
    let t = thread::spawn(move || tcp_echo_on(&ta, BYTES, 8).map(|()| ta));
    tcp_echo_on(&tb, BYTES, 9).unwrap();
    let ta = t.join().unwrap().unwrap();
    let ua = udp_socket(&a.pod.path, a.sock(port)).unwrap();
    let ub = udp_socket(&b.pod.path, b.sock(port)).unwrap();
    let wait = Duration::from_secs(2);
    for i in 0..10u8 {
        udp_echo_on(&ua, server.addr, &payload(80, i), 3, wait).unwrap();
        udp_echo_on(&ub, server.addr, &payload(80, i), 3, wait).unwrap();
    }
    let end = m.wait(MONITOR_END).unwrap();
    assert_eq!(end.status, Some(0), "{end:#?}");
    // The same ICMPv6 echo identifier from both pods.
    let (pa, pb) = (
        Pinger6::new(&a.pod.path).unwrap(),
        Pinger6::new(&b.pod.path).unwrap(),
    );
    for seq in 1..=3 {
        pa.ping(ext6(), ICMP_ID, seq, 3, wait).unwrap();
        pb.ping(ext6(), ICMP_ID, seq, 3, wait).unwrap();
    }

    let peers = server.peers();
    let (fa, fb) = (w.flows_of(&a), w.flows_of(&b));
    assert_eq!((fa.len(), fb.len()), (3, 3), "{fa:#?} {fb:#?}");
    for f in fa.iter().chain(&fb) {
        assert_eq!(f["natIp"], NODE_IP6, "{f:#}");
        assert_eq!(f["dstIp"], EXT_IP6, "{f:#}");
        assert!(is_nat_port(nat_port(f)), "{f:#}");
    }
    assert_ne!(
        nat_port(flow(&fa, "icmpv6")),
        nat_port(flow(&fb, "icmpv6")),
        "both pods' pings got the same NAT identifier"
    );
    let node = IpAddr::V6(node6());
    for proto in ["tcp", "udp"] {
        let (na, nb) = (
            nat_port(flow_from(&fa, proto, port)),
            nat_port(flow_from(&fb, proto, port)),
        );
        assert_ne!(na, nb, "{proto}: both pods got NAT port {na}");
        let seen: BTreeSet<SocketAddr> = if proto == "tcp" {
            peers.tcp.iter().copied().collect()
        } else {
            peers.udp_sources()
        };
        assert_eq!(
            seen,
            BTreeSet::from([SocketAddr::new(node, na), SocketAddr::new(node, nb)]),
            "{proto} peers seen by the server"
        );
    }

    // The monitor's events: one per pod and protocol, with the node's IPv6
    // address and the NAT port `nat list` shows.
    let events = end.json();
    assert_eq!(events.len(), 4, "{end:#?}");
    for (p, flows) in [(&a, &fa), (&b, &fb)] {
        for proto in ["tcp", "udp"] {
            let ev = events
                .iter()
                .find(|e| e["proto"] == proto && e["src"] == p.ip6.to_string())
                .unwrap_or_else(|| panic!("no {proto} event from {}: {events:#?}", p.ip6));
            let want = json!({
                "type": "nat-new",
                "reason": "masq_new_flow",
                "family": 6,
                "ifindex": w.host_ifindex(p),
                "containerId": p.cid,
                "ifname": "eth0",
                "sport": port,
                "dst": EXT_IP6,
                "dport": server.addr.port(),
                "natAddress": NODE_IP6,
                "natPort": nat_port(flow_from(flows, proto, port)),
            });
            for (k, v) in want.as_object().unwrap() {
                assert_eq!(&ev[k], v, "{k} of {ev:#}");
            }
        }
    }
    drop((ta, tb, ua, ub));
    w.del(&a);
    w.del(&b);
    assert!(w.flows(&[]).is_empty(), "{:#?}", w.flows(&[]));
    w.node.assert_clean(NETWORK);
}

// --- Expiry --------------------------------------------------------------------

/// The flows of the idle-expiry tests, all answered by `server`: a UDP socket
/// on pod port 40001 and an ICMPv6 echo, a TCP connection closed by both ends,
/// and one left open (tcpEstablished: the default six hours).
struct IdleFlows {
    udp: UdpSocket,
    closed_port: u16,
    open: TcpStream,
    open_port: u16,
}

fn idle_flows(a: &P, server: &EchoServer) -> IdleFlows {
    let wait = Duration::from_secs(2);
    let udp = udp_socket(&a.pod.path, a.sock(40001)).unwrap();
    udp_echo_on(&udp, server.addr, b"first", 3, wait).unwrap();
    Pinger6::new(&a.pod.path)
        .unwrap()
        .ping(ext6(), ICMP_ID, 1, 3, wait)
        .unwrap();
    let closed = tcp6(a, server.addr);
    let closed_port = closed.local_addr().unwrap().port();
    tcp_echo_on(&closed, 4096, 10).unwrap();
    closed.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    Read::read_to_end(&mut &closed, &mut rest).unwrap();
    drop(closed);
    let open = tcp6(a, server.addr);
    let open_port = open.local_addr().unwrap().port();
    tcp_echo_on(&open, 4096, 11).unwrap();
    IdleFlows {
        udp,
        closed_port,
        open,
        open_port,
    }
}

/// With short timeouts (the keys the IPv4 test sets), idle UDP, ICMPv6 and
/// closed TCP flows disappear within a bounded wait (`nat_expired`), an open
/// TCP connection's flow stays on its NAT port, and a later datagram of the
/// same UDP 5-tuple starts a new flow, which `sluicectl monitor` shows as
/// `[node IPv6]:port`.
#[test]
fn idle_ipv6_flows_expire_and_come_back_as_new_flows() {
    let w =
        World::new(&json!({"natTimeouts": {"udp": 2, "tcpClosing": 2, "icmp": 2, "tcpSyn": 2}}));
    let Some(a) = w.add_masq6("x6", "masq6-exp") else {
        return;
    };
    let server = w.server();
    let wait = Duration::from_secs(2);
    let IdleFlows {
        udp: u,
        closed_port,
        open,
        open_port,
    } = idle_flows(&a, &server);

    let flows = w.flows_of(&a);
    assert_eq!(flows.len(), 4, "{flows:#?}");
    assert_eq!(flow_from(&flows, "tcp", closed_port)["state"], "closing");
    let first_udp = nat_port(flow_from(&flows, "udp", 40001));
    let open_nat = nat_port(flow_from(&flows, "tcp", open_port));
    let c0 = w.node.counters().unwrap();
    let started = Instant::now();
    let gone = wait_for(Duration::from_secs(15), || {
        let f = w.flows_of(&a);
        f.len() == 1 && f[0]["podPort"] == open_port
    });
    let flows = w.flows_of(&a);
    assert!(gone, "after {:?}: {flows:#?}", started.elapsed());
    eprintln!("idle IPv6 flows went after {:?}", started.elapsed());
    let d = w.node.counters().unwrap().since(&c0);
    assert_eq!(d.get("nat_expired"), 3, "{d}");
    assert_eq!(flows[0]["state"], "established", "{flows:#?}");
    assert_eq!(flows[0]["proto"], "tcp", "{flows:#?}");

    // The open connection still works, on its NAT port.
    tcp_echo_on(&open, 4096, 12).unwrap();
    assert_eq!(
        nat_port(flow_from(&w.flows_of(&a), "tcp", open_port)),
        open_nat
    );
    // The same UDP 5-tuple again: a new flow, shown by a monitor.
    let m = CtlChild::monitor(&w.node, &["--type", "nat", "--count", "1"]).unwrap();
    wait_lease(&w.node, true, Duration::from_secs(5)).unwrap();
    let c1 = w.node.counters().unwrap();
    udp_echo_on(&u, server.addr, b"again", 3, wait).unwrap();
    let d = w.node.counters().unwrap().since(&c1);
    assert_eq!(d.get("masq_new_flow"), 1, "{d}");
    assert_eq!(d.get("nat_expired"), 0, "{d}");
    let end = m.wait(MONITOR_END).unwrap();
    assert_eq!(end.status, Some(0), "{end:#?}");
    let flows = w.flows_of(&a);
    assert_eq!(flows.len(), 2, "{flows:#?}");
    let again = flow_from(&flows, "udp", 40001);
    assert_eq!(again["natIp"], NODE_IP6, "{again:#}");
    assert_eq!(again["state"], "udp", "{again:#}");
    let nat = nat_port(again);
    let seen = server.peers().udp;
    assert_eq!(
        seen.last().copied(),
        Some(SocketAddr::new(node6().into(), nat)),
        "{seen:?} (first NAT port {first_udp})"
    );
    assert_eq!(end.lines.len(), 1, "{end:#?}");
    let line = &end.lines[0];
    assert!(
        line.contains("nat       new flow")
            && line.contains(&format!(
                "udp [{}]:40001 -> [{EXT_IP6}]:{}",
                a.ip6,
                server.addr.port()
            ))
            && line.ends_with(&format!("as [{NODE_IP6}]:{nat}")),
        "monitor line {line:?}"
    );
    drop((open, u));
    w.del(&a);
    assert!(w.flows(&[]).is_empty(), "{:#?}", w.flows(&[]));
    w.node.assert_clean(NETWORK);
}

/// The node agent's sweep (`sluice-node sweep`) on IPv6 flows: idle UDP,
/// ICMPv6 and closed TCP flows go within the same bounded wait, removed by
/// the agent (its count grows by exactly those 3, the datapath's
/// `nat_expired` not at all),
/// and the open connection's flow stays and still carries it on its NAT port.
#[test]
fn idle_ipv6_flows_are_swept_by_the_node_agent() {
    let w =
        World::new(&json!({"natTimeouts": {"udp": 2, "tcpClosing": 2, "icmp": 2, "tcpSyn": 2}}));
    let Some(a) = w.add_masq6("x6", "masq6-agent") else {
        return;
    };
    let agent = sweep_agent(&w.node).unwrap();
    let sweep = || w.node.status().unwrap()["natSweep"].clone();
    assert!(
        wait_for(Duration::from_secs(10), || sweep()["by"] == "agent"),
        "{}",
        sweep()
    );
    let server = w.server();
    // Counted before the flows exist: under emulation the first idle flows
    // can reach their 2 s timeout, and the agent's next pass, while the
    // last ones are still being made.
    let (c0, n0) = (
        w.node.counters().unwrap(),
        sweep()["agentExpired"].as_u64().unwrap(),
    );
    let IdleFlows {
        udp: u,
        open,
        open_port,
        ..
    } = idle_flows(&a, &server);
    let open_nat = nat_port(flow_from(&w.flows_of(&a), "tcp", open_port));
    let started = Instant::now();
    let gone = wait_for(Duration::from_secs(15), || {
        let f = w.flows_of(&a);
        f.len() == 1 && f[0]["podPort"] == open_port
    });
    assert!(gone, "after {:?}: {:#?}", started.elapsed(), w.flows_of(&a));
    let d = w.node.counters().unwrap().since(&c0);
    assert_eq!(d.get("nat_expired"), 0, "the datapath expired some: {d}");
    assert_eq!(sweep()["agentExpired"].as_u64().unwrap(), n0 + 3);
    tcp_echo_on(&open, 4096, 12).unwrap();
    assert_eq!(
        nat_port(flow_from(&w.flows_of(&a), "tcp", open_port)),
        open_nat
    );
    drop(agent);
    drop((open, u));
    w.del(&a);
}

/// A server that answers one byte on each connection and closes it first, so
/// that the connection stays in `TIME_WAIT` on its side (60 s); bounded by
/// `stop`, which a last connection wakes.
fn closing_server(
    netns: &std::path::Path,
) -> (SocketAddr, Arc<AtomicBool>, thread::JoinHandle<()>) {
    let l = in_netns(netns, || {
        TcpListener::bind(SocketAddr::new(ext6().into(), 0))
            .map_err(|e| sluice_tests::err!("bind: {e}"))
    })
    .unwrap();
    let addr = l.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = Arc::clone(&stop);
    let t = thread::spawn(move || {
        while !s2.load(Ordering::Relaxed) {
            let Ok((mut c, _)) = l.accept() else { break };
            let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
            let mut b = [0u8; 1];
            if c.read_exact(&mut b).is_ok() {
                let _ = c.write_all(&b);
            }
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    });
    (addr, stop, t)
}

/// A server keeps each connection it closed in `TIME_WAIT` and refuses a SYN
/// for the same address and port pair that carries another connection's
/// timestamps (PAWS: Linux offsets timestamps per connection), so the client
/// waits a second for the retransmission. Once a pod's closed flows expired,
/// its next connections to that server must not land on NAT ports other
/// connections of it left in `TIME_WAIT` there: none refused, no SYN sent twice.
/// (With NAT ports drawn from a hash of the whole flow, about one in twenty of
/// these connections was.)
#[test]
fn new_connections_do_not_meet_the_servers_time_wait_once_flows_expired() {
    let w = World::new(&json!({"natTimeouts": {"tcpClosing": 1}}));
    let Some(a) = w.add_masq6("tw", "masq6-timewait") else {
        return;
    };
    let (to, stop, server) = closing_server(&w.ext.netns_path());
    let batch = |n: usize| {
        for i in 0..n {
            let mut s = tcp_connect(&a.pod.path, None, to).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.write_all(b"x").unwrap();
            let mut b = [0u8; 1];
            s.read_exact(&mut b)
                .unwrap_or_else(|e| panic!("connection {i} to {to}: {e}"));
        }
    };
    batch(2000);
    // The closed flows expire (closing timeout 1 s, the sweeper once a second).
    let gone = wait_for(Duration::from_secs(15), || {
        w.flows_of(&a).iter().all(|f| f["proto"] != "tcp")
    });
    assert!(gone, "flows left: {:#?}", w.flows_of(&a));
    let (ext0, pod0) = (
        look::snmp(&w.ext.netns_path()).unwrap(),
        look::snmp(&a.pod.path).unwrap(),
    );
    batch(2000);
    let (ext1, pod1) = (
        look::snmp(&w.ext.netns_path()).unwrap(),
        look::snmp(&a.pod.path).unwrap(),
    );
    let delta =
        |a: &std::collections::BTreeMap<String, u64>,
         b: &std::collections::BTreeMap<String, u64>,
         k: &str| { b.get(k).copied().unwrap_or(0) - a.get(k).copied().unwrap_or(0) };
    stop.store(true, Ordering::Relaxed);
    let _ = tcp_connect(&a.pod.path, None, to);
    server.join().unwrap();
    assert_eq!(
        delta(&ext0, &ext1, "TcpExt.PAWSTimewait"),
        0,
        "SYNs the server refused"
    );
    assert_eq!(
        delta(&pod0, &pod1, "TcpExt.TCPSynRetrans"),
        0,
        "SYNs the pod sent again"
    );
    w.del(&a);
    w.node.assert_clean(NETWORK);
}
