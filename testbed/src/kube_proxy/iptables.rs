//! kube-proxy's iptables mode: `syncProxyRules` and
//! `writeServiceToEndpointRules` of pkg/proxy/iptables/proxier.go, and the
//! `iptables-restore` plumbing the IPVS mode shares.
use std::{collections::BTreeSet, fmt, path::Path};

use super::{
    ports::{self, Ctx, Ep, SvcPort},
    tools,
};
use crate::Result;

/// `metrics.IPTablesCTStateInvalidDroppedNFAcctCounter`.
pub const INVALID_DROPPED_COUNTER: &str = "ct_state_invalid_dropped_pkts";
/// `metrics.LocalhostNodePortAcceptedNFAcctCounter`.
pub const LOCALHOST_NODEPORT_COUNTER: &str = "localhost_nps_accepted_pkts";

/// The chain prefixes `isServiceChainName` recognises: stale ones are deleted.
const SERVICE_CHAIN_PREFIXES: [&str; 5] = [
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-SEP-",
    "KUBE-FW-",
    "KUBE-EXT-",
];

/// A jump from a built-in chain that kube-proxy keeps outside the restore
/// input: `EnsureChain(table, target)` then `EnsureRule(Prepend, table, chain,
/// args...)`, i.e. `iptables -t <table> -C <chain> <args>` and, when missing,
/// `iptables -t <table> -I <chain> <args>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Jump {
    pub table: &'static str,
    pub chain: &'static str,
    pub target: &'static str,
    /// The rule's arguments, `-j <target>` last.
    pub args: Vec<String>,
}

/// One table of an `iptables-restore` input.
#[derive(Clone, Debug, Default)]
pub(crate) struct Table {
    pub name: &'static str,
    /// `:CHAIN - [0:0]` lines (with `--noflush` they create or flush the chain).
    pub chains: Vec<String>,
    pub rules: Vec<String>,
}

impl Table {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            ..Self::default()
        }
    }

    /// `utiliptables.MakeChainLine`.
    pub(crate) fn chain(&mut self, chain: &str) {
        self.chains.push(format!(":{chain} - [0:0]"));
    }

    pub(crate) fn rule(&mut self, rule: String) {
        self.rules.push(rule);
    }
}

/// Writes tables as `iptables-restore` reads them.
pub(crate) fn restore_text(tables: &[&Table]) -> String {
    let mut s = String::new();
    for t in tables {
        s.push('*');
        s.push_str(t.name);
        s.push('\n');
        for l in t.chains.iter().chain(&t.rules) {
            s.push_str(l);
            s.push('\n');
        }
        s.push_str("COMMIT\n");
    }
    s
}

/// The iptables mode's rules.
#[derive(Clone, Debug)]
pub struct Rules {
    pub ipv6: bool,
    /// The jumps from the built-in chains, in kube-proxy's order (each is
    /// prepended, so the last ends up first).
    pub jumps: Vec<Jump>,
    /// nfacct counters kube-proxy makes before the restore.
    pub nfacct_counters: Vec<&'static str>,
    /// The `iptables-restore --noflush` input (filter, then nat).
    pub restore: String,
    /// The nat chains this sync fills; other service chains are stale.
    pub active_nat_chains: BTreeSet<String>,
    filter: Table,
    nat: Table,
}

impl fmt::Display for Rules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in &self.nfacct_counters {
            writeln!(f, "nfacct add {c}")?;
        }
        write_jumps(f, self.ipv6, &self.jumps)?;
        write!(f, "{}", self.restore)
    }
}

/// The jumps as the commands that ensure them.
pub(crate) fn write_jumps(f: &mut fmt::Formatter<'_>, ipv6: bool, jumps: &[Jump]) -> fmt::Result {
    let bin = binaries(ipv6).0;
    for j in jumps {
        writeln!(f, "{bin} -t {} -N {}", j.table, j.target)?;
        let args: Vec<String> = j
            .args
            .iter()
            .map(|a| {
                if a.contains(' ') {
                    format!("\"{a}\"")
                } else {
                    a.clone()
                }
            })
            .collect();
        writeln!(f, "{bin} -t {} -I {} {}", j.table, j.chain, args.join(" "))?;
    }
    Ok(())
}

/// `iptables`, `iptables-save`, `iptables-restore` of the family.
pub(crate) fn binaries(ipv6: bool) -> (&'static str, &'static str, &'static str) {
    if ipv6 {
        ("ip6tables", "ip6tables-save", "ip6tables-restore")
    } else {
        ("iptables", "iptables-save", "iptables-restore")
    }
}

/// `iptablesJumpChains` then `iptablesKubeletJumpChains`.
fn jumps() -> Vec<Jump> {
    const NEW: &[&str] = &["-m", "conntrack", "--ctstate", "NEW"];
    let table: [(&str, &str, &str, &str, &[&str]); 14] = [
        (
            "filter",
            "INPUT",
            "KUBE-EXTERNAL-SERVICES",
            "kubernetes externally-visible service portals",
            NEW,
        ),
        (
            "filter",
            "FORWARD",
            "KUBE-EXTERNAL-SERVICES",
            "kubernetes externally-visible service portals",
            NEW,
        ),
        (
            "filter",
            "INPUT",
            "KUBE-NODEPORTS",
            "kubernetes health check service ports",
            &[],
        ),
        (
            "filter",
            "FORWARD",
            "KUBE-SERVICES",
            "kubernetes service portals",
            NEW,
        ),
        (
            "filter",
            "OUTPUT",
            "KUBE-SERVICES",
            "kubernetes service portals",
            NEW,
        ),
        (
            "filter",
            "FORWARD",
            "KUBE-FORWARD",
            "kubernetes forwarding rules",
            &[],
        ),
        (
            "filter",
            "INPUT",
            "KUBE-PROXY-FIREWALL",
            "kubernetes load balancer firewall",
            NEW,
        ),
        (
            "filter",
            "OUTPUT",
            "KUBE-PROXY-FIREWALL",
            "kubernetes load balancer firewall",
            NEW,
        ),
        (
            "filter",
            "FORWARD",
            "KUBE-PROXY-FIREWALL",
            "kubernetes load balancer firewall",
            NEW,
        ),
        (
            "nat",
            "OUTPUT",
            "KUBE-SERVICES",
            "kubernetes service portals",
            &[],
        ),
        (
            "nat",
            "PREROUTING",
            "KUBE-SERVICES",
            "kubernetes service portals",
            &[],
        ),
        (
            "nat",
            "POSTROUTING",
            "KUBE-POSTROUTING",
            "kubernetes postrouting rules",
            &[],
        ),
        ("filter", "INPUT", "KUBE-FIREWALL", "", &[]),
        ("filter", "OUTPUT", "KUBE-FIREWALL", "", &[]),
    ];
    table
        .into_iter()
        .map(|(table, chain, target, comment, extra)| {
            let mut args: Vec<String> = extra.iter().map(|s| (*s).to_string()).collect();
            if !comment.is_empty() {
                args.extend([
                    "-m".into(),
                    "comment".into(),
                    "--comment".into(),
                    comment.into(),
                ]);
            }
            args.extend(["-j".into(), target.into()]);
            Jump {
                table,
                chain,
                target,
                args,
            }
        })
        .collect()
}

/// `"…"`: kube-proxy quotes comments with blanks itself.
fn q(s: &str) -> String {
    format!("\"{s}\"")
}

/// `-m <p> -p <p> -d <ip> --dport <port>`.
fn dst(p: &str, ip: impl fmt::Display, port: u16) -> String {
    format!("-m {p} -p {p} -d {ip} --dport {port}")
}

/// `syncProxyRules` (pkg/proxy/iptables/proxier.go) for a full sync.
pub(crate) fn render(ctx: &Ctx, ports: &[SvcPort]) -> Rules {
    let mark = &ctx.mark;
    let mut filter = Table::new("filter");
    let mut nat = Table::new("nat");
    for c in [
        "KUBE-SERVICES",
        "KUBE-EXTERNAL-SERVICES",
        "KUBE-FORWARD",
        "KUBE-NODEPORTS",
        "KUBE-PROXY-FIREWALL",
    ] {
        filter.chain(c);
    }
    for c in [
        "KUBE-SERVICES",
        "KUBE-NODEPORTS",
        "KUBE-POSTROUTING",
        "KUBE-MARK-MASQ",
    ] {
        nat.chain(c);
    }
    nat.rule(format!(
        "-A KUBE-POSTROUTING -m mark ! --mark {mark}/{mark} -j RETURN"
    ));
    nat.rule(format!("-A KUBE-POSTROUTING -j MARK --xor-mark {mark}"));
    nat.rule(format!(
        "-A KUBE-POSTROUTING -m comment --comment {} -j MASQUERADE{}",
        q("kubernetes service traffic requiring SNAT"),
        if ctx.features.random_fully {
            " --random-fully"
        } else {
            ""
        }
    ));
    nat.rule(format!("-A KUBE-MARK-MASQ -j MARK --or-mark {mark}"));
    if ctx.localhost_node_ports {
        filter.chain("KUBE-FIREWALL");
        filter.rule(format!(
            "-A KUBE-FIREWALL -m comment --comment {} -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
            q("block incoming localnet connections")
        ));
    }

    let large = ports::large_cluster(ports);
    let mut active = BTreeSet::new();
    for sp in ports {
        service_port(ctx, sp, large, &mut filter, &mut nat, &mut active);
    }

    // The tail call to KUBE-NODEPORTS, after every other KUBE-SERVICES rule.
    let last = q("kubernetes service nodeports; NOTE: this must be the last rule in this chain");
    if ctx.npa.match_all {
        let not_local = if ctx.ipv6 {
            " ! -d ::1/128"
        } else if ctx.localhost_node_ports {
            ""
        } else {
            " ! -d 127.0.0.0/8"
        };
        nat.rule(format!(
            "-A KUBE-SERVICES -m comment --comment {last} -m addrtype --dst-type LOCAL{not_local} -j KUBE-NODEPORTS"
        ));
    } else {
        for ip in ctx.node_port_ips() {
            if ip.is_loopback() && (ctx.ipv6 || !ctx.localhost_node_ports) {
                continue;
            }
            nat.rule(format!(
                "-A KUBE-SERVICES -m comment --comment {last} -d {ip} -j KUBE-NODEPORTS"
            ));
        }
    }

    if !ctx.features.tcp_be_liberal {
        let counter = if ctx.features.nfacct {
            format!(" -m nfacct --nfacct-name {INVALID_DROPPED_COUNTER}")
        } else {
            String::new()
        };
        filter.rule(format!(
            "-A KUBE-FORWARD -m conntrack --ctstate INVALID{counter} -j DROP"
        ));
    }
    filter.rule(format!(
        "-A KUBE-FORWARD -m comment --comment {} -m mark --mark {mark}/{mark} -j ACCEPT",
        q("kubernetes forwarding rules")
    ));
    filter.rule(format!(
        "-A KUBE-FORWARD -m comment --comment {} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        q("kubernetes forwarding conntrack rule")
    ));

    let nfacct_counters = if ctx.features.nfacct {
        vec![INVALID_DROPPED_COUNTER, LOCALHOST_NODEPORT_COUNTER]
    } else {
        Vec::new()
    };
    let restore = restore_text(&[&filter, &nat]);
    Rules {
        ipv6: ctx.ipv6,
        jumps: jumps(),
        nfacct_counters,
        restore,
        active_nat_chains: active,
        filter,
        nat,
    }
}

/// The body of `syncProxyRules`' loop over service ports.
fn service_port(
    ctx: &Ctx,
    sp: &SvcPort,
    large: bool,
    filter: &mut Table,
    nat: &mut Table,
    active: &mut BTreeSet<String>,
) {
    let p = sp.proto();
    let name = &sp.name;
    let hash = sp.ipt_hash();
    let cat = sp.categorize();

    let cluster_chain = format!("KUBE-SVC-{hash}");
    let uses_cluster_chain = !cat.cluster.is_empty() && sp.uses_cluster_endpoints();
    let local_chain = format!("KUBE-SVL-{hash}");
    let uses_local_chain = !cat.local.is_empty() && sp.uses_local_endpoints();

    let (internal_chain, has_internal) = if sp.internal_local {
        (&local_chain, cat.has_any && !cat.local.is_empty())
    } else {
        (&cluster_chain, cat.has_any)
    };
    let (external_policy_chain, has_external) = if sp.external_policy_local() {
        (&local_chain, cat.has_any && !cat.local.is_empty())
    } else {
        (&cluster_chain, cat.has_any)
    };
    let ext_chain = format!("KUBE-EXT-{hash}");
    let uses_ext_chain = cat.has_any && sp.externally_accessible();
    let fw_chain = format!("KUBE-FW-{hash}");
    let uses_fw = cat.has_any && !sp.lb_ips.is_empty() && !sp.source_ranges.is_empty();
    let lb_chain = if uses_fw { &fw_chain } else { &ext_chain };

    let (int_target, int_comment, ext_target, ext_comment) = if cat.has_any {
        let none = q(&format!("{name} has no local endpoints"));
        ("DROP", none.clone(), "DROP", none)
    } else {
        let none = q(&format!("{name} has no endpoints"));
        ("REJECT", none.clone(), "REJECT", none)
    };

    // Capture the clusterIP.
    if has_internal {
        nat.rule(format!(
            "-A KUBE-SERVICES -m comment --comment {} {} -j {internal_chain}",
            q(&format!("{name} cluster IP")),
            dst(p, sp.cluster_ip, sp.port)
        ));
    } else {
        filter.rule(format!(
            "-A KUBE-SERVICES -m comment --comment {int_comment} {} -j {int_target}",
            dst(p, sp.cluster_ip, sp.port)
        ));
    }

    // Capture externalIPs.
    for ip in &sp.external_ips {
        if cat.has_any {
            nat.rule(format!(
                "-A KUBE-SERVICES -m comment --comment {} {} -j {ext_chain}",
                q(&format!("{name} external IP")),
                dst(p, ip, sp.port)
            ));
        }
        if !has_external {
            filter.rule(format!(
                "-A KUBE-EXTERNAL-SERVICES -m comment --comment {ext_comment} {} -j {ext_target}",
                dst(p, ip, sp.port)
            ));
        }
    }

    // Capture load-balancer ingress.
    for ip in &sp.lb_ips {
        if cat.has_any {
            nat.rule(format!(
                "-A KUBE-SERVICES -m comment --comment {} {} -j {lb_chain}",
                q(&format!("{name} loadbalancer IP")),
                dst(p, ip, sp.port)
            ));
        }
        if uses_fw {
            filter.rule(format!(
                "-A KUBE-PROXY-FIREWALL -m comment --comment {} {} -j DROP",
                q(&format!("{name} traffic not accepted by {fw_chain}")),
                dst(p, ip, sp.port)
            ));
        }
    }
    if !has_external {
        for ip in &sp.lb_ips {
            filter.rule(format!(
                "-A KUBE-EXTERNAL-SERVICES -m comment --comment {ext_comment} {} -j {ext_target}",
                dst(p, ip, sp.port)
            ));
        }
    }

    // Capture nodeports.
    if let Some(node_port) = sp.node_port {
        if cat.has_any {
            if ctx.localhost_node_ports && ctx.features.nfacct {
                nat.rule(format!(
                    "-A KUBE-NODEPORTS -m comment --comment {name} -m {p} -p {p} -d 127.0.0.0/8 --dport {node_port} -m nfacct --nfacct-name {LOCALHOST_NODEPORT_COUNTER} -j {ext_chain}"
                ));
            }
            nat.rule(format!(
                "-A KUBE-NODEPORTS -m comment --comment {name} -m {p} -p {p} --dport {node_port} -j {ext_chain}"
            ));
        }
        if !has_external {
            filter.rule(format!(
                "-A KUBE-EXTERNAL-SERVICES -m comment --comment {ext_comment} -m addrtype --dst-type LOCAL -m {p} -p {p} --dport {node_port} -j {ext_target}"
            ));
        }
    }

    // Capture healthCheckNodePorts.
    if let Some(hc) = sp.health_check_node_port {
        filter.rule(format!(
            "-A KUBE-NODEPORTS -m comment --comment {} -m tcp -p tcp --dport {hc} -j ACCEPT",
            q(&format!("{name} health check node port"))
        ));
    }

    // Internal traffic: masquerade off-cluster sources.
    if has_internal {
        let args = format!(
            "-m comment --comment {} {}",
            q(&format!("{name} cluster IP")),
            dst(p, sp.cluster_ip, sp.port)
        );
        if ctx.masquerade_all {
            nat.rule(format!("-A {internal_chain} {args} -j KUBE-MARK-MASQ"));
        } else if let Some(not_local) = ctx.ipt_if_not_local() {
            nat.rule(format!(
                "-A {internal_chain} {args} {not_local} -j KUBE-MARK-MASQ"
            ));
        }
    }

    // External traffic.
    if uses_ext_chain {
        nat.chain(&ext_chain);
        active.insert(ext_chain.clone());
        if sp.external_policy_local() {
            if let Some(local) = ctx.ipt_if_local() {
                nat.rule(format!(
                    "-A {ext_chain} -m comment --comment {} {local} -j {cluster_chain}",
                    q(&format!("pod traffic for {name} external destinations"))
                ));
            }
            nat.rule(format!(
                "-A {ext_chain} -m comment --comment {} -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ",
                q(&format!("masquerade LOCAL traffic for {name} external destinations"))
            ));
            nat.rule(format!(
                "-A {ext_chain} -m comment --comment {} -m addrtype --src-type LOCAL -j {cluster_chain}",
                q(&format!("route LOCAL traffic for {name} external destinations"))
            ));
        } else {
            nat.rule(format!(
                "-A {ext_chain} -m comment --comment {} -j KUBE-MARK-MASQ",
                q(&format!(
                    "masquerade traffic for {name} external destinations"
                ))
            ));
        }
        if has_external {
            nat.rule(format!("-A {ext_chain} -j {external_policy_chain}"));
        }
    }

    // The firewall chain (loadBalancerSourceRanges).
    if uses_fw {
        nat.chain(&fw_chain);
        active.insert(fw_chain.clone());
        let args = format!(
            "-A {fw_chain} -m comment --comment {}",
            q(&format!("{name} loadbalancer IP"))
        );
        let mut allow_from_node = false;
        for cidr in &sp.source_ranges {
            nat.rule(format!("{args} -s {cidr} -j {ext_chain}"));
            allow_from_node |= ctx.node_ip.is_some_and(|ip| cidr.contains(ip));
        }
        if allow_from_node {
            for ip in &sp.lb_ips {
                nat.rule(format!("{args} -s {ip} -j {ext_chain}"));
            }
        }
        nat.rule(format!(
            "-A {fw_chain} -m comment --comment {}",
            q(&format!(
                "other traffic to {name} will be dropped by KUBE-PROXY-FIREWALL"
            ))
        ));
    }

    if uses_cluster_chain {
        nat.chain(&cluster_chain);
        active.insert(cluster_chain.clone());
        to_endpoints(sp, large, &cluster_chain, &cat.cluster, nat);
    }
    if uses_local_chain {
        nat.chain(&local_chain);
        active.insert(local_chain.clone());
        to_endpoints(sp, large, &local_chain, &cat.local, nat);
    }

    // The per-endpoint chains.
    for ep in &cat.all_reachable {
        let chain = sp.ipt_endpoint_chain(ep);
        nat.chain(&chain);
        active.insert(chain.clone());
        let args = comment(format!("-A {chain}"), large, name);
        nat.rule(format!("{args} -s {} -j KUBE-MARK-MASQ", ep.ip));
        let recent = if sp.affinity.is_some() {
            format!(" -m recent --name {chain} --set")
        } else {
            String::new()
        };
        nat.rule(format!(
            "{args}{recent} -m {p} -p {p} -j DNAT --to-destination {}",
            ep.addr()
        ));
    }
}

/// `appendServiceCommentLocked`: the comment unless in large-cluster mode.
fn comment(args: String, large: bool, comment: &str) -> String {
    if large {
        args
    } else {
        format!("{args} -m comment --comment {comment}")
    }
}

/// `writeServiceToEndpointRules`: affinity checks, then one
/// `statistic`-weighted jump per endpoint.
fn to_endpoints(sp: &SvcPort, large: bool, chain: &str, endpoints: &[&Ep], nat: &mut Table) {
    if let Some(seconds) = sp.affinity {
        for ep in endpoints {
            let sep = sp.ipt_endpoint_chain(ep);
            let args = comment(
                format!("-A {chain}"),
                large,
                &q(&format!("{} -> {}", sp.name, ep.addr())),
            );
            nat.rule(format!(
                "{args} -m recent --name {sep} --rcheck --seconds {seconds} --reap -j {sep}"
            ));
        }
    }
    let n = endpoints.len();
    for (i, ep) in endpoints.iter().enumerate() {
        let sep = sp.ipt_endpoint_chain(ep);
        let mut args = comment(
            format!("-A {chain}"),
            large,
            &q(&format!("{} -> {}", sp.name, ep.addr())),
        );
        if i + 1 < n {
            args = format!(
                "{args} -m statistic --mode random --probability {}",
                probability(n - i)
            );
        }
        nat.rule(format!("{args} -j {sep}"));
    }
}

/// `computeProbability`: `%0.10f` of 1/n.
fn probability(n: usize) -> String {
    #[expect(
        clippy::cast_precision_loss,
        reason = "endpoint counts are far below 2^52"
    )]
    let p = 1.0 / n as f64;
    format!("{p:.10}")
}

impl Rules {
    /// The restore input with the stale service chains of the nat table
    /// flushed and deleted, as `syncProxyRules` adds them after an
    /// `iptables-save` of the nat table.
    pub fn restore_with_stale(&self, stale: &[String]) -> String {
        let mut nat = self.nat.clone();
        for c in stale {
            nat.chain(c);
            nat.rule(format!("-X {c}"));
        }
        restore_text(&[&self.filter, &nat])
    }
}

/// The chains of a table in `iptables-save` output.
pub(crate) fn saved_chains(save: &str) -> Vec<String> {
    save.lines()
        .filter_map(|l| l.strip_prefix(':'))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// `EnsureChain` and `EnsureRule(Prepend, …)` for each jump: `-N` (exit code 1
/// is "exists"), `-C` (exit code 1 is "missing"), `-I`.
pub(crate) fn ensure_jumps(netns: &Path, ipv6: bool, jumps: &[Jump]) -> Result<()> {
    let bin = binaries(ipv6).0;
    for j in jumps {
        let out = tools::status(netns, bin, &["-w", "5", "-t", j.table, "-N", j.target])?;
        if !out.success() && out.status != Some(1) {
            return Err(crate::err!(
                "kube-proxy rules: {bin} -N {} failed: {out}",
                j.target
            ));
        }
        let mut check: Vec<&str> = vec!["-w", "5", "-t", j.table, "-C", j.chain];
        check.extend(j.args.iter().map(String::as_str));
        let out = tools::status(netns, bin, &check)?;
        match out.status {
            Some(0) => {}
            Some(1) => {
                let mut insert: Vec<&str> = vec!["-w", "5", "-t", j.table, "-I", j.chain];
                insert.extend(j.args.iter().map(String::as_str));
                tools::tool(netns, bin, &insert)?;
            }
            _ => {
                return Err(crate::err!(
                    "kube-proxy rules: {bin} -C {} failed: {out}",
                    j.chain
                ))
            }
        }
    }
    Ok(())
}

/// `iptables-restore -w 5 -W 100000 --noflush --counters` (utiliptables'
/// `RestoreAll` with `NoFlushTables` and `RestoreCounters`).
pub(crate) fn restore(netns: &Path, ipv6: bool, input: &str) -> Result<()> {
    let bin = binaries(ipv6).2;
    tools::run(
        netns,
        bin,
        &["-w", "5", "-W", "100000", "--noflush", "--counters"],
        input,
    )
    .map(drop)
}

/// Makes the nfacct counters that do not exist yet (`nfacct.Ensure`).
fn ensure_counters(netns: &Path, counters: &[&str]) -> Result<()> {
    if counters.is_empty() {
        return Ok(());
    }
    let list = tools::tool(netns, "nfacct", &["list"])?;
    for c in counters {
        if !list.contains(&format!("= {c};")) {
            tools::tool(netns, "nfacct", &["add", c])?;
        }
    }
    Ok(())
}

/// kube-proxy's iptables sync in the namespace: the nfacct counters and the
/// jumps from the built-in chains (`EnsureChain`/`EnsureRule`), then an
/// `iptables-save -t nat` to find stale service chains, then one
/// `iptables-restore --noflush` of the filter and nat tables that replaces
/// every kube-proxy chain and deletes the stale ones. (The sysctls are set
/// before, by [`super::apply`].)
pub(crate) fn apply(netns: &Path, ctx: &Ctx, ports: &[SvcPort]) -> Result<Rules> {
    let mut rules = render(ctx, ports);
    ensure_jumps(netns, ctx.ipv6, &rules.jumps)?;
    ensure_counters(netns, &rules.nfacct_counters)?;
    let save = tools::tool(netns, binaries(ctx.ipv6).1, &["-t", "nat"])?;
    let stale: Vec<String> = saved_chains(&save)
        .into_iter()
        .filter(|c| SERVICE_CHAIN_PREFIXES.iter().any(|p| c.starts_with(p)))
        .filter(|c| !rules.active_nat_chains.contains(c))
        .collect();
    rules.restore = rules.restore_with_stale(&stale);
    restore(netns, ctx.ipv6, &rules.restore)?;
    Ok(rules)
}
