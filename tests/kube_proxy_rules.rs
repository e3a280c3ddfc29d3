//! The kube-proxy rule writer (`sluice_tests::kube_proxy`) against the real
//! tools: for iptables and nftables mode, IPv4 and IPv6, the rules of a set of
//! Services go into a namespace of the test's own, are read back
//! (`iptables-save`, `nft -j list table`) and checked rule for rule against
//! what was rendered; a second sync with other Services must leave none of
//! the old Services' chains. IPVS mode runs where the kernel has IPVS (the VM
//! matrix): it is skipped, saying why, when `/proc/net/ip_vs` is absent.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::Path,
    sync::atomic::{AtomicUsize, Ordering},
};

use serde_json::Value;
use sluice_testbed::Netns;
use sluice_tests::{
    exec,
    kube_proxy::{
        apply, iptables, ipvs, nftables, Endpoint, Mode, Port, Protocol, Proxy, Rendered, Rules,
        Service,
    },
};

const NODE: &str = "node-a";

/// A namespace of this test's own, deleted when dropped.
fn netns(tag: &str) -> Netns {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    Netns::add(format!("slt{}kp{tag}{n}", std::process::id())).unwrap()
}

fn tool(ns: &Path, program: &str, args: &[&str]) -> String {
    exec::tool(Some(ns), program, args).unwrap()
}

/// The addresses of one family the test uses.
struct Family {
    ipv6: bool,
    node: IpAddr,
    cidr: &'static str,
    /// `n` -> a ClusterIP.
    vip: fn(u8) -> IpAddr,
    /// `n` -> a pod address.
    pod: fn(u8) -> IpAddr,
    external: IpAddr,
    lb: IpAddr,
    source_range: &'static str,
}

const V4: Family = Family {
    ipv6: false,
    node: IpAddr::V4(std::net::Ipv4Addr::new(192, 168, 50, 1)),
    cidr: "10.22.0.0/16",
    vip: |n| IpAddr::V4(std::net::Ipv4Addr::new(10, 96, 0, n)),
    pod: |n| IpAddr::V4(std::net::Ipv4Addr::new(10, 22, 0, n)),
    external: IpAddr::V4(std::net::Ipv4Addr::new(203, 0, 113, 10)),
    lb: IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, 7)),
    source_range: "203.0.113.0/25",
};

const V6: Family = Family {
    ipv6: true,
    node: IpAddr::V6(std::net::Ipv6Addr::new(0xfd00, 0x50, 0, 0, 0, 0, 0, 1)),
    cidr: "fd00:22::/48",
    vip: |n| {
        IpAddr::V6(std::net::Ipv6Addr::new(
            0xfd00,
            0x96,
            0,
            0,
            0,
            0,
            0,
            u16::from(n),
        ))
    },
    pod: |n| {
        IpAddr::V6(std::net::Ipv6Addr::new(
            0xfd00,
            0x22,
            0,
            0,
            0,
            0,
            0,
            u16::from(n),
        ))
    },
    external: IpAddr::V6(std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x10)),
    lb: IpAddr::V6(std::net::Ipv6Addr::new(0x2001, 0xdb8, 0x1, 0, 0, 0, 0, 0x7)),
    source_range: "2001:db8::/64",
};

fn proxy(mode: Mode, f: &Family) -> Proxy {
    let mut p = Proxy::new(mode, f.ipv6, NODE, vec![f.node]);
    p.cluster_cidr = Some(f.cidr.into());
    p.service_cidrs = vec![if f.ipv6 {
        "fd00:96::/112"
    } else {
        "10.96.0.0/16"
    }
    .into()];
    p
}

/// A ClusterIP with two endpoints (one local), a NodePort with
/// externalTrafficPolicy Local, a UDP Service on an external IP and a
/// load-balancer IP with source ranges and session affinity, a Service without
/// endpoints.
fn first_services(f: &Family) -> Vec<Service> {
    let web = Service {
        endpoints: vec![
            Endpoint::new((f.pod)(5), NODE),
            Endpoint::new((f.pod)(105), "node-b"),
        ],
        ..Service::new(
            "default",
            "web",
            (f.vip)(10),
            vec![Port::new("http", Protocol::Tcp, 80, 8080)],
        )
    };
    let mut np = Port::new("http", Protocol::Tcp, 80, 8080);
    np.node_port = Some(30080);
    let local = Service {
        external_traffic_local: true,
        health_check_node_port: Some(30999),
        endpoints: vec![
            Endpoint::new((f.pod)(6), NODE),
            Endpoint::new((f.pod)(106), "node-b"),
        ],
        ..Service::new("default", "local", (f.vip)(11), vec![np])
    };
    let ext = Service {
        external_ips: vec![f.external],
        load_balancer_ips: vec![f.lb],
        load_balancer_source_ranges: vec![f.source_range.into()],
        session_affinity_seconds: Some(600),
        endpoints: vec![Endpoint::new((f.pod)(7), NODE)],
        ..Service::new(
            "default",
            "ext",
            (f.vip)(12),
            vec![Port::new("dns", Protocol::Udp, 53, 5353)],
        )
    };
    let empty = Service::new(
        "default",
        "empty",
        (f.vip)(13),
        vec![Port::new("", Protocol::Tcp, 81, 81)],
    );
    vec![web, local, ext, empty]
}

/// The next sync: `web` moved to other endpoints, `local` and `ext` gone,
/// `empty` got an endpoint, a new Service.
fn second_services(f: &Family) -> Vec<Service> {
    let web = Service {
        endpoints: vec![Endpoint::new((f.pod)(8), NODE)],
        ..Service::new(
            "default",
            "web",
            (f.vip)(10),
            vec![Port::new("http", Protocol::Tcp, 80, 8080)],
        )
    };
    let empty = Service {
        endpoints: vec![Endpoint::new((f.pod)(9), "node-b")],
        ..Service::new(
            "default",
            "empty",
            (f.vip)(13),
            vec![Port::new("", Protocol::Tcp, 81, 81)],
        )
    };
    let new = Service {
        endpoints: vec![Endpoint::new((f.pod)(20), NODE)],
        ..Service::new(
            "other",
            "new",
            (f.vip)(20),
            vec![Port::new("grpc", Protocol::Tcp, 9000, 9000)],
        )
    };
    vec![web, empty, new]
}

/// The value of a sysctl inside the namespace.
fn sysctl_in(ns: &Path, name: &str) -> String {
    tool(ns, "sysctl", &["-n", name]).trim().to_string()
}

/// The machine's own value, read from this process's namespace.
fn host_sysctl(name: &str) -> String {
    std::fs::read_to_string(Path::new("/proc/sys").join(name.replace('.', "/")))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Rules per chain of an `iptables-save`/restore text (`table/chain` -> count).
fn rule_counts(text: &str) -> BTreeMap<String, usize> {
    let mut table = String::new();
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = t.to_string();
        } else if let Some(rest) = line.strip_prefix("-A ") {
            let chain = rest.split_whitespace().next().unwrap_or_default();
            *counts.entry(format!("{table}/{chain}")).or_default() += 1;
        }
    }
    counts
}

/// The lines of one table of an `iptables-save` output.
fn table_lines<'a>(save: &'a str, table: &str) -> impl Iterator<Item = &'a str> {
    let header = format!("*{table}");
    save.lines()
        .skip_while(move |l| *l != header)
        .take_while(|l| *l != "COMMIT")
}

fn iptables_of(r: &Rendered) -> &iptables::Rules {
    match &r.rules {
        Rules::Iptables(r) => r,
        _ => panic!("not iptables rules"),
    }
}

/// Every KUBE-* chain the restore filled holds exactly its rules in the
/// namespace (the kernel took them all), and the jumps are there once.
fn check_iptables(ns: &Path, ipv6: bool, restore: &str, jumps: &[iptables::Jump]) -> String {
    let save = tool(
        ns,
        if ipv6 {
            "ip6tables-save"
        } else {
            "iptables-save"
        },
        &[],
    );
    let saved = rule_counts(&save);
    for (chain, n) in rule_counts(restore) {
        assert_eq!(
            saved.get(&chain),
            Some(&n),
            "{chain}: rendered {n} rules\n{save}"
        );
    }
    for j in jumps {
        let target = format!("-j {}", j.target);
        let n = table_lines(&save, j.table)
            .filter(|l| l.starts_with(&format!("-A {} ", j.chain)) && l.ends_with(&target))
            .filter(|l| j.args.iter().all(|a| l.contains(a.as_str())))
            .count();
        assert_eq!(n, 1, "jump {} -> {} once\n{save}", j.chain, j.target);
    }
    save
}

fn iptables_mode(f: &Family) {
    let ns = netns(if f.ipv6 { "i6" } else { "i4" });
    let path = ns.path();
    let host_established = host_sysctl("net.netfilter.nf_conntrack_tcp_timeout_established");
    let p = proxy(Mode::Iptables, f);

    let first = apply(&path, &p, &first_services(f)).unwrap();
    let rules = iptables_of(&first);
    println!(
        "iptables (IPv{}), first sync, features {:?}:\n{first}",
        if f.ipv6 { 6 } else { 4 },
        first.features
    );
    let save = check_iptables(&path, f.ipv6, &rules.restore, &rules.jumps);
    let web_svc = rules
        .active_nat_chains
        .iter()
        .find(|c| {
            c.starts_with("KUBE-SVC-")
                && rules.restore.contains(&format!(
                    "-A {c} -m comment --comment \"default/web:http -> "
                ))
        })
        .cloned()
        .expect("web's KUBE-SVC chain");
    for needle in [
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
        "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE",
        "-m statistic --mode random --probability 0.50000000000",
        "-m recent --rcheck --seconds 600 --reap --name KUBE-SEP-",
        "default/empty has no endpoints",
        "default/local:http has no local endpoints",
        "-A KUBE-PROXY-FIREWALL",
    ] {
        // iptables-save's own spellings of what was restored.
        if needle.contains("has no local endpoints") {
            // externalTrafficPolicy Local with a local endpoint: no DROP rule.
            assert!(!save.contains(needle), "{needle}\n{save}");
        } else {
            assert!(save.contains(needle), "no `{needle}` in\n{save}");
        }
    }
    if first.features.nfacct {
        assert!(
            save.contains("--nfacct-name  ct_state_invalid_dropped_pkts")
                || save.contains("--nfacct-name ct_state_invalid_dropped_pkts")
        );
    }
    // kube-proxy's sysctls in the namespace, the machine's own untouched.
    assert_eq!(
        sysctl_in(&path, "net.netfilter.nf_conntrack_tcp_timeout_established"),
        "86400"
    );
    assert_eq!(
        sysctl_in(&path, "net.netfilter.nf_conntrack_tcp_timeout_close_wait"),
        "3600"
    );
    if !f.ipv6 {
        assert_eq!(sysctl_in(&path, "net.ipv4.conf.all.route_localnet"), "1");
    }
    assert_eq!(
        host_sysctl("net.netfilter.nf_conntrack_tcp_timeout_established"),
        host_established
    );

    // The next full sync: the old Services' chains are gone.
    let second = apply(&path, &p, &second_services(f)).unwrap();
    let rules2 = iptables_of(&second);
    let save2 = check_iptables(&path, f.ipv6, &rules2.restore, &rules2.jumps);
    for c in rules
        .active_nat_chains
        .difference(&rules2.active_nat_chains)
    {
        assert!(
            !save2.contains(&format!(":{c} ")),
            "stale chain {c} left\n{save2}"
        );
    }
    assert!(
        rules2.active_nat_chains.contains(&web_svc),
        "web keeps its chain name"
    );
    assert!(!save2.contains("default/local:http"), "{save2}");
    assert!(!save2.contains("default/empty has no endpoints"), "{save2}");
    assert!(save2.contains("other/new:grpc cluster IP"), "{save2}");
}

#[test]
fn iptables_ipv4() {
    iptables_mode(&V4);
}

#[test]
fn iptables_ipv6() {
    iptables_mode(&V6);
}

/// Chains (with their rule counts) and map elements of the table.
struct NftState {
    chains: BTreeMap<String, usize>,
    elements: BTreeMap<String, usize>,
    text: String,
}

fn nft_state(ns: &Path, family: &str) -> NftState {
    let json: Value = serde_json::from_str(&tool(
        ns,
        "nft",
        &["-j", "list", "table", family, nftables::TABLE],
    ))
    .unwrap();
    let mut s = NftState {
        chains: BTreeMap::new(),
        elements: BTreeMap::new(),
        text: tool(ns, "nft", &["list", "table", family, nftables::TABLE]),
    };
    for obj in json["nftables"].as_array().unwrap() {
        if let Some(name) = obj["chain"]["name"].as_str() {
            s.chains.entry(name.to_string()).or_default();
        }
        if let Some(chain) = obj["rule"]["chain"].as_str() {
            *s.chains.entry(chain.to_string()).or_default() += 1;
        }
        for kind in ["map", "set"] {
            if let Some(name) = obj[kind]["name"].as_str() {
                let n = obj[kind]["elem"].as_array().map_or(0, Vec::len);
                s.elements.insert(name.to_string(), n);
            }
        }
    }
    s
}

/// Rules per chain and elements per set/map the script leaves in an empty
/// table (its `add`s after its `flush`es; the first sync deletes nothing of
/// its own but the base chains it re-makes and, with every node address
/// taking NodePorts, the nodeport-ips set).
fn nft_expected(script: &str) -> (BTreeMap<String, usize>, BTreeMap<String, usize>) {
    let mut rules: BTreeMap<String, usize> = BTreeMap::new();
    let mut elements: BTreeMap<String, usize> = BTreeMap::new();
    for line in script.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match (w[0], w[1]) {
            ("add", "chain") => {
                rules.entry(w[4].to_string()).or_default();
            }
            ("delete", "chain") => {
                rules.remove(w[4]);
            }
            ("flush", "chain") => {
                rules.insert(w[4].to_string(), 0);
            }
            ("add", "rule") => *rules.entry(w[4].to_string()).or_default() += 1,
            ("add", "set" | "map") => {
                elements.entry(w[4].to_string()).or_default();
            }
            ("delete", "set") => {
                elements.remove(w[4]);
            }
            ("flush", "set" | "map") => {
                elements.insert(w[4].to_string(), 0);
            }
            ("add", "element") => *elements.entry(w[4].to_string()).or_default() += 1,
            _ => {}
        }
    }
    (rules, elements)
}

fn nftables_mode(f: &Family) {
    let ns = netns(if f.ipv6 { "n6" } else { "n4" });
    let path = ns.path();
    let family = if f.ipv6 { "ip6" } else { "ip" };
    let p = proxy(Mode::Nftables, f);

    let first = apply(&path, &p, &first_services(f)).unwrap();
    let Rules::Nftables(rules) = &first.rules else {
        panic!("not nftables")
    };
    println!("nftables ({family}), first sync:\n{first}");
    let state = nft_state(&path, family);
    let (want_rules, want_elements) = nft_expected(&rules.script);
    assert_eq!(state.chains, want_rules, "rules per chain\n{}", state.text);
    assert_eq!(
        state.elements, want_elements,
        "elements per set/map\n{}",
        state.text
    );
    for needle in [
        "type filter hook prerouting priority dstnat - 10",
        "type nat hook postrouting priority srcnat",
        "masquerade fully-random",
        "comment \"default/empty\" : goto reject-chain",
        "numgen random mod 2 vmap",
        "flags dynamic,timeout",
    ] {
        assert!(
            state.text.contains(needle),
            "no `{needle}` in\n{}",
            state.text
        );
    }
    assert_eq!(
        sysctl_in(&path, "net.netfilter.nf_conntrack_tcp_timeout_established"),
        "86400"
    );

    let second = apply(&path, &p, &second_services(f)).unwrap();
    let Rules::Nftables(rules2) = &second.rules else {
        panic!("not nftables")
    };
    assert!(
        !rules2.stale_chains.is_empty(),
        "the first sync's chains are stale"
    );
    let state2 = nft_state(&path, family);
    let (want_rules2, want_elements2) = nft_expected(&rules2.script);
    // The stale chains were flushed by the sync, then deleted.
    let mut want_rules2 = want_rules2;
    for c in &rules2.stale_chains {
        want_rules2.remove(c);
    }
    assert_eq!(
        state2.chains, want_rules2,
        "rules per chain after the second sync\n{}",
        state2.text
    );
    assert_eq!(
        state2.elements, want_elements2,
        "elements after the second sync\n{}",
        state2.text
    );
    for gone in ["default/local", "default/ext", "affinity-"] {
        assert!(
            !state2.text.contains(gone),
            "`{gone}` left after the second sync\n{}",
            state2.text
        );
    }
    assert!(
        state2.text.contains("other/new/tcp/grpc"),
        "{}",
        state2.text
    );
}

#[test]
fn nftables_ipv4() {
    nftables_mode(&V4);
}

#[test]
fn nftables_ipv6() {
    nftables_mode(&V6);
}

/// Whether the kernel has IPVS as seen from `ns` (`ipvsadm -Ln` first, which
/// loads the module on demand as kube-proxy's own probe does).
fn has_ipvs(ns: &Path) -> bool {
    let _ = exec::run(Some(ns), Path::new("ipvsadm"), &["-Ln"], &[], b"");
    exec::run(
        Some(ns),
        Path::new("test"),
        &["-e", "/proc/net/ip_vs"],
        &[],
        b"",
    )
    .is_ok_and(|o| o.success())
}

fn ipvs_mode(f: &Family) {
    let ns = netns(if f.ipv6 { "v6" } else { "v4" });
    let path = ns.path();
    let p = proxy(Mode::Ipvs, f);
    if !has_ipvs(&path) {
        println!(
            "SKIP ipvs (IPv{}): /proc/net/ip_vs is absent in the namespace (this kernel has no IPVS); `cargo xtask vm-test` runs it",
            if f.ipv6 { 6 } else { 4 }
        );
        ipvs_parts_without_ipvs(&path, &p, f);
        return;
    }
    let first = apply(&path, &p, &first_services(f)).unwrap();
    let Rules::Ipvs(rules) = &first.rules else {
        panic!("not IPVS")
    };
    println!(
        "ipvs (IPv{}), first sync:\n{first}",
        if f.ipv6 { 6 } else { 4 }
    );
    let save = tool(&path, "ipvsadm-save", &["-n"]);
    for vs in &rules.virtual_servers {
        assert!(
            save.contains(&vs.service_line()),
            "no `{}` in\n{save}",
            vs.service_line()
        );
        for r in &vs.real_servers {
            assert!(
                save.contains(&vs.real_line(*r)),
                "no `{}` in\n{save}",
                vs.real_line(*r)
            );
        }
    }
    let sets = tool(&path, "ipset", &["save"]);
    for set in &rules.sets {
        assert!(
            sets.contains(&format!("create {} ", set.name)),
            "no set {}\n{sets}",
            set.name
        );
        for e in &set.entries {
            assert!(
                sets.contains(&format!("add {} {e}", set.name)),
                "no {e} in {}\n{sets}",
                set.name
            );
        }
    }
    let addrs = tool(&path, "ip", &["-o", "addr", "show", "dev", ipvs::DUMMY]);
    for a in &rules.bind {
        assert!(
            addrs.contains(&format!(" {a}/")),
            "{a} not on {}\n{addrs}",
            ipvs::DUMMY
        );
    }
    let ipt = tool(
        &path,
        if f.ipv6 {
            "ip6tables-save"
        } else {
            "iptables-save"
        },
        &[],
    );
    let saved = rule_counts(&ipt);
    for (chain, n) in rule_counts(&rules.restore) {
        assert_eq!(saved.get(&chain), Some(&n), "{chain}\n{ipt}");
    }
    assert_eq!(sysctl_in(&path, "net.ipv4.vs.conntrack"), "1");

    let second = apply(&path, &p, &second_services(f)).unwrap();
    let Rules::Ipvs(rules2) = &second.rules else {
        panic!("not IPVS")
    };
    let save2 = tool(&path, "ipvsadm-save", &["-n"]);
    let wanted: Vec<String> = rules2
        .virtual_servers
        .iter()
        .map(ipvs::VirtualServer::service_line)
        .collect();
    let services: Vec<&str> = save2.lines().filter(|l| l.starts_with("-A ")).collect();
    assert_eq!(
        services.len(),
        wanted.len(),
        "stale virtual servers left\n{save2}"
    );
    let addrs2 = tool(&path, "ip", &["-o", "addr", "show", "dev", ipvs::DUMMY]);
    assert!(
        !addrs2.contains(&format!(" {}/", f.external)),
        "stale address on the dummy\n{addrs2}"
    );
}

/// What of the IPVS mode needs no IPVS: the rendered sets go into `ipset
/// restore`, and the iptables rules of Services whose rules need no `-m ipvs`
/// (no firewalled load balancer) into `iptables-restore`.
fn ipvs_parts_without_ipvs(ns: &Path, p: &Proxy, f: &Family) {
    let r = sluice_tests::kube_proxy::render(p, &second_services(f)).unwrap();
    let Rules::Ipvs(rules) = &r.rules else {
        panic!("not IPVS")
    };
    assert!(!rules.restore.contains("-m ipvs"));
    exec::run(
        Some(ns),
        Path::new("ipset"),
        &["-exist", "restore"],
        &[],
        rules.ipset_restore.as_bytes(),
    )
    .map(|o| assert!(o.success(), "{o}\n{}", rules.ipset_restore))
    .unwrap();
    let sets = tool(ns, "ipset", &["save"]);
    for set in &rules.sets {
        assert!(
            sets.contains(&format!("create {} ", set.name)),
            "no set {}\n{sets}",
            set.name
        );
    }
    let bin = if f.ipv6 {
        "ip6tables-restore"
    } else {
        "iptables-restore"
    };
    exec::run(
        Some(ns),
        Path::new(bin),
        &["--noflush"],
        &[],
        rules.restore.as_bytes(),
    )
    .map(|o| assert!(o.success(), "{o}\n{}", rules.restore))
    .unwrap();
    let ipt = tool(
        ns,
        if f.ipv6 {
            "ip6tables-save"
        } else {
            "iptables-save"
        },
        &[],
    );
    let saved = rule_counts(&ipt);
    for (chain, n) in rule_counts(&rules.restore) {
        assert_eq!(saved.get(&chain), Some(&n), "{chain}\n{ipt}");
    }
}

#[test]
fn ipvs_ipv4() {
    ipvs_mode(&V4);
}

#[test]
fn ipvs_ipv6() {
    ipvs_mode(&V6);
}
