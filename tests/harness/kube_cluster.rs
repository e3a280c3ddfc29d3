//! A small Kubernetes cluster for the Service tests, built from namespaces:
//! two nodes whose pods are attached by Sluice or by the reference chain, a
//! router between them that is also the external client and the host of the
//! API server (a host-network endpoint off both nodes), kube-proxy's rules on
//! each node ([`crate::kube_proxy`], the real tools), an echo server in every
//! pod that notes who talked to it, and the paths a cluster's Service traffic
//! takes ([`Case`]), each run for real with the source each side saw checked;
//! and a Service without endpoints, which kube-proxy refuses
//! ([`Cluster::no_endpoint_tries`]).
//!
//! The same cluster runs Sluice's own Services instead
//! ([`Cluster::with_sluice_services`]: no kube-proxy rule written, the agent
//! `route-sync --service-proxy` on each node, see [`crate::kube_services`]),
//! and the same cases are its oracle: each must give kube-proxy's answer or
//! the difference [`sluice_answer`] names, with why.
//!
//! ```text
//!   node-1 (up0 192.168.61.1)          router (ext1 192.168.61.2, ext2 192.168.62.2,
//!     pods 10.64.1.0/24, fd00:64:0:1::/64      API server 192.168.99.10:6443 on lo)
//!     client, server-1 ---------------- router ---------------- node-2 (up0 192.168.62.1)
//!                                                                 pods 10.64.2.0/24: server-2
//! ```
//!
//! The router forwards and routes each node's pod range to it, so pods reach
//! each other untranslated and, without masquerade, the API server answers a
//! pod directly. Everything is removed when the [`Cluster`] drops (its nodes,
//! pods and router are values that delete their namespaces).
use std::{
    fmt::{self, Write as _},
    io::{Read, Write},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket},
    path::Path,
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use crate::{
    err, exec,
    fixtures::add,
    host::{self, Host},
    hostport::{client_in, Cgroup, ClientReport},
    kube_proxy::{self, Endpoint, Mode, Port, Protocol, Proxy, Service},
    kube_services::{service_ports, AgentNode, SluiceServices},
    masq::{in_netns, sysctl, EchoServer, Pinger, Pinger6},
    node::{Node, Pod},
    Result,
};

/// The cluster's pod range (both nodes' pod CIDRs are in it).
pub const CLUSTER_CIDR4: &str = "10.64.0.0/16";
pub const CLUSTER_CIDR6: &str = "fd00:64::/56";
/// The Service ranges.
pub const SERVICE_CIDR4: &str = "10.96.0.0/16";
pub const SERVICE_CIDR6: &str = "fd00:96::/112";
/// Where every pod's echo server listens (TCP and UDP, both families).
pub const POD_PORT: u16 = 8080;
/// The API server, on the router's loopback (a host-network endpoint off the
/// nodes, as a control plane node's address is).
pub const API4: Ipv4Addr = Ipv4Addr::new(192, 168, 99, 10);
pub const API6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 0x10);
pub const API_PORT: u16 = 6443;
/// An external IP and a load balancer IP of Services; the router routes them
/// to node 1.
pub const EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 100, 10);
pub const LB_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 101, 10);
/// NodePorts: one Service with `externalTrafficPolicy: Cluster`, one with
/// `Local`, one LoadBalancer.
pub const NODE_PORT_CLUSTER: u16 = 30080;
pub const NODE_PORT_LOCAL: u16 = 30081;
pub const NODE_PORT_LB: u16 = 30082;
/// The Service without endpoints (`default/empty`, [`service_ip`] 70): an
/// HTTP port (TCP 80) and a DNS port (UDP 53), in each family. kube-proxy
/// REJECTs what is sent to it (iptables: filter `KUBE-SERVICES`, "has no
/// endpoints"; nftables: `no-endpoint-services` to `reject-chain`): an ICMP
/// port unreachable, `ECONNREFUSED` in the client.
pub const NO_ENDPOINTS: u16 = 70;

/// Longest a case waits for a connection or an answer: a case that fails
/// times out, and the instrument checks expect some to. (Under emulation in
/// the kernel matrix a first connection across both nodes took over 3 s.)
const WAIT: Duration = Duration::from_secs(6);

/// Who attaches the pods.
#[derive(Clone, Copy, Debug)]
pub enum Cni {
    Sluice(Sluice),
    /// bridge (a gateway bridge with hairpin mode, as kubenet set it up) and
    /// host-local, no masquerade: the baseline, and a check of the instrument.
    Reference,
}

/// Sluice's settings for the cluster's pods.
#[derive(Clone, Copy, Debug)]
pub struct Sluice {
    pub ip_masq: bool,
    /// `podAttach`: `tc` or `tcx`.
    pub pod_attach: &'static str,
    /// `podDevice`: `veth` or `auto` (netkit where the kernel has it).
    pub pod_device: &'static str,
    /// Whether the config names the Service ranges (`serviceCIDRs`).
    pub service_cidrs: bool,
    /// `xdp` on the uplink: `auto` (off on these veth uplinks) or `native`
    /// (the router then sends complete checksums, as a NIC delivers them).
    pub xdp: &'static str,
}

impl Default for Sluice {
    fn default() -> Self {
        Self {
            ip_masq: false,
            pod_attach: "tc",
            pod_device: "veth",
            service_cidrs: true,
            xdp: "auto",
        }
    }
}

/// A pod of the cluster, serving on [`POD_PORT`].
pub struct KubePod {
    pub name: &'static str,
    /// Index of its node in [`Cluster::nodes`].
    pub node: usize,
    pub pod: Pod,
    pub ip4: IpAddr,
    pub ip6: Option<IpAddr>,
    pub server: EchoServer,
}

impl KubePod {
    /// Its address of the family.
    pub fn ip(&self, ipv6: bool) -> Result<IpAddr> {
        if ipv6 {
            self.ip6
                .ok_or_else(|| err!("pod {} has no IPv6 address", self.name))
        } else {
            Ok(self.ip4)
        }
    }
}

/// One node: its namespace (where the plugin runs), name and addresses.
pub struct KubeNode {
    pub node: Node,
    /// The Node's name (kube-proxy's `--hostname-override`).
    pub hostname: String,
    pub ip4: Ipv4Addr,
    pub ip6: Ipv6Addr,
    pub pod_cidr4: String,
    pub pod_cidr6: String,
    /// The network config its pods were attached with.
    pub conf: Value,
    /// Whether its config is a plain plugin config of the reference bridge.
    reference: bool,
}

/// The cluster. Pods: `client` and `server-1` on node 1, `server-2` on node 2.
pub struct Cluster {
    /// Sluice's own Services instead of kube-proxy's rules (`None`: the
    /// rules of [`Self::mode`]). First: its agents stop before the nodes go.
    pub sluice_services: Option<SluiceServices>,
    pub mode: Mode,
    pub cni: Cni,
    pub dual_stack: bool,
    pub router: Host,
    pub nodes: Vec<KubeNode>,
    pub pods: Vec<KubePod>,
    /// The API server (TCP and UDP echo) on the router.
    pub api: EchoServer,
}

/// Index of each pod in [`Cluster::pods`].
pub const CLIENT: usize = 0;
pub const SERVER_1: usize = 1;
pub const SERVER_2: usize = 2;

impl Cluster {
    /// Builds the cluster: router, two nodes with their pods, kube-proxy's
    /// rules of `mode` on each node for the Services of [`Self::services`].
    pub fn new(cni: Cni, mode: Mode, dual_stack: bool) -> Result<Self> {
        let cluster = Self::build(cni, mode, dual_stack)?;
        cluster.apply_kube_proxy()?;
        Ok(cluster)
    }

    /// Builds the same cluster with no kube-proxy rule written: Sluice's own
    /// Services instead ([`SluiceServices`]: on each node the agent
    /// `route-sync --service-proxy` with an API server serving
    /// [`Self::services`] of both families), every Service port programmed
    /// on both nodes before it returns. `client`: `sluice-test-client`, the
    /// process that runs in a node's hooks' cgroup for the pods' and the
    /// nodes' cases.
    pub fn with_sluice_services(cni: Cni, dual_stack: bool, client: &Path) -> Result<Self> {
        // `mode` is only a label here: nothing of it is written.
        let mut cluster = Self::build(cni, Mode::Iptables, dual_stack)?;
        let mut services = Vec::new();
        for ipv6 in cluster.families() {
            services.extend(cluster.services(ipv6)?);
        }
        let agents: Vec<AgentNode<'_>> = cluster
            .nodes
            .iter()
            .map(|n| AgentNode {
                node: &n.node,
                hostname: &n.hostname,
                ip4: n.ip4,
                ip6: n.ip6,
                pod_cidrs: if dual_stack {
                    vec![n.pod_cidr4.as_str(), n.pod_cidr6.as_str()]
                } else {
                    vec![n.pod_cidr4.as_str()]
                },
            })
            .collect();
        let s = SluiceServices::start(&agents, &services, client)?;
        drop(agents);
        cluster.sluice_services = Some(s);
        let nodes: Vec<&Node> = cluster.nodes.iter().map(|n| &n.node).collect();
        if let Some(s) = &cluster.sluice_services {
            s.wait_programmed(&nodes, service_ports(&services))?;
        }
        Ok(cluster)
    }

    /// Stops Sluice's agents (each must exit cleanly); nothing without them.
    pub fn stop_sluice_services(&mut self) -> Result<()> {
        let nodes: Vec<&Node> = self.nodes.iter().map(|n| &n.node).collect();
        match &mut self.sluice_services {
            Some(s) => s.stop(&nodes),
            None => Ok(()),
        }
    }

    /// The cluster without any Service implementation.
    fn build(cni: Cni, mode: Mode, dual_stack: bool) -> Result<Self> {
        let router = Host::new()?;
        let mut nodes = Vec::new();
        for n in 1..=2u8 {
            nodes.push(KubeNode::new(&router, n, cni, dual_stack)?);
        }
        sysctl(&router.netns_path(), "net.ipv4.ip_forward", "1")?;
        sysctl(&router.netns_path(), "net.ipv6.conf.all.forwarding", "1")?;
        router.ip(&["addr", "add", &format!("{API4}/32"), "dev", "lo"])?;
        router.ip(&["addr", "add", &format!("{API6}/128"), "dev", "lo"])?;
        // The external IP and the load balancer IP lead to node 1, as a
        // cloud's router or BGP would make them.
        for a in [EXTERNAL_IP, LB_IP] {
            router.ip(&["route", "add", &format!("{a}/32"), "via", "192.168.61.1"])?;
        }
        // The wires' neighbours resolved before the first case, both ways.
        for (i, n) in nodes.iter().enumerate() {
            let seq = u16::try_from(i).unwrap_or(0);
            // The router's ends of node i+1's wire (see KubeNode::new).
            let (rt4, rt6) = (
                Ipv4Addr::new(192, 168, 61 + u8::try_from(i).unwrap_or(0), 2),
                Ipv6Addr::new(0xfd00, 0x61 + seq, 0, 0, 0, 0, 0, 2),
            );
            let wait = Duration::from_secs(2);
            for (ns, v4, v6) in [
                (n.node.netns_path(), rt4, rt6),
                (router.netns_path(), n.ip4, n.ip6),
            ] {
                Pinger::new(&ns)?.ping(v4, 0x5e1c, seq, 3, wait)?;
                Pinger6::new(&ns)?.ping(v6, 0x5e1c, seq, 3, wait)?;
            }
        }
        let api = EchoServer::start(
            &router.netns_path(),
            SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), API_PORT),
        )?;
        let mut pods = Vec::new();
        for (name, node) in [("client", 0), ("server-1", 0), ("server-2", 1)] {
            pods.push(nodes[node].attach(name, node)?);
        }
        Ok(Self {
            sluice_services: None,
            mode,
            cni,
            dual_stack,
            router,
            nodes,
            pods,
            api,
        })
    }

    /// The cluster's Services for one family, as kube-proxy sees them.
    pub fn services(&self, ipv6: bool) -> Result<Vec<Service>> {
        let node = |i: usize| self.nodes[i].hostname.as_str();
        let ep = |p: usize| -> Result<Endpoint> {
            Ok(Endpoint::new(
                self.pods[p].ip(ipv6)?,
                node(self.pods[p].node),
            ))
        };
        let vip = |n: u16| service_ip(ipv6, n);
        let tcp = |port: u16| Port::new("", Protocol::Tcp, port, POD_PORT);
        let named = |name: &str, proto: Protocol, port: u16| Port::new(name, proto, port, POD_PORT);
        let mut v = Vec::new();
        // A Service whose endpoint is on node 1, with a TCP and a UDP port (DNS).
        let mut web = Service::new(
            "default",
            "web",
            vip(10),
            vec![
                named("http", Protocol::Tcp, 80),
                named("dns", Protocol::Udp, 53),
            ],
        );
        web.endpoints = vec![ep(SERVER_1)?];
        v.push(web);
        // Its endpoint on node 2.
        let mut remote = Service::new(
            "default",
            "remote",
            vip(20),
            vec![
                named("http", Protocol::Tcp, 80),
                named("dns", Protocol::Udp, 53),
            ],
        );
        remote.endpoints = vec![ep(SERVER_2)?];
        v.push(remote);
        // The API server: a host-network endpoint off the nodes.
        let mut api = Service::new(
            "default",
            "kubernetes",
            vip(1),
            vec![Port::new("https", Protocol::Tcp, 443, API_PORT)],
        );
        api.endpoints = vec![Endpoint::new(
            if ipv6 {
                IpAddr::V6(API6)
            } else {
                IpAddr::V4(API4)
            },
            "control-plane",
        )];
        v.push(api);
        // The client's own Service (hairpin).
        let mut own = Service::new("default", "client", vip(30), vec![tcp(80)]);
        own.endpoints = vec![ep(CLIENT)?];
        v.push(own);
        // NodePort, externalTrafficPolicy Cluster, endpoint on node 1.
        let mut np = Service::new(
            "default",
            "nodeport",
            vip(40),
            vec![Port {
                node_port: Some(NODE_PORT_CLUSTER),
                ..tcp(80)
            }],
        );
        np.endpoints = vec![ep(SERVER_1)?];
        v.push(np);
        // NodePort, externalTrafficPolicy Local, endpoint on node 1.
        let mut local = Service::new(
            "default",
            "nodeport-local",
            vip(41),
            vec![Port {
                node_port: Some(NODE_PORT_LOCAL),
                ..tcp(80)
            }],
        );
        local.external_traffic_local = true;
        local.endpoints = vec![ep(SERVER_1)?];
        v.push(local);
        if !ipv6 {
            // An external IP and a LoadBalancer, endpoints on node 2.
            let mut ext = Service::new("default", "external", vip(50), vec![tcp(80)]);
            ext.external_ips = vec![IpAddr::V4(EXTERNAL_IP)];
            ext.endpoints = vec![ep(SERVER_2)?];
            v.push(ext);
            let mut lb = Service::new(
                "default",
                "balanced",
                vip(60),
                vec![Port {
                    node_port: Some(NODE_PORT_LB),
                    ..tcp(80)
                }],
            );
            lb.load_balancer_ips = vec![IpAddr::V4(LB_IP)];
            lb.endpoints = vec![ep(SERVER_2)?];
            v.push(lb);
        }
        // No endpoints at all (none ready, or scaled to zero).
        v.push(Service::new(
            "default",
            "empty",
            vip(NO_ENDPOINTS),
            vec![
                named("http", Protocol::Tcp, 80),
                named("dns", Protocol::Udp, 53),
            ],
        ));
        Ok(v)
    }

    /// Writes kube-proxy's rules on both nodes, for each family the cluster
    /// has (one proxier per family, as kube-proxy runs them).
    pub fn apply_kube_proxy(&self) -> Result<()> {
        for n in &self.nodes {
            for ipv6 in self.families() {
                let mut p = Proxy::new(
                    self.mode,
                    ipv6,
                    &n.hostname,
                    vec![if ipv6 {
                        IpAddr::V6(n.ip6)
                    } else {
                        IpAddr::V4(n.ip4)
                    }],
                );
                p.cluster_cidr = Some(if ipv6 { CLUSTER_CIDR6 } else { CLUSTER_CIDR4 }.into());
                kube_proxy::apply(&n.node.netns_path(), &p, &self.services(ipv6)?)
                    .map_err(|e| err!("kube-proxy rules on {}: {e}", n.hostname))?;
            }
        }
        Ok(())
    }

    fn families(&self) -> Vec<bool> {
        if self.dual_stack {
            vec![false, true]
        } else {
            vec![false]
        }
    }

    /// Every path of Service traffic the cluster has, with what each side
    /// must see.
    pub fn cases(&self) -> Vec<Case> {
        use Client::{External, NodeHost, Pod as P};
        use Seen::{ClientPod, NodeAddress, PodOf, Router};
        use Server::{Api, Pod as S};
        let mut v = Vec::new();
        for ipv6 in self.families() {
            let vip = |n: u16, port: u16| SocketAddr::new(service_ip(ipv6, n), port);
            let f = if ipv6 { "IPv6" } else { "IPv4" };
            let case = |name: &str, from, to, proto, server, seen| Case {
                name: format!("{f} {name}"),
                from,
                to,
                proto,
                server,
                seen,
            };
            // IPv6 is masqueraded on the kernels with the NAT sweeper only
            // (5.15; before, routed: the API server answers the pod itself).
            let api_seen = if self.masquerades() && (!ipv6 || crate::kernel::has("sweeper")) {
                NodeAddress(0)
            } else {
                ClientPod
            };
            v.extend([
                case(
                    "pod -> ClusterIP (TCP) -> pod on this node",
                    P(CLIENT),
                    vip(10, 80),
                    Protocol::Tcp,
                    S(SERVER_1),
                    ClientPod,
                ),
                case(
                    "pod -> ClusterIP (UDP, DNS) -> pod on this node",
                    P(CLIENT),
                    vip(10, 53),
                    Protocol::Udp,
                    S(SERVER_1),
                    ClientPod,
                ),
                case(
                    "pod -> ClusterIP (TCP) -> pod on another node",
                    P(CLIENT),
                    vip(20, 80),
                    Protocol::Tcp,
                    S(SERVER_2),
                    ClientPod,
                ),
                case(
                    "pod -> ClusterIP (UDP) -> pod on another node",
                    P(CLIENT),
                    vip(20, 53),
                    Protocol::Udp,
                    S(SERVER_2),
                    ClientPod,
                ),
                case(
                    "pod -> ClusterIP -> host-network endpoint off the node (API server)",
                    P(CLIENT),
                    vip(1, 443),
                    Protocol::Tcp,
                    Api,
                    api_seen,
                ),
                case(
                    "pod -> its own Service (hairpin)",
                    P(CLIENT),
                    vip(30, 80),
                    Protocol::Tcp,
                    S(CLIENT),
                    NodeAddress(0),
                ),
                case(
                    "node -> ClusterIP -> pod",
                    NodeHost(0),
                    vip(10, 80),
                    Protocol::Tcp,
                    S(SERVER_1),
                    NodeAddress(0),
                ),
                case(
                    "node -> ClusterIP -> pod on another node",
                    NodeHost(0),
                    vip(20, 80),
                    Protocol::Tcp,
                    S(SERVER_2),
                    NodeAddress(0),
                ),
                case(
                    "external -> NodePort (Cluster) -> pod on that node",
                    External,
                    SocketAddr::new(self.node_ip(0, ipv6), NODE_PORT_CLUSTER),
                    Protocol::Tcp,
                    S(SERVER_1),
                    NodeAddress(0),
                ),
                case(
                    "external -> NodePort (Cluster) -> pod on another node",
                    External,
                    SocketAddr::new(self.node_ip(1, ipv6), NODE_PORT_CLUSTER),
                    Protocol::Tcp,
                    S(SERVER_1),
                    NodeAddress(1),
                ),
                case(
                    "external -> NodePort (Local) -> pod on that node, source kept",
                    External,
                    SocketAddr::new(self.node_ip(0, ipv6), NODE_PORT_LOCAL),
                    Protocol::Tcp,
                    S(SERVER_1),
                    Router,
                ),
                case(
                    "pod -> this node's NodePort -> pod",
                    P(CLIENT),
                    SocketAddr::new(self.node_ip(0, ipv6), NODE_PORT_CLUSTER),
                    Protocol::Tcp,
                    S(SERVER_1),
                    NodeAddress(0),
                ),
                case(
                    "pod on another node -> ClusterIP -> pod here",
                    P(SERVER_2),
                    vip(10, 80),
                    Protocol::Tcp,
                    S(SERVER_1),
                    PodOf(SERVER_2),
                ),
            ]);
            if !ipv6 {
                let ext = SocketAddr::new(IpAddr::V4(EXTERNAL_IP), 80);
                let lb = SocketAddr::new(IpAddr::V4(LB_IP), 80);
                v.extend([
                    case(
                        "pod -> external IP -> pod on another node",
                        P(CLIENT),
                        ext,
                        Protocol::Tcp,
                        S(SERVER_2),
                        NodeAddress(0),
                    ),
                    case(
                        "pod -> LoadBalancer IP -> pod on another node",
                        P(CLIENT),
                        lb,
                        Protocol::Tcp,
                        S(SERVER_2),
                        NodeAddress(0),
                    ),
                    case(
                        "external -> external IP -> pod on another node",
                        External,
                        ext,
                        Protocol::Tcp,
                        S(SERVER_2),
                        NodeAddress(0),
                    ),
                    case(
                        "external -> LoadBalancer IP -> pod on another node",
                        External,
                        lb,
                        Protocol::Tcp,
                        S(SERVER_2),
                        NodeAddress(0),
                    ),
                ]);
            }
        }
        v
    }

    /// Pod `p`'s tries at the Service without endpoints ([`NO_ENDPOINTS`]),
    /// in each family the cluster has: a TCP connect (`tcp ADDR 64`) and a
    /// connected UDP socket's datagram and receive (`udp-connected ADDR 1
    /// 2000`), each a run of the test client `bin` (`sluice-test-client`) in
    /// the pod; what each came to, named. A refusal shows as `errno`
    /// `ECONNREFUSED`; a dropped SYN or datagram would end in the client's
    /// own timeout instead, with no `errno` (every wait is the client's, and
    /// bounded).
    pub fn no_endpoint_tries(&self, bin: &Path, p: usize) -> Result<Vec<(String, ClientReport)>> {
        let netns = &self.pods[p].pod.path;
        let mut v = Vec::new();
        for ipv6 in self.families() {
            let ip = service_ip(ipv6, NO_ENDPOINTS);
            let (tcp, udp) = (
                SocketAddr::new(ip, 80).to_string(),
                SocketAddr::new(ip, 53).to_string(),
            );
            let tries: [(String, Vec<&str>); 2] = [
                (format!("TCP connect to {tcp}"), vec!["tcp", &tcp, "64"]),
                (
                    format!("connected UDP to {udp}"),
                    vec!["udp-connected", &udp, "1", "2000"],
                ),
            ];
            for (what, args) in tries {
                let r = client_in(bin, netns, self.cgroup_of(Client::Pod(p)), &args)
                    .map_err(|e| err!("{what} from pod {}: {e}", self.pods[p].name))?;
                v.push((what, r));
            }
        }
        Ok(v)
    }

    /// A TCP connection from pod `p` to `to` (reads and writes time out).
    pub fn connect(&self, p: usize, to: SocketAddr) -> Result<TcpStream> {
        crate::masq::tcp_connect(&self.pods[p].pod.path, None, to)
    }

    /// Whether pods' traffic leaving the cluster is masqueraded.
    fn masquerades(&self) -> bool {
        matches!(self.cni, Cni::Sluice(s) if s.ip_masq)
    }

    /// Node `i`'s address of the family.
    pub fn node_ip(&self, i: usize, ipv6: bool) -> IpAddr {
        if ipv6 {
            IpAddr::V6(self.nodes[i].ip6)
        } else {
            IpAddr::V4(self.nodes[i].ip4)
        }
    }

    /// Runs every case; the outcome of each, in order.
    pub fn run_all(&self) -> Vec<(Case, Result<()>)> {
        self.cases()
            .into_iter()
            .map(|c| {
                let r = self.run(&c);
                (c, r)
            })
            .collect()
    }

    /// Runs one case: a TCP echo or a UDP echo (the answer must come from the
    /// address asked), then checks who the server saw.
    pub fn run(&self, c: &Case) -> Result<()> {
        let before = self.peers_of(c.server, c.proto);
        let netns = match c.from {
            Client::Pod(p) => self.pods[p].pod.path.clone(),
            Client::NodeHost(n) => self.nodes[n].node.netns_path(),
            Client::External => self.router.netns_path(),
        };
        let payload = format!("{} {}", c.name, c.to);
        if let (Some(s), Some(cgroup)) = (&self.sluice_services, self.cgroup_of(c.from)) {
            // Sluice translates at the socket: the client is a process in
            // its node's hooks' cgroup.
            client_echo(&s.client, &netns, cgroup, c)?;
        } else {
            match c.proto {
                Protocol::Tcp => tcp_echo(&netns, c.to, payload.as_bytes())?,
                Protocol::Udp => udp_echo(&netns, c.to, payload.as_bytes())?,
                Protocol::Sctp => return Err(err!("no SCTP cases")),
            }
        }
        let after = self.peers_of(c.server, c.proto);
        let Some(peer) = after.get(before.len()..).and_then(<[SocketAddr]>::first) else {
            return Err(err!("the answer came, but {:?} saw no new peer", c.server));
        };
        let ip = canonical(peer.ip());
        let ok = match c.seen {
            Seen::ClientPod => match c.from {
                Client::Pod(p) => self.pods[p].ip4 == ip || self.pods[p].ip6 == Some(ip),
                _ => false,
            },
            Seen::PodOf(p) => self.pods[p].ip4 == ip || self.pods[p].ip6 == Some(ip),
            Seen::NodeAddress(n) => self.node_addrs(n)?.contains(&ip),
            Seen::Router => self.router_addrs()?.contains(&ip),
        };
        if ok {
            Ok(())
        } else {
            Err(err!("the server saw {ip}, not {:?}", c.seen))
        }
    }

    /// With Sluice's Services, the hooks' cgroup of the node a client of
    /// the cluster runs on (`None`: outside, or kube-proxy's rules).
    fn cgroup_of(&self, from: Client) -> Option<&Cgroup> {
        let n = match from {
            Client::Pod(p) => self.pods[p].node,
            Client::NodeHost(n) => n,
            Client::External => return None,
        };
        Some(&self.sluice_services.as_ref()?.nodes.get(n)?.cgroup)
    }

    /// Every case with what Sluice's own Services must answer in it, against
    /// kube-proxy's answer (the case's own [`Case::seen`]); see
    /// [`SluiceAnswer`].
    pub fn sluice_cases(&self) -> Vec<(Case, SluiceAnswer)> {
        self.cases()
            .into_iter()
            .map(|c| {
                let a = sluice_answer(&c, |p| self.pods[p].node);
                (c, a)
            })
            .collect()
    }

    /// Runs every case of [`Self::sluice_cases`] with the source Sluice's
    /// answer names; each with its outcome.
    pub fn run_sluice_all(&self) -> Vec<(Case, SluiceAnswer, Result<()>)> {
        self.sluice_cases()
            .into_iter()
            .map(|(c, a)| {
                let mut run = c.clone();
                if let SluiceAnswer::Differs(seen, _) = a {
                    run.seen = seen;
                }
                let r = self.run(&run);
                (c, a, r)
            })
            .collect()
    }

    /// The outcomes of [`Self::run_sluice_all`] as a table (Sluice's answer
    /// against kube-proxy's, and why they differ), and whether every case
    /// that Sluice supports passed.
    pub fn report_sluice(&self, results: &[(Case, SluiceAnswer, Result<()>)]) -> (String, bool) {
        let mut s = format!("{self}:\n");
        let mut all = true;
        for (c, a, r) in results {
            let (sluice, note) = match a {
                SluiceAnswer::Same => (format!("{:?}", c.seen), String::new()),
                SluiceAnswer::Differs(seen, why) => {
                    (format!("{seen:?}"), format!("\n        differs: {why}"))
                }
                SluiceAnswer::Unsupported(why) => {
                    ("-".to_string(), format!("\n        unsupported: {why}"))
                }
            };
            // The outcome's tag, and what came of a case that did not pass.
            let (tag, detail) = match (a, r) {
                (SluiceAnswer::Unsupported(_), Ok(())) => (
                    "unsup",
                    "\n        passed although unsupported: update sluice_answer".to_string(),
                ),
                (SluiceAnswer::Unsupported(_), Err(e)) => {
                    ("unsup", format!("\n        fails: {e}"))
                }
                (_, Ok(())) => ("ok", String::new()),
                (_, Err(e)) => {
                    all = false;
                    ("FAIL", format!("\n        fails: {e}"))
                }
            };
            let _ = writeln!(
                s,
                "  {tag:<5} {} | Sluice: {sluice} | kube-proxy: {:?}{note}{detail}",
                c.name, c.seen,
            );
        }
        (s, all)
    }

    fn peers_of(&self, s: Server, proto: Protocol) -> Vec<SocketAddr> {
        let peers = match s {
            Server::Pod(p) => self.pods[p].server.peers(),
            Server::Api => self.api.peers(),
        };
        match proto {
            Protocol::Udp => peers.udp,
            _ => peers.tcp,
        }
    }

    /// Every address of node `n`'s namespace (what a masquerade there may
    /// pick: the uplink's, a gateway's).
    pub fn node_addrs(&self, n: usize) -> Result<Vec<IpAddr>> {
        addrs(self.nodes[n].node.name())
    }

    fn router_addrs(&self) -> Result<Vec<IpAddr>> {
        addrs(self.router.name())
    }

    /// The cases' outcomes as a table, and whether all passed.
    pub fn report(&self, results: &[(Case, Result<()>)]) -> (String, bool) {
        let mut s = format!("{self}:\n");
        let mut all = true;
        for (c, r) in results {
            match r {
                Ok(()) => {
                    let _ = writeln!(s, "  ok    {}", c.name);
                }
                Err(e) => {
                    all = false;
                    let _ = writeln!(s, "  FAIL  {}: {e}", c.name);
                }
            }
        }
        (s, all)
    }

    /// What to look at when a case fails: each node's addresses and routes,
    /// kube-proxy's state in its mode, and (Sluice) the datapath's counters.
    pub fn diagnostics(&self) -> String {
        let mut out = String::new();
        for n in &self.nodes {
            let ns = n.node.netns_path();
            let mut look: Vec<(&str, Vec<&str>)> = vec![
                ("ip", vec!["-o", "addr", "show"]),
                ("ip", vec!["route", "show"]),
                ("ip", vec!["-6", "route", "show"]),
                // The ICMP the node sent, and what its rate limit held back
                // (`-s`: no history file).
                ("nstat", vec!["-as", "Icmp*"]),
            ];
            match self.mode {
                _ if self.sluice_services.is_some() => {
                    look.push(("nstat", vec!["-as", "Tcp*"]));
                }
                Mode::Iptables => {
                    look.push(("iptables-save", vec!["-t", "nat"]));
                    // The REJECTs of Services without endpoints.
                    look.push(("iptables-save", vec!["-t", "filter"]));
                }
                Mode::Nftables => look.push(("nft", vec!["list", "table", "ip", "kube-proxy"])),
                Mode::Ipvs => {
                    look.push(("ipvsadm", vec!["-Ln"]));
                    look.push(("ipset", vec!["list", "-t"]));
                    look.push(("iptables-save", vec!["-t", "nat"]));
                }
            }
            for (program, args) in look {
                let text = exec::tool(Some(&ns), program, &args).unwrap_or_else(|e| e.to_string());
                let _ = writeln!(
                    out,
                    "--- {}: {program} {}\n{text}",
                    n.hostname,
                    args.join(" ")
                );
            }
            if !n.reference {
                let text = n
                    .node
                    .counters()
                    .map_or_else(|e| e.to_string(), |c| c.to_string());
                let _ = writeln!(out, "--- {}: sluicectl counters\n{text}", n.hostname);
            }
            if self.sluice_services.is_some() {
                let lb = n
                    .node
                    .sluicectl_json(&["services", "lb", "--json"])
                    .map_or_else(|e| e.to_string(), |v| format!("{v:#}"));
                let log = crate::agent::log_of(&n.node, crate::kube_services::LOG);
                let _ = writeln!(
                    out,
                    "--- {}: sluicectl services lb --json\n{lb}\n--- {}: the agent's log\n{log}",
                    n.hostname, n.hostname
                );
            }
        }
        out
    }

    /// `sluicectl counters --json` of node `n` (Sluice only).
    pub fn counters(&self, n: usize) -> Result<crate::Counters> {
        self.nodes[n].node.counters()
    }
}

impl fmt::Display for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cni = match self.cni {
            Cni::Reference => "reference (bridge + host-local)".to_string(),
            Cni::Sluice(s) => format!(
                "Sluice (ipMasq {}, podAttach {}, podDevice {}, xdp {}, serviceCIDRs {})",
                s.ip_masq,
                s.pod_attach,
                s.pod_device,
                s.xdp,
                if s.service_cidrs { "set" } else { "unset" }
            ),
        };
        let proxy = if self.sluice_services.is_some() {
            "Sluice's Services (route-sync --service-proxy, no kube-proxy rule)".to_string()
        } else {
            format!("kube-proxy {:?} mode", self.mode)
        };
        write!(
            f,
            "{cni}, {proxy}, {}",
            if self.dual_stack {
                "dual stack"
            } else {
                "IPv4"
            }
        )
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The agents go first, while their nodes are there.
        if let Err(e) = self.stop_sluice_services() {
            eprintln!("cleanup: stopping Sluice's agents: {e}");
        }
    }
}

/// What Sluice's own Services answer in a case, against kube-proxy's (the
/// case's [`Case::seen`]).
#[derive(Clone, Copy, Debug)]
pub enum SluiceAnswer {
    /// The same source address as with kube-proxy.
    Same,
    /// Another source address, and why.
    Differs(Seen, &'static str),
    /// Sluice does not translate this path yet (the case is run and its
    /// outcome reported, not required).
    Unsupported(&'static str),
}

/// Sluice's answer in case `c` (`node_of`: the node of a pod). Sluice
/// translates a pod's or the node's connection at the socket (`connect`,
/// `sendmsg`) to the backend itself: the packets are plain pod-to-pod or
/// node-to-pod ones that need no source NAT; traffic from outside is
/// translated in `uplink_in`, which keeps the client's address for a
/// backend on the receiving node and uses the node's address for one on
/// another node (so that the answers come back through it).
pub fn sluice_answer(c: &Case, node_of: impl Fn(usize) -> usize) -> SluiceAnswer {
    use SluiceAnswer::{Differs, Same};
    match (c.from, c.server, c.seen) {
        // eTP Cluster with the endpoint on the receiving node: kube-proxy
        // masquerades every NodePort flow of policy Cluster to the node's
        // address; Sluice delivers it to the pod here untranslated in its
        // source (only the destination is rewritten, the answers are
        // translated back on their way out), so the pod sees the client.
        (Client::External, Server::Pod(p), Seen::NodeAddress(n)) if node_of(p) == n => Differs(
            Seen::Router,
            "eTP Cluster, endpoint on the receiving node: Sluice keeps the client's own \
             address (no SNAT); kube-proxy masquerades to the node address",
        ),
        // Hairpin: kube-proxy DNATs the pod's packet back to itself and must
        // masquerade it (else the pod would answer itself from its own
        // address, bypassing the un-DNAT); Sluice's socket hook points the
        // connect at the pod's own address, a connection inside the pod.
        (Client::Pod(p), Server::Pod(s), Seen::NodeAddress(_)) if p == s => Differs(
            Seen::ClientPod,
            "hairpin: translated at the socket to the pod's own address, no packet is \
             NATed; kube-proxy masquerades hairpin traffic to the node address",
        ),
        // A pod to a NodePort, external IP or load balancer IP: kube-proxy
        // marks these for masquerade (KUBE-MARK-MASQ of NodePorts and of
        // external destinations from pods); Sluice's socket hook translates
        // them like a ClusterIP, to a plain pod-to-pod connection.
        (Client::Pod(_), Server::Pod(_), Seen::NodeAddress(_)) => Differs(
            Seen::ClientPod,
            "pod -> NodePort/external IP/LB IP is translated at the socket like a ClusterIP: \
             a plain pod-to-pod connection with the pod's own address; kube-proxy \
             masquerades it to the node address",
        ),
        _ => Same,
    }
}

/// One case's TCP or UDP echo made by `sluice-test-client` in the hooks'
/// `cgroup` of the node, from the namespace at `netns`: the echo must come
/// back, from the address asked (`getpeername` of the TCP connection, the
/// source of the UDP echo: the hooks show the Service again).
fn client_echo(bin: &Path, netns: &Path, cgroup: &Cgroup, c: &Case) -> Result<()> {
    let to = c.to.to_string();
    let args: Vec<&str> = match c.proto {
        Protocol::Tcp => vec!["tcp", &to, "1024"],
        Protocol::Udp => vec!["udp", &to, "3", "2000"],
        Protocol::Sctp => return Err(err!("no SCTP cases")),
    };
    let r = client_in(bin, netns, Some(cgroup), &args)?;
    if !r.ok {
        return Err(err!("{}: {}", r.error, r.output));
    }
    let back = match c.proto {
        Protocol::Tcp => r.peer,
        _ => r.from,
    };
    if back != Some(c.to) {
        return Err(err!(
            "the answer came from {back:?}, not from {to}: {}",
            r.output
        ));
    }
    Ok(())
}

/// Who opens the connection.
#[derive(Clone, Copy, Debug)]
pub enum Client {
    Pod(usize),
    /// A process in node `n`'s own namespace.
    NodeHost(usize),
    /// The router, outside the cluster.
    External,
}

/// Who must answer.
#[derive(Clone, Copy, Debug)]
pub enum Server {
    Pod(usize),
    Api,
}

/// The source address the server must see.
#[derive(Clone, Copy, Debug)]
pub enum Seen {
    /// The client pod's own address.
    ClientPod,
    /// Pod `p`'s address.
    PodOf(usize),
    /// An address of node `n` (kube-proxy's or Sluice's masquerade).
    NodeAddress(usize),
    /// The external client's own address.
    Router,
}

/// One path of Service traffic.
#[derive(Clone, Debug)]
pub struct Case {
    pub name: String,
    pub from: Client,
    pub to: SocketAddr,
    pub proto: Protocol,
    pub server: Server,
    pub seen: Seen,
}

/// The address of Service `n` in the family's Service range.
pub fn service_ip(ipv6: bool, n: u16) -> IpAddr {
    if ipv6 {
        IpAddr::V6(Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, n))
    } else {
        IpAddr::V4(Ipv4Addr::new(10, 96, 0, u8::try_from(n).unwrap_or(0)))
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(a) => a.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// Every address of namespace `ns`.
fn addrs(ns: &str) -> Result<Vec<IpAddr>> {
    let out = host::ip(ns, &["-o", "addr", "show"])?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            w.find(|x| *x == "inet" || *x == "inet6")?;
            w.next()?.split('/').next()?.parse().ok()
        })
        .collect())
}

/// Connects from the namespace at `netns` to `to`, sends `data` and reads it
/// back, within [`WAIT`] for each step.
fn tcp_echo(netns: &Path, to: SocketAddr, data: &[u8]) -> Result<()> {
    let data = data.to_vec();
    in_netns(netns, move || {
        let mut s =
            TcpStream::connect_timeout(&to, WAIT).map_err(|e| err!("connecting to {to}: {e}"))?;
        s.set_read_timeout(Some(WAIT))?;
        s.set_write_timeout(Some(WAIT))?;
        s.write_all(&data)
            .map_err(|e| err!("writing to {to}: {e}"))?;
        let mut back = vec![0u8; data.len()];
        s.read_exact(&mut back)
            .map_err(|e| err!("reading the echo from {to}: {e}"))?;
        if back != data {
            return Err(err!("the echo from {to} differs from what was sent"));
        }
        Ok(())
    })
}

/// Sends `data` to `to` from an unconnected UDP socket in the namespace at
/// `netns` (three tries within [`WAIT`]); the echo must come back from `to`
/// itself, as a resolver's socket expects of its server.
fn udp_echo(netns: &Path, to: SocketAddr, data: &[u8]) -> Result<()> {
    let bind = if to.is_ipv4() {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)
    } else {
        SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0)
    };
    let s: UdpSocket = in_netns(netns, move || {
        UdpSocket::bind(bind).map_err(|e| err!("binding UDP {bind}: {e}"))
    })?;
    let deadline = Instant::now() + WAIT;
    let mut buf = vec![0u8; 2048];
    let mut seen = Vec::new();
    for _ in 0..3 {
        s.send_to(data, to).map_err(|e| err!("UDP to {to}: {e}"))?;
        let until = (Instant::now() + WAIT / 3).min(deadline);
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            s.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
            match s.recv_from(&mut buf) {
                Ok((n, from)) if from == to && buf[..n] == *data => return Ok(()),
                Ok((_, from)) => seen.push(from),
                Err(_) => break,
            }
        }
    }
    Err(if seen.is_empty() {
        err!("no UDP answer from {to} within {WAIT:?}")
    } else {
        err!("UDP answers came from {seen:?}, not from {to}")
    })
}

impl KubeNode {
    /// Node `n` (1 or 2): its namespace wired to the router, the routes both
    /// ways, and the pods' network config.
    fn new(router: &Host, n: u8, cni: Cni, dual_stack: bool) -> Result<Self> {
        let node = Node::new()?;
        let (ip4, rt4) = (
            Ipv4Addr::new(192, 168, 60 + n, 1),
            Ipv4Addr::new(192, 168, 60 + n, 2),
        );
        let (ip6, rt6) = (
            Ipv6Addr::new(0xfd00, 0x60 + u16::from(n), 0, 0, 0, 0, 0, 1),
            Ipv6Addr::new(0xfd00, 0x60 + u16::from(n), 0, 0, 0, 0, 0, 2),
        );
        let pod_cidr4 = format!("10.64.{n}.0/24");
        let pod_cidr6 = format!("fd00:64:0:{n}::/64");
        let ext_if = format!("ext{n}");
        host::wire(
            node.name(),
            "up0",
            &format!("{ip4}/24"),
            router.name(),
            &ext_if,
            &format!("{rt4}/24"),
        )?;
        let nip = |args: &[&str]| host::ip(node.name(), args);
        nip(&["addr", "add", &format!("{ip6}/64"), "dev", "up0", "nodad"])?;
        router.ip(&["addr", "add", &format!("{rt6}/64"), "dev", &ext_if, "nodad"])?;
        nip(&["route", "add", "default", "via", &rt4.to_string()])?;
        nip(&["-6", "route", "add", "default", "via", &rt6.to_string()])?;
        router.ip(&["route", "add", &pod_cidr4, "via", &ip4.to_string()])?;
        router.ip(&["-6", "route", "add", &pod_cidr6, "via", &ip6.to_string()])?;
        if matches!(cni, Cni::Sluice(s) if s.xdp == "native") {
            // As a NIC's: complete checksums, and what the node's XDP sends
            // back out arrives (a veth takes XDP frames only with NAPI on).
            host::tx_checksum_off(&router.netns_path(), &ext_if)?;
            host::gro_on(&router.netns_path(), &ext_if)?;
        }
        let hostname = format!("node-{n}");
        let (conf, reference) = match cni {
            Cni::Sluice(s) => (
                sluice_conf(&node, s, &pod_cidr4, &pod_cidr6, dual_stack),
                false,
            ),
            Cni::Reference => (
                reference_conf(&node, n, &pod_cidr4, &pod_cidr6, dual_stack),
                true,
            ),
        };
        Ok(Self {
            node,
            hostname,
            ip4,
            ip6,
            pod_cidr4,
            pod_cidr6,
            conf,
            reference,
        })
    }

    /// A pod attached with this node's config, its echo server started.
    fn attach(&self, name: &'static str, index: usize) -> Result<KubePod> {
        let pod = self.node.pod(name)?;
        let ips: Vec<IpAddr> = if self.reference {
            let out = self
                .node
                .reference("bridge", "ADD", &self.conf, name, "eth0", Some(&pod))?;
            out.result()["ips"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|i| i["address"].as_str()?.split('/').next()?.parse().ok())
                .collect()
        } else {
            add(&self.node, &self.conf, name, &pod)
                .ips
                .iter()
                .map(|i| i.0)
                .collect()
        };
        let ip4 = *ips
            .iter()
            .find(|a| a.is_ipv4())
            .ok_or_else(|| err!("pod {name} got no IPv4 address: {ips:?}"))?;
        let ip6 = ips.iter().copied().find(IpAddr::is_ipv6);
        let server = EchoServer::start(
            &pod.path,
            SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), POD_PORT),
        )?;
        Ok(KubePod {
            name,
            node: index,
            pod,
            ip4,
            ip6,
            server,
        })
    }
}

/// The IPAM ranges and default routes of a node's pods.
fn ipam_ranges(pod_cidr4: &str, pod_cidr6: &str, dual_stack: bool) -> (Value, Value) {
    if dual_stack {
        (
            json!([[{"subnet": pod_cidr4}], [{"subnet": pod_cidr6}]]),
            json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]),
        )
    } else {
        (
            json!([[{"subnet": pod_cidr4}]]),
            json!([{"dst": "0.0.0.0/0"}]),
        )
    }
}

fn sluice_conf(node: &Node, s: Sluice, pod_cidr4: &str, pod_cidr6: &str, dual: bool) -> Value {
    let mut conf = node.conf("1.0.0", pod_cidr4);
    let (ranges, routes) = ipam_ranges(pod_cidr4, pod_cidr6, dual);
    if let Some(ipam) = conf["ipam"].as_object_mut() {
        ipam.remove("subnet");
    }
    conf["ipam"]["ranges"] = ranges;
    conf["ipam"]["routes"] = routes;
    conf["ipMasq"] = json!(s.ip_masq);
    conf["podAttach"] = json!(s.pod_attach);
    conf["podDevice"] = json!(s.pod_device);
    conf["xdp"] = json!(s.xdp);
    // The whole cluster's pods keep their addresses between nodes.
    conf["nonMasqueradeCIDRs"] = json!([CLUSTER_CIDR4, CLUSTER_CIDR6]);
    if s.service_cidrs {
        // The external and load balancer IPs too: an operator lists what
        // kube-proxy translates (the node agent adds them from the Services).
        conf["serviceCIDRs"] = json!([
            SERVICE_CIDR4,
            SERVICE_CIDR6,
            format!("{EXTERNAL_IP}/32"),
            format!("{LB_IP}/32"),
        ]);
    }
    conf
}

fn reference_conf(node: &Node, n: u8, pod_cidr4: &str, pod_cidr6: &str, dual: bool) -> Value {
    let (ranges, routes) = ipam_ranges(pod_cidr4, pod_cidr6, dual);
    json!({
        "cniVersion": "1.0.0",
        "name": format!("kube{n}"),
        "type": "bridge",
        "bridge": "cbr0",
        "isGateway": true,
        "hairpinMode": true,
        "ipMasq": false,
        "ipam": {
            "type": "host-local",
            "ranges": ranges,
            "routes": routes,
            "dataDir": node.ipam_dir(),
        },
    })
}

/// Runs `program args` in the namespace at `netns`, which must succeed.
pub fn tool(netns: &Path, program: &str, args: &[&str]) -> Result<String> {
    exec::tool(Some(netns), program, args)
}
