//! What every kube-proxy mode computes before writing rules: the proxier's
//! settings (`NewProxier`), the service ports of its family with their sorted,
//! de-duplicated endpoints (`ServiceChangeTracker`, `EndpointSliceCache`), and
//! which endpoints each traffic policy uses (`CategorizeEndpoints`).
use std::{collections::BTreeMap, net::IpAddr};

use ipnetwork::IpNetwork;

use super::{hash, loopback, Features, Protocol, Proxy, Service};
use crate::{err, Result};

/// `largeClusterEndpointsThreshold` (pkg/proxy/iptables/proxier.go): past this
/// many endpoints the iptables proxier drops per-endpoint comments.
const LARGE_CLUSTER_ENDPOINTS: usize = 1000;

/// A proxier's settings, as `NewProxier` derives them from its flags.
pub(crate) struct Ctx {
    pub ipv6: bool,
    pub hostname: String,
    /// The node IP (`nodeIP`): the first of `node_ips`.
    pub node_ip: Option<IpAddr>,
    /// The node's addresses of the family, loopback and IPv6 link-local left
    /// out (`GetAllLocalAddressesExcept`, IPVS `isValidForSet`).
    pub node_ips: Vec<IpAddr>,
    /// `DetectLocalByCIDR`'s CIDR.
    pub local_cidr: Option<IpNetwork>,
    pub masquerade_all: bool,
    /// Go's `fmt.Sprintf("%#08x", 1<<masqueradeBit)`: `0x00004000` for bit 14.
    pub mark: String,
    /// `NodePortAddresses`.
    pub npa: NodePortAddresses,
    /// `localhostNodePorts` after `NewProxier` turned it off for IPv6 or when
    /// the NodePort addresses hold no IPv4 loopback.
    pub localhost_node_ports: bool,
    pub service_cidrs: Vec<IpNetwork>,
    pub features: Features,
}

/// `NodePortAddresses` (`pkg/proxy/util/nodeport_addresses.go`).
pub(crate) struct NodePortAddresses {
    pub cidrs: Vec<IpNetwork>,
    pub match_all: bool,
    pub contains_ipv4_loopback: bool,
}

impl Ctx {
    pub(crate) fn new(proxy: &Proxy, features: Features) -> Result<Self> {
        let ipv6 = proxy.ipv6;
        let of_family = |ip: &IpAddr| ip.is_ipv6() == ipv6;
        let node_ips: Vec<IpAddr> = proxy
            .node_ips
            .iter()
            .copied()
            .filter(|ip| of_family(ip) && !ip.is_loopback() && !is_link_local(ip))
            .collect();
        let local_cidr = proxy
            .cluster_cidr
            .as_deref()
            .map(|c| cidr_of_family(c, ipv6, "--cluster-cidr"))
            .transpose()?;
        if proxy.masquerade_bit > 31 {
            return Err(err!(
                "kube-proxy rules: masquerade bit {} is not in 0..=31",
                proxy.masquerade_bit
            ));
        }
        // Go's "%#08x": eight zero-padded digits after the 0x.
        let mark = format!("0x{:08x}", 1u32 << proxy.masquerade_bit);
        let npa = NodePortAddresses::new(&proxy.node_port_addresses, ipv6)?;
        let localhost_node_ports =
            proxy.localhost_node_ports && !ipv6 && npa.contains_ipv4_loopback;
        let mut service_cidrs = Vec::new();
        for c in &proxy.service_cidrs {
            let net: IpNetwork = parse_cidr(c, "ServiceCIDR")?;
            if net.is_ipv6() == ipv6 {
                service_cidrs.push(net);
            }
        }
        if proxy.hostname.is_empty() {
            return Err(err!("kube-proxy rules: the node needs a hostname"));
        }
        Ok(Self {
            ipv6,
            hostname: proxy.hostname.clone(),
            node_ip: node_ips.first().copied(),
            node_ips,
            local_cidr,
            masquerade_all: proxy.masquerade_all,
            mark,
            npa,
            localhost_node_ports,
            service_cidrs,
            features,
        })
    }

    /// `ip`/`ip6` (nft) and `ipv4_addr`/`ipv6_addr`.
    pub(crate) fn nft_family(&self) -> (&'static str, &'static str) {
        if self.ipv6 {
            ("ip6", "ipv6_addr")
        } else {
            ("ip", "ipv4_addr")
        }
    }

    /// `LocalTrafficDetector.IfNotLocal()` for iptables: `! -s <cidr>`.
    pub(crate) fn ipt_if_not_local(&self) -> Option<String> {
        self.local_cidr.map(|c| format!("! -s {c}"))
    }

    /// `IfLocal()` for iptables: `-s <cidr>`.
    pub(crate) fn ipt_if_local(&self) -> Option<String> {
        self.local_cidr.map(|c| format!("-s {c}"))
    }

    /// `IfNotLocalNFT()`: `ip saddr != <cidr>`.
    pub(crate) fn nft_if_not_local(&self) -> Option<String> {
        let (ip, _) = self.nft_family();
        self.local_cidr.map(|c| format!("{ip} saddr != {c}"))
    }

    /// `IfLocalNFT()`: `ip saddr <cidr>`.
    pub(crate) fn nft_if_local(&self) -> Option<String> {
        let (ip, _) = self.nft_family();
        self.local_cidr.map(|c| format!("{ip} saddr {c}"))
    }

    /// `NodePortAddresses.GetNodeIPs`: the node's addresses (and the loopback
    /// address, which every node has) inside the NodePort CIDRs, sorted.
    pub(crate) fn node_port_ips(&self) -> Vec<IpAddr> {
        let mut ips: Vec<IpAddr> = self
            .node_ips
            .iter()
            .copied()
            .chain([loopback(self.ipv6)])
            .filter(|ip| self.npa.cidrs.iter().any(|c| c.contains(*ip)))
            .collect();
        ips.sort_unstable();
        ips.dedup();
        ips
    }
}

impl NodePortAddresses {
    /// `NewNodePortAddresses`: the CIDRs of the family, `0.0.0.0/0` or `::/0`
    /// when there are none.
    fn new(cidrs: &[String], ipv6: bool) -> Result<Self> {
        let mut of_family = Vec::new();
        for c in cidrs {
            let net = parse_cidr(c, "--nodeport-addresses")?;
            if net.is_ipv6() == ipv6 {
                of_family.push(net);
            }
        }
        if of_family.is_empty() {
            of_family.push(if ipv6 {
                parse_cidr("::/0", "default")?
            } else {
                parse_cidr("0.0.0.0/0", "default")?
            });
        }
        let mut npa = Self {
            cidrs: Vec::new(),
            match_all: false,
            contains_ipv4_loopback: false,
        };
        for net in of_family {
            if let IpNetwork::V4(v4) = net {
                if v4.ip().is_loopback() || v4.contains(std::net::Ipv4Addr::new(127, 0, 0, 0)) {
                    npa.contains_ipv4_loopback = true;
                }
            }
            if net.prefix() == 0 {
                npa.cidrs = vec![net];
                npa.match_all = true;
                break;
            }
            npa.cidrs.push(net);
        }
        Ok(npa)
    }
}

fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(_) => false,
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// A CIDR (surrounding blanks ignored, as kube-proxy does), normalised to its
/// network address.
fn parse_cidr(s: &str, what: &str) -> Result<IpNetwork> {
    let net: IpNetwork = s
        .trim()
        .parse()
        .map_err(|e| err!("kube-proxy rules: {what} {s:?} is not a CIDR: {e}"))?;
    IpNetwork::new(net.network(), net.prefix())
        .map_err(|e| err!("kube-proxy rules: {what} {s:?}: {e}"))
}

fn cidr_of_family(s: &str, ipv6: bool, what: &str) -> Result<IpNetwork> {
    let net = parse_cidr(s, what)?;
    if net.is_ipv6() != ipv6 {
        return Err(err!(
            "kube-proxy rules: {what} {s} is not of the proxier's family (IPv{})",
            if ipv6 { 6 } else { 4 }
        ));
    }
    Ok(net)
}

/// One endpoint of a service port (`BaseEndpointInfo`).
#[derive(Clone, Debug)]
pub(crate) struct Ep {
    pub ip: IpAddr,
    pub port: u16,
    pub local: bool,
    pub ready: bool,
}

impl Ep {
    /// `Endpoint.String()`: `ip:port`, `[ip6]:port`.
    pub(crate) fn addr(&self) -> String {
        std::net::SocketAddr::new(self.ip, self.port).to_string()
    }
}

/// One service port of the proxier's family (`BaseServicePortInfo`).
pub(crate) struct SvcPort {
    /// `ServicePortName.String()`: `ns/name:port` (`ns/name` for an unnamed port).
    pub name: String,
    pub namespace: String,
    pub service: String,
    pub port_name: String,
    pub protocol: Protocol,
    pub cluster_ip: IpAddr,
    pub port: u16,
    pub node_port: Option<u16>,
    pub external_ips: Vec<IpAddr>,
    pub lb_ips: Vec<IpAddr>,
    pub source_ranges: Vec<IpNetwork>,
    pub health_check_node_port: Option<u16>,
    pub affinity: Option<u32>,
    pub internal_local: bool,
    external_local: bool,
    /// Every endpoint of the family, sorted by `Endpoint.String()` and
    /// de-duplicated (`endpointsMapFromEndpointInfo`).
    pub endpoints: Vec<Ep>,
}

/// `CategorizeEndpoints` (pkg/proxy/topology.go), without terminating
/// endpoints and topology.
pub(crate) struct Categorized<'a> {
    pub cluster: Vec<&'a Ep>,
    pub local: Vec<&'a Ep>,
    pub all_reachable: Vec<&'a Ep>,
    pub has_any: bool,
}

impl SvcPort {
    pub(crate) fn proto(&self) -> &'static str {
        self.protocol.lower()
    }

    /// `ExternallyAccessible()`.
    pub(crate) fn externally_accessible(&self) -> bool {
        self.node_port.is_some() || !self.lb_ips.is_empty() || !self.external_ips.is_empty()
    }

    /// `ExternalPolicyLocal()`.
    pub(crate) fn external_policy_local(&self) -> bool {
        self.external_local
    }

    /// `UsesClusterEndpoints()`.
    pub(crate) fn uses_cluster_endpoints(&self) -> bool {
        !self.internal_local || (self.externally_accessible() && !self.external_policy_local())
    }

    /// `UsesLocalEndpoints()`.
    pub(crate) fn uses_local_endpoints(&self) -> bool {
        self.internal_local || (self.externally_accessible() && self.external_policy_local())
    }

    pub(crate) fn categorize(&self) -> Categorized<'_> {
        let mut c = Categorized {
            cluster: Vec::new(),
            local: Vec::new(),
            all_reachable: Vec::new(),
            has_any: false,
        };
        if self.endpoints.is_empty() {
            return c;
        }
        if self.uses_cluster_endpoints() {
            c.cluster = self.endpoints.iter().filter(|e| e.ready).collect();
            c.has_any = !c.cluster.is_empty();
        }
        if !self.uses_local_endpoints() {
            c.all_reachable.clone_from(&c.cluster);
            return c;
        }
        if self.endpoints.iter().any(|e| e.ready) {
            c.has_any = true;
        }
        c.local = self
            .endpoints
            .iter()
            .filter(|e| e.ready && e.local)
            .collect();
        c.all_reachable = if self.uses_cluster_endpoints() {
            // Only ready endpoints and no topology: the cluster list holds the
            // local one.
            c.cluster.clone()
        } else {
            c.local.clone()
        };
        c
    }

    /// The iptables chains' hash (`portProtoHash`).
    pub(crate) fn ipt_hash(&self) -> String {
        hash::port_proto_hash(&self.name, self.proto())
    }

    /// `KUBE-SEP-…` of an endpoint.
    pub(crate) fn ipt_endpoint_chain(&self, ep: &Ep) -> String {
        hash::endpoint_chain(&self.name, self.proto(), &ep.addr())
    }

    /// `servicePortChainNameBase` (nftables).
    pub(crate) fn nft_base(&self) -> String {
        hash::nft_hash_and_truncate(&format!(
            "{}/{}/{}/{}",
            self.namespace,
            self.service,
            self.proto(),
            self.port_name
        ))
    }

    /// `servicePortEndpointChainNameBase` (nftables): colons of an IPv6
    /// endpoint become dots.
    pub(crate) fn nft_endpoint_base(&self, ep: &Ep) -> String {
        hash::nft_hash_and_truncate(&format!(
            "{}/{}/{}/{}__{}/{}",
            self.namespace,
            self.service,
            self.proto(),
            self.port_name,
            ep.ip.to_string().replace(':', "."),
            ep.port
        ))
    }
}

/// Whether the iptables proxier runs in `largeClusterMode`.
pub(crate) fn large_cluster(ports: &[SvcPort]) -> bool {
    ports.iter().map(|p| p.endpoints.len()).sum::<usize>() > LARGE_CLUSTER_ENDPOINTS
}

/// Names kube-proxy writes unquoted into rules and chain names: Kubernetes
/// object names (DNS labels and subdomains, IANA service names).
fn check_name(s: &str, what: &str, may_be_empty: bool) -> Result<()> {
    let ok = s
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    if !ok || (s.is_empty() && !may_be_empty) || s.len() > 63 {
        return Err(err!(
            "kube-proxy rules: {what} {s:?} is not a Kubernetes name ([a-z0-9.-], 1 to 63 characters)"
        ));
    }
    Ok(())
}

/// The service ports of the proxier's family, in the order of `services` and
/// their ports (`ServiceChangeTracker` with the `EndpointSliceCache`).
pub(crate) fn service_ports(ctx: &Ctx, services: &[Service]) -> Result<Vec<SvcPort>> {
    let mut out = Vec::new();
    for svc in services {
        check_name(&svc.namespace, "namespace", false)?;
        check_name(&svc.name, "service name", false)?;
        if svc.ports.is_empty() {
            return Err(err!(
                "kube-proxy rules: {}/{} has no ports",
                svc.namespace,
                svc.name
            ));
        }
        // A single-stack Service of the other family has no ClusterIP here:
        // the proxier skips it.
        if svc.cluster_ip.is_ipv6() != ctx.ipv6 {
            continue;
        }
        let mut source_ranges = Vec::new();
        for r in &svc.load_balancer_source_ranges {
            let net = parse_cidr(r, "loadBalancerSourceRanges entry")?;
            if net.is_ipv6() == ctx.ipv6 {
                source_ranges.push(net);
            }
        }
        let external_ips: Vec<IpAddr> = svc
            .external_ips
            .iter()
            .copied()
            .filter(|ip| ip.is_ipv6() == ctx.ipv6)
            .collect();
        let lb_ips: Vec<IpAddr> = svc
            .load_balancer_ips
            .iter()
            .copied()
            .filter(|ip| ip.is_ipv6() == ctx.ipv6)
            .collect();
        let nodeport_or_lb = !lb_ips.is_empty() || svc.ports.iter().any(|p| p.node_port.is_some());
        for p in &svc.ports {
            check_name(&p.name, "port name", svc.ports.len() == 1)?;
            if p.port == 0 || p.target_port == 0 || p.node_port == Some(0) {
                return Err(err!(
                    "kube-proxy rules: {}/{} port {:?}: ports must not be 0",
                    svc.namespace,
                    svc.name,
                    p.name
                ));
            }
            let name = if p.name.is_empty() {
                format!("{}/{}", svc.namespace, svc.name)
            } else {
                format!("{}/{}:{}", svc.namespace, svc.name, p.name)
            };
            out.push(SvcPort {
                name,
                namespace: svc.namespace.clone(),
                service: svc.name.clone(),
                port_name: p.name.clone(),
                protocol: p.protocol,
                cluster_ip: svc.cluster_ip,
                port: p.port,
                node_port: p.node_port,
                external_ips: external_ips.clone(),
                lb_ips: lb_ips.clone(),
                source_ranges: source_ranges.clone(),
                health_check_node_port: svc.health_check_node_port,
                affinity: svc.session_affinity_seconds,
                internal_local: svc.internal_traffic_local,
                external_local: svc.external_traffic_local && nodeport_or_lb,
                endpoints: endpoints(ctx, svc, p.target_port),
            });
        }
    }
    Ok(out)
}

/// The endpoints of the family on `port`, keyed (so sorted and de-duplicated)
/// by `ip:port`; a duplicate that is local wins (`addEndpoints`).
fn endpoints(ctx: &Ctx, svc: &Service, port: u16) -> Vec<Ep> {
    let mut by_addr: BTreeMap<String, Ep> = BTreeMap::new();
    for e in svc.endpoints.iter().filter(|e| e.ip.is_ipv6() == ctx.ipv6) {
        let ep = Ep {
            ip: e.ip,
            port,
            local: !ctx.hostname.is_empty() && e.node == ctx.hostname,
            ready: e.ready,
        };
        let key = ep.addr();
        if !by_addr.contains_key(&key) || ep.local {
            by_addr.insert(key, ep);
        }
    }
    by_addr.into_values().collect()
}
