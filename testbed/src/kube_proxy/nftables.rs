//! kube-proxy's nftables mode: the transaction `syncProxyRules` (with
//! `setupNFTables` and `writeServiceToEndpointRules`) of
//! pkg/proxy/nftables/proxier.go runs through knftables, written out as knftables
//! writes it for `nft -f -`.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    thread,
    time::Duration,
};

use serde_json::Value;

use super::{
    ports::{Ctx, Ep, SvcPort},
    tools,
};
use crate::Result;

/// kube-proxy's table, in the `ip` or `ip6` family.
pub const TABLE: &str = "kube-proxy";

/// kube-proxy deletes stale chains one second after it flushed them (kernels
/// before 6.2 notice a dropped map reference late).
const STALE_CHAIN_DELAY: Duration = Duration::from_millis(1100);

/// The nftables mode's rules.
#[derive(Clone, Debug)]
pub struct Rules {
    /// The `nft -f -` input of the sync.
    pub script: String,
    /// Service chains the sync flushed as stale; deleted right after.
    pub stale_chains: Vec<String>,
}

/// What the table held before the sync (`nftables.List` of chains and sets).
#[derive(Clone, Debug, Default)]
pub(crate) struct Existing {
    pub chains: Vec<String>,
    pub sets: Vec<String>,
}

/// `nftablesBaseChains`: name, type, hook, priority (knftables writes
/// `dstnat-10` etc. as numbers: dstnat is -100, snat 100).
const BASE_CHAINS: [(&str, &str, &str, i32); 8] = [
    ("filter-prerouting", "filter", "prerouting", -110),
    ("filter-input", "filter", "input", -110),
    ("filter-forward", "filter", "forward", -110),
    ("filter-output", "filter", "output", -110),
    ("filter-output-post-dnat", "filter", "output", -90),
    ("nat-prerouting", "nat", "prerouting", -100),
    ("nat-output", "nat", "output", -100),
    ("nat-postrouting", "nat", "postrouting", 100),
];

/// `nftablesJumpChains`: target, source, extra match.
const JUMP_CHAINS: [(&str, &str, &str); 11] = [
    ("nodeport-endpoints-check", "filter-input", "ct state new"),
    ("service-endpoints-check", "filter-input", "ct state new"),
    ("service-endpoints-check", "filter-forward", "ct state new"),
    ("service-endpoints-check", "filter-output", "ct state new"),
    ("firewall-check", "filter-prerouting", "ct state new"),
    ("firewall-check", "filter-output", "ct state new"),
    ("services", "nat-output", ""),
    ("services", "nat-prerouting", ""),
    ("masquerading", "nat-postrouting", ""),
    ("cluster-ips-check", "filter-forward", "ct state new"),
    (
        "cluster-ips-check",
        "filter-output-post-dnat",
        "ct state new",
    ),
];

/// A knftables transaction being written.
struct Tx {
    family: &'static str,
    lines: Vec<String>,
    /// `ensureChain`'s `createdChains`/`activeChains`.
    created: BTreeSet<String>,
    /// The element storages (`nftElementStorage`): container -> key -> value.
    elements: BTreeMap<&'static str, BTreeMap<String, String>>,
}

impl Tx {
    fn op(&mut self, verb: &str, what: &str, name: &str, tail: &str) {
        self.lines.push(format!(
            "{verb} {what} {} {TABLE} {name}{tail}",
            self.family
        ));
    }

    /// `ensureChain`: add and flush once per transaction.
    fn ensure_chain(&mut self, chain: &str) {
        if self.created.insert(chain.to_string()) {
            self.op("add", "chain", chain, "");
            self.op("flush", "chain", chain, "");
        }
    }

    fn rule(&mut self, chain: &str, rule: &str, comment: Option<&str>) {
        let comment = comment.map_or_else(String::new, |c| format!(" comment \"{c}\""));
        self.op("add", "rule", chain, &format!(" {rule}{comment}"));
    }

    /// `nftElementStorage.ensureElem`.
    fn element(
        &mut self,
        container: &'static str,
        key: &str,
        comment: Option<&str>,
        value: Option<&str>,
    ) {
        let existing = self
            .elements
            .entry(container)
            .or_default()
            .insert(key.to_string(), value.unwrap_or_default().to_string());
        let comment = comment.map_or_else(String::new, |c| format!(" comment \"{c}\""));
        let value_part = value.map_or_else(String::new, |v| format!(" : {v}"));
        let line = format!(" {{ {key}{comment}{value_part} }}");
        match existing {
            Some(old) if old == value.unwrap_or_default() => {}
            Some(_) => {
                self.op("delete", "element", container, &format!(" {{ {key} }}"));
                self.op("add", "element", container, &line);
            }
            None => self.op("add", "element", container, &line),
        }
    }
}

/// `setupNFTables`, for a proxier's first sync (`flushed` false: every base
/// chain is added and deleted once so that it is re-made with its hook).
fn setup(ctx: &Ctx, tx: &mut Tx) {
    let (ip, addr) = ctx.nft_family();
    let no_localhost = if ctx.ipv6 {
        "ip6 daddr != ::1"
    } else {
        "ip daddr != 127.0.0.0/8"
    };
    tx.lines.push(format!(
        "add table {} {TABLE} {{ comment \"rules for kube-proxy\" ; }}",
        tx.family
    ));
    for (name, ..) in BASE_CHAINS {
        tx.op("add", "chain", name, "");
        tx.op("delete", "chain", name, "");
    }
    for (name, kind, hook, prio) in BASE_CHAINS {
        tx.op(
            "add",
            "chain",
            name,
            &format!(" {{ type {kind} hook {hook} priority {prio} ; }}"),
        );
        tx.op("flush", "chain", name, "");
    }
    for (target, source, extra) in JUMP_CHAINS {
        tx.ensure_chain(target);
        let rule = if extra.is_empty() {
            format!("jump {target}")
        } else {
            format!("{extra} jump {target}")
        };
        tx.rule(source, &rule, None);
    }
    for chain in [
        "services",
        "cluster-ips-check",
        "masquerading",
        "mark-for-masquerade",
    ] {
        tx.ensure_chain(chain);
    }
    let mark = &ctx.mark;
    tx.rule(
        "mark-for-masquerade",
        &format!("mark set mark or {mark}"),
        None,
    );
    tx.rule(
        "masquerading",
        &format!("mark and {mark} == 0 return"),
        None,
    );
    tx.rule("masquerading", &format!("mark set mark xor {mark}"), None);
    tx.rule("masquerading", "masquerade fully-random", None);

    tx.op(
        "add",
        "set",
        "cluster-ips",
        &format!(" {{ type {addr} ; comment \"Active ClusterIPs\" ; }}"),
    );
    tx.rule(
        "cluster-ips-check",
        &format!("{ip} daddr @cluster-ips reject"),
        Some("Reject traffic to invalid ports of ClusterIPs"),
    );
    if !ctx.service_cidrs.is_empty() {
        let cidrs: Vec<String> = ctx.service_cidrs.iter().map(ToString::to_string).collect();
        tx.rule(
            "cluster-ips-check",
            &format!("{ip} daddr {{ {} }} drop", cidrs.join(",")),
            Some("Drop traffic to unallocated ClusterIPs"),
        );
    }

    tx.op(
        "add",
        "set",
        "nodeport-ips",
        &format!(" {{ type {addr} ; comment \"IPs that accept NodePort traffic\" ; }}"),
    );
    if ctx.npa.match_all {
        tx.op("delete", "set", "nodeport-ips", "");
    } else {
        tx.op("flush", "set", "nodeport-ips", "");
        for node_ip in ctx.node_port_ips() {
            // "localhost NodePorts are not supported" in nftables mode.
            if !node_ip.is_loopback() {
                tx.op(
                    "add",
                    "element",
                    "nodeport-ips",
                    &format!(" {{ {node_ip} }}"),
                );
            }
        }
    }

    let vmap = format!("{addr} . inet_proto . inet_service : verdict");
    tx.op(
        "add",
        "map",
        "no-endpoint-services",
        &format!(" {{ type {vmap} ; comment \"vmap to drop or reject packets to services with no endpoints\" ; }}"),
    );
    tx.op(
        "add",
        "map",
        "no-endpoint-nodeports",
        " { type inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to service nodeports with no endpoints\" ; }",
    );
    tx.op(
        "add",
        "chain",
        "reject-chain",
        " { comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\" ; }",
    );
    tx.op("flush", "chain", "reject-chain", "");
    tx.rule("reject-chain", "reject", None);
    tx.rule(
        "service-endpoints-check",
        &format!("{ip} daddr . meta l4proto . th dport vmap @no-endpoint-services"),
        None,
    );
    if ctx.npa.match_all {
        tx.rule(
            "nodeport-endpoints-check",
            &format!("{no_localhost} meta l4proto . th dport vmap @no-endpoint-nodeports"),
            None,
        );
    } else {
        tx.rule(
            "nodeport-endpoints-check",
            &format!(
                "{ip} daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports"
            ),
            None,
        );
    }

    tx.op(
        "add",
        "map",
        "firewall-ips",
        &format!(" {{ type {vmap} ; comment \"destinations that are subject to LoadBalancerSourceRanges\" ; }}"),
    );
    tx.ensure_chain("firewall-check");
    tx.rule(
        "firewall-check",
        &format!("{ip} daddr . meta l4proto . th dport vmap @firewall-ips"),
        None,
    );

    tx.op(
        "add",
        "map",
        "service-ips",
        &format!(
            " {{ type {vmap} ; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ; }}"
        ),
    );
    tx.op(
        "add",
        "map",
        "service-nodeports",
        " { type inet_proto . inet_service : verdict ; comment \"NodePort traffic\" ; }",
    );
    tx.rule(
        "services",
        &format!("{ip} daddr . meta l4proto . th dport vmap @service-ips"),
        None,
    );
    if ctx.npa.match_all {
        tx.rule(
            "services",
            &format!("fib daddr type local {no_localhost} meta l4proto . th dport vmap @service-nodeports"),
            None,
        );
    } else {
        tx.rule(
            "services",
            &format!("{ip} daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports"),
            None,
        );
    }

    // nftElementStorage.reset for each container.
    tx.op("flush", "set", "cluster-ips", "");
    for map in [
        "service-ips",
        "firewall-ips",
        "no-endpoint-services",
        "no-endpoint-nodeports",
        "service-nodeports",
    ] {
        tx.op("flush", "map", map, "");
    }
}

/// `syncProxyRules` (pkg/proxy/nftables/proxier.go) for a full sync, given
/// what the table held before (its stale service chains are flushed and its
/// stale affinity sets deleted).
pub(crate) fn render(ctx: &Ctx, ports: &[SvcPort], existing: &Existing) -> Rules {
    let mut tx = Tx {
        family: ctx.nft_family().0,
        lines: Vec::new(),
        created: BTreeSet::new(),
        elements: BTreeMap::new(),
    };
    setup(ctx, &mut tx);
    // The service chains are tracked apart from setupNFTables' chains.
    tx.created.clear();
    let mut affinity_sets = BTreeSet::new();
    for sp in ports {
        service_port(ctx, sp, &mut tx, &mut affinity_sets);
    }
    let stale_chains: Vec<String> = existing
        .chains
        .iter()
        .filter(|c| c.contains('/') && !tx.created.contains(*c))
        .cloned()
        .collect();
    for c in &stale_chains {
        tx.op("flush", "chain", c, "");
    }
    for s in &existing.sets {
        if s.starts_with("affinity-") && !affinity_sets.contains(s) {
            tx.op("delete", "set", s, "");
        }
    }
    let mut script = tx.lines.join("\n");
    script.push('\n');
    Rules {
        script,
        stale_chains,
    }
}

/// The body of `syncProxyRules`' loop over service ports.
fn service_port(ctx: &Ctx, sp: &SvcPort, tx: &mut Tx, affinity_sets: &mut BTreeSet<String>) {
    let (ip, addr) = ctx.nft_family();
    let p = sp.proto();
    let name = &sp.name;
    let base = sp.nft_base();
    let cat = sp.categorize();

    for ep in &cat.all_reachable {
        let ep_base = sp.nft_endpoint_base(ep);
        tx.ensure_chain(&format!("endpoint-{ep_base}"));
        if sp.affinity.is_some() {
            affinity_sets.insert(format!("affinity-{ep_base}"));
        }
    }

    let cluster_chain = format!("service-{base}");
    let uses_cluster_chain = !cat.cluster.is_empty() && sp.uses_cluster_endpoints();
    if uses_cluster_chain {
        tx.ensure_chain(&cluster_chain);
    }
    let local_chain = format!("local-{base}");
    let uses_local_chain = !cat.local.is_empty() && sp.uses_local_endpoints();
    if uses_local_chain {
        tx.ensure_chain(&local_chain);
    }
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
    let ext_chain = format!("external-{base}");
    let uses_ext_chain = cat.has_any && sp.externally_accessible();
    if uses_ext_chain {
        tx.ensure_chain(&ext_chain);
    }
    let (internal_verdict, external_verdict) = if cat.has_any {
        ("drop", "drop")
    } else {
        ("goto reject-chain", "goto reject-chain")
    };

    let port = sp.port;
    tx.element("cluster-ips", &sp.cluster_ip.to_string(), None, None);
    let key = |ip: &std::net::IpAddr| format!("{ip} . {p} . {port}");
    if has_internal {
        tx.element(
            "service-ips",
            &key(&sp.cluster_ip),
            None,
            Some(&format!("goto {internal_chain}")),
        );
    } else {
        tx.element(
            "no-endpoint-services",
            &key(&sp.cluster_ip),
            Some(name),
            Some(internal_verdict),
        );
    }
    for eip in &sp.external_ips {
        if cat.has_any {
            tx.element(
                "service-ips",
                &key(eip),
                None,
                Some(&format!("goto {ext_chain}")),
            );
        }
        if !has_external {
            tx.element(
                "no-endpoint-services",
                &key(eip),
                Some(name),
                Some(external_verdict),
            );
        }
    }

    let uses_fw = !sp.lb_ips.is_empty() && !sp.source_ranges.is_empty();
    let fw_chain = format!("firewall-{base}");
    if uses_fw {
        tx.ensure_chain(&fw_chain);
    }
    for lb in &sp.lb_ips {
        if cat.has_any {
            tx.element(
                "service-ips",
                &key(lb),
                None,
                Some(&format!("goto {ext_chain}")),
            );
        }
        if uses_fw {
            tx.element(
                "firewall-ips",
                &key(lb),
                None,
                Some(&format!("goto {fw_chain}")),
            );
        }
    }
    if !has_external {
        for lb in &sp.lb_ips {
            tx.element(
                "no-endpoint-services",
                &key(lb),
                Some(name),
                Some(external_verdict),
            );
        }
    }
    if let Some(node_port) = sp.node_port {
        let np_key = format!("{p} . {node_port}");
        if cat.has_any {
            tx.element(
                "service-nodeports",
                &np_key,
                None,
                Some(&format!("goto {ext_chain}")),
            );
        }
        if !has_external {
            tx.element(
                "no-endpoint-nodeports",
                &np_key,
                Some(name),
                Some(external_verdict),
            );
        }
    }

    // Internal traffic: masquerade off-cluster sources.
    if has_internal {
        let dst = format!("{ip} daddr {} {p} dport {port}", sp.cluster_ip);
        if ctx.masquerade_all {
            tx.rule(
                internal_chain,
                &format!("{dst} jump mark-for-masquerade"),
                None,
            );
        } else if let Some(not_local) = ctx.nft_if_not_local() {
            tx.rule(
                internal_chain,
                &format!("{dst} {not_local} jump mark-for-masquerade"),
                None,
            );
        }
    }

    // External traffic.
    if uses_ext_chain {
        if sp.external_policy_local() {
            if let Some(local) = ctx.nft_if_local() {
                tx.rule(
                    &ext_chain,
                    &format!("{local} goto {cluster_chain}"),
                    Some("short-circuit pod traffic"),
                );
            }
            tx.rule(
                &ext_chain,
                "fib saddr type local jump mark-for-masquerade",
                Some("masquerade local traffic"),
            );
            tx.rule(
                &ext_chain,
                &format!("fib saddr type local goto {cluster_chain}"),
                Some("short-circuit local traffic"),
            );
        } else {
            tx.rule(&ext_chain, "jump mark-for-masquerade", None);
        }
        if has_external {
            tx.rule(&ext_chain, &format!("goto {external_policy_chain}"), None);
        }
    }

    if uses_fw {
        let mut sources: Vec<String> = sp.source_ranges.iter().map(ToString::to_string).collect();
        let allow_from_node = ctx
            .node_ip
            .is_some_and(|n| sp.source_ranges.iter().any(|c| c.contains(n)));
        if allow_from_node {
            sources.extend(sp.lb_ips.iter().map(ToString::to_string));
        }
        tx.rule(
            &fw_chain,
            &format!("{ip} saddr != {{ {} }} drop", sources.join(" , ")),
            None,
        );
    }

    if let Some(seconds) = sp.affinity {
        for ep in &cat.all_reachable {
            tx.op(
                "add",
                "set",
                &format!("affinity-{}", sp.nft_endpoint_base(ep)),
                &format!(" {{ type {addr} ; flags dynamic,timeout ; timeout {seconds}s ; }}"),
            );
        }
    }

    if uses_cluster_chain {
        to_endpoints(ctx, sp, tx, &cluster_chain, &cat.cluster);
    }
    if uses_local_chain {
        to_endpoints(ctx, sp, tx, &local_chain, &cat.local);
    }

    for ep in &cat.all_reachable {
        let ep_base = sp.nft_endpoint_base(ep);
        let chain = format!("endpoint-{ep_base}");
        tx.rule(
            &chain,
            &format!("{ip} saddr {} jump mark-for-masquerade", ep.ip),
            None,
        );
        if sp.affinity.is_some() {
            tx.rule(
                &chain,
                &format!("update @affinity-{ep_base} {{ {ip} saddr }}"),
                None,
            );
        }
        tx.rule(
            &chain,
            &format!("meta l4proto {p} dnat to {}", ep.addr()),
            None,
        );
    }
}

/// `writeServiceToEndpointRules`: affinity checks, then a `numgen` vmap over
/// the endpoint chains.
fn to_endpoints(ctx: &Ctx, sp: &SvcPort, tx: &mut Tx, chain: &str, endpoints: &[&Ep]) {
    let (ip, _) = ctx.nft_family();
    if sp.affinity.is_some() {
        for ep in endpoints {
            let ep_base = sp.nft_endpoint_base(ep);
            tx.rule(
                chain,
                &format!("{ip} saddr @affinity-{ep_base} goto endpoint-{ep_base}"),
                None,
            );
        }
    }
    let elements: Vec<String> = endpoints
        .iter()
        .enumerate()
        .map(|(i, ep)| format!("{i} : goto endpoint-{}", sp.nft_endpoint_base(ep)))
        .collect();
    tx.rule(
        chain,
        &format!(
            "numgen random mod {} vmap {{ {} }}",
            endpoints.len(),
            elements.join(" , ")
        ),
        None,
    );
}

/// The chains and sets of the table (`nft -j list table`), none when it does
/// not exist.
fn existing(netns: &Path, family: &str) -> Result<Existing> {
    let out = tools::status(netns, "nft", &["-j", "list", "table", family, TABLE])?;
    if !out.success() {
        if out.stderr.contains("No such file or directory") {
            return Ok(Existing::default());
        }
        return Err(crate::err!("kube-proxy rules: nft list failed: {out}"));
    }
    let v: Value = serde_json::from_str(&out.stdout)?;
    let mut e = Existing::default();
    for obj in v["nftables"].as_array().into_iter().flatten() {
        if let Some(name) = obj["chain"]["name"].as_str() {
            e.chains.push(name.to_string());
        }
        if let Some(name) = obj["set"]["name"].as_str() {
            e.sets.push(name.to_string());
        }
    }
    Ok(e)
}

/// kube-proxy's nftables sync in the namespace: list the table's chains and
/// sets, run the sync's transaction (`nft -f -`: the table, its base and
/// dispatch chains, sets and maps re-made and flushed, every service chain
/// and element written, stale service chains flushed and stale affinity sets
/// deleted), then delete the flushed stale chains in a second transaction as
/// kube-proxy's next sync does (once more a second later if the kernel still
/// holds a reference). (The sysctls are set before, by [`super::apply`].)
pub(crate) fn apply(netns: &Path, ctx: &Ctx, ports: &[SvcPort]) -> Result<Rules> {
    let family = ctx.nft_family().0;
    let before = existing(netns, family)?;
    let rules = render(ctx, ports, &before);
    tools::run(netns, "nft", &["-f", "-"], &rules.script)?;
    if !rules.stale_chains.is_empty() {
        let delete: Vec<String> = rules
            .stale_chains
            .iter()
            .map(|c| format!("delete chain {family} {TABLE} {c}"))
            .collect();
        let delete = delete.join("\n") + "\n";
        if tools::run(netns, "nft", &["-f", "-"], &delete).is_err() {
            thread::sleep(STALE_CHAIN_DELAY);
            tools::run(netns, "nft", &["-f", "-"], &delete)?;
        }
    }
    Ok(rules)
}
