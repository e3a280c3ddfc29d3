//! kube-proxy's IPVS mode: `syncProxyRules`, `syncService`, `syncEndpoint`,
//! `writeIptablesRules` and `createAndLinkKubeChain` of
//! pkg/proxy/ipvs/proxier.go, the sets of pkg/proxy/ipvs/ipset.go, written for
//! `ipset restore`, `ipvsadm -R`, `iptables-restore` and `ip`.
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::{IpAddr, SocketAddr},
    path::Path,
};

use super::{
    iptables::{self, Jump, Table},
    ports::{Ctx, Ep, SvcPort},
    tools, Protocol,
};
use crate::Result;

/// `defaultDummyDevice`: the dummy interface service addresses are bound to.
pub const DUMMY: &str = "kube-ipvs0";
/// `defaultScheduler`.
const SCHEDULER: &str = "rr";

/// An ipset type (`utilipset.Type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SetType {
    HashIpPortIp,
    HashIpPort,
    HashIpPortNet,
    BitmapPort,
    HashIp,
}

impl SetType {
    fn as_str(self) -> &'static str {
        match self {
            Self::HashIpPortIp => "hash:ip,port,ip",
            Self::HashIpPort => "hash:ip,port",
            Self::HashIpPortNet => "hash:ip,port,net",
            Self::BitmapPort => "bitmap:port",
            Self::HashIp => "hash:ip",
        }
    }
}

/// `ipsetInfo`: the sets, in kube-proxy's order, with their comments.
const SETS: [(&str, SetType, &str); 17] = [
    (
        "KUBE-LOOP-BACK",
        SetType::HashIpPortIp,
        "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose",
    ),
    (
        "KUBE-CLUSTER-IP",
        SetType::HashIpPort,
        "Kubernetes service cluster ip + port for masquerade purpose",
    ),
    (
        "KUBE-EXTERNAL-IP",
        SetType::HashIpPort,
        "Kubernetes service external ip + port for masquerade and filter purpose",
    ),
    (
        "KUBE-EXTERNAL-IP-LOCAL",
        SetType::HashIpPort,
        "Kubernetes service external ip + port with externalTrafficPolicy=local",
    ),
    (
        "KUBE-LOAD-BALANCER",
        SetType::HashIpPort,
        "Kubernetes service lb portal",
    ),
    (
        "KUBE-LOAD-BALANCER-FW",
        SetType::HashIpPort,
        "Kubernetes service load balancer ip + port for load balancer with sourceRange",
    ),
    (
        "KUBE-LOAD-BALANCER-LOCAL",
        SetType::HashIpPort,
        "Kubernetes service load balancer ip + port with externalTrafficPolicy=local",
    ),
    (
        "KUBE-LOAD-BALANCER-SOURCE-IP",
        SetType::HashIpPortIp,
        "Kubernetes service load balancer ip + port + source IP for packet filter purpose",
    ),
    (
        "KUBE-LOAD-BALANCER-SOURCE-CIDR",
        SetType::HashIpPortNet,
        "Kubernetes service load balancer ip + port + source cidr for packet filter purpose",
    ),
    (
        "KUBE-NODE-PORT-TCP",
        SetType::BitmapPort,
        "Kubernetes nodeport TCP port for masquerade purpose",
    ),
    (
        "KUBE-NODE-PORT-LOCAL-TCP",
        SetType::BitmapPort,
        "Kubernetes nodeport TCP port with externalTrafficPolicy=local",
    ),
    (
        "KUBE-NODE-PORT-UDP",
        SetType::BitmapPort,
        "Kubernetes nodeport UDP port for masquerade purpose",
    ),
    (
        "KUBE-NODE-PORT-LOCAL-UDP",
        SetType::BitmapPort,
        "Kubernetes nodeport UDP port with externalTrafficPolicy=local",
    ),
    (
        "KUBE-NODE-PORT-SCTP-HASH",
        SetType::HashIpPort,
        "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'",
    ),
    (
        "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
        SetType::HashIpPort,
        "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'",
    ),
    (
        "KUBE-HEALTH-CHECK-NODE-PORT",
        SetType::BitmapPort,
        "Kubernetes health check node port",
    ),
    ("KUBE-IPVS-IPS", SetType::HashIp, "Kubernetes ipvs ips"),
];

/// `ipsetWithIptablesChain`: set, table, from chain, to, match type, protocol.
const SET_RULES: [(&str, &str, &str, &str, &str, &str); 12] = [
    (
        "KUBE-LOOP-BACK",
        "nat",
        "KUBE-POSTROUTING",
        "MASQUERADE",
        "dst,dst,src",
        "",
    ),
    (
        "KUBE-LOAD-BALANCER",
        "nat",
        "KUBE-SERVICES",
        "KUBE-LOAD-BALANCER",
        "dst,dst",
        "",
    ),
    (
        "KUBE-LOAD-BALANCER-LOCAL",
        "nat",
        "KUBE-LOAD-BALANCER",
        "RETURN",
        "dst,dst",
        "",
    ),
    (
        "KUBE-NODE-PORT-LOCAL-TCP",
        "nat",
        "KUBE-NODE-PORT",
        "RETURN",
        "dst",
        "tcp",
    ),
    (
        "KUBE-NODE-PORT-TCP",
        "nat",
        "KUBE-NODE-PORT",
        "KUBE-MARK-MASQ",
        "dst",
        "tcp",
    ),
    (
        "KUBE-NODE-PORT-LOCAL-UDP",
        "nat",
        "KUBE-NODE-PORT",
        "RETURN",
        "dst",
        "udp",
    ),
    (
        "KUBE-NODE-PORT-UDP",
        "nat",
        "KUBE-NODE-PORT",
        "KUBE-MARK-MASQ",
        "dst",
        "udp",
    ),
    (
        "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
        "nat",
        "KUBE-NODE-PORT",
        "RETURN",
        "dst,dst",
        "sctp",
    ),
    (
        "KUBE-NODE-PORT-SCTP-HASH",
        "nat",
        "KUBE-NODE-PORT",
        "KUBE-MARK-MASQ",
        "dst,dst",
        "sctp",
    ),
    (
        "KUBE-LOAD-BALANCER-FW",
        "filter",
        "KUBE-PROXY-FIREWALL",
        "KUBE-SOURCE-RANGES-FIREWALL",
        "dst,dst",
        "",
    ),
    (
        "KUBE-LOAD-BALANCER-SOURCE-CIDR",
        "filter",
        "KUBE-SOURCE-RANGES-FIREWALL",
        "RETURN",
        "dst,dst,src",
        "",
    ),
    (
        "KUBE-LOAD-BALANCER-SOURCE-IP",
        "filter",
        "KUBE-SOURCE-RANGES-FIREWALL",
        "RETURN",
        "dst,dst,src",
        "",
    ),
];

/// An ipset of the proxier, with the entries this sync wants in it.
#[derive(Clone, Debug)]
pub struct IpSet {
    /// The set's name: `KUBE-6-…` (cut to 31 characters) for IPv6 (`NewIPSet`).
    pub name: String,
    /// Its name in kube-proxy's code (the IPv4 name).
    pub base: &'static str,
    set_type: SetType,
    pub comment: &'static str,
    pub entries: BTreeSet<String>,
}

impl IpSet {
    /// `ipset create` arguments (`createSet`: hash sizes and family, or the
    /// bitmap's port range).
    pub fn create_args(&self, ipv6: bool) -> String {
        let t = self.set_type.as_str();
        if self.set_type == SetType::BitmapPort {
            format!("{} {t} range 0-65535", self.name)
        } else {
            let family = if ipv6 { "inet6" } else { "inet" };
            format!(
                "{} {t} family {family} hashsize 1024 maxelem 65536",
                self.name
            )
        }
    }
}

/// An IPVS virtual server with its real servers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VirtualServer {
    pub addr: SocketAddr,
    pub protocol: Protocol,
    /// Session affinity: `-p <timeout>` (`FlagPersistent`).
    pub persistent: Option<u32>,
    pub real_servers: Vec<SocketAddr>,
}

impl VirtualServer {
    /// `-t`, `-u`, `--sctp-service`.
    fn flag(&self) -> &'static str {
        match self.protocol {
            Protocol::Tcp => "-t",
            Protocol::Udp => "-u",
            Protocol::Sctp => "--sctp-service",
        }
    }

    /// The virtual server as `ipvsadm-save -n` writes it.
    pub fn service_line(&self) -> String {
        let persistent = self
            .persistent
            .map_or_else(String::new, |t| format!(" -p {t}"));
        format!(
            "-A {} {} -s {SCHEDULER}{persistent}",
            self.flag(),
            self.addr
        )
    }

    /// A real server as `ipvsadm-save -n` writes it: masquerading, weight 1.
    pub fn real_line(&self, real: SocketAddr) -> String {
        format!("-a {} {} -r {real} -m -w 1", self.flag(), self.addr)
    }
}

/// The IPVS mode's rules.
#[derive(Clone, Debug)]
pub struct Rules {
    pub ipv6: bool,
    /// Every set `ensureIPSet` makes, with its entries.
    pub sets: Vec<IpSet>,
    /// The `ipset -exist restore` input of a node with no sets yet.
    pub ipset_restore: String,
    pub virtual_servers: Vec<VirtualServer>,
    /// The `ipvsadm -R` input of a node with no virtual servers yet.
    pub ipvsadm_restore: String,
    /// Addresses bound to [`DUMMY`] (`activeBindAddrs`).
    pub bind: Vec<IpAddr>,
    /// `createAndLinkKubeChain`'s jumps.
    pub jumps: Vec<Jump>,
    /// The `iptables-restore --noflush` input (nat, then filter).
    pub restore: String,
}

impl fmt::Display for Rules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "ip link add {DUMMY} type dummy")?;
        write!(f, "{}", self.ipset_restore)?;
        write!(f, "{}", self.ipvsadm_restore)?;
        let len = if self.ipv6 { 128 } else { 32 };
        for a in &self.bind {
            writeln!(f, "ip addr add {a}/{len} dev {DUMMY}")?;
        }
        iptables::write_jumps(f, self.ipv6, &self.jumps)?;
        write!(f, "{}", self.restore)
    }
}

/// `iptablesJumpChain` of the IPVS proxier.
fn jumps() -> Vec<Jump> {
    let table: [(&str, &str, &str, &str); 9] = [
        (
            "nat",
            "OUTPUT",
            "KUBE-SERVICES",
            "kubernetes service portals",
        ),
        (
            "nat",
            "PREROUTING",
            "KUBE-SERVICES",
            "kubernetes service portals",
        ),
        (
            "nat",
            "POSTROUTING",
            "KUBE-POSTROUTING",
            "kubernetes postrouting rules",
        ),
        (
            "filter",
            "FORWARD",
            "KUBE-FORWARD",
            "kubernetes forwarding rules",
        ),
        (
            "filter",
            "INPUT",
            "KUBE-NODE-PORT",
            "kubernetes health check rules",
        ),
        (
            "filter",
            "INPUT",
            "KUBE-PROXY-FIREWALL",
            "kube-proxy firewall rules",
        ),
        (
            "filter",
            "FORWARD",
            "KUBE-PROXY-FIREWALL",
            "kube-proxy firewall rules",
        ),
        (
            "filter",
            "INPUT",
            "KUBE-IPVS-FILTER",
            "kubernetes ipvs access filter",
        ),
        (
            "filter",
            "OUTPUT",
            "KUBE-IPVS-OUT-FILTER",
            "kubernetes ipvs access filter",
        ),
    ];
    table
        .into_iter()
        .map(|(table, chain, target, comment)| Jump {
            table,
            chain,
            target,
            args: ["-m", "comment", "--comment", comment, "-j", target]
                .into_iter()
                .map(str::to_string)
                .collect(),
        })
        .collect()
}

/// The sets of the family, empty.
fn sets(ipv6: bool) -> BTreeMap<&'static str, IpSet> {
    SETS.iter()
        .map(|&(base, set_type, comment)| {
            let mut name = base.to_string();
            if ipv6 {
                name = name.replacen("KUBE-", "KUBE-6-", 1);
                name.truncate(31);
            }
            (
                base,
                IpSet {
                    name,
                    base,
                    set_type,
                    comment,
                    entries: BTreeSet::new(),
                },
            )
        })
        .collect()
}

/// Accumulates a sync: sets, virtual servers, bound addresses, entries that
/// block node access to firewalled load balancers.
struct Sync {
    sets: BTreeMap<&'static str, IpSet>,
    servers: Vec<VirtualServer>,
    bind: Vec<IpAddr>,
    lb_no_node_access: Vec<(IpAddr, &'static str, u16)>,
}

impl Sync {
    fn add(&mut self, set: &str, entry: String) {
        if let Some(s) = self.sets.get_mut(set) {
            s.entries.insert(entry);
        }
    }

    fn has(&self, set: &str) -> bool {
        self.sets.get(set).is_some_and(|s| !s.entries.is_empty())
    }

    fn name(&self, set: &str) -> String {
        self.sets
            .get(set)
            .map_or_else(String::new, |s| s.name.clone())
    }

    fn comment(&self, set: &str) -> String {
        self.sets
            .get(set)
            .map_or_else(String::new, |s| format!("\"{}\"", s.comment))
    }

    /// `syncService` + `syncEndpoint`: one virtual server and its real servers.
    fn server(&mut self, sp: &SvcPort, ip: IpAddr, port: u16, only_local: bool, bind: bool) {
        let cat = sp.categorize();
        let endpoints: &[&Ep] = if only_local && !cat.local.is_empty() {
            &cat.local
        } else {
            &cat.cluster
        };
        let mut real_servers: Vec<SocketAddr> = endpoints
            .iter()
            .map(|e| SocketAddr::new(e.ip, e.port))
            .collect();
        real_servers.sort_unstable();
        real_servers.dedup();
        self.servers.push(VirtualServer {
            addr: SocketAddr::new(ip, port),
            protocol: sp.protocol,
            persistent: sp.affinity,
            real_servers,
        });
        if bind && !self.bind.contains(&ip) {
            self.bind.push(ip);
        }
    }
}

/// `syncProxyRules` (pkg/proxy/ipvs/proxier.go) for a full sync.
pub(crate) fn render(ctx: &Ctx, ports: &[SvcPort]) -> Rules {
    let mut s = Sync {
        sets: sets(ctx.ipv6),
        servers: Vec::new(),
        bind: Vec::new(),
        lb_no_node_access: Vec::new(),
    };
    let has_node_port = ports.iter().any(|p| p.node_port.is_some());
    let node_ips: Vec<IpAddr> = if !has_node_port {
        Vec::new()
    } else if ctx.npa.match_all {
        ctx.node_ips.clone()
    } else {
        ctx.node_port_ips()
            .into_iter()
            .filter(|ip| !ip.is_loopback())
            .collect()
    };
    for sp in ports {
        service_port(ctx, sp, &node_ips, &mut s);
    }
    // KUBE-IPVS-IPS holds the bound addresses.
    let bound: Vec<String> = s.bind.iter().map(ToString::to_string).collect();
    for b in bound {
        s.add("KUBE-IPVS-IPS", b);
    }
    let (nat, filter) = iptables_rules(ctx, &s);
    let sets: Vec<IpSet> = SETS
        .iter()
        .filter_map(|(base, ..)| s.sets.get(base).cloned())
        .collect();
    let ipset_restore = ipset_input(ctx.ipv6, &sets, &BTreeMap::new());
    let mut ipvsadm_restore = String::new();
    for vs in &s.servers {
        ipvsadm_restore.push_str(&vs.service_line());
        ipvsadm_restore.push('\n');
        for r in &vs.real_servers {
            ipvsadm_restore.push_str(&vs.real_line(*r));
            ipvsadm_restore.push('\n');
        }
    }
    Rules {
        ipv6: ctx.ipv6,
        sets,
        ipset_restore,
        virtual_servers: s.servers,
        ipvsadm_restore,
        bind: s.bind,
        jumps: jumps(),
        restore: iptables::restore_text(&[&nat, &filter]),
    }
}

/// The body of `syncProxyRules`' loop over service ports.
fn service_port(ctx: &Ctx, sp: &SvcPort, node_ips: &[IpAddr], s: &mut Sync) {
    let p = sp.proto();
    let port = sp.port;
    // Hairpin: local endpoints masquerade traffic to themselves.
    for ep in sp.endpoints.iter().filter(|e| e.local) {
        s.add(
            "KUBE-LOOP-BACK",
            format!("{},{p}:{},{}", ep.ip, ep.port, ep.ip),
        );
    }

    s.add("KUBE-CLUSTER-IP", format!("{},{p}:{port}", sp.cluster_ip));
    s.server(sp, sp.cluster_ip, port, sp.internal_local, true);

    let external_local = sp.external_policy_local();
    for ip in &sp.external_ips {
        let set = if external_local {
            "KUBE-EXTERNAL-IP-LOCAL"
        } else {
            "KUBE-EXTERNAL-IP"
        };
        s.add(set, format!("{ip},{p}:{port}"));
        let bind = !ctx.node_ips.contains(ip);
        s.server(sp, *ip, port, external_local, bind);
    }

    for ip in &sp.lb_ips {
        let entry = format!("{ip},{p}:{port}");
        s.add("KUBE-LOAD-BALANCER", entry.clone());
        if external_local {
            s.add("KUBE-LOAD-BALANCER-LOCAL", entry.clone());
        }
        if !sp.source_ranges.is_empty() {
            s.add("KUBE-LOAD-BALANCER-FW", entry.clone());
            let mut allow_from_node = false;
            for cidr in &sp.source_ranges {
                s.add("KUBE-LOAD-BALANCER-SOURCE-CIDR", format!("{entry},{cidr}"));
                allow_from_node |= ctx.node_ip.is_some_and(|n| cidr.contains(n));
            }
            if allow_from_node {
                s.add("KUBE-LOAD-BALANCER-SOURCE-IP", format!("{entry},{ip}"));
            } else {
                s.lb_no_node_access.push((*ip, p, port));
            }
        }
        let bind = !ctx.node_ips.contains(ip);
        s.server(sp, *ip, port, external_local, bind);
    }

    if let Some(node_port) = sp.node_port {
        if !node_ips.is_empty() {
            let (set, local_set, entries): (&str, &str, Vec<String>) = match sp.protocol {
                Protocol::Tcp => (
                    "KUBE-NODE-PORT-TCP",
                    "KUBE-NODE-PORT-LOCAL-TCP",
                    vec![node_port.to_string()],
                ),
                Protocol::Udp => (
                    "KUBE-NODE-PORT-UDP",
                    "KUBE-NODE-PORT-LOCAL-UDP",
                    vec![node_port.to_string()],
                ),
                Protocol::Sctp => (
                    "KUBE-NODE-PORT-SCTP-HASH",
                    "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
                    node_ips
                        .iter()
                        .map(|ip| format!("{ip},{p}:{node_port}"))
                        .collect(),
                ),
            };
            for e in &entries {
                s.add(set, e.clone());
                if external_local {
                    s.add(local_set, e.clone());
                }
            }
            for ip in node_ips {
                s.server(sp, *ip, node_port, external_local, false);
            }
        }
    }

    if let Some(hc) = sp.health_check_node_port {
        s.add("KUBE-HEALTH-CHECK-NODE-PORT", hc.to_string());
    }
}

/// `createAndLinkKubeChain`'s chain lines and `writeIptablesRules`.
fn iptables_rules(ctx: &Ctx, s: &Sync) -> (Table, Table) {
    let mark = &ctx.mark;
    let mut nat = Table {
        name: "nat",
        ..Table::default()
    };
    let mut filter = Table {
        name: "filter",
        ..Table::default()
    };
    for c in [
        "KUBE-SERVICES",
        "KUBE-POSTROUTING",
        "KUBE-NODE-PORT",
        "KUBE-LOAD-BALANCER",
        "KUBE-MARK-MASQ",
    ] {
        nat.chain(c);
    }
    for c in [
        "KUBE-FORWARD",
        "KUBE-NODE-PORT",
        "KUBE-PROXY-FIREWALL",
        "KUBE-SOURCE-RANGES-FIREWALL",
        "KUBE-IPVS-FILTER",
        "KUBE-IPVS-OUT-FILTER",
    ] {
        filter.chain(c);
    }

    let lo = if ctx.ipv6 { "::1/128" } else { "127.0.0.0/8" };
    nat.rule(format!("-A KUBE-SERVICES -s {lo} -j RETURN"));
    for (set, table, from, to, match_type, proto) in SET_RULES {
        if !s.has(set) {
            continue;
        }
        let proto = if proto.is_empty() {
            String::new()
        } else {
            format!(" -p {proto}")
        };
        let rule = format!(
            "-A {from}{proto} -m comment --comment {} -m set --match-set {} {match_type} -j {to}",
            s.comment(set),
            s.name(set)
        );
        if table == "filter" {
            filter.rule(rule);
        } else {
            nat.rule(rule);
        }
    }

    if s.has("KUBE-CLUSTER-IP") {
        let args = format!(
            "-A KUBE-SERVICES -m comment --comment {} -m set --match-set {}",
            s.comment("KUBE-CLUSTER-IP"),
            s.name("KUBE-CLUSTER-IP")
        );
        if ctx.masquerade_all {
            nat.rule(format!("{args} dst,dst -j KUBE-MARK-MASQ"));
        } else if let Some(not_local) = ctx.ipt_if_not_local() {
            nat.rule(format!("{args} dst,dst {not_local} -j KUBE-MARK-MASQ"));
        } else {
            nat.rule(format!("{args} src,dst -j KUBE-MARK-MASQ"));
        }
    }

    // externalIPRules: from off the machine, or to a local address.
    let external_ip_rules = |nat: &mut Table, args: &str| {
        nat.rule(format!(
            "{args} -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT"
        ));
        nat.rule(format!("{args} -m addrtype --dst-type LOCAL -j ACCEPT"));
    };
    if s.has("KUBE-EXTERNAL-IP") {
        let args = format!(
            "-A KUBE-SERVICES -m comment --comment {} -m set --match-set {} dst,dst",
            s.comment("KUBE-EXTERNAL-IP"),
            s.name("KUBE-EXTERNAL-IP")
        );
        nat.rule(format!("{args} -j KUBE-MARK-MASQ"));
        external_ip_rules(&mut nat, &args);
    }
    if s.has("KUBE-EXTERNAL-IP-LOCAL") {
        let args = format!(
            "-A KUBE-SERVICES -m comment --comment {} -m set --match-set {} dst,dst",
            s.comment("KUBE-EXTERNAL-IP-LOCAL"),
            s.name("KUBE-EXTERNAL-IP-LOCAL")
        );
        external_ip_rules(&mut nat, &args);
    }

    nat.rule("-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT".to_string());
    nat.rule("-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ".to_string());
    filter.rule("-A KUBE-SOURCE-RANGES-FIREWALL -j DROP".to_string());
    for (ip, proto, port) in &s.lb_no_node_access {
        filter.rule(format!(
            "-A KUBE-IPVS-OUT-FILTER -s {ip} -m ipvs --vaddr {ip} --vproto {proto} --vport {port} -j DROP"
        ));
    }
    // acceptIPVSTraffic.
    for set in ["KUBE-CLUSTER-IP", "KUBE-LOAD-BALANCER"] {
        if s.has(set) {
            nat.rule(format!(
                "-A KUBE-SERVICES -m set --match-set {} dst,dst -j ACCEPT",
                s.name(set)
            ));
        }
    }
    filter.rule(format!(
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {mark}/{mark} -j ACCEPT"
    ));
    filter.rule(
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
            .to_string(),
    );
    filter.rule(format!(
        "-A KUBE-NODE-PORT -m comment --comment {} -m set --match-set {} dst -j ACCEPT",
        s.comment("KUBE-HEALTH-CHECK-NODE-PORT"),
        s.name("KUBE-HEALTH-CHECK-NODE-PORT")
    ));
    for (set, match_type) in [
        ("KUBE-LOAD-BALANCER", "dst,dst"),
        ("KUBE-CLUSTER-IP", "dst,dst"),
        ("KUBE-EXTERNAL-IP", "dst,dst"),
        ("KUBE-EXTERNAL-IP-LOCAL", "dst,dst"),
        ("KUBE-HEALTH-CHECK-NODE-PORT", "dst"),
    ] {
        filter.rule(format!(
            "-A KUBE-IPVS-FILTER -m set --match-set {} {match_type} -j RETURN",
            s.name(set)
        ));
    }
    filter.rule(format!(
        "-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set {} dst -j REJECT",
        s.name("KUBE-IPVS-IPS")
    ));

    nat.rule(format!(
        "-A KUBE-POSTROUTING -m mark ! --mark {mark}/{mark} -j RETURN"
    ));
    nat.rule(format!("-A KUBE-POSTROUTING -j MARK --xor-mark {mark}"));
    nat.rule(format!(
        "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE{}",
        if ctx.features.random_fully { " --random-fully" } else { "" }
    ));
    nat.rule(format!("-A KUBE-MARK-MASQ -j MARK --or-mark {mark}"));
    (nat, filter)
}

/// The `ipset -exist restore` input: every set made (`ensureIPSet`), then the
/// entries reconciled against `current` (`syncIPSetEntries`: stale ones
/// deleted, missing ones added).
fn ipset_input(ipv6: bool, sets: &[IpSet], current: &BTreeMap<String, BTreeSet<String>>) -> String {
    let mut lines: Vec<String> = sets
        .iter()
        .map(|set| format!("create {}", set.create_args(ipv6)))
        .collect();
    let none = BTreeSet::new();
    for set in sets {
        let have = current.get(&set.name).unwrap_or(&none);
        lines.extend(
            have.difference(&set.entries)
                .map(|e| format!("del {} {e}", set.name)),
        );
        lines.extend(
            set.entries
                .difference(have)
                .map(|e| format!("add {} {e}", set.name)),
        );
    }
    lines_text(&lines)
}

/// Lines, each ended by a newline.
fn lines_text(lines: &[String]) -> String {
    lines.iter().fold(String::new(), |mut s, l| {
        s.push_str(l);
        s.push('\n');
        s
    })
}

/// The entries of every set in the namespace (`ipset save`).
fn current_sets(netns: &Path) -> Result<BTreeMap<String, BTreeSet<String>>> {
    let save = tools::tool(netns, "ipset", &["save"])?;
    let mut sets: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in save.lines() {
        let mut words = line.split_whitespace();
        if let (Some("add"), Some(set), Some(entry)) = (words.next(), words.next(), words.next()) {
            sets.entry(set.to_string())
                .or_default()
                .insert(entry.to_string());
        }
    }
    Ok(sets)
}

/// The virtual servers and real servers in the namespace (`ipvsadm-save -n`):
/// service line by identity (`-A -t addr`), real server lines by service
/// identity and real address.
#[derive(Default)]
struct CurrentIpvs {
    services: BTreeMap<String, String>,
    reals: BTreeMap<String, BTreeMap<String, String>>,
}

fn current_ipvs(netns: &Path) -> Result<CurrentIpvs> {
    let save = tools::tool(netns, "ipvsadm-save", &["-n"])?;
    let mut cur = CurrentIpvs::default();
    for line in save.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["-A", flag, addr, ..] => {
                cur.services
                    .insert(format!("{flag} {addr}"), line.trim().to_string());
            }
            ["-a", flag, addr, "-r", real, ..] => {
                cur.reals
                    .entry(format!("{flag} {addr}"))
                    .or_default()
                    .insert((*real).to_string(), line.trim().to_string());
            }
            _ => {}
        }
    }
    Ok(cur)
}

/// Whether a virtual server address (`10.0.0.1:80`, `[2001:db8::1]:80`) is of
/// the family.
fn of_family(addr: &str, ipv6: bool) -> bool {
    addr.starts_with('[') == ipv6
}

/// The `ipvsadm -R` commands that make the namespace's IPVS table what
/// `rules` wants: `syncService` (add, or edit a changed service) and
/// `syncEndpoint` (add missing real servers, edit changed ones, delete gone
/// ones); and, apart, `cleanLegacyService`'s deletes of services of the family
/// this sync did not make.
fn ipvs_commands(rules: &Rules, cur: &CurrentIpvs) -> (String, String) {
    let mut sync: Vec<String> = Vec::new();
    let mut wanted = BTreeSet::new();
    for vs in &rules.virtual_servers {
        let id = format!("{} {}", vs.flag(), vs.addr);
        wanted.insert(id.clone());
        let line = vs.service_line();
        match cur.services.get(&id) {
            None => sync.push(line),
            Some(have) if *have != line => sync.push(line.replacen("-A", "-E", 1)),
            Some(_) => {}
        }
        let none = BTreeMap::new();
        let have = cur.reals.get(&id).unwrap_or(&none);
        let mut reals = BTreeSet::new();
        for r in &vs.real_servers {
            let key = r.to_string();
            let line = vs.real_line(*r);
            match have.get(&key) {
                None => sync.push(line),
                Some(h) if *h != line => sync.push(line.replacen("-a", "-e", 1)),
                Some(_) => {}
            }
            reals.insert(key);
        }
        for r in have.keys().filter(|r| !reals.contains(*r)) {
            sync.push(format!("-d {id} -r {r}"));
        }
    }
    let clean: Vec<String> = cur
        .services
        .keys()
        .filter(|id| {
            let addr = id.split_whitespace().nth(1).unwrap_or_default();
            of_family(addr, rules.ipv6) && !wanted.contains(*id)
        })
        .map(|id| format!("-D {id}"))
        .collect();
    (lines_text(&sync), lines_text(&clean))
}

/// The addresses of the family on [`DUMMY`].
fn bound_addresses(netns: &Path, ipv6: bool) -> Result<Vec<IpAddr>> {
    let family = if ipv6 { "-6" } else { "-4" };
    let out = tools::tool(netns, "ip", &[family, "-o", "addr", "show", "dev", DUMMY])?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let mut w = l
                .split_whitespace()
                .skip_while(|w| *w != "inet" && *w != "inet6");
            w.nth(1)?.split('/').next()?.parse().ok()
        })
        .collect())
}

/// kube-proxy's IPVS sync in the namespace, in its order: the iptables chains
/// and jumps (`createAndLinkKubeChain`), the dummy device (`ip link add
/// kube-ipvs0 type dummy`, left down as kube-proxy leaves it), the sets
/// (`ipset create -exist`), the virtual and real servers (`ipvsadm -R`,
/// reconciled against `ipvsadm-save -n`), the service addresses bound to the
/// dummy device (`ip addr add`), the set entries (reconciled against `ipset
/// save`), the `iptables-restore --noflush`, then the addresses and virtual
/// servers of the family this sync did not make removed. (The sysctls are
/// set before, by [`super::apply`].)
pub(crate) fn apply(netns: &Path, ctx: &Ctx, ports: &[SvcPort]) -> Result<Rules> {
    let mut rules = render(ctx, ports);
    iptables::ensure_jumps(netns, ctx.ipv6, &rules.jumps)?;

    let links = tools::tool(netns, "ip", &["-o", "link", "show"])?;
    if !links.lines().any(|l| {
        l.split_whitespace()
            .nth(1)
            .is_some_and(|n| n.trim_end_matches(':') == DUMMY)
    }) {
        tools::tool(netns, "ip", &["link", "add", DUMMY, "type", "dummy"])?;
    }

    let current = current_sets(netns)?;
    let creates = ipset_input(ctx.ipv6, &rules.sets, &current);
    let (create_lines, entry_lines): (Vec<&str>, Vec<&str>) =
        creates.lines().partition(|l| l.starts_with("create "));
    tools::run(
        netns,
        "ipset",
        &["-exist", "restore"],
        &(create_lines.join("\n") + "\n"),
    )?;

    let cur = current_ipvs(netns)?;
    let (sync, clean) = ipvs_commands(&rules, &cur);
    if !sync.is_empty() {
        // `ipvsadm -R`, not Debian's `ipvsadm-restore`, which runs
        // `ipvsadm -C` first and would wipe the other family's proxier's
        // virtual servers (kube-proxy edits them one by one over netlink).
        tools::run(netns, "ipvsadm", &["-R"], &sync)?;
    }

    let len = if ctx.ipv6 { 128 } else { 32 };
    let bound = bound_addresses(netns, ctx.ipv6)?;
    for a in rules.bind.iter().filter(|a| !bound.contains(a)) {
        tools::tool(
            netns,
            "ip",
            &["addr", "add", &format!("{a}/{len}"), "dev", DUMMY],
        )?;
    }

    if !entry_lines.is_empty() {
        tools::run(
            netns,
            "ipset",
            &["-exist", "restore"],
            &(entry_lines.join("\n") + "\n"),
        )?;
    }
    iptables::restore(netns, ctx.ipv6, &rules.restore)?;

    for a in bound.iter().filter(|a| !rules.bind.contains(a)) {
        tools::tool(
            netns,
            "ip",
            &["addr", "del", &format!("{a}/{len}"), "dev", DUMMY],
        )?;
    }
    if !clean.is_empty() {
        tools::run(netns, "ipvsadm", &["-R"], &clean)?;
    }
    rules.ipset_restore = creates;
    rules.ipvsadm_restore = sync + &clean;
    Ok(rules)
}
