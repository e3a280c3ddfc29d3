//! A full masquerade table never locks pods out (`nat::evict` of the eBPF
//! crate), with real traffic: one pod floods new flows (UDP datagrams to
//! thousands of ports of an external host that answers none of them, or TCP
//! SYNs to an address that drops them) while another pod opens TCP
//! connections and a third keeps a TCP stream and a replied UDP flow going.
//! The other pods' new connections succeed on their first SYN (no
//! retransmission in their namespace), the stream and the replied flow are
//! not cut, and the flooding pod is held to its share of the table
//! (`natPodShare`); with a share of the whole table, the flood's unreplied
//! flows make room for the others (`nat_evict_unreplied`). IPv4 and IPv6, at
//! a small `natMaxFlows` and at the default.
//!
//! Without the NAT sweeper (Linux before 5.15) the tables are LRU maps: the
//! kernel makes room itself and the share is not enforced; those kernels
//! check only that nobody is locked out and nothing established is cut.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::{FromRawFd, OwnedFd},
    path::Path,
    thread,
    time::Duration,
};

use serde_json::{json, Value};
use sluice_tests::{
    ctl::{wait_lease, CtlChild},
    fixtures::{add, del, merge_keys, EXT_IF, EXT_IP, NODE_IP, UPLINK},
    host, kernel, look,
    masq::{
        in_netns, masq_external_host, nat_list, sockaddr_in, tcp_connect, tcp_echo_on, udp_echo_on,
        udp_socket, EchoServer,
    },
    stream::Stream,
    Counters, Host, Node, Pod,
};

/// The uplink's IPv6 subnet: the node is `::1`, the external host `::2`.
const NODE_IP6: &str = "fd00:5b::1";
const EXT_IP6: &str = "fd00:5b::2";
/// An address the external host drops (it forwards nothing): SYNs to it are
/// never answered.
const BLACKHOLE: &str = "198.51.100.9";
/// New TCP connections the well-behaved pod opens during a flood.
const CONNECTIONS: u8 = 20;

fn ext_ip() -> IpAddr {
    EXT_IP.parse().unwrap()
}

fn ext_ip6() -> IpAddr {
    EXT_IP6.parse().unwrap()
}

/// A node with masquerade on (both families), wired to an external host with
/// no route to the pods.
struct World {
    node: Node,
    ext: Host,
    conf: Value,
}

/// A pod `ADDed` to a [`World`].
struct P {
    pod: Pod,
    cid: String,
    v4: Ipv4Addr,
    v6: Ipv6Addr,
    host_veth: String,
}

impl P {
    /// The pod's address of `to`'s family, port 0.
    fn any_port(&self, to: IpAddr) -> SocketAddr {
        match to {
            IpAddr::V4(_) => SocketAddr::new(self.v4.into(), 0),
            IpAddr::V6(_) => SocketAddr::new(self.v6.into(), 0),
        }
    }
}

impl World {
    fn new(subnet4: &str, subnet6: &str, extra: &Value) -> Self {
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
            "ranges": [[{"subnet": subnet4}], [{"subnet": subnet6}]],
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
        let (mut v4, mut v6) = (None, None);
        for (ip, _) in &added.ips {
            match ip {
                IpAddr::V4(a) => v4 = Some(*a),
                IpAddr::V6(a) => v6 = Some(*a),
            }
        }
        P {
            pod,
            cid: cid.to_string(),
            v4: v4.unwrap_or_else(|| panic!("no IPv4 address: {:#}", added.result)),
            v6: v6.unwrap_or_else(|| panic!("no IPv6 address: {:#}", added.result)),
            host_veth: added.host_veth,
        }
    }

    fn del(&self, p: &P) {
        del(&self.node, &self.conf, &p.cid, &p.pod);
    }

    fn counters(&self) -> Counters {
        self.node.counters().unwrap()
    }

    /// An echo server on the external host, on `ip`.
    fn server(&self, ip: IpAddr) -> EchoServer {
        EchoServer::start(&self.ext.netns_path(), SocketAddr::new(ip, 0)).unwrap()
    }

    /// Flows the pod holds in the table of `to`'s family.
    fn flows_of(&self, p: &P, to: IpAddr) -> usize {
        let ip = match to {
            IpAddr::V4(_) => p.v4.to_string(),
            IpAddr::V6(_) => p.v6.to_string(),
        };
        nat_list(&self.node, &["--pod", &ip]).unwrap().len()
    }

    fn ifindex(&self, p: &P) -> u64 {
        look::ifindex(self.node.name(), &p.host_veth).unwrap()
    }
}

/// TCP segments a namespace has retransmitted (`Tcp.RetransSegs`): a SYN
/// the datapath dropped is sent again after a second.
fn retransmitted(netns: &Path) -> u64 {
    look::snmp(netns).unwrap()["Tcp.RetransSegs"]
}

/// `count` UDP datagrams from one socket of `p` to as many ports of `to`,
/// on a thread (bursts of 100, 3 ms apart: the others' connections start
/// while it runs): each is a new flow that is never answered (the host has no
/// listener there; its ICMP errors are no reply).
fn udp_flood(p: &P, to: IpAddr, count: u32) -> thread::JoinHandle<()> {
    let s = udp_socket(&p.pod.path, p.any_port(to)).unwrap();
    thread::spawn(move || {
        for i in 0..count {
            let port = 10_000 + u16::try_from(i % 50_000).unwrap();
            // A full socket buffer (ENOBUFS) only loses a datagram.
            let _ = s.send_to(b"flood", SocketAddr::new(to, port));
            if i % 100 == 99 {
                thread::sleep(Duration::from_millis(3));
            }
        }
    })
}

/// `count` TCP connection attempts from `p` to `to`, each from a new source
/// port, none ever answered: non-blocking connects (one SYN each), the
/// socket closed at once (a closed `SYN_SENT` socket sends nothing more).
fn syn_flood(p: &P, to: SocketAddr, count: u32) -> thread::JoinHandle<()> {
    let netns = p.pod.path.clone();
    thread::spawn(move || {
        in_netns(&netns, move || {
            let SocketAddr::V4(v4) = to else {
                unreachable!("IPv4 only");
            };
            let addr = sockaddr_in(v4);
            for i in 0..count {
                // SAFETY: plain system calls on a descriptor owned here.
                unsafe {
                    let fd = libc::socket(
                        libc::AF_INET,
                        libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                        0,
                    );
                    assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
                    let fd = OwnedFd::from_raw_fd(fd);
                    let _ = libc::connect(
                        std::os::fd::AsRawFd::as_raw_fd(&fd),
                        (&raw const addr).cast(),
                        u32::try_from(size_of::<libc::sockaddr_in>()).unwrap(),
                    );
                }
                if i % 200 == 199 {
                    thread::sleep(Duration::from_millis(2));
                }
            }
            Ok(())
        })
        .unwrap();
    })
}

/// What the other pods see while `flood` runs: `b` opens [`CONNECTIONS`]
/// TCP connections to `server` (each echoes data) and not one of its SYNs is
/// retransmitted; `c`'s stream and its replied UDP flow opened before go on.
fn others_are_unaffected(
    w: &World,
    (b, c): (&P, &P),
    server: &EchoServer,
    flood: impl FnOnce() -> thread::JoinHandle<()>,
) -> Counters {
    let to = server.addr.ip();
    let stream =
        Stream::start(&w.ext.netns_path(), SocketAddr::new(to, 0), &c.pod.path, to).unwrap();
    stream
        .wait_received(1 << 20, Duration::from_secs(20))
        .unwrap();
    let replied = udp_socket(&c.pod.path, c.any_port(to)).unwrap();
    udp_echo_on(&replied, server.addr, b"before", 3, Duration::from_secs(2)).unwrap();
    let c0 = w.counters();
    let retrans0 = retransmitted(&b.pod.path);
    let flooding = flood();
    // The connections start with the flood and go on after it.
    for i in 0..CONNECTIONS {
        let s = tcp_connect(&b.pod.path, Some(b.any_port(to)), server.addr)
            .unwrap_or_else(|e| panic!("connection {i} of the well-behaved pod: {e}"));
        tcp_echo_on(&s, 4096, i).unwrap();
        thread::sleep(Duration::from_millis(25));
    }
    flooding.join().unwrap();
    for i in 0..5 {
        let s = tcp_connect(&b.pod.path, Some(b.any_port(to)), server.addr).unwrap();
        tcp_echo_on(&s, 4096, 100 + i).unwrap();
    }
    let d = w.counters().since(&c0);
    eprintln!("during the flood: {d}");
    assert_eq!(
        retransmitted(&b.pod.path) - retrans0,
        0,
        "the well-behaved pod retransmitted (a SYN or segment was dropped): {d}"
    );
    udp_echo_on(&replied, server.addr, b"after", 3, Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("the replied UDP flow opened before the flood: {e}; {d}"));
    let at = stream.received();
    stream
        .wait_received(at + (1 << 20), Duration::from_secs(20))
        .unwrap();
    let report = stream.finish().unwrap();
    eprintln!("stream across the flood: {report:?}");
    assert_eq!(d.get("drop_masq_map_full"), 0, "{d}");
    d
}

/// The flooding pod holds at most its share (and, there, replaced its own
/// flows), or the kernel has no sweeper (LRU tables, no share).
fn held_to_share(w: &World, a: &P, to: IpAddr, share: usize, d: &Counters) {
    let held = w.flows_of(a, to);
    eprintln!("the flooding pod holds {held} flows (share {share})");
    if !kernel::has("sweeper") {
        return;
    }
    // A few over at most: pods race their counts between CPUs.
    assert!(held <= share + 8, "{held} flows, share {share}: {d}");
    assert!(held >= share / 2, "{held} flows, share {share}: {d}");
    assert!(d.get("nat_evict_pod_share") > 0, "{d}");
    let pods = w.node.sluicectl_json(&["nat", "pods", "--json"]).unwrap();
    let ifindex = w.ifindex(a);
    let row = pods
        .as_array()
        .and_then(|rows| {
            rows.iter()
                .find(|r| r["hostIfindex"].as_u64() == Some(ifindex))
        })
        .unwrap_or_else(|| panic!("the flooding pod (ifindex {ifindex}) in nat pods: {pods}"));
    assert!(
        row["flows"].as_u64().unwrap() >= (share / 2) as u64,
        "{row}"
    );
}

fn flood_case(subnets: (&str, &str), extra: &Value, to: IpAddr, flood: u32, share: usize) {
    let w = World::new(subnets.0, subnets.1, extra);
    let (a, b, c) = (w.add("a", "np-a"), w.add("b", "np-b"), w.add("c", "np-c"));
    let server = w.server(to);
    let d = others_are_unaffected(&w, (&b, &c), &server, || udp_flood(&a, to, flood));
    held_to_share(&w, &a, to, share, &d);
    for p in [&a, &b, &c] {
        w.del(p);
    }
    assert!(nat_list(&w.node, &[]).unwrap().is_empty());
}

/// The case: `natMaxFlows: 1024`, one pod sends to 3,000 ports; the
/// others' new connections all succeed, and it holds half the table.
#[test]
fn a_udp_flood_leaves_other_pods_their_new_connections() {
    flood_case(
        ("10.97.1.0/24", "fd00:97:1::/64"),
        &json!({"natMaxFlows": 1024}),
        ext_ip(),
        3_000,
        512,
    );
}

/// The same over IPv6 (masquerade of IPv6 needs the sweeper's kernels).
#[test]
fn an_ipv6_udp_flood_leaves_other_pods_their_new_connections() {
    if !kernel::has("sweeper") {
        eprintln!("skipped: IPv6 masquerade needs the NAT sweeper (Linux 5.15)");
        return;
    }
    flood_case(
        ("10.97.2.0/24", "fd00:97:2::/64"),
        &json!({"natMaxFlows": 1024}),
        ext_ip6(),
        3_000,
        512,
    );
}

/// At the default table (65,536 flows), a pod sending to 40,000 ports is
/// held to its 32,768.
#[test]
fn a_flood_at_the_default_table_size_is_held_to_its_share() {
    flood_case(
        ("10.97.3.0/24", "fd00:97:3::/64"),
        &json!({}),
        ext_ip(),
        40_000,
        32_768,
    );
}

/// TCP SYNs that are never answered (a scan, a dead peer) are flows that
/// never saw a reply: held to the share the same way.
#[test]
fn a_syn_flood_leaves_other_pods_their_new_connections() {
    let w = World::new(
        "10.97.4.0/24",
        "fd00:97:4::/64",
        &json!({"natMaxFlows": 1024}),
    );
    let (a, b, c) = (w.add("a", "np-a"), w.add("b", "np-b"), w.add("c", "np-c"));
    let server = w.server(ext_ip());
    let hole = SocketAddr::new(BLACKHOLE.parse().unwrap(), 80);
    let d = others_are_unaffected(&w, (&b, &c), &server, || syn_flood(&a, hole, 2_000));
    held_to_share(&w, &a, ext_ip(), 512, &d);
    let syn = nat_list(&w.node, &["--pod", &a.v4.to_string(), "--proto", "tcp"]).unwrap();
    assert!(
        syn.iter()
            .all(|f| f["state"] == "syn-sent" || f["state"] == "syn"),
        "{syn:?}"
    );
    for p in [&a, &b, &c] {
        w.del(p);
    }
}

/// With a share of the whole table one pod can fill it: then the flows that
/// never saw a reply make room (the flood's own), and nothing established,
/// nor the replied UDP flow, is evicted.
#[test]
fn a_full_table_evicts_unreplied_flows_first() {
    let w = World::new(
        "10.97.5.0/24",
        "fd00:97:5::/64",
        &json!({"natMaxFlows": 1024, "natPodShare": 100}),
    );
    let (a, b, c) = (w.add("a", "np-a"), w.add("b", "np-b"), w.add("c", "np-c"));
    let server = w.server(ext_ip());
    let monitor = CtlChild::monitor(&w.node, &["--json", "--type", "nat"]).unwrap();
    wait_lease(&w.node, true, Duration::from_secs(5)).unwrap();
    let d = others_are_unaffected(&w, (&b, &c), &server, || udp_flood(&a, ext_ip(), 3_000));
    let listed = nat_list(&w.node, &[]).unwrap().len();
    assert!(listed <= 1024, "{listed} flows listed");
    if kernel::has("sweeper") {
        // Each eviction is a monitor event: the flood's own flow, unreplied.
        let evicted = |evs: &[Value]| evs.iter().find(|e| e["type"] == "nat-evict").cloned();
        assert!(
            monitor.wait_for(Duration::from_secs(10), |evs| evicted(evs).is_some()),
            "no nat-evict event: {}",
            monitor.stderr()
        );
        let ev = evicted(&monitor.json()).unwrap();
        assert_eq!(ev["reason"], "nat_evict_unreplied", "{ev}");
        assert_eq!(ev["containerId"], a.cid, "{ev}");
        assert_eq!(ev["src"], a.v4.to_string(), "{ev}");
        assert_eq!(ev["natAddress"], NODE_IP, "{ev}");
        assert!(d.get("nat_evict_unreplied") > 0, "{d}");
        assert_eq!(d.get("drop_masq_pod_share"), 0, "{d}");
        // More flows were made than the table holds: room was made.
        assert!(d.get("masq_new_flow") > 1024, "{d}");
    }
    for p in [&a, &b, &c] {
        w.del(p);
    }
    assert!(nat_list(&w.node, &[]).unwrap().is_empty());
}

/// NAT ports are per destination: flows to one server hold at most the
/// range's ports (here 1,024, `masqueradePorts`). Once they are all taken,
/// a new flow to that server takes the port of one that is idle (over a
/// second) and not an established connection, instead of being refused.
#[test]
fn a_destination_out_of_nat_ports_gives_idle_ports_to_new_flows() {
    let w = World::new(
        "10.97.6.0/24",
        "fd00:97:6::/64",
        &json!({"natMaxFlows": 4096, "natPodShare": 100, "masqueradePorts": "20000-21023"}),
    );
    let (a, b) = (w.add("a", "np-a"), w.add("b", "np-b"));
    let server = w.server(ext_ip());
    // Flows from as many source ports to the one server until every NAT
    // port is taken (each flow answered); topped up, a bounded number of
    // times, where a datagram was lost.
    let bind = a.any_port(ext_ip());
    let to = server.addr;
    let fill = |n: u32| {
        in_netns(&a.pod.path, move || {
            for i in 0..n {
                let s = std::net::UdpSocket::bind(bind)?;
                let _ = s.send_to(&i.to_be_bytes(), to);
                if i % 100 == 99 {
                    thread::sleep(Duration::from_millis(3));
                }
            }
            Ok(())
        })
        .unwrap();
    };
    let held = || {
        nat_list(&w.node, &["--pod", &a.v4.to_string()])
            .unwrap()
            .len()
    };
    fill(1_100);
    for _ in 0..3 {
        if sluice_tests::masq::wait_for(Duration::from_secs(3), || held() >= 1_024) {
            break;
        }
        fill(200);
    }
    assert_eq!(held(), 1_024, "the pod's flows did not take every NAT port");
    // Idle over a second: their ports may go to new flows.
    thread::sleep(Duration::from_millis(1_500));
    let c0 = w.counters();
    let s = udp_socket(&b.pod.path, b.any_port(ext_ip())).unwrap();
    let attempt = udp_echo_on(&s, server.addr, b"a port", 3, Duration::from_secs(2)).unwrap();
    let d = w.counters().since(&c0);
    eprintln!("a new flow to a destination out of ports: {d}");
    if kernel::has("sweeper") {
        assert_eq!(attempt, 1, "{d}");
        assert_eq!(d.get("drop_masq_no_port"), 0, "{d}");
        assert!(
            d.get("nat_evict_idle") + d.get("nat_evict_unreplied") >= 1,
            "{d}"
        );
    }
    for p in [&a, &b] {
        w.del(p);
    }
}
