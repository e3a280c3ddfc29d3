//! hostPort (CNI `portMappings`, issue 5) with real traffic: a node wired to an
//! external host that has no route to the pods, so that only the hostPort
//! translation can bring a client to a pod and its replies back. External TCP
//! and UDP to node address:hostPort reach pod:containerPort and the server sees
//! the client; hostIP-specific mappings answer on that address only; the node
//! itself reaches 127.0.0.1:hostPort and its address through the cgroup socket
//! hooks, only from the configured cgroup; pods reach hostPorts (their own too:
//! hairpin); conflicts are refused with code 106 leaving nothing; DEL and GC
//! remove exactly a container's mappings, CHECK notices a missing one; 10,000
//! mappings; `sluicectl ports`; bad values refused with code 7.
//!
//! Every test has its own namespaces, pin root and cgroup (`hostPortCgroup`),
//! removed on every path ([`HpWorld`] and its parts drop them).
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::Path,
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use sluice_tests::{
    exec::Output,
    fixtures::{EXT_IF, NODE_IP},
    host::tx_checksum_off,
    hostport::{
        assert_only, capture_from, client_in, ext_ip, mapping, node_client, node_ip, ports,
        second_node_ip, with_raw_mappings, ClientReport, HpPod, HpWorld, SECOND_NODE_IP,
    },
    kernel, look,
    masq::{node_agent, tcp_connect, tcp_echo_on, udp_echo_on, udp_socket, wait_for, EchoServer},
    sluice_next_bin, Counters, NETWORK,
};

/// The client process of the node-local tests (`harness/bin/client.rs`).
const CLIENT: &str = env!("CARGO_BIN_EXE_sluice-test-client");
/// The port the pods' echo servers listen on.
const CPORT: u16 = 8080;
/// The usual host port (different from [`CPORT`], so the port is translated).
const HP: u16 = 18080;
/// Counters of the hostPort datapath (`sluicectl counters --json`).
const HP_COUNTERS: [&str; 4] = [
    "hostport_dnat",
    "hostport_reply",
    "hostport_hairpin",
    "hostport_sock",
];

fn sa(ip: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(ip), port)
}

fn localhost(port: u16) -> SocketAddr {
    sa(Ipv4Addr::LOCALHOST, port)
}

fn tcp_udp(host_port: u16, container_port: u16, host_ip: &str) -> [Value; 2] {
    [
        mapping(host_port, container_port, "tcp", host_ip),
        mapping(host_port, container_port, "udp", host_ip),
    ]
}

/// An echo server (TCP and UDP) on `p`'s address, port [`CPORT`].
fn server_in(p: &HpPod) -> EchoServer {
    EchoServer::start(&p.pod.path, p.sock(CPORT)).unwrap()
}

/// Asserts that a TCP connection from the external host to `to` is refused
/// (the node's kernel answered: nothing translated it).
#[track_caller]
fn assert_ext_tcp_refused(w: &HpWorld, to: SocketAddr) {
    match tcp_connect(&w.ext.netns_path(), None, to) {
        Ok(s) => panic!(
            "TCP from the external host to {to} was accepted by {:?}",
            s.peer_addr()
        ),
        Err(e) => assert!(
            e.0.contains("refused"),
            "TCP from the external host to {to}: expected connection refused, got: {e}"
        ),
    }
}

/// Asserts that no UDP echo comes back from `to` to the external host.
#[track_caller]
fn assert_ext_udp_unanswered(w: &HpWorld, to: SocketAddr) {
    let r = w.ext_udp_tries(to, 2, Duration::from_millis(500));
    assert!(r.is_err(), "UDP from the external host to {to} was echoed");
}

/// A node-local client (see [`node_client`]) in the world's cgroup, or not.
fn client(w: &HpWorld, in_cgroup: bool, args: &[&str]) -> ClientReport {
    let cg = in_cgroup.then_some(&w.cgroup);
    node_client(Path::new(CLIENT), &w.node, cg, args).unwrap()
}

fn tcp_args(to: SocketAddr) -> Vec<String> {
    vec!["tcp".into(), to.to_string(), "65536".into()]
}

fn udp_args(op: &str, to: SocketAddr, tries: u32, wait_ms: u64) -> Vec<String> {
    vec![
        op.into(),
        to.to_string(),
        tries.to_string(),
        wait_ms.to_string(),
    ]
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[track_caller]
fn assert_no_hostport_activity(d: &Counters) {
    for c in HP_COUNTERS {
        assert_eq!(d.get(c), 0, "{c} rose: {d}");
    }
}

/// The mappings of `list` as (hostIp, hostPort, protocol) triples.
fn keys(list: &[Value]) -> BTreeSet<(String, u64, String)> {
    list.iter()
        .map(|m| {
            (
                m["hostIp"].as_str().unwrap_or("?").to_string(),
                m["hostPort"].as_u64().unwrap_or(0),
                m["protocol"].as_str().unwrap_or("?").to_string(),
            )
        })
        .collect()
}

/// Asserts that a `ports list --json` entry is exactly a CNI mapping of `p`.
#[track_caller]
fn assert_cni_entry(m: &Value, p: &HpPod, host_ip: &str, host_port: u16, proto: &str) {
    let want = json!({
        "hostIp": host_ip,
        "hostPort": host_port,
        "protocol": proto,
        "podIp": p.ip.to_string(),
        "containerPort": CPORT,
        "containerId": p.cid,
        "ifname": "eth0",
        "origin": "cni",
    });
    for (k, v) in want.as_object().unwrap() {
        assert_eq!(&m[k], v, "{k} of {m:#}");
    }
}

// --- 1. External clients -----------------------------------------------------

/// External TCP and UDP to node address:hostPort reach pod:containerPort; the
/// server sees the external client's address; replies come from
/// node:hostPort (the client's connected socket and `udp_echo_on` require it)
/// and never with the pod's address; the node's kernel forwards nothing.
/// `extra`: config keys (`ipMasq`, `podDevice`).
fn external_clients_reach_the_pod(subnet: &str, xdp: &str, extra: &Value, cid: &str) {
    let w = HpWorld::new(subnet, xdp, extra).unwrap();
    if xdp == "native" {
        tx_checksum_off(&w.ext.netns_path(), EXT_IF).unwrap();
    }
    let a = w.add("a", cid, &tcp_udp(HP, CPORT, ""));
    let device = kernel::pod_device(extra);
    kernel::assert_device_kind(&w.node, &a.added.host_veth, device);
    // Nothing listens in the pod yet: its reset comes back translated.
    assert_ext_tcp_refused(&w, sa(node_ip(), HP));
    let server = server_in(&a);
    let leak = capture_from(&w.ext.netns_path(), EXT_IF, a.ip).unwrap();
    let c0 = w.counters();
    let fwd0 = w.node.snmp().unwrap()["Ip.ForwDatagrams"];

    let to = sa(node_ip(), HP);
    let tcp_local = w.ext_tcp(to, 1);
    let udp_local = w.ext_udp(to);
    // A second connection and datagram: translation is per flow.
    let tcp_local2 = w.ext_tcp(to, 2);
    let d = w.counters().since(&c0);
    let fwd = w.node.snmp().unwrap()["Ip.ForwDatagrams"] - fwd0;
    let leaked = leak.stop().unwrap();
    eprintln!("xdp {xdp} {extra}: {d}");
    let (tcp_local, udp_local, tcp_local2) = match (tcp_local, udp_local, tcp_local2) {
        (Ok(t), Ok(u), Ok(t2)) => (t, u, t2),
        (t, u, t2) => panic!(
            "external -> {to}: TCP {t:?}, UDP {u:?}, TCP again {t2:?}\ncounters: {d}\nports: {:#?}",
            w.ports(&[])
        ),
    };
    assert!(
        leaked.is_empty(),
        "{} frames with the pod's address {} reached the external host",
        leaked.len(),
        a.ip
    );
    let peers = server.peers();
    assert_eq!(
        peers.tcp,
        vec![tcp_local, tcp_local2],
        "TCP peers the pod's server saw"
    );
    assert_eq!(
        peers.udp_sources(),
        BTreeSet::from([udp_local]),
        "UDP sources the pod's server saw"
    );
    assert_eq!(tcp_local.ip(), ext_ip());
    assert!(d.get("hostport_dnat") >= 6, "{d}");
    assert!(d.get("hostport_reply") >= 6, "{d}");
    assert_eq!(d.get("hostport_hairpin"), 0, "{d}");
    assert!(
        fwd <= kernel::kernel_forwarding_allowed(&d),
        "the node's kernel forwarded {fwd} packets ({d})"
    );

    w.check(&a).unwrap().ok_silent();
    w.del(&a);
    assert!(w.ports(&[]).is_empty(), "{:#?}", w.ports(&[]));
    assert_ext_tcp_refused(&w, to);
    w.node.assert_clean(NETWORK);
}

#[test]
fn external_tcp_and_udp_reach_the_pod_through_the_host_port() {
    external_clients_reach_the_pod("10.97.1.0/24", "auto", &json!({}), "hp-ext-a");
}

/// The same into a netkit pod where the kernel has netkit (`podDevice: auto`).
#[test]
fn external_tcp_and_udp_reach_a_netkit_pod_through_the_host_port() {
    external_clients_reach_the_pod(
        "10.97.30.0/24",
        "auto",
        &json!({"podDevice": "auto"}),
        "hp-extnk-a",
    );
}

#[test]
fn external_tcp_and_udp_reach_the_pod_with_masquerade_on() {
    external_clients_reach_the_pod(
        "10.97.2.0/24",
        "auto",
        &json!({"ipMasq": true}),
        "hp-extm-a",
    );
}

#[test]
fn external_tcp_and_udp_reach_the_pod_with_native_xdp() {
    external_clients_reach_the_pod("10.97.3.0/24", "native", &json!({}), "hp-extx-a");
}

/// With masquerade on, a hostPort that is also a masquerade port must not
/// capture the replies of a pod's masqueraded flow: `masqueradePorts` is the
/// one port pod c maps. Pod a's TCP connection to a server outside either
/// works (its replies reach a) or, should that port be kept for the mapping,
/// gets no NAT port (`drop_masq_no_port`); the replies never reach c. An
/// external client still reaches c through the mapping.
#[test]
fn a_host_port_never_captures_a_masqueraded_flows_replies() {
    let w = HpWorld::new(
        "10.97.20.0/24",
        "auto",
        &json!({"ipMasq": true, "masqueradePorts": format!("{HP}-{HP}")}),
    )
    .unwrap();
    let c = w.add("c", "hp-masqc-c", &tcp_udp(HP, CPORT, ""));
    let a = w.add("a", "hp-masqc-a", &[]);
    let in_c = server_in(&c);
    let outside = EchoServer::start(&w.ext.netns_path(), sa(ext_ip(), 0)).unwrap();
    let c0 = w.counters();
    let r = tcp_connect(&a.pod.path, None, outside.addr).and_then(|s| tcp_echo_on(&s, 4096, 1));
    let d = w.counters().since(&c0);
    eprintln!(
        "a -> outside: {r:?}; {d}; outside saw {:?}",
        outside.peers()
    );
    let seen_by_c = in_c.peers();
    assert!(
        seen_by_c.tcp.iter().all(|p| p.ip() != IpAddr::V4(ext_ip())),
        "the replies of a's masqueraded flow went to c through hostPort {HP}: c saw {seen_by_c:?}, \
         a got {r:?}, counters {d}"
    );
    assert_eq!(
        d.get("hostport_dnat"),
        0,
        "packets of a's masqueraded flow were translated to c: a got {r:?}, counters {d}"
    );
    assert!(
        r.is_ok() || d.get("drop_masq_no_port") > 0,
        "a's connection failed without a reason: {r:?}; counters {d}; outside saw {:?}",
        outside.peers()
    );
    let t = w.ext_tcp(sa(node_ip(), HP), 2).unwrap();
    assert_eq!(in_c.peers().tcp, vec![t]);
    w.del(&a);
    w.del(&c);
}

// --- 2. hostIP -------------------------------------------------------------------

/// A mapping with `hostIP` answers on that address only; a wildcard mapping on
/// every address of the node.
#[test]
fn a_host_ip_mapping_answers_on_that_address_only() {
    let w = HpWorld::new("10.97.4.0/24", "auto", &json!({})).unwrap();
    w.add_second_address().unwrap();
    let wild = HP + 1;
    let mut maps = tcp_udp(HP, CPORT, SECOND_NODE_IP).to_vec();
    maps.push(mapping(wild, CPORT, "tcp", ""));
    let a = w.add("a", "hp-hostip-a", &maps);
    let server = server_in(&a);

    let t = w.ext_tcp(sa(second_node_ip(), HP), 1).unwrap();
    let u = w.ext_udp(sa(second_node_ip(), HP)).unwrap();
    assert_ext_tcp_refused(&w, sa(node_ip(), HP));
    assert_ext_udp_unanswered(&w, sa(node_ip(), HP));
    let peers = server.peers();
    assert_eq!(peers.tcp, vec![t], "TCP peers");
    assert_eq!(peers.udp_sources(), BTreeSet::from([u]), "UDP sources");

    // From the node itself (in the cgroup): that address only, too.
    let local = client(&w, true, &strs(&tcp_args(sa(second_node_ip(), HP))));
    assert!(
        local.ok && local.peer == Some(sa(second_node_ip(), HP)),
        "node-local TCP to {SECOND_NODE_IP}:{HP}: {local:#?}"
    );
    for to in [localhost(HP), sa(node_ip(), HP)] {
        let r = client(&w, true, &strs(&tcp_args(to)));
        assert!(
            !r.ok && r.refused(),
            "node-local TCP to {to} (the mapping is for {SECOND_NODE_IP} only): {r:#?}"
        );
    }
    assert_eq!(server.peers().tcp.len(), 2, "{:?}", server.peers());
    let local_peer = server.peers().tcp[1];

    let t1 = w.ext_tcp(sa(node_ip(), wild), 2).unwrap();
    let t2 = w.ext_tcp(sa(second_node_ip(), wild), 3).unwrap();
    assert_eq!(server.peers().tcp, vec![t, local_peer, t1, t2], "TCP peers");

    let list = w.ports(&[]);
    assert_eq!(
        keys(&list),
        BTreeSet::from([
            (SECOND_NODE_IP.to_string(), u64::from(HP), "tcp".to_string()),
            (SECOND_NODE_IP.to_string(), u64::from(HP), "udp".to_string()),
            ("0.0.0.0".to_string(), u64::from(wild), "tcp".to_string()),
        ]),
        "{list:#?}"
    );
    w.del(&a);
    w.node.assert_clean(NETWORK);
}

/// The node agent keeps the node's addresses (`sluice-node node-addrs`): it
/// takes the lease (`sluicectl status`: `hostPort.nodeAddressesBy` is
/// `agent`, and the metric says so); an address added to the node answers a
/// hostPort within seconds with no ADD in between. While the lease lasts an
/// ADD leaves the addresses alone: with the agent stopped (SIGSTOP), an
/// address taken off the node stays in the map across an ADD, and goes once
/// the agent runs again and reads the notification. SIGTERM gives the lease
/// back, and ADDs read the addresses themselves again.
#[test]
fn the_node_agent_keeps_the_node_addresses_current() {
    let w = HpWorld::new("10.97.21.0/24", "auto", &json!({})).unwrap();
    let a = w.add("a", "hp-addrs-a", &[mapping(HP, CPORT, "tcp", "")]);
    let server = server_in(&a);
    let hp = |w: &HpWorld| w.node.status().unwrap()["hostPort"].clone();
    let listed = |w: &HpWorld| {
        hp(w)["nodeAddresses"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v == SECOND_NODE_IP)
    };
    let wait = Duration::from_secs(10);
    assert_eq!(hp(&w)["nodeAddressesBy"], "add", "{}", hp(&w));

    let agent = node_agent(&w.node, "node-addrs").unwrap();
    assert!(
        wait_for(wait, || hp(&w)["nodeAddressesBy"] == "agent"),
        "{}",
        hp(&w)
    );
    let m = w.node.sluicectl(&["metrics"]).unwrap();
    assert!(
        m.stdout
            .lines()
            .any(|l| l == "sluice_node_addrs_by_agent 1"),
        "{m}"
    );
    // An address added with no ADD after it: written, and it answers.
    assert!(!listed(&w), "{}", hp(&w));
    w.add_second_address().unwrap();
    assert!(wait_for(wait, || listed(&w)), "{}", hp(&w));
    let t = w.ext_tcp(sa(second_node_ip(), HP), 1).unwrap();
    assert_eq!(server.peers().tcp, vec![t], "TCP peers");

    // Stopped, its lease still running: an ADD leaves the map alone.
    let pid = i32::try_from(agent.pid().unwrap()).unwrap();
    // SAFETY: signals to our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    // The clock starts before the lease is read: `took` then bounds the
    // time from that reading to the ADD's end, and `took < left` means the
    // lease still held when the ADD looked at it.
    let started = Instant::now();
    let lease = hp(&w);
    w.del_second_address().unwrap();
    let b = w.add("b", "hp-addrs-b", &[mapping(HP + 1, CPORT, "tcp", "")]);
    let took = started.elapsed();
    let left = Duration::from_secs_f64(lease["nodeAddressesAgentLeaseSeconds"].as_f64().unwrap());
    if took < left {
        assert!(listed(&w), "the ADD rewrote the node addresses: {}", hp(&w));
    } else {
        // An emulated guest's ADD takes about 2 s: it may have begun after
        // the lease ran out, when reading the addresses is its job.
        eprintln!(
            "the ADD took {took:?}, the stopped agent's lease had {left:?} left: not checked"
        );
    }
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    assert!(wait_for(wait, || !listed(&w)), "{}", hp(&w));

    // SIGTERM: the lease goes back at once; the next ADD reads them itself.
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let out = agent.wait(wait).unwrap();
    assert!(out.success(), "{out}");
    assert!(out.stderr.contains("kept for"), "{out}");
    assert_eq!(hp(&w)["nodeAddressesBy"], "add", "{}", hp(&w));
    w.add_second_address().unwrap();
    assert!(!listed(&w), "{}", hp(&w));
    let c = w.add("c", "hp-addrs-c", &[mapping(HP + 2, CPORT, "tcp", "")]);
    assert!(listed(&w), "{}", hp(&w));
    for p in [&c, &b, &a] {
        w.del(p);
    }
    w.node.assert_clean(NETWORK);
}

// --- 3. The node itself ------------------------------------------------------------

/// A process of the node in `hostPortCgroup` reaches 127.0.0.1:hostPort and
/// node-address:hostPort, TCP and UDP, and sees the address it used as its peer
/// (getpeername, the source of the UDP echo).
#[test]
fn the_node_reaches_host_ports_on_localhost_and_its_address_from_the_cgroup() {
    let w = HpWorld::new("10.97.5.0/24", "auto", &json!({})).unwrap();
    let a = w.add("a", "hp-local-a", &tcp_udp(HP, CPORT, ""));
    let server = server_in(&a);
    let hooks = cgroup_programs(&w);
    for h in HOOKS {
        assert!(
            hooks.contains(h),
            "{h} is not attached to the cgroup: {hooks:?}"
        );
    }
    let c0 = w.counters();
    let mut failures = Vec::new();
    for to in [localhost(HP), sa(node_ip(), HP)] {
        let t = client(&w, true, &strs(&tcp_args(to)));
        if !(t.ok && t.peer == Some(to)) {
            failures.push(format!("TCP to {to}: {t:#?}"));
        }
        let u = client(&w, true, &strs(&udp_args("udp", to, 3, 2000)));
        if !(u.ok && u.from == Some(to)) {
            failures.push(format!("UDP to {to}: {u:#?}"));
        }
    }
    let d = w.counters().since(&c0);
    assert!(
        failures.is_empty(),
        "node-local access from the cgroup failed:\n{}\ncounters: {d}\nserver saw {:?}",
        failures.join("\n"),
        server.peers()
    );
    let peers = server.peers();
    assert_eq!(peers.tcp.len(), 2, "{peers:?}");
    assert!(peers.udp.len() >= 2, "{peers:?}");
    assert!(d.get("hostport_sock") >= 4, "{d}");
    assert_eq!(
        d.get("hostport_dnat"),
        0,
        "nothing came from the uplink: {d}"
    );
    assert!(w.cgroup.procs().unwrap().is_empty());
    w.del(&a);
    w.node.assert_clean(NETWORK);
}

/// Connected UDP from the cgroup (`connect` then `send`/`recv`, as resolvers
/// do): getpeername gives the address used, the echo comes back.
#[test]
fn connected_udp_from_the_cgroup_reaches_the_host_port() {
    let w = HpWorld::new("10.97.6.0/24", "auto", &json!({})).unwrap();
    let a = w.add("a", "hp-cudp-a", &tcp_udp(HP, CPORT, ""));
    let server = server_in(&a);
    for to in [localhost(HP), sa(node_ip(), HP)] {
        let u = client(&w, true, &strs(&udp_args("udp-connected", to, 3, 2000)));
        assert!(
            u.ok && u.peer == Some(to) && u.from == Some(to),
            "connected UDP to {to}: {u:#?}\nserver saw {:?}",
            server.peers()
        );
    }
    w.del(&a);
}

/// A process of the node outside `hostPortCgroup` is not rewritten: TCP to
/// 127.0.0.1:hostPort and node-address:hostPort is refused, UDP gets no echo,
/// the pod's server sees nothing.
#[test]
fn node_processes_outside_the_cgroup_are_not_rewritten() {
    let w = HpWorld::new("10.97.7.0/24", "auto", &json!({})).unwrap();
    let a = w.add("a", "hp-nocg-a", &tcp_udp(HP, CPORT, ""));
    let server = server_in(&a);
    let c0 = w.counters();
    for to in [localhost(HP), sa(node_ip(), HP)] {
        let t = client(&w, false, &strs(&tcp_args(to)));
        assert!(
            !t.ok && t.refused(),
            "TCP to {to} from outside the cgroup: {t:#?}"
        );
        let u = client(&w, false, &strs(&udp_args("udp", to, 2, 500)));
        assert!(
            !u.ok,
            "UDP to {to} from outside the cgroup was echoed: {u:#?}"
        );
    }
    let d = w.counters().since(&c0);
    let peers = server.peers();
    assert!(
        peers.tcp.is_empty() && peers.udp.is_empty(),
        "the pod's server saw {peers:?}"
    );
    assert_no_hostport_activity(&d);
    // The same clients in the cgroup do get through (the mapping is there).
    let t = client(&w, true, &strs(&tcp_args(localhost(HP))));
    assert!(t.ok, "TCP from the cgroup: {t:#?}");
    w.del(&a);
}

/// The hooks act on sockets of the node's network namespace only: a process
/// in `hostPortCgroup` but in a pod's or the external host's namespace is not
/// rewritten (127.0.0.1:hostPort is refused there).
#[test]
fn cgroup_processes_in_other_namespaces_are_not_rewritten() {
    let w = HpWorld::new("10.97.17.0/24", "auto", &json!({})).unwrap();
    let a = w.add("a", "hp-nsck-a", &tcp_udp(HP, CPORT, ""));
    let b = w.add("b", "hp-nsck-b", &[]);
    let server = server_in(&a);
    let c0 = w.counters();
    for ns in [b.pod.path.clone(), w.ext.netns_path()] {
        let args = tcp_args(localhost(HP));
        let t = client_in(Path::new(CLIENT), &ns, Some(&w.cgroup), &strs(&args)).unwrap();
        assert!(
            !t.ok && t.refused(),
            "TCP to 127.0.0.1:{HP} from the cgroup in {}: {t:#?}",
            ns.display()
        );
        let args = udp_args("udp", localhost(HP), 2, 500);
        let u = client_in(Path::new(CLIENT), &ns, Some(&w.cgroup), &strs(&args)).unwrap();
        assert!(
            !u.ok,
            "UDP to 127.0.0.1:{HP} from the cgroup in {}: {u:#?}",
            ns.display()
        );
    }
    let d = w.counters().since(&c0);
    assert_eq!(d.get("hostport_sock"), 0, "{d}");
    let peers = server.peers();
    assert!(
        peers.tcp.is_empty() && peers.udp.is_empty(),
        "the pod's server saw {peers:?}"
    );
    w.del(&b);
    w.del(&a);
}

// --- 4. Hairpin ------------------------------------------------------------------------

/// A pod reaches node-address:hostPort: its own mapping (hairpin) and another
/// pod's, TCP and UDP; the server sees the node's address as the source.
#[test]
fn pods_reach_host_ports_their_own_and_another_pods() {
    let w = HpWorld::new("10.97.8.0/24", "auto", &json!({})).unwrap();
    let a = w.add("a", "hp-hair-a", &tcp_udp(HP, CPORT, ""));
    let b = w.add("b", "hp-hair-b", &[]);
    let server = server_in(&a);
    let to = sa(node_ip(), HP);
    let c0 = w.counters();
    let mut results = Vec::new();
    for p in [&a, &b] {
        let tcp = tcp_connect(&p.pod.path, None, to).and_then(|s| {
            let peer = s.peer_addr()?;
            tcp_echo_on(&s, 64 << 10, 5)?;
            Ok(peer)
        });
        let udp = udp_socket(&p.pod.path, p.sock(0))
            .and_then(|u| udp_echo_on(&u, to, b"hairpin", 3, Duration::from_secs(2)));
        results.push(format!("from {}: TCP {tcp:?}, UDP {udp:?}", p.cid));
        if tcp.is_err() || udp.is_err() {
            let d = w.counters().since(&c0);
            panic!(
                "pod {} -> {to}: TCP {tcp:?}, UDP {udp:?}\n{results:?}\ncounters: {d}\nserver saw {:?}",
                p.cid,
                server.peers()
            );
        }
    }
    let d = w.counters().since(&c0);
    let peers = server.peers();
    assert_eq!(peers.tcp.len(), 2, "{peers:?}");
    for (what, p) in peers
        .tcp
        .iter()
        .map(|p| ("TCP", p))
        .chain(peers.udp.iter().map(|p| ("UDP", p)))
    {
        assert_eq!(
            p.ip(),
            IpAddr::V4(node_ip()),
            "{what} source the server saw (the node's address): {peers:?}"
        );
    }
    assert!(d.get("hostport_hairpin") >= 4, "{d}");
    w.del(&b);
    w.del(&a);
    w.node.assert_clean(NETWORK);
}

/// Two pods reaching the same hostPort from the same source port at the same
/// time (hairpin, TCP and UDP): both work; the server sees the node's address
/// with two different ports (the second flow's source port is replaced).
#[test]
fn hairpin_flows_from_the_same_source_port_get_distinct_ports() {
    let w = HpWorld::new("10.97.19.0/24", "auto", &json!({})).unwrap();
    let c = w.add("c", "hp-hpsp-c", &tcp_udp(HP, CPORT, ""));
    let a = w.add("a", "hp-hpsp-a", &[]);
    let b = w.add("b", "hp-hpsp-b", &[]);
    let server = server_in(&c);
    let to = sa(node_ip(), HP);
    let port = 40000;
    let ta = tcp_connect(&a.pod.path, Some(a.sock(port)), to).unwrap();
    let tb = tcp_connect(&b.pod.path, Some(b.sock(port)), to);
    let tb = tb.unwrap_or_else(|e| {
        panic!(
            "b from the same source port: {e}; server saw {:?}",
            server.peers()
        )
    });
    tcp_echo_on(&ta, 64 << 10, 1).unwrap();
    tcp_echo_on(&tb, 64 << 10, 2).unwrap();
    let ua = udp_socket(&a.pod.path, a.sock(port)).unwrap();
    let ub = udp_socket(&b.pod.path, b.sock(port)).unwrap();
    for i in 0..3u8 {
        udp_echo_on(&ua, to, &[b'a', i], 3, Duration::from_secs(2)).unwrap();
        udp_echo_on(&ub, to, &[b'b', i], 3, Duration::from_secs(2)).unwrap();
    }
    let peers = server.peers();
    let tcp: BTreeSet<SocketAddr> = peers.tcp.iter().copied().collect();
    assert_eq!(tcp.len(), 2, "TCP peers: {peers:?}");
    assert_eq!(peers.udp_sources().len(), 2, "UDP sources: {peers:?}");
    assert!(
        tcp.iter()
            .chain(peers.udp.iter())
            .all(|p| p.ip() == IpAddr::V4(node_ip())),
        "{peers:?}"
    );
    drop((ta, tb));
    for p in [&a, &b, &c] {
        w.del(p);
    }
}

// --- 5. Conflicts ------------------------------------------------------------------

/// A second container asking for a mapped hostPort/protocol/hostIP (or an
/// overlapping wildcard/specific one) fails with 106 naming the port and the
/// owner, leaving nothing; the same port with the other protocol, or on
/// another specific address, works.
#[test]
fn a_conflicting_mapping_is_refused_and_leaves_nothing() {
    let w = HpWorld::new("10.97.9.0/24", "auto", &json!({})).unwrap();
    w.add_second_address().unwrap();
    let a = w.add("a", "hp-conf-a", &[mapping(HP, CPORT, "tcp", "")]);
    let before = w.ports(&[]);
    let pod_b = w.node.pod("b").unwrap();

    let cases: Vec<(Vec<Value>, Vec<String>)> = vec![
        (
            vec![mapping(HP, CPORT, "tcp", "")],
            vec![format!("*:{HP}/tcp"), a.cid.clone()],
        ),
        // A good mapping first: it must not stay.
        (
            vec![
                mapping(HP + 7, CPORT, "tcp", ""),
                mapping(HP, CPORT, "tcp", SECOND_NODE_IP),
            ],
            vec![format!("{HP}/tcp"), a.cid.clone()],
        ),
    ];
    for (maps, words) in cases {
        let out = w.try_add(&w.conf_with(&maps), "hp-conf-b", &pod_b).unwrap();
        let e = out.error(106);
        assert!(e.msg.contains("port mapping conflict"), "{e:?}");
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        e.assert_names(&words);
        assert_only(&w.node, &[&a]);
        assert_eq!(w.ports(&[]), before, "mappings after a refused ADD");
    }

    // The other protocol on the same port works, and each protocol reaches its pod.
    let b = w.add_into(pod_b, "hp-conf-b", &[mapping(HP, CPORT, "udp", "")]);
    let (sa_, sb) = (server_in(&a), server_in(&b));
    let t = w.ext_tcp(sa(node_ip(), HP), 1).unwrap();
    let u = w.ext_udp(sa(node_ip(), HP)).unwrap();
    assert_eq!(sa_.peers().tcp, vec![t]);
    assert!(sa_.peers().udp.is_empty(), "{:?}", sa_.peers());
    assert_eq!(sb.peers().udp_sources(), BTreeSet::from([u]));
    assert!(sb.peers().tcp.is_empty(), "{:?}", sb.peers());

    // Two specific addresses do not overlap; a wildcard overlaps both.
    let port = HP + 1;
    let c = w.add(
        "c",
        "hp-conf-c",
        &[mapping(port, CPORT, "tcp", SECOND_NODE_IP)],
    );
    let d = w.add("d", "hp-conf-d", &[mapping(port, CPORT, "tcp", NODE_IP)]);
    let pod_e = w.node.pod("e").unwrap();
    let before = w.ports(&[]);
    let out = w
        .try_add(
            &w.conf_with(&[mapping(port, CPORT, "tcp", "")]),
            "hp-conf-e",
            &pod_e,
        )
        .unwrap();
    let e = out.error(106);
    assert!(
        e.text().contains(&format!("{port}/tcp"))
            && (e.text().contains(&c.cid) || e.text().contains(&d.cid)),
        "the error should name {port}/tcp and its owner: {e:?}"
    );
    assert_only(&w.node, &[&a, &b, &c, &d]);
    assert_eq!(w.ports(&[]), before, "mappings after a refused ADD");

    // A port an operator mapped is taken too.
    let out = ports(
        &w.node,
        &[
            "add",
            "--host-port",
            "7000",
            "--pod",
            &a.ip.to_string(),
            "--container-port",
            &CPORT.to_string(),
        ],
    )
    .unwrap();
    assert!(out.success(), "{out}");
    let before = w.ports(&[]);
    let out = w
        .try_add(
            &w.conf_with(&[mapping(7000, CPORT, "tcp", "")]),
            "hp-conf-e",
            &pod_e,
        )
        .unwrap();
    out.error(106).assert_names(&["7000/tcp"]);
    assert_only(&w.node, &[&a, &b, &c, &d]);
    assert_eq!(w.ports(&[]), before, "mappings after a refused ADD");

    for p in [&a, &b, &c, &d] {
        w.del(p);
    }
    assert!(w.ports(&[]).is_empty());
    w.node.assert_clean(NETWORK);
}

// --- 6. DEL, CHECK, GC -------------------------------------------------------------------

/// DEL removes exactly that container's mappings, and those an operator added
/// for its pod (the other pod's stay and keep working); CHECK fails with 105
/// once a mapping was deleted behind its back, or put back differently.
#[test]
fn del_removes_only_its_mappings_and_check_notices_a_missing_one() {
    let w = HpWorld::new("10.97.10.0/24", "auto", &json!({})).unwrap();
    let (hpa, hpb) = (HP, HP + 1);
    let a = w.add("a", "hp-del-a", &tcp_udp(hpa, CPORT, ""));
    let b = w.add("b", "hp-del-b", &tcp_udp(hpb, CPORT, ""));
    let (sa_, sb) = (server_in(&a), server_in(&b));
    w.ext_tcp(sa(node_ip(), hpb), 1).unwrap();
    w.ext_udp(sa(node_ip(), hpb)).unwrap();
    assert_eq!(sb.peers().tcp.len(), 1);
    w.check(&a).unwrap().ok_silent();
    w.check(&b).unwrap().ok_silent();

    // An operator's mapping to b goes with b.
    let out = ports(
        &w.node,
        &[
            "add",
            "--host-port",
            "7000",
            "--pod",
            &b.ip.to_string(),
            "--container-port",
            &CPORT.to_string(),
        ],
    )
    .unwrap();
    assert!(out.success(), "{out}");
    assert_eq!(w.ports(&[]).len(), 5);

    w.del(&b);
    let list = w.ports(&[]);
    assert_eq!(list.len(), 2, "{list:#?}");
    for m in &list {
        assert_eq!(m["containerId"], a.cid, "{list:#?}");
        assert_eq!(m["hostPort"], hpa, "{list:#?}");
    }
    assert_ext_tcp_refused(&w, sa(node_ip(), hpb));
    assert_ext_tcp_refused(&w, sa(node_ip(), 7000));
    let t = w.ext_tcp(sa(node_ip(), hpa), 2).unwrap();
    let u = w.ext_udp(sa(node_ip(), hpa)).unwrap();
    assert_eq!(sa_.peers().tcp, vec![t]);
    assert_eq!(sa_.peers().udp_sources(), BTreeSet::from([u]));
    // A second DEL changes nothing.
    w.del(&b);
    assert_eq!(w.ports(&[]), list);
    w.check(&a).unwrap().ok_silent();

    let hp = hpa.to_string();
    let out = ports(&w.node, &["del", "--host-port", &hp, "--proto", "udp"]).unwrap();
    assert!(out.success(), "{out}");
    let out = w.check(&a).unwrap();
    out.error(105).assert_names(&[&hp]);
    // Put back by an operator to another container port: still not as ADD left it.
    let out = ports(
        &w.node,
        &[
            "add",
            "--host-port",
            &hp,
            "--proto",
            "udp",
            "--pod",
            &a.ip.to_string(),
            "--container-port",
            "9999",
        ],
    )
    .unwrap();
    assert!(out.success(), "{out}");
    let out = w.check(&a).unwrap();
    out.error(105).assert_names(&[&hp]);

    w.del(&a);
    assert!(w.ports(&[]).is_empty(), "{:#?}", w.ports(&[]));
    w.node.assert_clean(NETWORK);
}

/// GC (1.1.0) removes the mappings of containers that are not valid
/// attachments and keeps the others working.
#[test]
fn gc_removes_the_mappings_of_attachments_no_one_owns() {
    let w = HpWorld::new("10.97.11.0/24", "auto", &json!({"cniVersion": "1.1.0"})).unwrap();
    let a = w.add("a", "hp-gc-a", &tcp_udp(HP, CPORT, ""));
    let b = w.add("b", "hp-gc-b", &tcp_udp(HP + 1, CPORT, ""));
    let server = server_in(&a);
    let mut gc = w.conf.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": a.cid, "ifname": "eth0"}]);
    w.node
        .cni("GC", &gc, "", "", None, &[])
        .unwrap()
        .ok_silent();
    let list = w.ports(&[]);
    assert_eq!(list.len(), 2, "{list:#?}");
    assert!(list.iter().all(|m| m["containerId"] == a.cid), "{list:#?}");
    let t = w.ext_tcp(sa(node_ip(), HP), 1).unwrap();
    assert_eq!(server.peers().tcp, vec![t]);
    assert_ext_tcp_refused(&w, sa(node_ip(), HP + 1));
    w.del(&a);
    w.del(&b);
    assert!(w.ports(&[]).is_empty());
    w.node.assert_clean(NETWORK);
}

// --- 7. Scale ------------------------------------------------------------------------------

/// One container with 10,000 mappings: ADD accepts them, all are listed, the
/// first and the last carry traffic, CHECK passes, DEL removes them all.
#[test]
fn ten_thousand_mappings_of_one_container() {
    const N: u16 = 10_000;
    const FIRST: u16 = 20_000;
    let w = HpWorld::new("10.97.12.0/24", "auto", &json!({})).unwrap();
    let maps: Vec<Value> = (0..N)
        .map(|i| mapping(FIRST + i, CPORT, "tcp", ""))
        .collect();
    let a = w.add("a", "hp-10k-a", &maps);
    let server = server_in(&a);
    let list = w.ports(&[]);
    assert_eq!(list.len(), usize::from(N));
    let ports_seen: BTreeSet<u64> = list.iter().filter_map(|m| m["hostPort"].as_u64()).collect();
    assert_eq!(ports_seen.len(), usize::from(N));
    let last = FIRST + N - 1;
    let one = w.ports(&["--port", &last.to_string()]);
    assert_eq!(one.len(), 1, "{one:#?}");
    assert_cni_entry(&one[0], &a, "0.0.0.0", last, "tcp");

    let t1 = w.ext_tcp(sa(node_ip(), last), 1).unwrap();
    let t2 = w.ext_tcp(sa(node_ip(), FIRST), 2).unwrap();
    assert_eq!(server.peers().tcp, vec![t1, t2]);
    assert_ext_tcp_refused(&w, sa(node_ip(), last + 1));
    w.check(&a).unwrap().ok_silent();
    w.del(&a);
    assert!(w.ports(&[]).is_empty());
    w.node.assert_clean(NETWORK);
}

// --- 8. sluicectl ports -------------------------------------------------------------------

/// `sluicectl ports list/add/del`: the JSON fields, filters and the table;
/// an added mapping carries traffic, a deleted one no longer; conflicts are
/// refused naming the owner, bad input refused, nothing changed by either.
#[test]
fn sluicectl_ports_lists_adds_and_deletes_mappings() {
    let w = HpWorld::new("10.97.13.0/24", "auto", &json!({})).unwrap();
    w.add_second_address().unwrap();
    let a = w.add(
        "a",
        "hp-ctl-a",
        &[
            mapping(HP, CPORT, "tcp", ""),
            mapping(HP + 1, CPORT, "udp", ""),
        ],
    );
    let b = w.add(
        "b",
        "hp-ctl-b",
        &[mapping(HP + 2, CPORT, "tcp", SECOND_NODE_IP)],
    );
    let (sa_, sb) = (server_in(&a), server_in(&b));

    // list --json: every field of every entry.
    let list = w.ports(&[]);
    assert_eq!(list.len(), 3, "{list:#?}");
    for m in &list {
        let o = m
            .as_object()
            .unwrap_or_else(|| panic!("not an object: {m}"));
        let fields: BTreeSet<&str> = o.keys().map(String::as_str).collect();
        for f in [
            "hostIp",
            "hostPort",
            "protocol",
            "podIp",
            "containerPort",
            "containerId",
            "ifname",
            "origin",
        ] {
            assert!(fields.contains(f), "no {f} in {m:#}");
        }
    }
    let find = |port: u16| -> Value {
        list.iter()
            .find(|m| m["hostPort"] == port)
            .cloned()
            .unwrap_or_else(|| panic!("no mapping of {port}: {list:#?}"))
    };
    assert_cni_entry(&find(HP), &a, "0.0.0.0", HP, "tcp");
    assert_cni_entry(&find(HP + 1), &a, "0.0.0.0", HP + 1, "udp");
    assert_cni_entry(&find(HP + 2), &b, SECOND_NODE_IP, HP + 2, "tcp");

    // Filters.
    let a_ip = a.ip.to_string();
    let b_ip = b.ip.to_string();
    let count = |f: &[&str]| w.ports(f).len();
    assert_eq!(count(&["--pod", &a_ip]), 2);
    assert_eq!(count(&["--pod", &b_ip]), 1);
    assert_eq!(count(&["--pod", "hp-ctl-a"]), 2, "container id prefix");
    assert_eq!(count(&["--pod", "hp-ctl"]), 3, "container id prefix");
    assert_eq!(count(&["--port", &HP.to_string()]), 1);
    assert_eq!(count(&["--port", "1"]), 0);
    assert_eq!(count(&["--proto", "udp"]), 1);
    assert_eq!(count(&["--proto", "tcp"]), 2);
    assert_eq!(count(&["--proto", "sctp"]), 0);
    assert_eq!(count(&["--pod", &b_ip, "--proto", "udp"]), 0);

    // The table.
    let table = ports(&w.node, &["list"]).unwrap();
    assert!(table.success(), "{table}");
    let header = table.stdout.lines().next().unwrap_or_default();
    for col in ["PROTO", "HOST", "POD", "CONTAINER", "ORIGIN"] {
        assert!(header.contains(col), "no {col} column: {table}");
    }
    assert!(
        table.stdout.contains(&format!("{a_ip}:{CPORT}"))
            && table.stdout.contains(&a.cid)
            && table
                .stdout
                .contains(&format!("{SECOND_NODE_IP}:{}", HP + 2)),
        "{table}"
    );

    // add: reflected in the list and in traffic.
    let op_port = 7000u16;
    let out = ports(
        &w.node,
        &[
            "add",
            "--host-port",
            &op_port.to_string(),
            "--pod",
            &a_ip,
            "--container-port",
            &CPORT.to_string(),
        ],
    )
    .unwrap();
    assert!(out.success(), "{out}");
    assert!(
        out.stdout
            .contains(&format!("added *:{op_port}/tcp -> {a_ip}:{CPORT}")),
        "{out}"
    );
    let added = w.ports(&["--port", &op_port.to_string()]);
    assert_eq!(added.len(), 1, "{added:#?}");
    assert_eq!(added[0]["origin"], "operator", "{added:#?}");
    assert_eq!(added[0]["podIp"], a_ip, "{added:#?}");
    assert_eq!(added[0]["hostIp"], "0.0.0.0", "{added:#?}");
    assert_eq!(added[0]["protocol"], "tcp", "{added:#?}");
    assert_eq!(added[0]["containerPort"], CPORT, "{added:#?}");
    let t = w.ext_tcp(sa(node_ip(), op_port), 1).unwrap();
    assert_eq!(sa_.peers().tcp, vec![t]);

    // By container id prefix, UDP, on one address.
    let out = ports(
        &w.node,
        &[
            "add",
            "--host-port",
            &(op_port + 1).to_string(),
            "--pod",
            "hp-ctl-b",
            "--container-port",
            &CPORT.to_string(),
            "--proto",
            "udp",
            "--host-ip",
            SECOND_NODE_IP,
        ],
    )
    .unwrap();
    assert!(out.success(), "{out}");
    assert!(
        out.stdout.contains(&format!(
            "added {SECOND_NODE_IP}:{}/udp -> {b_ip}:{CPORT}",
            op_port + 1
        )),
        "{out}"
    );
    let u = w.ext_udp(sa(second_node_ip(), op_port + 1)).unwrap();
    assert_eq!(sb.peers().udp_sources(), BTreeSet::from([u]));
    assert_ext_udp_unanswered(&w, sa(node_ip(), op_port + 1));

    // Conflicts: refused naming the owner, nothing changed.
    let before = w.ports(&[]);
    let hp = HP.to_string();
    let cport = CPORT.to_string();
    let out = ports(
        &w.node,
        &[
            "add",
            "--host-port",
            &hp,
            "--pod",
            &b_ip,
            "--container-port",
            &cport,
        ],
    )
    .unwrap();
    assert_eq!(out.status, Some(1), "a conflicting add: {out}");
    assert!(
        format!("{}{}", out.stdout, out.stderr).contains(&a.cid),
        "the refusal should name the owner {}: {out}",
        a.cid
    );
    let out = ports(
        &w.node,
        &[
            "add",
            "--host-port",
            &(HP + 2).to_string(),
            "--pod",
            &a_ip,
            "--container-port",
            &cport,
        ],
    )
    .unwrap();
    assert_eq!(
        out.status,
        Some(1),
        "a wildcard over {SECOND_NODE_IP}'s: {out}"
    );
    assert!(
        format!("{}{}", out.stdout, out.stderr).contains(&b.cid),
        "the refusal should name the owner {}: {out}",
        b.cid
    );
    assert_eq!(w.ports(&[]), before);

    // del: prints what it removed; traffic stops; a second del fails.
    let out = ports(&w.node, &["del", "--host-port", &op_port.to_string()]).unwrap();
    assert!(out.success(), "{out}");
    assert!(
        out.stdout
            .contains(&format!("deleted *:{op_port}/tcp -> {a_ip}:{CPORT}")),
        "{out}"
    );
    assert_ext_tcp_refused(&w, sa(node_ip(), op_port));
    let out = ports(&w.node, &["del", "--host-port", &op_port.to_string()]).unwrap();
    assert_eq!(out.status, Some(1), "deleting a missing mapping: {out}");
    let out = ports(
        &w.node,
        &[
            "del",
            "--host-port",
            &(op_port + 1).to_string(),
            "--proto",
            "udp",
            "--host-ip",
            SECOND_NODE_IP,
        ],
    )
    .unwrap();
    assert!(out.success(), "{out}");
    assert_eq!(w.ports(&[]).len(), 3);
    assert!(
        w.ports(&[]).iter().all(|m| m["origin"] == "cni"),
        "{:#?}",
        w.ports(&[])
    );
    w.del(&a);
    w.del(&b);
    assert!(w.ports(&[]).is_empty());
    w.node.assert_clean(NETWORK);
}

/// Bad `sluicectl ports` input: (arguments, the value the refusal must name).
/// `syntax`: values the argument parser itself can tell are wrong (ranges,
/// numbers, protocol names, addresses); else values only the mappings and
/// the pods can refute.
fn bad_ports_input(a_ip: &str, syntax: bool) -> Vec<(Vec<String>, String)> {
    let add = |host_port: &str, pod: &str, cport: &str, more: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = [
            "add",
            "--host-port",
            host_port,
            "--pod",
            pod,
            "--container-port",
            cport,
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        v.extend(more.iter().map(ToString::to_string));
        v
    };
    let c = CPORT.to_string();
    let hp = HP.to_string();
    let del = |more: &[&str]| -> Vec<String> {
        let mut v = vec!["del".to_string()];
        v.extend(more.iter().map(ToString::to_string));
        v
    };
    let cases: Vec<(Vec<String>, &str)> = if syntax {
        vec![
            (add("0", a_ip, &c, &[]), "0"),
            (add("70000", a_ip, &c, &[]), "70000"),
            (add("x1", a_ip, &c, &[]), "x1"),
            (add("7100", a_ip, "0", &[]), "0"),
            (add("7100", a_ip, &c, &["--proto", "icmp"]), "icmp"),
            (
                add("7100", a_ip, &c, &["--host-ip", "300.1.2.3"]),
                "300.1.2.3",
            ),
            (del(&["--host-port", "0"]), "0"),
            (del(&["--host-port", &hp, "--proto", "icmp"]), "icmp"),
            (
                del(&["--host-port", &hp, "--host-ip", "300.1.2.3"]),
                "300.1.2.3",
            ),
        ]
    } else {
        vec![
            (add("7100", "10.97.99.99", &c, &[]), "10.97.99.99"),
            (add("7100", "no-such-pod", &c, &[]), "no-such-pod"),
            // SCTP must keep its port.
            (add("7100", a_ip, &c, &["--proto", "sctp"]), "7100"),
            (del(&["--host-port", "7101"]), "7101"),
        ]
    };
    cases.into_iter().map(|(a, w)| (a, w.to_string())).collect()
}

/// Runs every case of [`bad_ports_input`]: each must be refused (a non-zero
/// exit) naming its value, and change nothing. Returns the outputs.
fn refuse_bad_ports_input(w: &HpWorld, a: &HpPod, syntax: bool) -> Vec<Output> {
    let before = w.ports(&[]);
    let mut outs = Vec::new();
    for (args, word) in bad_ports_input(&a.ip.to_string(), syntax) {
        let out = ports(&w.node, &strs(&args)).unwrap();
        assert!(
            !out.success() && format!("{}{}", out.stdout, out.stderr).contains(&word),
            "bad input must be refused naming {word:?}: {out}"
        );
        assert_eq!(w.ports(&[]), before, "after {args:?}");
        outs.push(out);
    }
    outs
}

/// `sluicectl ports add/del` refuse bad input naming the bad value, with exit 1
/// (the spec: "refused (exit 1, ...) on conflict, bad input or unknown pod"),
/// and change nothing: values only the mappings and pods can refute.
#[test]
fn sluicectl_ports_refuses_unknown_pods_and_bad_mappings() {
    let w = HpWorld::new("10.97.16.0/24", "auto", &json!({})).unwrap();
    let a = w.add("a", "hp-ctlbad-a", &[mapping(HP, CPORT, "tcp", "")]);
    for out in refuse_bad_ports_input(&w, &a, false) {
        assert_eq!(out.status, Some(1), "{out}");
    }
    w.del(&a);
}

/// The same for values the argument parser can tell are wrong (port ranges,
/// numbers, protocol names, addresses): refused naming the value, nothing
/// changed, and exit 1 as the spec says.
#[test]
fn sluicectl_ports_refuses_malformed_arguments_with_exit_1() {
    let w = HpWorld::new("10.97.18.0/24", "auto", &json!({})).unwrap();
    let a = w.add("a", "hp-ctlarg-a", &[mapping(HP, CPORT, "tcp", "")]);
    let wrong: Vec<String> = refuse_bad_ports_input(&w, &a, true)
        .into_iter()
        .filter(|o| o.status != Some(1))
        .map(|o| o.to_string())
        .collect();
    assert!(
        wrong.is_empty(),
        "{} bad inputs did not exit with 1:\n{}",
        wrong.len(),
        wrong.join("\n\n")
    );
    w.del(&a);
}

// --- 9. Bad portMappings ---------------------------------------------------------------------

/// Bad `portMappings` values: refused with code 7 naming the key path and the
/// value, nothing left behind. SCTP keeping its port is accepted.
#[test]
fn bad_port_mappings_are_refused_naming_the_key() {
    let w = HpWorld::new("10.97.14.0/24", "auto", &json!({})).unwrap();
    // A pod without mappings first: the datapath is loaded, `ports list` works.
    let a = w.add("a", "hp-bad-a", &[]);
    let pod = w.node.pod("b").unwrap();
    let good = mapping(HP, CPORT, "tcp", "");
    let key = |k: &str| format!("runtimeConfig.portMappings[1].{k}");
    let cases: Vec<(Value, Vec<String>)> = vec![
        (
            json!({"hostPort": 0, "containerPort": 80}),
            vec![key("hostPort"), "0".into()],
        ),
        (
            json!({"hostPort": 70000, "containerPort": 80}),
            vec![key("hostPort"), "70000".into()],
        ),
        (
            json!({"hostPort": "8081", "containerPort": 80}),
            vec![key("hostPort"), "8081".into()],
        ),
        (json!({"containerPort": 80}), vec![key("hostPort")]),
        (
            json!({"hostPort": 8081, "containerPort": 0}),
            vec![key("containerPort"), "0".into()],
        ),
        (
            json!({"hostPort": 8081, "containerPort": 65536}),
            vec![key("containerPort"), "65536".into()],
        ),
        (
            json!({"hostPort": 8081, "containerPort": 80, "protocol": "icmp"}),
            vec![key("protocol"), "icmp".into()],
        ),
        (
            json!({"hostPort": 8081, "containerPort": 80, "hostIP": "300.1.2.3"}),
            vec![key("hostIP"), "300.1.2.3".into()],
        ),
        (
            json!({"hostPort": 8081, "containerPort": 80, "hostIP": "node"}),
            vec![key("hostIP"), "node".into()],
        ),
        (
            json!({"hostPort": 5000, "containerPort": 6000, "protocol": "sctp"}),
            vec![key("containerPort"), "6000".into()],
        ),
    ];
    for (bad, words) in cases {
        let conf = with_raw_mappings(&w.conf, &json!([good, bad]));
        let out = w.try_add(&conf, "hp-bad-b", &pod).unwrap();
        eprintln!("{bad}: {}", out.out.stdout.trim());
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        out.error(7).assert_names(&words);
        assert_only(&w.node, &[&a]);
        assert!(w.ports(&[]).is_empty(), "after {bad}: {:#?}", w.ports(&[]));
    }
    let conf = with_raw_mappings(&w.conf, &json!({"hostPort": 1}));
    let out = w.try_add(&conf, "hp-bad-b", &pod).unwrap();
    out.error(7).assert_names(&["runtimeConfig.portMappings"]);
    assert_only(&w.node, &[&a]);

    // SCTP keeping its port is fine.
    let b = w.add_into(pod, "hp-bad-b", &[mapping(5000, 5000, "sctp", "")]);
    let list = w.ports(&[]);
    assert_eq!(list.len(), 1, "{list:#?}");
    assert_eq!(list[0]["protocol"], "sctp");
    assert_eq!(list[0]["hostPort"], 5000);
    assert_eq!(list[0]["containerPort"], 5000);
    w.del(&b);
    w.del(&a);
    w.node.assert_clean(NETWORK);
}

// --- 10. Upgrades --------------------------------------------------------------------------

/// The cgroup hooks attached to `hostPortCgroup`: their program names.
fn cgroup_programs(w: &HpWorld) -> BTreeSet<String> {
    look::cgroup_sock_programs(w.cgroup.path()).unwrap()
}

const HOOKS: [&str; 4] = [
    "hp_connect4",
    "hp_sendmsg4",
    "hp_recvmsg4",
    "hp_getpeername4",
];

/// A datapath reload by a binary embedding another object keeps the mappings,
/// an established translated connection, external access and node-local
/// access (the cgroup links now run the new programs).
#[test]
fn host_ports_keep_working_across_a_datapath_reload() {
    let w = HpWorld::new("10.97.15.0/24", "auto", &json!({})).unwrap();
    let a = w.add("a", "hp-upg-a", &tcp_udp(HP, CPORT, ""));
    let server = server_in(&a);
    let to = sa(node_ip(), HP);
    let open = tcp_connect(&w.ext.netns_path(), None, to).unwrap();
    tcp_echo_on(&open, 64 << 10, 1).unwrap();
    let t = client(&w, true, &strs(&tcp_args(localhost(HP))));
    assert!(t.ok, "node-local TCP before the reload: {t:#?}");
    let before = w.ports(&[]);
    let hooks = cgroup_programs(&w);
    for h in HOOKS {
        assert!(
            hooks.contains(h),
            "{h} is not attached to the cgroup: {hooks:?}"
        );
    }

    let root = w.node.pin_root().display().to_string();
    let out = w
        .node
        .run(
            &sluice_next_bin().unwrap(),
            &["datapath", "reload", "--pin-root", &root],
        )
        .unwrap();
    assert!(out.success(), "reload failed: {out}");

    assert_eq!(w.ports(&[]), before, "mappings after the reload");
    tcp_echo_on(&open, 64 << 10, 2).expect("the connection opened before the reload");
    w.ext_tcp(to, 3)
        .expect("a new external connection after the reload");
    w.ext_udp(to).expect("external UDP after the reload");
    let t = client(&w, true, &strs(&tcp_args(localhost(HP))));
    assert!(
        t.ok && t.peer == Some(localhost(HP)),
        "node-local TCP after the reload: {t:#?}"
    );
    let u = client(&w, true, &strs(&udp_args("udp", localhost(HP), 3, 2000)));
    assert!(u.ok, "node-local UDP after the reload: {u:#?}");
    // Each hook runs the pinned (new) program, once.
    for h in HOOKS {
        let pin = w.node.pin_root().join("links").join(format!("cgroup-{h}"));
        let link = look::bpf_link_pinned(&pin).unwrap();
        let prog = look::pinned_prog_id(&w.node.pin_root().join("progs").join(h)).unwrap();
        assert_eq!(link["prog_id"], prog, "{h}: link {link}");
    }
    let after = cgroup_programs(&w);
    assert_eq!(
        after.len(),
        HOOKS.len(),
        "programs on the cgroup: {after:?}"
    );
    assert!(server.peers().tcp.len() >= 3, "{:?}", server.peers());
    drop(open);
    w.check(&a).unwrap().ok_silent();
    w.del(&a);
    w.node.assert_clean(NETWORK);
}
