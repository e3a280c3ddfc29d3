//! Sluice's Services from outside: NodePorts and load balancer IPs reached
//! through the node's uplink, translated in `uplink_in` (`lb/uplink.rs`),
//! with the real agent (`route-sync --service-proxy`, which keeps the node's
//! addresses in the datapath too) reading the stand-in API server.
//!
//! The wire: the node's `up0` (192.168.50.1) to a router (192.168.50.2),
//! which forwards to a far host (192.168.51.2), the client. Nobody routes to
//! the pods. The router plays another node: an endpoint of its own
//! (`node-b`) is a remote backend.
//!
//! Checked with real traffic: a NodePort from outside reaches a pod on this
//! node with the client's own address (TCP and UDP), and the client sees the
//! node address and NodePort as its peer; with `externalTrafficPolicy:
//! Cluster` an endpoint on another node is reached from the node address and
//! its answers go back to the client; with `Local` a load balancer IP's
//! packets go only to this node's endpoints, none: dropped, and the health
//! check node port answers 503 and then 200 as kube-proxy's does.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use std::{
    io::{Read, Write},
    net::{IpAddr, SocketAddr, TcpStream},
    path::Path,
    time::Duration,
};

use serde_json::{json, Value};
use sluice_tests::{
    agent::{log_of, start as agent, stop},
    apiserver::ApiServer,
    counters::Counters,
    ctl::{wait_lease, CtlChild},
    fixtures::{add, UPLINK},
    host::{gro_on, tx_checksum_off},
    hostport::{client_in, Cgroup, ClientReport},
    masq::{
        in_netns, routed_external_host6, wait_for, EchoServer, Routed, FAR6_IP, FAR_IP,
        NODE6_ROUTED, ROUTER6_IP, ROUTER_FAR_IP, ROUTER_IP,
    },
    Node, Pod,
};

const CLIENT: &str = env!("CARGO_BIN_EXE_sluice-test-client");
const CIDR: &str = "10.94.0.0/24";
const CIDR6: &str = "fd00:94::/64";
const CLUSTER_IP: &str = "10.96.8.10";
const CLUSTER_IP6: &str = "fd00:96::8:10";
const NODE_IP: &str = "192.168.50.1";
/// A load balancer's address, routed by the router to this node.
const LB_IP: &str = "192.168.60.10";
const HTTP: u16 = 80;
const DNS: u16 = 53;
const TARGET: u16 = 8080;
const NODE_PORT: u16 = 30080;
const HEALTH_PORT: u16 = 32100;
const FOLLOW: Duration = Duration::from_secs(20);
const LOG: &str = "route-sync.log";

struct World {
    node: Node,
    wire: Routed,
    /// The pod on this node and its address.
    local: (Pod, IpAddr, EchoServer),
    /// The same pod's IPv6 address and server.
    local6: (IpAddr, EchoServer),
    /// The router's own echo server: an endpoint on another node.
    remote: EchoServer,
    /// The router's, on its IPv6 address.
    remote6: EchoServer,
    cgroup: Cgroup,
    api: ApiServer,
}

impl World {
    fn new() -> Self {
        Self::with_xdp("off")
    }

    /// `xdp`: the config's XDP mode (native: the router's frames carry
    /// complete checksums, as a NIC's do).
    fn with_xdp(xdp: &str) -> Self {
        let node = Node::new().unwrap();
        let wire = routed_external_host6(&node, 1500).unwrap();
        if xdp == "native" {
            tx_checksum_off(&wire.router.netns_path(), "r0").unwrap();
            // What the uplink's XDP sends back out reaches the router.
            gro_on(&wire.router.netns_path(), "r0").unwrap();
        }
        // The load balancer's address reaches this node.
        wire.router
            .ip(&["route", "add", &format!("{LB_IP}/32"), "via", NODE_IP])
            .unwrap();
        wire.far
            .ip(&["route", "add", &format!("{LB_IP}/32"), "via", ROUTER_FAR_IP])
            .unwrap();
        // The ClusterIP too, as a router announcing the Service range does.
        wire.router
            .ip(&["route", "add", &format!("{CLUSTER_IP}/32"), "via", NODE_IP])
            .unwrap();
        wire.far
            .ip(&[
                "route",
                "add",
                &format!("{CLUSTER_IP}/32"),
                "via",
                ROUTER_FAR_IP,
            ])
            .unwrap();
        let mut conf = node.conf("1.0.0", CIDR);
        conf["ipam"]["ranges"] = json!([[{"subnet": CIDR}], [{"subnet": CIDR6}]]);
        conf["ipam"].as_object_mut().unwrap().remove("subnet");
        conf["ipam"]["routes"] = json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]);
        conf["uplink"] = json!(UPLINK);
        conf["xdp"] = json!(xdp);
        let pod = node.pod("b").unwrap();
        let ips: Vec<IpAddr> = add(&node, &conf, "lb-up-backend", &pod)
            .ips
            .iter()
            .map(|(ip, _)| *ip)
            .collect();
        let ip = *ips.iter().find(|ip| ip.is_ipv4()).unwrap();
        let ip6 = *ips.iter().find(|ip| ip.is_ipv6()).unwrap();
        let server = EchoServer::start(&pod.path, SocketAddr::new(ip, TARGET)).unwrap();
        let server6 = EchoServer::start(&pod.path, SocketAddr::new(ip6, TARGET)).unwrap();
        let remote = EchoServer::start(
            &wire.router.netns_path(),
            SocketAddr::new(ROUTER_IP.parse().unwrap(), TARGET),
        )
        .unwrap();
        let remote6 = EchoServer::start(
            &wire.router.netns_path(),
            SocketAddr::new(ROUTER6_IP.parse().unwrap(), TARGET),
        )
        .unwrap();
        let api = ApiServer::start(&node.netns_path(), "127.0.0.1:0").unwrap();
        api.set_bookmark_interval(Duration::from_millis(300));
        api.set_node("node-a", &[CIDR], &[NODE_IP]);
        Self {
            node,
            wire,
            local: (pod, ip, server),
            local6: (ip6, server6),
            remote,
            remote6,
            cgroup: Cgroup::new().unwrap(),
            api,
        }
    }

    /// The Service: `type` with `policy` as its externalTrafficPolicy.
    fn service(&self, kind: &str, policy: &str) {
        let mut spec = json!({"type": kind, "clusterIP": CLUSTER_IP,
            "clusterIPs": [CLUSTER_IP, CLUSTER_IP6], "ipFamilies": ["IPv4", "IPv6"],
            "ipFamilyPolicy": "PreferDualStack",
            "externalTrafficPolicy": policy,
            "ports": [{"name": "http", "port": HTTP, "protocol": "TCP", "targetPort": TARGET,
                       "nodePort": NODE_PORT},
                      {"name": "dns", "port": DNS, "protocol": "UDP", "targetPort": TARGET,
                       "nodePort": NODE_PORT}]});
        let mut status = json!({});
        if kind == "LoadBalancer" {
            spec["healthCheckNodePort"] = json!(HEALTH_PORT);
            status = json!({"loadBalancer": {"ingress": [{"ip": LB_IP}]}});
        }
        self.api.set_service("shop", "web", &spec, &status);
    }

    /// The IPv6 endpoints: this node's pod (`local`) and the router's
    /// (`remote`).
    fn endpoints6(&self, local: bool, remote: bool) {
        let mut list: Vec<Value> = Vec::new();
        if local {
            list.push(json!({"addresses": [self.local6.0.to_string()], "nodeName": "node-a"}));
        }
        if remote {
            list.push(json!({"addresses": [ROUTER6_IP], "nodeName": "node-b"}));
        }
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

    /// The endpoints: this node's pod (`local`) and the router's (`remote`).
    fn endpoints(&self, local: bool, remote: bool) {
        let mut list: Vec<Value> = Vec::new();
        if local {
            list.push(json!({"addresses": [self.local.1.to_string()], "nodeName": "node-a"}));
        }
        if remote {
            list.push(json!({"addresses": [ROUTER_IP], "nodeName": "node-b"}));
        }
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

    fn agent(&self) -> sluice_tests::exec::Running {
        agent(
            &self.node,
            self.api.port(),
            &[
                "route-sync",
                "--node-name",
                "node-a",
                "--service-proxy",
                "--service-cgroup",
                &self.cgroup.display(),
                "--cni-state-dir",
                &self.node.state_dir().display().to_string(),
                "--node-ip",
                NODE_IP,
                "--service-state-file",
                &self.state_file(),
            ],
            LOG,
        )
        .unwrap()
    }

    /// One client run on the far host (outside the cluster).
    fn far(&self, args: &[&str]) -> ClientReport {
        client_in(Path::new(CLIENT), &self.wire.far.netns_path(), None, args).unwrap()
    }

    fn tcp_to(&self, ip: &str, port: u16) -> ClientReport {
        self.far(&["tcp", &format!("{ip}:{port}"), "2000"])
    }

    /// The health check node port's answer to the far host: status and body.
    fn health(&self) -> (u16, Value) {
        let to = SocketAddr::new(NODE_IP.parse().unwrap(), HEALTH_PORT);
        let raw = in_netns(&self.wire.far.netns_path(), move || {
            let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: node\r\n\r\n")?;
            let mut out = String::new();
            s.read_to_string(&mut out)?;
            Ok(out)
        })
        .unwrap_or_default();
        let Some((head, body)) = raw.split_once("\r\n\r\n") else {
            return (0, Value::Null);
        };
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        (code, serde_json::from_str(body).unwrap_or(Value::Null))
    }

    fn log(&self) -> String {
        log_of(&self.node, LOG)
    }

    /// The agent's state file (Service names and endpoint states).
    fn state_file(&self) -> String {
        self.node.dir().join("services.json").display().to_string()
    }
}

fn far_ip() -> IpAddr {
    FAR_IP.parse().unwrap()
}

#[test]
fn a_node_port_from_outside_reaches_a_pod_here_with_the_clients_own_address() {
    let w = World::new();
    w.service("NodePort", "Cluster");
    w.endpoints(true, false);
    let a = w.agent();
    let at = SocketAddr::new(NODE_IP.parse().unwrap(), NODE_PORT);
    let mut last = None;
    assert!(
        wait_for(FOLLOW, || {
            let r = w.tcp_to(NODE_IP, NODE_PORT);
            let ok = r.ok;
            last = Some(r);
            ok
        }),
        "far -> {at}: {:?}\n{}",
        last.map(|r| r.output),
        w.log()
    );
    // The monitor shows the new flow: client -> node:NodePort, to the pod.
    let m = CtlChild::monitor(&w.node, &["--json", "--type", "service", "--count", "1"]).unwrap();
    wait_lease(&w.node, true, Duration::from_secs(5)).unwrap();
    let r = w.tcp_to(NODE_IP, NODE_PORT);
    assert!(r.ok, "{}", r.output);
    // The answers come from what the client sent to.
    assert_eq!(r.peer, Some(at), "{}", r.output);
    let end = m.wait(Duration::from_secs(10)).unwrap();
    let events = end.json();
    assert_eq!(events.len(), 1, "{end:#?}");
    let want = json!({"type": "service-flow", "reason": "lb_uplink_new", "src": FAR_IP,
                      "dst": NODE_IP, "dport": NODE_PORT,
                      "natAddress": w.local.1.to_string(), "natPort": TARGET});
    for (k, v) in want.as_object().unwrap() {
        assert_eq!(&events[0][k], v, "{k}: {:#}", events[0]);
    }
    // The pod saw the client itself (no source NAT for a local endpoint).
    let peers = w.local.2.peers();
    assert!(
        peers.tcp.iter().all(|p| p.ip() == far_ip()) && !peers.tcp.is_empty(),
        "the pod's TCP peers: {:?}",
        peers.tcp
    );
    // UDP to the same NodePort: an echo back, from the NodePort.
    let u = w.far(&["udp", &at.to_string(), "3", "1000"]);
    assert!(u.ok, "{}", u.output);
    assert_eq!(u.from, Some(at), "{}", u.output);
    assert!(
        w.local.2.peers().udp.iter().any(|p| p.ip() == far_ip()),
        "the pod's UDP peers: {:?}",
        w.local.2.peers().udp
    );
    // The ClusterIP, routed to this node from outside: translated too (as
    // kube-proxy translates it), the client's address kept.
    let vip = SocketAddr::new(CLUSTER_IP.parse().unwrap(), HTTP);
    let r = w.tcp_to(CLUSTER_IP, HTTP);
    assert!(r.ok, "far -> {vip}: {}", r.output);
    assert_eq!(r.peer, Some(vip), "{}", r.output);
    assert!(
        w.local.2.peers().tcp.iter().all(|p| p.ip() == far_ip()),
        "the pod's TCP peers: {:?}",
        w.local.2.peers().tcp
    );
    let c = w.node.counters().unwrap();
    assert!(c.get("lb_uplink_new") >= 3, "{c:?}");
    assert!(c.get("lb_uplink_flow") >= 2, "{c:?}");
    // The operator's view: the NodePort once for the node's own
    // connections, once from outside.
    let v = w
        .node
        .sluicectl_json(&["services", "lb", "--json", "--state", &w.state_file()])
        .unwrap();
    let outside: Vec<&Value> = v["servicePorts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["fromOutside"] == json!(true))
        .collect();
    // TCP and UDP, IPv4 and IPv6, each named.
    assert_eq!(outside.len(), 4, "{v:#}");
    assert!(
        outside
            .iter()
            .all(|p| p["service"] == json!("shop/web") && p["port"].is_string()),
        "{v:#}"
    );
    assert!(
        outside.iter().any(|p| p["frontends"]
            .as_array()
            .unwrap()
            .contains(&json!(format!("0.0.0.0:{NODE_PORT}/tcp")))),
        "{v:#}"
    );
    stop(a, &w.node, LOG).unwrap();
}

/// The far host's TCP connection and UDP datagrams to the NodePort `at`,
/// once a connection gets through and `ready` holds: both answered from
/// `at`. The node's counters over that exchange.
fn exchange(w: &World, at: SocketAddr, ready: impl Fn() -> bool) -> Counters {
    let mut last = None;
    assert!(
        wait_for(FOLLOW, || {
            let r = w.far(&["tcp", &at.to_string(), "2000"]);
            let ok = r.ok && ready();
            last = Some(r.output);
            ok
        }),
        "far -> {at}: {last:?}\n{}\n{}",
        w.log(),
        w.node.counters().unwrap()
    );
    let c0 = w.node.counters().unwrap();
    let r = w.far(&["tcp", &at.to_string(), "2000"]);
    assert!(r.ok, "{}", r.output);
    assert_eq!(r.peer, Some(at), "{}", r.output);
    let u = w.far(&["udp", &at.to_string(), "3", "1000"]);
    assert!(u.ok, "{}", u.output);
    assert_eq!(u.from, Some(at), "{}", u.output);
    w.node.counters().unwrap().since(&c0)
}

#[test]
fn native_xdp_translates_a_node_ports_flows_to_a_pod_here_and_to_another_node() {
    let w = World::with_xdp("native");
    w.service("NodePort", "Cluster");
    w.endpoints(true, false);
    let a = w.agent();
    let at = SocketAddr::new(NODE_IP.parse().unwrap(), NODE_PORT);
    let at6 = SocketAddr::new(NODE6_ROUTED.parse().unwrap(), NODE_PORT);
    // Before 5.13 native XDP falls back to off on this veth uplink, and tc
    // does it all.
    let native = sluice_tests::kernel::xdp_mode("native") == "native";
    // The connection's packets and the datagrams went into the pod from
    // XDP, translated there.
    let d = exchange(&w, at, || true);
    if native {
        assert!(d.get("xdp_to_pod") >= 3, "{d}");
    }
    assert!(d.get("lb_uplink_flow") >= 3, "{d}");
    assert!(
        w.local.2.peers().tcp.iter().all(|p| p.ip() == far_ip()),
        "the pod's TCP peers: {:?}",
        w.local.2.peers().tcp
    );
    // IPv6: the same, from XDP.
    w.endpoints6(true, false);
    let d = exchange(&w, at6, || true);
    if native {
        assert!(d.get("xdp_to_pod") >= 3, "{d}");
    }
    assert!(d.get("lb_uplink_flow") >= 3, "{d}");
    let far6: IpAddr = FAR6_IP.parse().unwrap();
    let peers = w.local6.1.peers();
    assert!(
        !peers.tcp.is_empty() && peers.tcp.iter().all(|p| p.ip() == far6),
        "the pod's IPv6 TCP peers: {:?}",
        peers.tcp
    );
    // The endpoint on another node (the router's): the client's packets
    // go back out from XDP to it, from the node address, and its answers
    // back out to the client (both ways: the connection's and the
    // datagrams' packets), once the FIB knows the neighbours.
    w.endpoints(false, true);
    let d = exchange(&w, at, || !w.remote.peers().tcp.is_empty());
    if native {
        assert!(d.get("xdp_lb_send") >= 6, "{d}");
    }
    let node_ip: IpAddr = NODE_IP.parse().unwrap();
    assert!(
        w.remote.peers().tcp.iter().all(|p| p.ip() == node_ip),
        "node-b's peers: {:?}",
        w.remote.peers().tcp
    );
    // The same over IPv6.
    w.endpoints6(false, true);
    let d = exchange(&w, at6, || !w.remote6.peers().tcp.is_empty());
    if native {
        assert!(d.get("xdp_lb_send") >= 6, "{d}");
    }
    let node6: IpAddr = NODE6_ROUTED.parse().unwrap();
    assert!(
        w.remote6.peers().tcp.iter().all(|p| p.ip() == node6),
        "node-b's IPv6 peers: {:?}",
        w.remote6.peers().tcp
    );
    stop(a, &w.node, LOG).unwrap();
}

#[test]
fn cluster_policy_reaches_an_endpoint_on_another_node_from_the_node_address() {
    let w = World::new();
    w.service("NodePort", "Cluster");
    w.endpoints(false, true);
    let a = w.agent();
    let at = SocketAddr::new(NODE_IP.parse().unwrap(), NODE_PORT);
    let mut last = None;
    assert!(
        wait_for(FOLLOW, || {
            let r = w.tcp_to(NODE_IP, NODE_PORT);
            let ok = r.ok;
            last = Some(r);
            ok
        }),
        "far -> {at} (to node-b's endpoint): {:?}\n{}",
        last.map(|r| r.output),
        w.log()
    );
    let r = w.tcp_to(NODE_IP, NODE_PORT);
    assert_eq!(r.peer, Some(at), "{}", r.output);
    // node-b's endpoint saw the node (source NAT), so its answers come back
    // here to be translated.
    let peers = w.remote.peers();
    assert!(
        !peers.tcp.is_empty() && peers.tcp.iter().all(|p| p.ip().to_string() == NODE_IP),
        "node-b's endpoint's TCP peers: {:?}",
        peers.tcp
    );
    let u = w.far(&["udp", &at.to_string(), "3", "1000"]);
    assert!(u.ok, "{}", u.output);
    assert_eq!(u.from, Some(at), "{}", u.output);
    stop(a, &w.node, LOG).unwrap();
}

#[test]
fn local_policy_sends_only_to_this_nodes_endpoints_and_the_health_check_says_so() {
    let w = World::new();
    w.service("LoadBalancer", "Local");
    // Only node-b has an endpoint: this node drops the load balancer's
    // packets and tells the load balancer so.
    w.endpoints(false, true);
    let a = w.agent();
    let mut last = (0, Value::Null);
    assert!(
        wait_for(FOLLOW, || {
            last = w.health();
            last.0 == 503
        }),
        "health check without a local endpoint: {last:?}\n{}",
        w.log()
    );
    assert_eq!(
        last.1,
        json!({"service": {"namespace": "shop", "name": "web"},
               "localEndpoints": 0, "serviceProxyHealthy": true})
    );
    let dropped = w.node.counters().unwrap().get("drop_lb_no_endpoint");
    let r = w.tcp_to(LB_IP, HTTP);
    assert!(!r.ok, "reached without a local endpoint: {}", r.output);
    assert!(
        w.remote.peers().tcp.is_empty(),
        "node-b's endpoint was reached"
    );
    assert!(
        w.node.counters().unwrap().get("drop_lb_no_endpoint") > dropped,
        "not counted as a drop"
    );
    // A local endpoint: the load balancer's packets reach it, with the
    // client's address; the health check says 200.
    w.endpoints(true, true);
    assert!(
        wait_for(FOLLOW, || {
            last = w.health();
            last.0 == 200
        }),
        "health check with a local endpoint: {last:?}\n{}",
        w.log()
    );
    assert_eq!(last.1["localEndpoints"], json!(1));
    let lb = SocketAddr::new(LB_IP.parse().unwrap(), HTTP);
    let mut tries = 0;
    while tries < 6 {
        let r = w.tcp_to(LB_IP, HTTP);
        assert!(r.ok, "far -> {lb}: {}\n{}", r.output, w.log());
        assert_eq!(r.peer, Some(lb), "{}", r.output);
        tries += 1;
    }
    assert!(
        w.remote.peers().tcp.is_empty(),
        "node-b's endpoint got a connection under Local"
    );
    let peers = w.local.2.peers();
    assert!(
        peers.tcp.len() >= 6 && peers.tcp.iter().all(|p| p.ip() == far_ip()),
        "the pod's TCP peers: {:?}",
        peers.tcp
    );
    stop(a, &w.node, LOG).unwrap();
}

#[test]
fn an_ipv6_node_port_from_outside_reaches_a_pod_here_and_an_endpoint_elsewhere() {
    let w = World::new();
    w.service("NodePort", "Cluster");
    w.endpoints(true, false);
    w.endpoints6(true, false);
    let a = w.agent();
    let at = SocketAddr::new(NODE6_ROUTED.parse().unwrap(), NODE_PORT);
    let far6: IpAddr = FAR6_IP.parse().unwrap();
    let mut last = None;
    assert!(
        wait_for(FOLLOW, || {
            let r = w.far(&["tcp", &at.to_string(), "2000"]);
            let ok = r.ok;
            last = Some(r);
            ok
        }),
        "far -> {at}: {:?}\n{}\ncounters: {:?}\n{:#}",
        last.map(|r| r.output),
        w.log(),
        w.node.counters().unwrap(),
        w.node
            .sluicectl_json(&["services", "lb", "--json"])
            .unwrap()
    );
    let r = w.far(&["tcp", &at.to_string(), "2000"]);
    assert_eq!(r.peer, Some(at), "{}", r.output);
    let peers = w.local6.1.peers();
    assert!(
        !peers.tcp.is_empty() && peers.tcp.iter().all(|p| p.ip() == far6),
        "the pod's IPv6 TCP peers: {:?}",
        peers.tcp
    );
    let u = w.far(&["udp", &at.to_string(), "3", "1000"]);
    assert!(u.ok, "{}", u.output);
    assert_eq!(u.from, Some(at), "{}", u.output);
    // The endpoint moves to another node: reached from the node address.
    w.endpoints6(false, true);
    let mut last = None;
    assert!(
        wait_for(FOLLOW, || {
            let r = w.far(&["tcp", &at.to_string(), "2000"]);
            let ok = r.ok && !w.remote6.peers().tcp.is_empty();
            last = Some(r);
            ok
        }),
        "far -> {at} (node-b's endpoint): {:?}\n{}",
        last.map(|r| r.output),
        w.log()
    );
    let node6: IpAddr = NODE6_ROUTED.parse().unwrap();
    assert!(
        w.remote6.peers().tcp.iter().all(|p| p.ip() == node6),
        "node-b's IPv6 peers: {:?}",
        w.remote6.peers().tcp
    );
    stop(a, &w.node, LOG).unwrap();
}

#[test]
fn a_service_port_without_any_endpoint_refuses_from_outside_as_kube_proxy_does() {
    let w = World::new();
    w.service("NodePort", "Cluster");
    w.endpoints(false, false);
    let a = w.agent();
    // (The node's own stack refuses too, nothing listens there: wait for
    // the frontends from outside, then count Sluice's answers.)
    assert!(
        wait_for(FOLLOW, || {
            w.node
                .sluicectl_json(&["services", "lb", "--json"])
                .is_ok_and(|v| {
                    v["servicePorts"].as_array().is_some_and(|p| {
                        p.iter().filter(|p| p["fromOutside"] == json!(true)).count() == 4
                    })
                })
        }),
        "no frontends from outside\n{}",
        w.log()
    );
    let c0 = w.node.counters().unwrap();
    // kube-proxy's KUBE-EXTERNAL-SERVICES REJECT: port unreachable, the
    // client's connect refused at once (not a timeout).
    let r = w.tcp_to(NODE_IP, NODE_PORT);
    assert!(r.refused(), "{}", r.output);
    let at = SocketAddr::new(NODE_IP.parse().unwrap(), NODE_PORT);
    let u = w.far(&["udp-connected", &at.to_string(), "2", "1000"]);
    assert!(!u.ok, "{}", u.output);
    assert_eq!(u.errno, Some(libc::ECONNREFUSED), "{}", u.output);
    // The ClusterIP routed here from outside: refused too (kube-proxy's
    // REJECT in KUBE-SERVICES, which FORWARD walks).
    let r = w.tcp_to(CLUSTER_IP, HTTP);
    assert!(r.refused(), "far -> {CLUSTER_IP}:{HTTP}: {}", r.output);
    let d = w.node.counters().unwrap().since(&c0);
    assert!(d.get("drop_lb_no_endpoint") >= 3, "{d}");
    assert_eq!(d.get("uplink_pass"), 0, "{d}");
    stop(a, &w.node, LOG).unwrap();
}
