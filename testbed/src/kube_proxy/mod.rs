//! kube-proxy's rules for a test node: what kube-proxy would write for a set of
//! Services, in each of its three modes, written with the real tools into a
//! network namespace the test made.
//!
//! The renderers follow kube-proxy's own code at kubernetes/kubernetes commit
//! `b0f823e6ccd8a10b3893fc75011b9981af39285c` (`pkg/proxy/iptables/proxier.go`,
//! `pkg/proxy/nftables/proxier.go`, `pkg/proxy/ipvs/proxier.go` and
//! `pkg/proxy/ipvs/ipset.go` at that commit; `pkg/proxy/topology.go`,
//! `endpointslicecache.go`, `util/nodeport_addresses.go` and
//! `conntrack/sysctls.go` of the same era), checked against the rule dumps of
//! the `*_test.go` files next to them. Each function names the kube-proxy
//! function it mirrors. Our own code, not a translation: only the output is
//! meant to be the same, byte for byte where kube-proxy's order is fixed.
//!
//! - [`render`] gives the exact text each tool is fed for a node that has no
//!   kube-proxy state yet (kube-proxy's first sync);
//! - [`apply`] writes it into a namespace with `iptables-restore`/`nft`/
//!   `ipset`/`ipvsadm`/`ip`/`sysctl`/`nfacct`, each run inside the namespace
//!   through `nsenter --net=`; a second call with other Services replaces the
//!   rules as kube-proxy's next full sync does (stale chains, sets, virtual
//!   servers and addresses removed).
//!
//! What is not modelled: terminating endpoints (a not-ready endpoint is left
//! out; kube-proxy falls back to serving-terminating ones), topology hints,
//! partial syncs, IPVS graceful termination (stale real servers are deleted at
//! once instead of being drained at weight 0), the health-check HTTP servers,
//! and the machine-wide `nf_conntrack_max`/`hashsize` (never written from a test).
use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::Path,
};

use crate::{err, Result};

mod hash;
pub mod iptables;
pub mod ipvs;
pub mod nftables;
mod ports;
mod tools;

pub use tools::Sysctl;

/// kube-proxy's `--proxy-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Iptables,
    Nftables,
    Ipvs,
}

/// A Service port's protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// `tcp`, `udp`, `sctp`: what kube-proxy writes into rules and hashes.
    pub fn lower(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Sctp => "sctp",
        }
    }
}

/// One kube-proxy proxier: one IP family of one node.
#[derive(Clone, Debug)]
pub struct Proxy {
    pub mode: Mode,
    /// The family this proxier handles: Services, endpoints and addresses of
    /// the other family are ignored, as kube-proxy's single-family proxiers do.
    pub ipv6: bool,
    /// This node's name (`--hostname-override`): endpoints on it are local.
    pub hostname: String,
    /// This node's addresses of the family; the first is the node IP
    /// (`--node-ip`, used for `loadBalancerSourceRanges`). They stand for the
    /// addresses kube-proxy reads from the interfaces: NodePort addresses and
    /// IPVS node-port virtual servers.
    pub node_ips: Vec<IpAddr>,
    /// `--cluster-cidr` of the family: the local traffic detector
    /// (`DetectLocalByCIDR`); `None` runs with no detector.
    pub cluster_cidr: Option<String>,
    /// `--masquerade-all`.
    pub masquerade_all: bool,
    /// `--iptables-masquerade-bit` (14 by default: mark 0x4000).
    pub masquerade_bit: u32,
    /// `--nodeport-addresses` (CIDRs); empty matches every node address.
    pub node_port_addresses: Vec<String>,
    /// `--iptables-localhost-nodeports` (true by default; IPv4 iptables mode only).
    pub localhost_node_ports: bool,
    /// The cluster's ServiceCIDRs (nftables mode drops traffic to unallocated
    /// ClusterIPs in them); empty writes no such rule.
    pub service_cidrs: Vec<String>,
    /// What the node supports; `None`: [`apply`] probes the namespace and
    /// [`render`] assumes [`Features::default`].
    pub features: Option<Features>,
}

impl Proxy {
    /// A proxier with kube-proxy's defaults (mark bit 14, all node addresses
    /// for NodePorts, localhost NodePorts on, no detector, no ServiceCIDRs).
    pub fn new(mode: Mode, ipv6: bool, hostname: &str, node_ips: Vec<IpAddr>) -> Self {
        Self {
            mode,
            ipv6,
            hostname: hostname.to_string(),
            node_ips,
            cluster_cidr: None,
            masquerade_all: false,
            masquerade_bit: 14,
            node_port_addresses: Vec::new(),
            localhost_node_ports: true,
            service_cidrs: Vec::new(),
            features: None,
        }
    }
}

/// Node features kube-proxy's output depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// `iptables` is 1.6.2 or newer (`HasRandomFully`): `MASQUERADE --random-fully`.
    pub random_fully: bool,
    /// nfacct counters can be made (`nfacct.Ensure`): the INVALID-drop and
    /// localhost-NodePort rules count through `-m nfacct`.
    pub nfacct: bool,
    /// `net.netfilter.nf_conntrack_tcp_be_liberal` is set: no INVALID drop rule.
    pub tcp_be_liberal: bool,
    /// The kernel's major and minor version (IPVS `conn_reuse_mode`).
    pub kernel: (u32, u32),
}

impl Default for Features {
    /// A Debian 12 node: iptables 1.8.9, nfacct available, kernel 6.1.
    fn default() -> Self {
        Self {
            random_fully: true,
            nfacct: true,
            tcp_be_liberal: false,
            kernel: (6, 1),
        }
    }
}

/// A Service as kube-proxy sees it (Service and EndpointSlices together).
#[derive(Clone, Debug)]
pub struct Service {
    pub namespace: String,
    pub name: String,
    pub cluster_ip: IpAddr,
    pub ports: Vec<Port>,
    pub external_ips: Vec<IpAddr>,
    /// `status.loadBalancer.ingress[].ip` (ipMode VIP).
    pub load_balancer_ips: Vec<IpAddr>,
    /// `spec.loadBalancerSourceRanges` (CIDRs).
    pub load_balancer_source_ranges: Vec<String>,
    /// `externalTrafficPolicy: Local`; kube-proxy honours it on NodePort and
    /// LoadBalancer Services only, here: when a port has a node port or the
    /// Service has load-balancer IPs.
    pub external_traffic_local: bool,
    /// `internalTrafficPolicy: Local`.
    pub internal_traffic_local: bool,
    /// `spec.healthCheckNodePort` (LoadBalancer with `externalTrafficPolicy: Local`).
    pub health_check_node_port: Option<u16>,
    /// `sessionAffinity: ClientIP` with this timeout.
    pub session_affinity_seconds: Option<u32>,
    /// Every endpoint serves every port (on the port's `target_port`).
    pub endpoints: Vec<Endpoint>,
}

impl Service {
    /// A ClusterIP Service with no external addresses, default policies and no
    /// endpoints.
    pub fn new(namespace: &str, name: &str, cluster_ip: IpAddr, ports: Vec<Port>) -> Self {
        Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
            cluster_ip,
            ports,
            external_ips: Vec::new(),
            load_balancer_ips: Vec::new(),
            load_balancer_source_ranges: Vec::new(),
            external_traffic_local: false,
            internal_traffic_local: false,
            health_check_node_port: None,
            session_affinity_seconds: None,
            endpoints: Vec::new(),
        }
    }
}

/// A Service port.
#[derive(Clone, Debug)]
pub struct Port {
    /// The port's name (empty for a Service's single unnamed port).
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
    /// The endpoints' port.
    pub target_port: u16,
    pub node_port: Option<u16>,
}

impl Port {
    pub fn new(name: &str, protocol: Protocol, port: u16, target_port: u16) -> Self {
        Self {
            name: name.to_string(),
            protocol,
            port,
            target_port,
            node_port: None,
        }
    }
}

/// An endpoint of a Service (one address of an EndpointSlice).
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub ip: IpAddr,
    /// `nodeName` (empty: unknown, never local).
    pub node: String,
    /// `conditions.ready`; a not-ready endpoint gets no rules.
    pub ready: bool,
}

impl Endpoint {
    /// A ready endpoint on `node`.
    pub fn new(ip: IpAddr, node: &str) -> Self {
        Self {
            ip,
            node: node.to_string(),
            ready: true,
        }
    }
}

/// What [`render`] produced, or what [`apply`] wrote.
#[derive(Clone, Debug)]
pub struct Rendered {
    pub mode: Mode,
    /// The features the rules were rendered for.
    pub features: Features,
    /// kube-proxy's sysctls for this mode, set inside the namespace.
    pub sysctls: Vec<Sysctl>,
    pub rules: Rules,
}

/// The mode's rules.
#[derive(Clone, Debug)]
pub enum Rules {
    Iptables(iptables::Rules),
    Nftables(nftables::Rules),
    Ipvs(ipvs::Rules),
}

impl fmt::Display for Rendered {
    /// Everything, in the order [`apply`] writes it, for messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for s in &self.sysctls {
            writeln!(f, "sysctl -w {s}")?;
        }
        match &self.rules {
            Rules::Iptables(r) => write!(f, "{r}"),
            Rules::Nftables(r) => write!(f, "{}", r.script),
            Rules::Ipvs(r) => write!(f, "{r}"),
        }
    }
}

/// The rules kube-proxy's first sync writes on a node with no kube-proxy
/// state, for `services` (in their order; kube-proxy's own order within a
/// chain is that of a Go map, which its tests sort away).
pub fn render(proxy: &Proxy, services: &[Service]) -> Result<Rendered> {
    let features = proxy.features.unwrap_or_default();
    let ctx = ports::Ctx::new(proxy, features)?;
    let ports = ports::service_ports(&ctx, services)?;
    let rules = match proxy.mode {
        Mode::Iptables => Rules::Iptables(iptables::render(&ctx, &ports)),
        Mode::Nftables => Rules::Nftables(nftables::render(
            &ctx,
            &ports,
            &nftables::Existing::default(),
        )),
        Mode::Ipvs => Rules::Ipvs(ipvs::render(&ctx, &ports)),
    };
    Ok(Rendered {
        mode: proxy.mode,
        features,
        sysctls: tools::sysctls(proxy.mode, &ctx),
        rules,
    })
}

/// Writes kube-proxy's rules for `services` into the network namespace at
/// `netns` (a `/run/netns/<name>` the test made) with the real tools, as a full
/// kube-proxy sync does (see each mode's `apply` for the steps), and returns
/// what it wrote. Features not given in `proxy.features` are probed in the
/// namespace first. Nothing outside that namespace is touched.
pub fn apply(netns: &Path, proxy: &Proxy, services: &[Service]) -> Result<Rendered> {
    if !netns.exists() {
        return Err(err!(
            "kube-proxy rules: no network namespace at {}",
            netns.display()
        ));
    }
    let features = match proxy.features {
        Some(f) => f,
        None => tools::probe(netns, proxy)?,
    };
    let ctx = ports::Ctx::new(proxy, features)?;
    let ports = ports::service_ports(&ctx, services)?;
    let sysctls = tools::sysctls(proxy.mode, &ctx);
    tools::set_sysctls(netns, &sysctls)?;
    let rules = match proxy.mode {
        Mode::Iptables => Rules::Iptables(iptables::apply(netns, &ctx, &ports)?),
        Mode::Nftables => Rules::Nftables(nftables::apply(netns, &ctx, &ports)?),
        Mode::Ipvs => Rules::Ipvs(ipvs::apply(netns, &ctx, &ports)?),
    };
    Ok(Rendered {
        mode: proxy.mode,
        features,
        sysctls,
        rules,
    })
}

/// The loopback address of the family.
fn loopback(ipv6: bool) -> IpAddr {
    if ipv6 {
        IpAddr::V6(Ipv6Addr::LOCALHOST)
    } else {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    }
}

#[cfg(test)]
mod tests;
