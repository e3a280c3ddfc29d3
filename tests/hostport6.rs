//! IPv6 hostPort with real traffic on dual-stack namespaces: a node whose
//! uplink has an IPv4 and an IPv6 address, wired to an external host with no
//! route to the pods. A mapping without `hostIP` is published on both families
//! (as the reference portmap does); TCP and UDP from outside to
//! `[node IPv6]:hostPort` reach the pod and its replies come back; the node
//! itself reaches `[::1]:hostPort` and `[node IPv6]:hostPort` through the
//! cgroup socket hooks, only from the configured cgroup, and sees the address
//! it asked for as the peer; pods reach it too (hairpin); an IPv6 `hostIP`
//! answers on that address only; CHECK notices a missing IPv6 mapping, DEL
//! removes them; `sluicectl ports list` shows them.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use std::{
    net::{IpAddr, Ipv6Addr, SocketAddr},
    path::Path,
    time::Duration,
};

use serde_json::{json, Value};
use sluice_tests::{
    ctl::{wait_lease, CtlChild},
    fixtures::{EXT_IF, UPLINK},
    host,
    hostport::{mapping, node_client, node_ip, ports, ClientReport, HpPod, HpWorld},
    masq::{set_dstopts, tcp_connect, tcp_echo_on, udp_echo_on, udp_socket, EchoServer},
    NETWORK,
};

/// The client process of the node-local tests (`harness/bin/client.rs`).
const CLIENT: &str = env!("CARGO_BIN_EXE_sluice-test-client");
/// The node's and the external host's IPv6 addresses on the uplink.
const NODE6: &str = "fd00:5c::1";
const EXT6: &str = "fd00:5c::2";
/// A second IPv6 address of the node (the `hostIP` test).
const NODE6_B: &str = "fd00:5c::3";
const CPORT: u16 = 8080;
const HP: u16 = 18080;

fn v6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

fn sa6(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V6(v6(ip)), port)
}

/// A dual-stack hostPort world: IPv6 on the uplink (node and external host,
/// which has no route to the pods) and dual-stack pods from `pods6`.
fn world(subnet: &str, pods6: &str) -> HpWorld {
    world_xdp(subnet, pods6, "auto")
}

/// [`world`] with the uplink's XDP mode `xdp`; `native` also turns off the
/// external side's TX checksum offload, so native XDP sees complete checksums.
fn world_xdp(subnet: &str, pods6: &str, xdp: &str) -> HpWorld {
    let mut w = HpWorld::new(subnet, xdp, &json!({})).unwrap();
    if xdp == "native" {
        host::tx_checksum_off(&w.ext.netns_path(), EXT_IF).unwrap();
    }
    host::ip(
        w.node.name(),
        &[
            "addr",
            "add",
            &format!("{NODE6}/64"),
            "dev",
            UPLINK,
            "nodad",
        ],
    )
    .unwrap();
    host::ip(
        w.node.name(),
        &[
            "addr",
            "add",
            &format!("{NODE6_B}/64"),
            "dev",
            UPLINK,
            "nodad",
        ],
    )
    .unwrap();
    w.ext
        .ip(&["addr", "add", &format!("{EXT6}/64"), "dev", EXT_IF, "nodad"])
        .unwrap();
    w.conf["ipam"] = json!({
        "type": "sluice",
        "ranges": [[{"subnet": subnet}], [{"subnet": pods6}]],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
        "dataDir": w.node.ipam_dir(),
    });
    w
}

fn ip6_of(p: &HpPod) -> Ipv6Addr {
    p.added
        .ips
        .iter()
        .find_map(|(ip, _)| match ip {
            IpAddr::V6(a) => Some(*a),
            IpAddr::V4(_) => None,
        })
        .unwrap_or_else(|| panic!("no IPv6 address: {:#}", p.added.result))
}

/// An echo server (TCP and UDP) on the pod's IPv6 address, port [`CPORT`].
fn server6(p: &HpPod) -> EchoServer {
    EchoServer::start(&p.pod.path, SocketAddr::new(ip6_of(p).into(), CPORT)).unwrap()
}

fn tcp_udp(host_ip: &str) -> [Value; 2] {
    [
        mapping(HP, CPORT, "tcp", host_ip),
        mapping(HP, CPORT, "udp", host_ip),
    ]
}

/// TCP (an echo of 64 KiB) and UDP (an echo) from the external host to `to`.
fn from_outside(w: &HpWorld, to: SocketAddr) -> sluice_tests::Result<()> {
    let s = tcp_connect(&w.ext.netns_path(), None, to)?;
    tcp_echo_on(&s, 64 << 10, 3)?;
    let u = udp_socket(&w.ext.netns_path(), sa6(EXT6, 0))?;
    udp_echo_on(&u, to, b"sluice IPv6 hostPort", 3, Duration::from_secs(2)).map(drop)
}

fn client(w: &HpWorld, in_cgroup: bool, args: &[&str]) -> ClientReport {
    let cg = in_cgroup.then_some(&w.cgroup);
    node_client(Path::new(CLIENT), &w.node, cg, args).unwrap()
}

#[test]
fn ipv6_tcp_and_udp_from_outside_reach_the_pod_at_the_node_ipv6_address() {
    let w = world("10.98.1.0/24", "fd00:7c:1::/64");
    let a = w.add("a", "hp6-ext-a", &tcp_udp(""));
    let server = server6(&a);
    let m = CtlChild::monitor(&w.node, &["--json", "--type", "hostport", "--count", "2"]).unwrap();
    wait_lease(&w.node, true, Duration::from_secs(5)).unwrap();
    let c0 = w.counters();
    from_outside(&w, sa6(NODE6, HP)).unwrap();
    let d = w.counters().since(&c0);
    // The monitor shows both new flows: client -> [node]:hostPort, to the pod.
    let end = m.wait(Duration::from_secs(10)).unwrap();
    let events = end.json();
    assert_eq!(events.len(), 2, "{end:#?}");
    for proto in ["tcp", "udp"] {
        let ev = events
            .iter()
            .find(|e| e["proto"] == proto)
            .unwrap_or_else(|| panic!("no {proto} event: {events:#?}"));
        let want = json!({
            "type": "hostport-new",
            "reason": "hostport_dnat",
            "family": 6,
            "src": EXT6,
            "dst": NODE6,
            "dport": HP,
            "natAddress": ip6_of(&a).to_string(),
            "natPort": CPORT,
        });
        for (k, v) in want.as_object().unwrap() {
            assert_eq!(&ev[k], v, "{k} of {ev:#}");
        }
    }
    let peers = server.peers();
    assert_eq!(peers.tcp.len(), 1, "{peers:?}");
    // No source translation from outside: the pod sees the client.
    assert_eq!(peers.tcp[0].ip(), IpAddr::V6(v6(EXT6)), "{peers:?}");
    assert!(
        peers.udp.iter().all(|p| p.ip() == IpAddr::V6(v6(EXT6))),
        "{peers:?}"
    );
    assert!(d.get("hostport_dnat") >= 2, "{d}");
    assert!(d.get("hostport_reply") >= 2, "{d}");
    // Published on both families: IPv4 too, and both are listed.
    let server4 = EchoServer::start(&a.pod.path, a.sock(CPORT)).unwrap();
    let s4 = tcp_connect(
        &w.ext.netns_path(),
        None,
        SocketAddr::new(node_ip().into(), HP),
    )
    .unwrap();
    tcp_echo_on(&s4, 4096, 4).unwrap();
    assert_eq!(server4.peers().tcp.len(), 1);
    let list = w.ports(&[]);
    assert_eq!(list.len(), 4, "{list:#?}");
    let tcp6: Vec<&Value> = list
        .iter()
        .filter(|m| m["hostIp"] == "::" && m["protocol"] == "tcp")
        .collect();
    assert_eq!(tcp6.len(), 1, "{list:#?}");
    assert_eq!(tcp6[0]["podIp"], ip6_of(&a).to_string());
    assert_eq!(tcp6[0]["containerPort"], CPORT);
    assert_eq!(tcp6[0]["hostPort"], HP);
    let table = w.node.sluicectl(&["ports", "list"]).unwrap();
    assert!(
        table.stdout.contains(&format!("[::]:{HP}/tcp"))
            && table.stdout.contains(&format!("[{}]:{CPORT}", ip6_of(&a))),
        "{table}"
    );
    drop(s4);
    // An operator's IPv6 mapping: added to the pod's IPv6 address, reached
    // from outside, deleted by its IPv6 wildcard address.
    let a6 = ip6_of(&a).to_string();
    let cport = CPORT.to_string();
    let out = ports(
        &w.node,
        &[
            "add",
            "--host-port",
            "9000",
            "--pod",
            &a6,
            "--container-port",
            &cport,
        ],
    )
    .unwrap();
    assert!(out.success(), "{out}");
    let s = tcp_connect(&w.ext.netns_path(), None, sa6(NODE6, 9000)).unwrap();
    tcp_echo_on(&s, 4096, 7).unwrap();
    drop(s);
    let op: Vec<Value> = w.ports(&["--port", "9000"]);
    assert_eq!(op.len(), 1, "{op:#?}");
    assert_eq!(op[0]["origin"], "operator");
    assert_eq!(op[0]["hostIp"], "::");
    let out = ports(&w.node, &["del", "--host-port", "9000", "--host-ip", "::"]).unwrap();
    assert!(out.success(), "{out}");
    assert!(w.ports(&["--port", "9000"]).is_empty());
    w.del(&a);
    assert!(w.ports(&[]).is_empty(), "{:#?}", w.ports(&[]));
    w.node.assert_clean(NETWORK);
}

/// With native XDP on the uplink, IPv6 from outside to `[node IPv6]:hostPort`
/// is translated and delivered by `uplink_xdp` (before 5.13 native XDP falls
/// back to off and tc does it); the replies still go through tc.
#[test]
fn ipv6_hostport_from_outside_with_native_xdp() {
    let w = world_xdp("10.98.5.0/24", "fd00:7c:5::/64", "native");
    let a = w.add("a", "hp6-xdp-a", &tcp_udp(""));
    let server = server6(&a);
    let mode = sluice_tests::kernel::xdp_mode("native");
    let st = w.node.status().unwrap();
    assert_eq!(st["uplink"]["xdp"], mode, "{st:#}");
    let c0 = w.counters();
    from_outside(&w, sa6(NODE6, HP)).unwrap();
    // A second connection: every packet of a flow is translated alike.
    let s = tcp_connect(&w.ext.netns_path(), None, sa6(NODE6, HP)).unwrap();
    tcp_echo_on(&s, 256 << 10, 5).unwrap();
    drop(s);
    let d = w.counters().since(&c0);
    eprintln!("xdp {mode}: {d}");
    let peers = server.peers();
    assert_eq!(peers.tcp.len(), 2, "{peers:?}");
    assert!(
        peers.tcp.iter().all(|p| p.ip() == IpAddr::V6(v6(EXT6))),
        "{peers:?}"
    );
    assert!(!peers.udp.is_empty(), "{peers:?}");
    assert!(d.get("hostport_dnat") >= 4, "{d}");
    assert!(d.get("hostport_reply") >= 4, "{d}");
    if mode == "native" {
        // Through XDP: the translated frames went straight into the pod.
        assert!(d.get("xdp_to_pod") >= 4, "{d}");
        assert!(d.get("xdp_to_pod") + 2 >= d.get("hostport_dnat"), "{d}");
    }
    w.del(&a);
    assert!(w.ports(&[]).is_empty(), "{:#?}", w.ports(&[]));
    w.node.assert_clean(NETWORK);
}

/// Extension headers are not walked on the hostPort path: a datagram with a
/// destination-options header to `[node IPv6]:hostPort` is left to the node's
/// kernel, never half translated (the pod sees nothing of it, nothing is
/// counted as translated); a plain one to the same port reaches the pod.
#[test]
fn an_ipv6_datagram_with_extension_headers_is_left_to_the_node() {
    let w = world("10.98.6.0/24", "fd00:7c:6::/64");
    let a = w.add("a", "hp6-exthdr-a", &tcp_udp(""));
    let server = server6(&a);
    let with_opts = udp_socket(&w.ext.netns_path(), sa6(EXT6, 0)).unwrap();
    set_dstopts(&with_opts).unwrap();
    let c0 = w.counters();
    let to = sa6(NODE6, HP);
    let r = udp_echo_on(
        &with_opts,
        to,
        b"with options",
        2,
        Duration::from_millis(500),
    );
    let d = w.counters().since(&c0);
    assert!(
        r.is_err(),
        "an echo of the datagram with options: {r:?} ({d})"
    );
    assert_eq!(d.get("hostport_dnat"), 0, "{d}");
    assert!(server.peers().udp.is_empty(), "{:?}", server.peers());
    let plain = udp_socket(&w.ext.netns_path(), sa6(EXT6, 0)).unwrap();
    udp_echo_on(&plain, to, b"plain", 3, Duration::from_secs(2)).unwrap();
    assert_eq!(
        server.peers().udp_sources().len(),
        1,
        "{:?}",
        server.peers()
    );
    drop((with_opts, plain));
    w.del(&a);
    w.node.assert_clean(NETWORK);
}

#[test]
fn the_node_reaches_ipv6_hostports_at_loopback_and_its_own_address() {
    let w = world("10.98.2.0/24", "fd00:7c:2::/64");
    let a = w.add("a", "hp6-node-a", &tcp_udp(""));
    let server = server6(&a);
    let c0 = w.counters();
    for to in [sa6("::1", HP), sa6(NODE6, HP)] {
        let t = to.to_string();
        let r = client(&w, true, &["tcp", &t, "65536"]);
        assert!(r.ok, "TCP to {to} from the cgroup: {}", r.output);
        // getpeername shows what the socket asked for, not the pod.
        assert_eq!(r.peer, Some(to), "{}", r.output);
        let r = client(&w, true, &["udp-connected", &t, "3", "1000"]);
        assert!(r.ok, "UDP to {to} from the cgroup: {}", r.output);
        assert_eq!(r.peer, Some(to), "{}", r.output);
        // recvmsg shows the answer coming from there too.
        let r = client(&w, true, &["udp", &t, "3", "1000"]);
        assert!(r.ok, "unconnected UDP to {to}: {}", r.output);
        assert_eq!(r.from, Some(to), "{}", r.output);
    }
    let d = w.counters().since(&c0);
    assert!(d.get("hostport_sock") >= 6, "{d}");
    assert_eq!(server.peers().tcp.len(), 2, "{:?}", server.peers());
    // Outside the cgroup nothing is rewritten: nobody listens on the node.
    let r = client(&w, false, &["tcp", &sa6("::1", HP).to_string(), "1024"]);
    assert!(
        r.refused(),
        "TCP to [::1]:{HP} outside the cgroup: {}",
        r.output
    );
    w.del(&a);
    w.node.assert_clean(NETWORK);
}

#[test]
fn pods_reach_an_ipv6_hostport_their_own_and_another_pods() {
    let w = world("10.98.3.0/24", "fd00:7c:3::/64");
    let a = w.add("a", "hp6-hair-a", &tcp_udp(""));
    let b = w.add("b", "hp6-hair-b", &[]);
    let server = server6(&a);
    let to = sa6(NODE6, HP);
    let c0 = w.counters();
    for p in [&a, &b] {
        let s = tcp_connect(&p.pod.path, None, to).unwrap();
        tcp_echo_on(&s, 64 << 10, 6).unwrap();
        let u = udp_socket(&p.pod.path, SocketAddr::new(ip6_of(p).into(), 0)).unwrap();
        udp_echo_on(&u, to, b"hairpin6", 3, Duration::from_secs(2)).unwrap();
    }
    let d = w.counters().since(&c0);
    let peers = server.peers();
    assert_eq!(peers.tcp.len(), 2, "{peers:?}");
    // The source is the node address the pods used, so replies come back
    // through the node even for the pod reaching itself.
    for p in peers.tcp.iter().chain(peers.udp.iter()) {
        assert_eq!(p.ip(), IpAddr::V6(v6(NODE6)), "{peers:?}");
    }
    assert!(d.get("hostport_hairpin") >= 4, "{d}");
    w.del(&b);
    w.del(&a);
    w.node.assert_clean(NETWORK);
}

#[test]
fn an_ipv6_host_ip_answers_there_only_and_check_and_del_follow_it() {
    let w = world("10.98.4.0/24", "fd00:7c:4::/64");
    let a = w.add("a", "hp6-hostip-a", &tcp_udp(NODE6_B));
    let server = server6(&a);
    from_outside(&w, sa6(NODE6_B, HP)).unwrap();
    assert_eq!(server.peers().tcp.len(), 1);
    // Not on the node's other IPv6 address, and not on IPv4.
    match tcp_connect(&w.ext.netns_path(), None, sa6(NODE6, HP)) {
        Ok(s) => panic!("[{NODE6}]:{HP} accepted: {:?}", s.peer_addr()),
        Err(e) => assert!(e.0.contains("refused"), "{e}"),
    }
    let list = w.ports(&[]);
    assert_eq!(list.len(), 2, "{list:#?}");
    assert!(list.iter().all(|m| m["hostIp"] == NODE6_B), "{list:#?}");
    // A second pod may not take the same address and port.
    let b = w.node.pod("b").unwrap();
    let out = w
        .try_add(&w.conf_with(&tcp_udp(NODE6_B)), "hp6-hostip-b", &b)
        .unwrap();
    out.error(106)
        .assert_names(&[&format!("[{NODE6_B}]:{HP}/tcp")]);
    assert_eq!(w.ports(&[]).len(), 2, "{:#?}", w.ports(&[]));
    // CHECK notices a missing IPv6 mapping (an operator removed it).
    w.check(&a).unwrap().ok_silent();
    let hp = HP.to_string();
    let out = ports(
        &w.node,
        &[
            "del",
            "--host-port",
            &hp,
            "--proto",
            "udp",
            "--host-ip",
            NODE6_B,
        ],
    )
    .unwrap();
    assert!(out.success(), "{out}");
    w.check(&a).unwrap().error(105).assert_names(&[&hp]);
    w.del(&a);
    assert!(w.ports(&[]).is_empty(), "{:#?}", w.ports(&[]));
    w.node.assert_clean(NETWORK);
}
