//! `sluice-node proxy`: Sluice translates Services itself, at the socket.
//! A node with a client pod and two backend pods (echo servers), the stand-in
//! API server (`harness/apiserver.rs`) serving a Service and its
//! EndpointSlices to the real kube-rs client, the agent with its socket
//! hooks on a cgroup of the test's own (the clients join it; a process
//! outside it is translated per packet in `from_pod`).
//!
//! Checked with real traffic: a pod's TCP connect and UDP datagrams to the
//! ClusterIP reach a backend directly (the backend sees the pod's own
//! address: plain pod-to-pod packets), `getpeername` and `recvmsg` show the
//! ClusterIP; connections spread over both backends; an endpoint removed
//! gets no new connection; a Service without endpoints refuses at once
//! (`ECONNREFUSED` in a pod, as kube-proxy's REJECT; `EPERM` on the node);
//! terminating endpoints serve only when none is ready; a Service deleted
//! leaves its address untranslated; the maps are as the agent says; the
//! hooks go with `proxy --stop`; `internalTrafficPolicy: Local` without a
//! local endpoint drops; the watches resume from bookmarks and list again
//! after `410 Expired`; `sluicectl services lb` names Service ports from
//! the agent's state file.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
    path::Path,
    time::Duration,
};

use serde_json::{json, Value};
use sluice_tests::{
    agent::{log_of, start as agent, stop},
    apiserver::ApiServer,
    fixtures::add,
    hostport::{client_in, Cgroup, ClientReport},
    leaks::map_entries,
    masq::{wait_for, EchoServer},
    Node, Pod,
};

const CLIENT: &str = env!("CARGO_BIN_EXE_sluice-test-client");
const CIDR: &str = "10.95.0.0/24";
const CIDR6: &str = "fd00:95::/64";
const CLUSTER_IP: &str = "10.96.7.10";
const CLUSTER_IP6: &str = "fd00:96::7:10";
/// The Service's ports, and the backends' (one echo server, TCP and UDP).
const HTTP: u16 = 80;
const DNS: u16 = 53;
const TARGET: u16 = 8080;
/// The NodePort of the route-sync test's Service, and the node's address.
const NODE_PORT: u16 = 30080;
const NODE_ADDR: &str = "192.168.77.1";
/// Longest the agent gets to follow a change.
const FOLLOW: Duration = Duration::from_secs(20);
const LOG: &str = "proxy.log";

struct World {
    node: Node,
    client: Pod,
    /// The client pod's IPv4 address.
    client_ip: IpAddr,
    backends: Vec<(IpAddr, EchoServer)>,
    /// The same pods' IPv6 addresses and servers.
    backends6: Vec<(IpAddr, EchoServer)>,
    /// The backend pods themselves.
    backend_pods: Vec<Pod>,
    cgroup: Cgroup,
    api: ApiServer,
}

impl World {
    fn new() -> Self {
        let node = Node::new().unwrap();
        let mut conf = node.conf("1.0.0", CIDR);
        conf["ipam"]["ranges"] = json!([[{"subnet": CIDR}], [{"subnet": CIDR6}]]);
        conf["ipam"].as_object_mut().unwrap().remove("subnet");
        // Default routes of both families, as a cluster's pods have: a
        // connect to a Service without endpoints leaves the pod untranslated.
        conf["ipam"]["routes"] = json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]);
        let client = node.pod("c").unwrap();
        let client_ip = add(&node, &conf, "lb-client", &client)
            .ips
            .iter()
            .map(|(ip, _)| *ip)
            .find(IpAddr::is_ipv4)
            .unwrap();
        let (mut backends, mut backends6, mut backend_pods) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..2 {
            let pod = node.pod(&format!("b{i}")).unwrap();
            let added = add(&node, &conf, &format!("lb-backend-{i}"), &pod);
            for (ip, _) in &added.ips {
                let server = EchoServer::start(&pod.path, SocketAddr::new(*ip, TARGET)).unwrap();
                if ip.is_ipv6() {
                    backends6.push((*ip, server));
                } else {
                    backends.push((*ip, server));
                }
            }
            backend_pods.push(pod);
        }
        let api = ApiServer::start(&node.netns_path(), "127.0.0.1:0").unwrap();
        api.set_bookmark_interval(Duration::from_millis(300));
        api.set_service(
            "shop",
            "web",
            &json!({"clusterIP": CLUSTER_IP, "clusterIPs": [CLUSTER_IP],
                    "ports": [{"name": "http", "port": HTTP, "protocol": "TCP", "targetPort": TARGET},
                              {"name": "dns", "port": DNS, "protocol": "UDP", "targetPort": TARGET}]}),
            &json!({}),
        );
        Self {
            node,
            client,
            client_ip,
            backends,
            backends6,
            backend_pods,
            cgroup: Cgroup::new().unwrap(),
            api,
        }
    }

    fn ip(&self, i: usize) -> IpAddr {
        self.backends[i].0
    }

    /// The Service's endpoints: `(backend index, ready, serving, terminating)`.
    fn endpoints(&self, eps: &[(usize, bool, bool, bool)]) {
        let list: Vec<Value> = eps
            .iter()
            .map(|(i, ready, serving, terminating)| {
                json!({"addresses": [self.ip(*i).to_string()], "nodeName": "node-a",
                       "conditions": {"ready": ready, "serving": serving, "terminating": terminating}})
            })
            .collect();
        self.api.set_endpoint_slice(
            "shop",
            "web-1",
            "web",
            "IPv4",
            &json!(list),
            &json!([{"name": "http", "port": TARGET, "protocol": "TCP"},
                     {"name": "dns", "port": TARGET, "protocol": "UDP"}]),
        );
    }

    /// The Service's IPv6 endpoints, all ready: `backends6[i]` for each `i`.
    fn endpoints6(&self, eps: &[usize]) {
        let list: Vec<Value> = eps
            .iter()
            .map(|i| json!({"addresses": [self.backends6[*i].0.to_string()], "nodeName": "node-a"}))
            .collect();
        self.api.set_endpoint_slice(
            "shop",
            "web-6",
            "web",
            "IPv6",
            &json!(list),
            &json!([{"name": "http", "port": TARGET, "protocol": "TCP"},
                     {"name": "dns", "port": TARGET, "protocol": "UDP"}]),
        );
    }

    /// One client run in the client pod, in the test's cgroup or not.
    fn run(&self, in_cgroup: bool, args: &[&str]) -> ClientReport {
        let cg = in_cgroup.then_some(&self.cgroup);
        client_in(Path::new(CLIENT), &self.client.path, cg, args).unwrap()
    }

    fn tcp(&self) -> ClientReport {
        self.run(true, &["tcp", &format!("{CLUSTER_IP}:{HTTP}"), "2000"])
    }

    /// The backends each of `n` new connections reached (by the servers'
    /// own count of accepted connections).
    fn spread(&self, n: usize) -> Vec<usize> {
        let before: Vec<usize> = self
            .backends
            .iter()
            .map(|(_, s)| s.peers().tcp.len())
            .collect();
        for _ in 0..n {
            let r = self.tcp();
            assert!(r.ok, "a connection to the ClusterIP failed: {}", r.output);
        }
        self.backends
            .iter()
            .zip(before)
            .map(|((_, s), b)| s.peers().tcp.len() - b)
            .collect()
    }

    fn log(&self) -> String {
        log_of(&self.node, LOG)
    }

    /// `sluice-node proxy` for this node: its hooks on the test's cgroup,
    /// the pods' namespaces from the node's records.
    fn proxy(&self) -> sluice_tests::exec::Running {
        let state = self.node.state_dir().display().to_string();
        agent(
            &self.node,
            self.api.port(),
            &[
                "proxy",
                "--node-name",
                "node-a",
                "--cgroup",
                &self.cgroup.display(),
                "--cni-state-dir",
                &state,
                "--state-file",
                &self.state_file(),
            ],
            LOG,
        )
        .unwrap()
    }

    /// The agent's state file (Service names and endpoint states).
    fn state_file(&self) -> String {
        self.node.dir().join("services.json").display().to_string()
    }
}

/// What a pod's connect to a Service without endpoints fails with:
/// `ECONNREFUSED` (the ICMP port unreachable `from_pod` answers with, as
/// kube-proxy's REJECT) where the agent can tell the node's namespace from a
/// pod's (`SO_NETNS_COOKIE`, 5.14), `EPERM` from the socket hook before.
fn no_endpoint_errno() -> i32 {
    if sluice_tests::kernel::has("netns_cookie") {
        libc::ECONNREFUSED
    } else {
        libc::EPERM
    }
}

/// The frontends in `sl_lb_svc` (bpftool's view): how many.
fn frontends(node: &Node) -> usize {
    map_entries(node, "sl_lb_svc").unwrap().len()
}

#[test]
fn a_pods_connections_to_a_cluster_ip_go_straight_to_its_endpoints() {
    let w = World::new();
    w.endpoints(&[(0, true, true, false), (1, true, true, false)]);
    // Before the agent: no translation, nothing reaches a backend.
    let before = w.tcp();
    assert!(
        !before.ok,
        "translated without the agent: {}",
        before.output
    );
    let a = w.proxy();
    let mut last = None;
    assert!(
        wait_for(FOLLOW, || {
            let r = w.tcp();
            let ok = r.ok;
            last = Some(r);
            ok
        }),
        "the ClusterIP never answered: {:?}\nagent log:\n{}",
        last.map(|r| r.output),
        w.log()
    );
    // TCP: the pod's own address reaches the backend (no NAT in the path),
    // and the socket's peer is the ClusterIP.
    let r = w.tcp();
    assert!(r.ok, "{}", r.output);
    let vip: SocketAddr = format!("{CLUSTER_IP}:{HTTP}").parse().unwrap();
    assert_eq!(r.peer, Some(vip), "getpeername: {}", r.output);
    let client_ip = r.local.unwrap().ip();
    let seen: BTreeSet<IpAddr> = w
        .backends
        .iter()
        .flat_map(|(_, s)| s.peers().tcp)
        .map(|p| p.ip())
        .collect();
    assert_eq!(seen, BTreeSet::from([client_ip]), "backends saw {seen:?}");
    // Both backends take new connections.
    let spread = w.spread(24);
    assert!(
        spread.iter().all(|n| *n > 0),
        "24 connections went {spread:?}"
    );
    // UDP (DNS's way): each datagram to the ClusterIP reaches a backend, the
    // answer shows as the ClusterIP's.
    let u = w.run(true, &["udp", &format!("{CLUSTER_IP}:{DNS}"), "3", "500"]);
    assert!(u.ok, "{}", u.output);
    let dns: SocketAddr = format!("{CLUSTER_IP}:{DNS}").parse().unwrap();
    assert_eq!(u.from, Some(dns), "recvmsg: {}", u.output);
    // A process outside the hooks' cgroup (no socket hook acts): its
    // packets are translated per flow in `from_pod` instead, and its
    // socket, connected to the ClusterIP, hears from the ClusterIP.
    let c0 = w.node.counters().unwrap();
    let outside = w.run(false, &["tcp", &format!("{CLUSTER_IP}:{HTTP}"), "100"]);
    assert!(outside.ok, "outside the cgroup: {}", outside.output);
    assert_eq!(outside.peer, Some(vip), "{}", outside.output);
    let u = w.run(false, &["udp", &format!("{CLUSTER_IP}:{DNS}"), "3", "500"]);
    assert!(u.ok, "outside the cgroup, UDP: {}", u.output);
    assert_eq!(u.from, Some(dns), "{}", u.output);
    let d = w.node.counters().unwrap().since(&c0);
    assert!(d.get("lb_packet_new") >= 2, "{d}");
    assert_eq!(d.get("lb_sock"), 0, "{d}");
    assert_eq!(frontends(&w.node), 2, "{}", w.log());
    // sluicectl shows each Service port: frontends, backends, translations.
    let state = w.state_file();
    let lb = w
        .node
        .sluicectl_json(&["services", "lb", "--json", "--state", &state])
        .unwrap();
    assert_eq!(lb["hooksAttached"], json!(true), "{lb}");
    let ports = lb["servicePorts"].as_array().unwrap();
    assert_eq!(ports.len(), 2, "{lb}");
    let http = ports
        .iter()
        .find(|p| p["frontends"] == json!([format!("{CLUSTER_IP}:{HTTP}/tcp")]))
        .unwrap_or_else(|| panic!("no TCP Service port: {lb}"));
    let mut want: Vec<String> = (0..2).map(|i| format!("{}:{TARGET}", w.ip(i))).collect();
    want.sort();
    let mut have: Vec<String> = http["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_str().unwrap().to_string())
        .collect();
    have.sort();
    assert_eq!(have, want, "{lb}");
    // Named from the agent's state file, each endpoint with its state.
    assert_eq!(http["service"], json!("shop/web"), "{http:#}");
    assert_eq!(http["port"], json!("http"), "{http:#}");
    assert_eq!(http["protocol"], json!("TCP"), "{http:#}");
    let eps = http["endpoints"].as_array().unwrap();
    assert_eq!(eps.len(), 2, "{http:#}");
    for e in eps {
        assert_eq!(e["node"], json!("node-a"), "{e}");
        assert_eq!(e["backend"], json!(true), "{e}");
        assert_eq!(
            e["conditions"],
            json!({"ready": true, "serving": true, "terminating": false}),
            "{e}"
        );
    }
    let translations = http["translations"].as_u64().unwrap();
    // One Service port by its frontend.
    let one = w
        .node
        .sluicectl_json(&[
            "services",
            "lb",
            "--json",
            "--frontend",
            &format!("{CLUSTER_IP}:{HTTP}"),
        ])
        .unwrap();
    assert_eq!(one["servicePorts"].as_array().unwrap().len(), 1, "{one}");
    assert_eq!(one["servicePorts"][0]["id"], http["id"], "{one}");
    assert!(translations >= 26, "{lb}");
    // The same as metrics, per Service port, named.
    let m = w
        .node
        .sluicectl(&["metrics", "--service-state", &state])
        .unwrap();
    assert!(m.success(), "{m}");
    let labels = format!(
        "{{frontend=\"{CLUSTER_IP}:{HTTP}/tcp\",scope=\"node\",service=\"shop/web\",port=\"http\"}}"
    );
    let series = format!("sluice_service_translations_total{labels} {translations}");
    assert!(
        m.stdout.contains(&series),
        "no {series:?} in:\n{}",
        m.stdout
    );
    assert!(
        m.stdout
            .contains(&format!("sluice_service_backends{labels} 2")),
        "{}",
        m.stdout
    );
    // The maps' fill (a full one is a Service port the agent could not
    // write): 2 of 65,536 frontends, 4 of 262,144 backend slots.
    for map in ["sl_lb_svc", "sl_lb_be"] {
        assert!(
            m.stdout.contains(&format!(
                "sluice_bpf_map_pressure{{map_name=\"{map}\"}} 0.0000"
            )),
            "no fill of {map} in:\n{}",
            m.stdout
        );
    }

    // An endpoint removed takes no new connection.
    w.endpoints(&[(1, true, true, false)]);
    assert!(
        wait_for(FOLLOW, || http_backends(&w) == [w.ip(1)]),
        "the removed endpoint is still a backend\nagent log:\n{}",
        w.log()
    );
    assert_eq!(
        w.spread(8),
        [0, 8],
        "connections still reach the removed endpoint"
    );
    // Not ready but serving while terminating: used only when no endpoint is
    // ready (kube-proxy's fallback).
    w.endpoints(&[(0, false, true, true), (1, true, true, false)]);
    assert!(
        wait_for(FOLLOW, || http_backends(&w) == [w.ip(1)]
            && std::fs::read_to_string(w.state_file())
                .is_ok_and(|s| s.contains("\"terminating\": true"))),
        "{}",
        w.log()
    );
    assert_eq!(w.spread(8), [0, 8]);
    // The operator's view of one Service port: the terminating endpoint is
    // there, not a backend while another is ready.
    let one = w
        .node
        .sluicectl(&[
            "services",
            "lb",
            "--service",
            "shop/web:http",
            "--state",
            &state,
        ])
        .unwrap();
    assert!(one.success(), "{one}");
    let line = |ip: IpAddr| {
        one.stdout
            .lines()
            .find(|l| l.starts_with(&format!("{ip}:{TARGET} ")))
            .unwrap_or_else(|| panic!("no {ip} in:\n{}", one.stdout))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(
        line(w.ip(0)),
        format!("{}:{TARGET} node-a serving, terminating no", w.ip(0)),
        "{}",
        one.stdout
    );
    assert_eq!(
        line(w.ip(1)),
        format!("{}:{TARGET} node-a ready yes", w.ip(1)),
        "{}",
        one.stdout
    );
    assert!(one.stdout.contains("shop/web:http/TCP"), "{}", one.stdout);
    w.endpoints(&[(0, false, true, true)]);
    assert!(
        wait_for(FOLLOW, || http_backends(&w) == [w.ip(0)]),
        "{}",
        w.log()
    );
    assert_eq!(w.spread(8), [8, 0]);
    // No endpoint: refused at once, no timeout, as kube-proxy's REJECT
    // (ICMP port unreachable: ECONNREFUSED) where the agent knows the
    // node's namespace (5.14 on); before, and on the node, EPERM at the
    // socket.
    w.endpoints(&[]);
    let from_pod = no_endpoint_errno();
    let mut refused = None;
    assert!(
        wait_for(FOLLOW, || {
            let r = w.tcp();
            let done = r.errno == Some(from_pod);
            refused = Some(r);
            done
        }),
        "a Service without endpoints did not refuse with errno {from_pod}: {:?}\n{}",
        refused.map(|r| r.output),
        w.log()
    );
    // DNS over connected UDP: its datagram answered, the error at once.
    let dns = format!("{CLUSTER_IP}:{DNS}");
    let u = w.run(true, &["udp-connected", &dns, "1", "2000"]);
    assert_eq!(u.errno, Some(from_pod), "{}", u.output);
    // The node's own sockets: refused at the socket.
    let n = client_in(
        Path::new(CLIENT),
        &w.node.netns_path(),
        Some(&w.cgroup),
        &["tcp", &format!("{CLUSTER_IP}:{HTTP}"), "2000"],
    )
    .unwrap();
    assert_eq!(n.errno, Some(libc::EPERM), "{}", n.output);
    // The Service gone: its frontends go, its address is not translated.
    w.endpoints(&[(0, true, true, false)]);
    w.api
        .delete(sluice_tests::apiserver::Resource::Services, "shop", "web");
    assert!(
        wait_for(FOLLOW, || frontends(&w.node) == 0),
        "frontends left: {}\n{}",
        frontends(&w.node),
        w.log()
    );
    let gone = w.tcp();
    assert!(
        !gone.ok && gone.errno != Some(libc::EPERM),
        "{}",
        gone.output
    );
    stop(a, &w.node, LOG).unwrap();
    // The hooks stay when the agent stops (connections keep working)...
    let links = w.node.pin_root().join("links");
    assert!(links.join("cgroup-lb_connect4").exists());
    // ...and go with `proxy --stop`: Services are kube-proxy's again.
    let out = sluice_tests::exec::run(
        Some(&w.node.netns_path()),
        &sluice_tests::sluice_node_bin().unwrap(),
        &[
            "proxy",
            "--stop",
            "--pin-root",
            &w.node.pin_root().display().to_string(),
        ],
        &[],
        b"",
    )
    .unwrap();
    assert!(out.success(), "{out}");
    assert!(!links.join("cgroup-lb_connect4").exists());
}

#[test]
fn client_ip_affinity_keeps_a_pod_on_one_endpoint() {
    let w = World::new();
    w.endpoints(&[(0, true, true, false), (1, true, true, false)]);
    w.api.set_service(
        "shop",
        "web",
        &json!({"clusterIP": CLUSTER_IP, "clusterIPs": [CLUSTER_IP],
                "sessionAffinity": "ClientIP",
                "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}},
                "ports": [{"name": "http", "port": HTTP, "protocol": "TCP", "targetPort": TARGET}]}),
        &json!({}),
    );
    let a = w.proxy();
    assert!(wait_for(FOLLOW, || w.tcp().ok), "{}", w.log());
    // Every new connection of the pod goes where its first went.
    let spread = w.spread(16);
    assert!(
        spread.contains(&0) && spread.contains(&16),
        "16 connections with ClientIP affinity went {spread:?}"
    );
    let lb = w
        .node
        .sluicectl_json(&["services", "lb", "--json"])
        .unwrap();
    assert_eq!(lb["servicePorts"][0]["affinitySeconds"], json!(600), "{lb}");
    // Its endpoint gone: the pod moves to the other one, and stays there.
    let kept = usize::from(spread[0] == 0);
    let other = 1 - kept;
    let mut eps = [(0, true, true, false); 1];
    eps[0].0 = other;
    w.endpoints(&eps);
    let mut want = [0, 0];
    want[other] = 6;
    assert!(wait_for(FOLLOW, || w.spread(6) == want), "{}", w.log());
    stop(a, &w.node, LOG).unwrap();
}

#[test]
fn route_sync_runs_the_proxy_in_its_mode_node_ports_too_and_removes_the_hooks_without_it() {
    let w = World::new();
    w.endpoints(&[(0, true, true, false)]);
    w.api.set_node("node-a", &[CIDR], &["192.168.70.1"]);
    // A NodePort Service too; the node has an address of its own (on `lo`,
    // in the test's node namespace), which route-sync keeps in the datapath.
    w.api.set_service(
        "shop",
        "web",
        &json!({"type": "NodePort", "clusterIP": CLUSTER_IP, "clusterIPs": [CLUSTER_IP],
                "ports": [{"name": "http", "port": HTTP, "protocol": "TCP", "targetPort": TARGET,
                           "nodePort": NODE_PORT}]}),
        &json!({}),
    );
    let out = sluice_tests::exec::run(
        Some(&w.node.netns_path()),
        Path::new("ip"),
        &["addr", "add", &format!("{NODE_ADDR}/32"), "dev", "lo"],
        &[],
        b"",
    )
    .unwrap();
    assert!(out.success(), "{out}");
    let cg = w.cgroup.display();
    let a = agent(
        &w.node,
        w.api.port(),
        &[
            "route-sync",
            "--node-name",
            "node-a",
            "--service-proxy",
            "--service-cgroup",
            &cg,
            "--cni-state-dir",
            &w.node.state_dir().display().to_string(),
        ],
        LOG,
    )
    .unwrap();
    assert!(wait_for(FOLLOW, || w.tcp().ok), "{}", w.log());
    // The NodePort from a pod, at the node's address, and from the node
    // itself at loopback: both reach the endpoint, both see what they asked
    // for as the peer.
    let at_node = SocketAddr::new(NODE_ADDR.parse().unwrap(), NODE_PORT);
    let mut last = None;
    assert!(
        wait_for(FOLLOW, || {
            let r = w.run(true, &["tcp", &at_node.to_string(), "500"]);
            let ok = r.ok;
            last = Some(r);
            ok
        }),
        "pod -> {at_node}: {:?}\n{}",
        last.map(|r| r.output),
        w.log()
    );
    let r = w.run(true, &["tcp", &at_node.to_string(), "500"]);
    assert_eq!(r.peer, Some(at_node), "{}", r.output);
    let lo = SocketAddr::new("127.0.0.1".parse().unwrap(), NODE_PORT);
    let n = client_in(
        Path::new(CLIENT),
        &w.node.netns_path(),
        Some(&w.cgroup),
        &["tcp", &lo.to_string(), "500"],
    )
    .unwrap();
    assert!(n.ok, "node -> {lo}: {}", n.output);
    assert_eq!(n.peer, Some(lo), "{}", n.output);
    stop(a, &w.node, LOG).unwrap();
    let hook = w.node.pin_root().join("links/cgroup-lb_connect4");
    assert!(hook.exists(), "the hooks went with the agent");
    // The DaemonSet restarted without the mode: back to kube-proxy.
    let b = agent(
        &w.node,
        w.api.port(),
        &["route-sync", "--node-name", "node-a"],
        LOG,
    )
    .unwrap();
    assert!(wait_for(FOLLOW, || !hook.exists()), "{}", w.log());
    let r = w.tcp();
    assert!(!r.ok, "still translated without the mode: {}", r.output);
    stop(b, &w.node, LOG).unwrap();
}

#[test]
fn ipv6_and_dual_stack_cluster_ips_go_to_the_endpoints_of_their_family() {
    let w = World::new();
    w.api.set_service(
        "shop",
        "web",
        &json!({"clusterIP": CLUSTER_IP, "clusterIPs": [CLUSTER_IP, CLUSTER_IP6],
                "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack",
                "ports": [{"name": "http", "port": HTTP, "protocol": "TCP", "targetPort": TARGET},
                          {"name": "dns", "port": DNS, "protocol": "UDP", "targetPort": TARGET}]}),
        &json!({}),
    );
    w.endpoints(&[(0, true, true, false)]);
    w.endpoints6(&[1]);
    let a = w.proxy();
    let vip6 = SocketAddr::new(CLUSTER_IP6.parse().unwrap(), HTTP);
    let tcp6 = || w.run(true, &["tcp", &vip6.to_string(), "2000"]);
    assert!(wait_for(FOLLOW, || tcp6().ok), "{}", w.log());
    let r = tcp6();
    assert!(r.ok, "{}", r.output);
    assert_eq!(r.peer, Some(vip6), "getpeername: {}", r.output);
    // The IPv6 endpoint took it, from the pod's own IPv6 address.
    let client6 = r.local.unwrap().ip();
    assert!(client6.is_ipv6());
    assert!(w.backends6[1]
        .1
        .peers()
        .tcp
        .iter()
        .any(|p| p.ip() == client6));
    assert!(w.backends6[0].1.peers().tcp.is_empty());
    // UDP over IPv6: the answer shows as the Service's.
    let dns6 = SocketAddr::new(CLUSTER_IP6.parse().unwrap(), DNS);
    let u = w.run(true, &["udp", &dns6.to_string(), "3", "500"]);
    assert!(u.ok, "{}", u.output);
    assert_eq!(u.from, Some(dns6), "recvmsg: {}", u.output);
    // Outside the hooks' cgroup, over IPv6: translated per packet.
    let c0 = w.node.counters().unwrap();
    let outside = w.run(false, &["tcp", &vip6.to_string(), "500"]);
    assert!(outside.ok, "{}", outside.output);
    assert_eq!(outside.peer, Some(vip6), "{}", outside.output);
    let u = w.run(false, &["udp", &dns6.to_string(), "3", "500"]);
    assert!(u.ok, "{}", u.output);
    assert_eq!(u.from, Some(dns6), "{}", u.output);
    let d = w.node.counters().unwrap().since(&c0);
    assert!(d.get("lb_packet_new") >= 2, "{d}");
    // The IPv4 ClusterIP of the same Service goes to the IPv4 endpoint.
    assert_eq!(w.spread(3), [3, 0]);
    assert_eq!(frontends(&w.node), 4, "{}", w.log());
    // No IPv6 endpoint: the pod's connect is refused (ICMPv6 port
    // unreachable from 5.14 on), the IPv4 side unaffected.
    w.endpoints6(&[]);
    let mut last = None;
    assert!(
        wait_for(FOLLOW, || {
            let r = tcp6();
            let done = r.errno == Some(no_endpoint_errno());
            last = Some(r);
            done
        }),
        "{:?}\n{}",
        last.map(|r| r.output),
        w.log()
    );
    let u = w.run(true, &["udp-connected", &dns6.to_string(), "1", "2000"]);
    assert_eq!(u.errno, Some(no_endpoint_errno()), "{}", u.output);
    assert_eq!(w.spread(2), [2, 0]);
    stop(a, &w.node, LOG).unwrap();
}

#[test]
fn a_restarted_agent_takes_over_the_maps_and_catches_up() {
    let w = World::new();
    w.endpoints(&[(0, true, true, false), (1, true, true, false)]);
    let a = w.proxy();
    assert!(wait_for(FOLLOW, || w.tcp().ok), "{}", w.log());
    let ids = |lb: &Value| -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = lb["servicePorts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["frontends"][0].as_str().unwrap().to_string(),
                    p["id"].as_u64().unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    };
    let before = w
        .node
        .sluicectl_json(&["services", "lb", "--json"])
        .unwrap();
    stop(a, &w.node, LOG).unwrap();
    // While no agent runs: connections keep working; an endpoint goes and
    // another Service comes.
    assert!(w.tcp().ok);
    w.endpoints(&[(1, true, true, false)]);
    w.api.set_service(
        "shop",
        "other",
        &json!({"clusterIP": "10.96.7.20", "clusterIPs": ["10.96.7.20"],
                "ports": [{"port": 81, "protocol": "TCP", "targetPort": TARGET}]}),
        &json!({}),
    );
    let b = w.proxy();
    assert!(
        wait_for(FOLLOW, || w.spread(4) == [0, 4]),
        "the restarted agent did not catch up\n{}",
        w.log()
    );
    let after = w
        .node
        .sluicectl_json(&["services", "lb", "--json"])
        .unwrap();
    // The Service ports it found keep their ids; the new one gets a free id.
    let (b_ids, a_ids) = (ids(&before), ids(&after));
    for (f, id) in &b_ids {
        assert!(
            a_ids.contains(&(f.clone(), *id)),
            "{f} lost id {id}: {before} -> {after}"
        );
    }
    assert_eq!(a_ids.len(), b_ids.len() + 1, "{after}");
    let other = a_ids
        .iter()
        .find(|(f, _)| f.starts_with("10.96.7.20:81"))
        .unwrap();
    assert!(!b_ids.iter().any(|(_, id)| *id == other.1), "{after}");
    stop(b, &w.node, LOG).unwrap();
}

/// kube-proxy clears the conntrack entries of a removed UDP endpoint so
/// that DNS recovers when a `CoreDNS` pod moves; the socket hook connected the
/// socket to the backend itself, so the agent closes such sockets: the
/// pod's held socket fails (`ECONNABORTED`) once its backend is removed, and
/// a new one reaches the other backend. The other backend's sockets stay.
#[test]
fn connected_udp_sockets_to_a_removed_endpoint_are_closed() {
    let w = World::new();
    w.endpoints(&[(0, true, true, false), (1, true, true, false)]);
    let a = w.proxy();
    let dns = format!("{CLUSTER_IP}:{DNS}");
    assert!(
        wait_for(FOLLOW, || w
            .run(true, &["udp-connected", &dns, "1", "500"])
            .ok),
        "{}",
        w.log()
    );
    let client_ip = w.client_ip;
    let udp_from_client = |i: usize| {
        w.backends[i]
            .1
            .peers()
            .udp
            .iter()
            .filter(|p| p.ip() == client_ip)
            .count()
    };
    let before = [udp_from_client(0), udp_from_client(1)];
    std::thread::scope(|s| {
        let held = s.spawn(|| w.run(true, &["udp-hold", &dns, "30"]));
        // The socket's backend: the one its datagrams reach.
        let mut target = None;
        assert!(
            wait_for(FOLLOW, || {
                target = (0..2).find(|i| udp_from_client(*i) > before[*i] + 2);
                target.is_some()
            }),
            "the held socket's datagrams reached no backend"
        );
        let gone = target.unwrap();
        let keep = 1 - gone;
        w.endpoints(&[(keep, true, true, false)]);
        let r = held.join().unwrap();
        // Destroyed: disconnected (a send fails with EDESTADDRREQ) with
        // ECONNABORTED pending (a receive fails with it).
        assert!(
            matches!(r.errno, Some(libc::ECONNABORTED | libc::EDESTADDRREQ)),
            "the held socket was not closed: {}\n{}",
            r.output,
            w.log()
        );
        assert!(r.echoes > 0, "{}", r.output);
        assert!(
            w.log().contains("connected sockets to them closed"),
            "{}",
            w.log()
        );
        // A new socket reaches the backend that stayed.
        let u = w.run(true, &["udp-connected", &dns, "3", "500"]);
        assert!(u.ok, "{}", u.output);
        assert!(udp_from_client(keep) > before[keep]);
    });
    stop(a, &w.node, LOG).unwrap();
}

/// Hairpin: a pod whose Service picks the pod itself reaches itself (the
/// socket connects to its own address: no packet leaves the pod), and the
/// peer shows as the Service.
#[test]
fn a_pod_reaches_itself_through_its_service() {
    let w = World::new();
    w.endpoints(&[(0, true, true, false)]);
    let a = w.proxy();
    assert!(wait_for(FOLLOW, || w.tcp().ok), "{}", w.log());
    let vip = format!("{CLUSTER_IP}:{HTTP}");
    let before = w.backends[0].1.peers().tcp.len();
    let r = client_in(
        Path::new(CLIENT),
        &w.backend_pods[0].path,
        Some(&w.cgroup),
        &["tcp", &vip, "2000"],
    )
    .unwrap();
    assert!(r.ok, "{}", r.output);
    assert_eq!(r.peer, Some(vip.parse().unwrap()), "{}", r.output);
    let peers = w.backends[0].1.peers().tcp;
    assert_eq!(peers.len(), before + 1);
    assert_eq!(
        peers.last().map(SocketAddr::ip),
        Some(w.ip(0)),
        "from itself"
    );
    stop(a, &w.node, LOG).unwrap();
}

/// `internalTrafficPolicy: Local` on a node without a local endpoint: a
/// pod's connect is dropped (it times out, nobody refuses), as kube-proxy's
/// "has no local endpoints" DROP rule does; refused only where the Service
/// has no endpoint anywhere. Once the endpoint is this node's, it is reached.
#[test]
fn internal_local_policy_without_a_local_endpoint_drops_as_kube_proxy_does() {
    let w = World::new();
    w.api.set_service(
        "shop",
        "web",
        &json!({"clusterIP": CLUSTER_IP, "clusterIPs": [CLUSTER_IP],
                "internalTrafficPolicy": "Local",
                "ports": [{"name": "http", "port": HTTP, "protocol": "TCP", "targetPort": TARGET},
                          {"name": "dns", "port": DNS, "protocol": "UDP", "targetPort": TARGET}]}),
        &json!({}),
    );
    // The only endpoint is on another node.
    let elsewhere = |node: &str| {
        w.api.set_endpoint_slice(
            "shop",
            "web-1",
            "web",
            "IPv4",
            &json!([{"addresses": [w.ip(0).to_string()], "nodeName": node}]),
            &json!([{"name": "http", "port": TARGET, "protocol": "TCP"},
                     {"name": "dns", "port": TARGET, "protocol": "UDP"}]),
        );
    };
    elsewhere("node-b");
    let a = w.proxy();
    assert!(
        wait_for(FOLLOW, || frontends(&w.node) > 0),
        "no frontends\n{}",
        w.log()
    );
    let c0 = w.node.counters().unwrap();
    let before = w.backends[0].1.peers().tcp.len();
    let r = w.run(true, &["tcp", &format!("{CLUSTER_IP}:{HTTP}"), "500"]);
    assert!(
        !r.ok,
        "reached under Local without a local endpoint: {}",
        r.output
    );
    if no_endpoint_errno() == libc::ECONNREFUSED {
        // Dropped in from_pod: a timeout, not a refusal.
        assert_eq!(r.errno, None, "{}", r.output);
        let d = w.node.counters().unwrap().since(&c0);
        assert!(d.get("drop_lb_no_endpoint") >= 1, "{d}");
    } else {
        // Before 5.14 the hook refuses every such connect (EPERM).
        assert_eq!(r.errno, Some(libc::EPERM), "{}", r.output);
    }
    assert_eq!(w.backends[0].1.peers().tcp.len(), before);
    // The endpoint is this node's: reached.
    elsewhere("node-a");
    assert!(
        wait_for(FOLLOW, || w.tcp().ok),
        "the local endpoint was never reached\n{}",
        w.log()
    );
    stop(a, &w.node, LOG).unwrap();
}

/// The proxy's watches resume from bookmarks and, where the history they
/// would resume from is gone (`410 Expired`, at a watch's start or inside
/// an open one), list again: an endpoint removed while the watches were
/// held back still stops getting connections, and one added still gets
/// them.
#[test]
fn endpoint_changes_a_410_hid_are_caught_up_by_listing_again() {
    let w = World::new();
    w.endpoints(&[(0, true, true, false), (1, true, true, false)]);
    let a = w.proxy();
    assert!(wait_for(FOLLOW, || w.tcp().ok), "{}", w.log());
    let slice_lists = || {
        w.api
            .requests()
            .iter()
            .filter(|r| {
                r.starts_with("GET /apis/discovery.k8s.io/v1/endpointslices?")
                    && !r.contains("watch=")
            })
            .count()
    };
    // Bookmarks flow while nothing changes (the World sends one every
    // 300 ms).
    let marks = w.api.bookmarks_sent();
    assert!(
        wait_for(Duration::from_secs(5), || w.api.bookmarks_sent() > marks),
        "no bookmark sent to the proxy's watches"
    );
    // 410 at the watches' start: the change never reaches them.
    let (lists, expired) = (slice_lists(), w.api.expired_watches());
    w.api.hold_watches();
    w.endpoints(&[(1, true, true, false)]);
    w.api.expire();
    assert!(
        wait_for(FOLLOW, || http_backends(&w) == [w.ip(1)]),
        "the removed endpoint is still a backend after a 410\n{}\n{:?}",
        w.log(),
        w.api.requests()
    );
    assert_eq!(w.spread(8), [0, 8]);
    assert!(w.api.expired_watches() > expired, "{:?}", w.api.requests());
    assert!(slice_lists() > lists, "{:?}", w.api.requests());
    // 410 inside an open watch: the history compacted under it.
    let (lists, expired) = (slice_lists(), w.api.expired_watches());
    w.api.hold_watches();
    w.endpoints(&[(0, true, true, false)]);
    w.api.compact();
    assert!(
        wait_for(FOLLOW, || http_backends(&w) == [w.ip(0)]),
        "the endpoint change is not followed after a 410 in a watch\n{}\n{:?}",
        w.log(),
        w.api.requests()
    );
    assert_eq!(w.spread(8), [8, 0]);
    assert!(w.api.expired_watches() > expired, "{:?}", w.api.requests());
    assert!(slice_lists() > lists, "{:?}", w.api.requests());
    stop(a, &w.node, LOG).unwrap();
}

/// The TCP Service port's backend addresses in the maps (`sluicectl
/// services lb`).
fn http_backends(w: &World) -> Vec<IpAddr> {
    let Ok(v) = w.node.sluicectl_json(&["services", "lb", "--json"]) else {
        return Vec::new();
    };
    v["servicePorts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["frontends"] == json!([format!("{CLUSTER_IP}:{HTTP}/tcp")]))
        .and_then(|p| p["backends"].as_array())
        .into_iter()
        .flatten()
        .filter_map(|b| b.as_str()?.parse::<SocketAddr>().ok())
        .map(|a| a.ip())
        .collect()
}
