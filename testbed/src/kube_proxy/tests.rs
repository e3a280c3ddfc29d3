//! Unit tests of the renderers: the Services of kube-proxy's
//! `TestOverallIPTablesRules` and `TestOverallNFTablesRules`
//! (`pkg/proxy/iptables/proxier_test.go`, `pkg/proxy/nftables/proxier_test.go`)
//! compared with their expected dumps, and the structural lines that matter
//! for the cases Sluice's tests use.
use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr},
};

use super::{render, Endpoint, Features, Mode, Port, Protocol, Proxy, Rendered, Rules, Service};

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

/// The proxier `NewFakeProxier` makes (`proxier_test.go`): node `test-node` at
/// 192.168.0.2, pod CIDR 10.0.0.0/8, mark 0x4000, nfacct counters present,
/// no `--random-fully`.
fn fake_proxy(mode: Mode) -> Proxy {
    let mut p = Proxy::new(
        mode,
        false,
        "test-node",
        vec![ip("192.168.0.2"), ip("192.168.1.2"), ip("192.168.99.11")],
    );
    p.cluster_cidr = Some("10.0.0.0/8".into());
    p.features = Some(Features {
        random_fully: false,
        nfacct: true,
        tcp_be_liberal: false,
        kernel: (6, 1),
    });
    p
}

fn p80(node_port: Option<u16>) -> Vec<Port> {
    let mut p = Port::new("p80", Protocol::Tcp, 80, 80);
    p.node_port = node_port;
    vec![p]
}

/// The six Services (and endpoints) of `TestOverallIPTablesRules`.
fn overall_services() -> Vec<Service> {
    let svc1 = Service {
        endpoints: vec![Endpoint::new(ip("10.180.0.1"), "")],
        ..Service::new("ns1", "svc1", ip("172.30.0.41"), p80(None))
    };
    // LoadBalancer, externalTrafficPolicy Local; its endpoint has no node name,
    // so it is not local.
    let svc2 = Service {
        external_ips: vec![ip("192.168.99.22")],
        load_balancer_ips: vec![ip("1.2.3.4")],
        external_traffic_local: true,
        health_check_node_port: Some(30000),
        endpoints: vec![Endpoint::new(ip("10.180.0.2"), "")],
        ..Service::new("ns2", "svc2", ip("172.30.0.42"), p80(Some(3001)))
    };
    let svc3 = Service {
        endpoints: vec![Endpoint::new(ip("10.180.0.3"), "")],
        ..Service::new("ns3", "svc3", ip("172.30.0.43"), p80(Some(3003)))
    };
    let svc4 = Service {
        external_ips: vec![ip("192.168.99.33")],
        endpoints: vec![
            Endpoint::new(ip("10.180.0.4"), ""),
            Endpoint::new(ip("10.180.0.5"), "test-node"),
        ],
        ..Service::new("ns4", "svc4", ip("172.30.0.44"), p80(None))
    };
    // LoadBalancer, Cluster policy, source ranges (with the test's stray
    // blank), ClientIP affinity. (Its healthCheckNodePort is ignored by
    // kube-proxy: Cluster policy.)
    let svc5 = Service {
        load_balancer_ips: vec![ip("5.6.7.8")],
        load_balancer_source_ranges: vec![" 203.0.113.0/25".into()],
        session_affinity_seconds: Some(10800),
        endpoints: vec![Endpoint::new(ip("10.180.0.3"), "")],
        ..Service::new("ns5", "svc5", ip("172.30.0.45"), p80(Some(3002)))
    };
    let svc6 = Service::new("ns6", "svc6", ip("172.30.0.46"), p80(None));
    vec![svc1, svc2, svc3, svc4, svc5, svc6]
}

/// The fake proxier hard-codes the mark as `0x4000`; `NewProxier` formats it
/// with `%#08x`.
fn fake_mark(s: &str) -> String {
    s.replace("0x00004000", "0x4000")
}

fn iptables_rules(r: &Rendered) -> &super::iptables::Rules {
    match &r.rules {
        Rules::Iptables(r) => r,
        _ => panic!("not iptables rules"),
    }
}

fn nft_script(r: &Rendered) -> &str {
    match &r.rules {
        Rules::Nftables(r) => &r.script,
        _ => panic!("not nftables rules"),
    }
}

fn ipvs_rules(r: &Rendered) -> &super::ipvs::Rules {
    match &r.rules {
        Rules::Ipvs(r) => r,
        _ => panic!("not IPVS rules"),
    }
}

/// `sortIPTablesRules` (`proxier_test.go`): tables by name; chains with
/// KUBE-NODEPORTS, then KUBE-SERVICES first, KUBE-* before others, else by
/// name; each chain's rules after the chain lines, in order, those of
/// KUBE-NODEPORTS and KUBE-SERVICES stably sorted by the service name of
/// their comment (the "must be the last rule" one kept last).
/// A table of a dump: its chains in order, the rules of each.
type DumpTable = (Vec<String>, BTreeMap<String, Vec<String>>);

fn sort_iptables(dump: &str) -> String {
    let mut tables: BTreeMap<String, DumpTable> = BTreeMap::new();
    let mut current = String::new();
    for line in dump.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(t) = line.strip_prefix('*') {
            current = t.to_string();
            tables.entry(current.clone()).or_default();
        } else if line == "COMMIT" {
        } else if let Some(c) = line.strip_prefix(':') {
            let chain = c.split_whitespace().next().unwrap_or_default().to_string();
            tables.entry(current.clone()).or_default().0.push(chain);
        } else {
            let chain = line
                .split_whitespace()
                .nth(1)
                .unwrap_or_default()
                .to_string();
            tables
                .entry(current.clone())
                .or_default()
                .1
                .entry(chain)
                .or_default()
                .push(line.to_string());
        }
    }
    let rank = |c: &str| match c {
        "KUBE-NODEPORTS" => (0, String::new()),
        "KUBE-SERVICES" => (1, String::new()),
        c if c.starts_with("KUBE-") => (2, c.to_string()),
        c => (3, c.to_string()),
    };
    let service = |rule: &str| {
        let c = rule.split("--comment ").nth(1).unwrap_or_default();
        let c = c.strip_prefix('"').unwrap_or(c);
        let end = c.find([' ', ':', '"']).unwrap_or(c.len());
        c[..end].to_string()
    };
    let mut out = String::new();
    for (name, (mut chains, mut rules)) in tables {
        chains.sort_by_key(|c| rank(c));
        out.push('*');
        out.push_str(&name);
        out.push('\n');
        for c in &chains {
            out.push(':');
            out.push_str(c);
            out.push_str(" - [0:0]\n");
        }
        for c in &chains {
            let mut rs = rules.remove(c).unwrap_or_default();
            if c == "KUBE-NODEPORTS" || c == "KUBE-SERVICES" {
                rs.sort_by_key(|r| (r.contains("must be the last rule"), service(r)));
            }
            for r in rs {
                out.push_str(&r);
                out.push('\n');
            }
        }
        out.push_str("COMMIT\n");
    }
    out
}

/// `expected` of `TestOverallIPTablesRules`.
const OVERALL_IPTABLES: &str = r#"
*filter
:KUBE-NODEPORTS - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
-A KUBE-NODEPORTS -m comment --comment "ns2/svc2:p80 health check node port" -m tcp -p tcp --dport 30000 -j ACCEPT
-A KUBE-SERVICES -m comment --comment "ns6/svc6:p80 has no endpoints" -m tcp -p tcp -d 172.30.0.46 --dport 80 -j REJECT
-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m tcp -p tcp -d 192.168.99.22 --dport 80 -j DROP
-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m tcp -p tcp -d 1.2.3.4 --dport 80 -j DROP
-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 3001 -j DROP
-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KUBE-PROXY-FIREWALL -m comment --comment "ns5/svc5:p80 traffic not accepted by KUBE-FW-NUKIZ6OKUXPJNT4C" -m tcp -p tcp -d 5.6.7.8 --dport 80 -j DROP
COMMIT
*nat
:KUBE-NODEPORTS - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-EXT-4SW47YFZTEDKD3PK - [0:0]
:KUBE-EXT-GNZBNJ2PO5MGZ6GT - [0:0]
:KUBE-EXT-NUKIZ6OKUXPJNT4C - [0:0]
:KUBE-EXT-X27LE4BHSL4DOUIK - [0:0]
:KUBE-FW-NUKIZ6OKUXPJNT4C - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SEP-C6EBXVWJJZMIWKLZ - [0:0]
:KUBE-SEP-I77PXRDZVX7PMWMN - [0:0]
:KUBE-SEP-OYPFS5VJICHGATKP - [0:0]
:KUBE-SEP-RS4RBKLTHTF2IUXJ - [0:0]
:KUBE-SEP-SXIVWICOYRO3J4NJ - [0:0]
:KUBE-SEP-UKSFD7AGPMPPLUHC - [0:0]
:KUBE-SVC-4SW47YFZTEDKD3PK - [0:0]
:KUBE-SVC-GNZBNJ2PO5MGZ6GT - [0:0]
:KUBE-SVC-NUKIZ6OKUXPJNT4C - [0:0]
:KUBE-SVC-X27LE4BHSL4DOUIK - [0:0]
:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
-A KUBE-NODEPORTS -m comment --comment ns2/svc2:p80 -m tcp -p tcp -d 127.0.0.0/8 --dport 3001 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
-A KUBE-NODEPORTS -m comment --comment ns2/svc2:p80 -m tcp -p tcp --dport 3001 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
-A KUBE-NODEPORTS -m comment --comment ns3/svc3:p80 -m tcp -p tcp -d 127.0.0.0/8 --dport 3003 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-X27LE4BHSL4DOUIK
-A KUBE-NODEPORTS -m comment --comment ns3/svc3:p80 -m tcp -p tcp --dport 3003 -j KUBE-EXT-X27LE4BHSL4DOUIK
-A KUBE-NODEPORTS -m comment --comment ns5/svc5:p80 -m tcp -p tcp -d 127.0.0.0/8 --dport 3002 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-NUKIZ6OKUXPJNT4C
-A KUBE-NODEPORTS -m comment --comment ns5/svc5:p80 -m tcp -p tcp --dport 3002 -j KUBE-EXT-NUKIZ6OKUXPJNT4C
-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 cluster IP" -m tcp -p tcp -d 172.30.0.42 --dport 80 -j KUBE-SVC-GNZBNJ2PO5MGZ6GT
-A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 external IP" -m tcp -p tcp -d 192.168.99.22 --dport 80 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
-A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 loadbalancer IP" -m tcp -p tcp -d 1.2.3.4 --dport 80 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
-A KUBE-SERVICES -m comment --comment "ns3/svc3:p80 cluster IP" -m tcp -p tcp -d 172.30.0.43 --dport 80 -j KUBE-SVC-X27LE4BHSL4DOUIK
-A KUBE-SERVICES -m comment --comment "ns4/svc4:p80 cluster IP" -m tcp -p tcp -d 172.30.0.44 --dport 80 -j KUBE-SVC-4SW47YFZTEDKD3PK
-A KUBE-SERVICES -m comment --comment "ns4/svc4:p80 external IP" -m tcp -p tcp -d 192.168.99.33 --dport 80 -j KUBE-EXT-4SW47YFZTEDKD3PK
-A KUBE-SERVICES -m comment --comment "ns5/svc5:p80 cluster IP" -m tcp -p tcp -d 172.30.0.45 --dport 80 -j KUBE-SVC-NUKIZ6OKUXPJNT4C
-A KUBE-SERVICES -m comment --comment "ns5/svc5:p80 loadbalancer IP" -m tcp -p tcp -d 5.6.7.8 --dport 80 -j KUBE-FW-NUKIZ6OKUXPJNT4C
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-EXT-4SW47YFZTEDKD3PK -m comment --comment "masquerade traffic for ns4/svc4:p80 external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-4SW47YFZTEDKD3PK -j KUBE-SVC-4SW47YFZTEDKD3PK
-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "pod traffic for ns2/svc2:p80 external destinations" -s 10.0.0.0/8 -j KUBE-SVC-GNZBNJ2PO5MGZ6GT
-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "masquerade LOCAL traffic for ns2/svc2:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ
-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "route LOCAL traffic for ns2/svc2:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-SVC-GNZBNJ2PO5MGZ6GT
-A KUBE-EXT-NUKIZ6OKUXPJNT4C -m comment --comment "masquerade traffic for ns5/svc5:p80 external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-NUKIZ6OKUXPJNT4C -j KUBE-SVC-NUKIZ6OKUXPJNT4C
-A KUBE-EXT-X27LE4BHSL4DOUIK -m comment --comment "masquerade traffic for ns3/svc3:p80 external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-X27LE4BHSL4DOUIK -j KUBE-SVC-X27LE4BHSL4DOUIK
-A KUBE-FW-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 loadbalancer IP" -s 203.0.113.0/25 -j KUBE-EXT-NUKIZ6OKUXPJNT4C
-A KUBE-FW-NUKIZ6OKUXPJNT4C -m comment --comment "other traffic to ns5/svc5:p80 will be dropped by KUBE-PROXY-FIREWALL"
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE
-A KUBE-SEP-C6EBXVWJJZMIWKLZ -m comment --comment ns4/svc4:p80 -s 10.180.0.5 -j KUBE-MARK-MASQ
-A KUBE-SEP-C6EBXVWJJZMIWKLZ -m comment --comment ns4/svc4:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.5:80
-A KUBE-SEP-I77PXRDZVX7PMWMN -m comment --comment ns5/svc5:p80 -s 10.180.0.3 -j KUBE-MARK-MASQ
-A KUBE-SEP-I77PXRDZVX7PMWMN -m comment --comment ns5/svc5:p80 -m recent --name KUBE-SEP-I77PXRDZVX7PMWMN --set -m tcp -p tcp -j DNAT --to-destination 10.180.0.3:80
-A KUBE-SEP-OYPFS5VJICHGATKP -m comment --comment ns3/svc3:p80 -s 10.180.0.3 -j KUBE-MARK-MASQ
-A KUBE-SEP-OYPFS5VJICHGATKP -m comment --comment ns3/svc3:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.3:80
-A KUBE-SEP-RS4RBKLTHTF2IUXJ -m comment --comment ns2/svc2:p80 -s 10.180.0.2 -j KUBE-MARK-MASQ
-A KUBE-SEP-RS4RBKLTHTF2IUXJ -m comment --comment ns2/svc2:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.2:80
-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ
-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80
-A KUBE-SEP-UKSFD7AGPMPPLUHC -m comment --comment ns4/svc4:p80 -s 10.180.0.4 -j KUBE-MARK-MASQ
-A KUBE-SEP-UKSFD7AGPMPPLUHC -m comment --comment ns4/svc4:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.4:80
-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 cluster IP" -m tcp -p tcp -d 172.30.0.44 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 -> 10.180.0.4:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-UKSFD7AGPMPPLUHC
-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 -> 10.180.0.5:80" -j KUBE-SEP-C6EBXVWJJZMIWKLZ
-A KUBE-SVC-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 cluster IP" -m tcp -p tcp -d 172.30.0.42 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SVC-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 -> 10.180.0.2:80" -j KUBE-SEP-RS4RBKLTHTF2IUXJ
-A KUBE-SVC-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 cluster IP" -m tcp -p tcp -d 172.30.0.45 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SVC-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 -> 10.180.0.3:80" -m recent --name KUBE-SEP-I77PXRDZVX7PMWMN --rcheck --seconds 10800 --reap -j KUBE-SEP-I77PXRDZVX7PMWMN
-A KUBE-SVC-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 -> 10.180.0.3:80" -j KUBE-SEP-I77PXRDZVX7PMWMN
-A KUBE-SVC-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 cluster IP" -m tcp -p tcp -d 172.30.0.43 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SVC-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 -> 10.180.0.3:80" -j KUBE-SEP-OYPFS5VJICHGATKP
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -j KUBE-SEP-SXIVWICOYRO3J4NJ
COMMIT
"#;

#[test]
fn iptables_overall_dump_matches_kube_proxy() {
    let r = render(&fake_proxy(Mode::Iptables), &overall_services()).expect("render");
    let got = sort_iptables(&fake_mark(&iptables_rules(&r).restore));
    let want = sort_iptables(OVERALL_IPTABLES);
    assert_eq!(
        want.lines().count(),
        95,
        "the whole expectation is compared"
    );
    assert_eq!(got, want, "\n--- got ---\n{got}\n--- want ---\n{want}");
}

/// The state a transaction leaves in a table that did not exist: kept `add`
/// lines (objects, rules in chain order, elements) after `flush`/`delete`.
fn nft_fold(script: &str) -> Vec<String> {
    let mut objects: Vec<(String, String)> = Vec::new(); // (kind name, line)
    let mut rules: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut elements: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in script.lines().filter(|l| !l.trim().is_empty()) {
        let w: Vec<&str> = line.split_whitespace().collect();
        let (verb, kind) = (w[0], w[1]);
        if kind == "table" {
            if !objects.iter().any(|(k, _)| k == "table") {
                objects.push(("table".into(), line.into()));
            }
            continue;
        }
        let name = w[4].to_string();
        let key = format!("{kind} {name}");
        match (verb, kind) {
            ("add", "chain" | "set" | "map") => {
                if !objects.iter().any(|(k, _)| *k == key) {
                    objects.push((key, line.into()));
                }
            }
            ("delete", "chain" | "set" | "map") => {
                objects.retain(|(k, _)| *k != key);
                rules.remove(&name);
                elements.remove(&name);
            }
            ("flush", "chain") => {
                rules.remove(&name);
            }
            ("flush", "set" | "map") => {
                elements.remove(&name);
            }
            ("add", "rule") => rules.entry(name).or_default().push(line.into()),
            ("add", "element") => elements.entry(name).or_default().push(line.into()),
            ("delete", "element") => {
                let k = line
                    .split(" { ")
                    .nth(1)
                    .unwrap_or_default()
                    .trim_end_matches(" }");
                if let Some(v) = elements.get_mut(&name) {
                    v.retain(|e| !e.contains(&format!("{{ {k} ")));
                }
            }
            _ => panic!("unexpected nft line {line}"),
        }
    }
    let mut out: Vec<String> = objects.into_iter().map(|(_, l)| l).collect();
    out.sort();
    for (_, rs) in rules {
        out.extend(rs);
    }
    let mut els: Vec<String> = elements.into_values().flatten().collect();
    els.sort();
    out.extend(els);
    out
}

/// The lines of an expected dump in [`nft_fold`]'s order.
fn nft_canonical(dump: &str) -> Vec<String> {
    nft_fold(
        &dump
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

/// `baseRules` of `pkg/proxy/nftables/proxier_test.go` as `setupNFTables` at the
/// followed commit writes them (filter chains at dstnat-10, the post-DNAT
/// output chain at dstnat+10; later kube-proxy moved to `*-pre-dnat` chains)
/// with that test's NodePort address 192.168.0.2 and ServiceCIDR
/// 172.30.0.0/16.
const NFT_BASE: &str = r#"
add table ip kube-proxy { comment "rules for kube-proxy" ; }
add set ip kube-proxy cluster-ips { type ipv4_addr ; comment "Active ClusterIPs" ; }
add set ip kube-proxy nodeport-ips { type ipv4_addr ; comment "IPs that accept NodePort traffic" ; }
add map ip kube-proxy firewall-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "destinations that are subject to LoadBalancerSourceRanges" ; }
add map ip kube-proxy no-endpoint-nodeports { type inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }
add map ip kube-proxy no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }
add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }
add map ip kube-proxy service-nodeports { type inet_proto . inet_service : verdict ; comment "NodePort traffic" ; }
add chain ip kube-proxy cluster-ips-check
add chain ip kube-proxy filter-prerouting { type filter hook prerouting priority -110 ; }
add chain ip kube-proxy filter-input { type filter hook input priority -110 ; }
add chain ip kube-proxy filter-forward { type filter hook forward priority -110 ; }
add chain ip kube-proxy filter-output { type filter hook output priority -110 ; }
add chain ip kube-proxy filter-output-post-dnat { type filter hook output priority -90 ; }
add chain ip kube-proxy firewall-check
add chain ip kube-proxy mark-for-masquerade
add chain ip kube-proxy masquerading
add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }
add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }
add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }
add chain ip kube-proxy nodeport-endpoints-check
add chain ip kube-proxy reject-chain { comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }
add chain ip kube-proxy services
add chain ip kube-proxy service-endpoints-check
add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"
add rule ip kube-proxy cluster-ips-check ip daddr { 172.30.0.0/16 } drop comment "Drop traffic to unallocated ClusterIPs"
add rule ip kube-proxy filter-prerouting ct state new jump firewall-check
add rule ip kube-proxy filter-forward ct state new jump service-endpoints-check
add rule ip kube-proxy filter-forward ct state new jump cluster-ips-check
add rule ip kube-proxy filter-input ct state new jump nodeport-endpoints-check
add rule ip kube-proxy filter-input ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output ct state new jump firewall-check
add rule ip kube-proxy filter-output-post-dnat ct state new jump cluster-ips-check
add rule ip kube-proxy firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips
add rule ip kube-proxy mark-for-masquerade mark set mark or 0x4000
add rule ip kube-proxy masquerading mark and 0x4000 == 0 return
add rule ip kube-proxy masquerading mark set mark xor 0x4000
add rule ip kube-proxy masquerading masquerade fully-random
add rule ip kube-proxy nat-output jump services
add rule ip kube-proxy nat-postrouting jump masquerading
add rule ip kube-proxy nat-prerouting jump services
add rule ip kube-proxy nodeport-endpoints-check ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports
add rule ip kube-proxy reject-chain reject
add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips
add rule ip kube-proxy services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports
add element ip kube-proxy nodeport-ips { 192.168.0.2 }
add rule ip kube-proxy service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services
"#;

/// The per-Service part of `TestOverallNFTablesRules`' expectation. The
/// ClusterIP masquerade rules carry `tcp dport 80`, as `syncProxyRules` wrote
/// them at the followed commit (the knftables dump test of that time has the
/// same lines; the newer test file dropped the port match).
const NFT_OVERALL_SERVICES: &str = r#"
# svc1
add chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip daddr 172.30.0.41 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 }
add chain ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 ip saddr 10.180.0.1 jump mark-for-masquerade
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 meta l4proto tcp dnat to 10.180.0.1:80
add element ip kube-proxy cluster-ips { 172.30.0.41 }
add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }

# svc2
add chain ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80
add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 ip daddr 172.30.0.42 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 }
add chain ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 ip saddr 10.0.0.0/8 goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit pod traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local jump mark-for-masquerade comment "masquerade local traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit local traffic"
add chain ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80
add rule ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 ip saddr 10.180.0.2 jump mark-for-masquerade
add rule ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 meta l4proto tcp dnat to 10.180.0.2:80
add element ip kube-proxy cluster-ips { 172.30.0.42 }
add element ip kube-proxy service-ips { 172.30.0.42 . tcp . 80 : goto service-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-ips { 192.168.99.22 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-ips { 1.2.3.4 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3001 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy no-endpoint-nodeports { tcp . 3001 comment "ns2/svc2:p80" : drop }
add element ip kube-proxy no-endpoint-services { 1.2.3.4 . tcp . 80 comment "ns2/svc2:p80" : drop }
add element ip kube-proxy no-endpoint-services { 192.168.99.22 . tcp . 80 comment "ns2/svc2:p80" : drop }

# svc3
add chain ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80
add rule ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80 ip daddr 172.30.0.43 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80 }
add chain ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80
add rule ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80 jump mark-for-masquerade
add rule ip kube-proxy external-4AT6LBPK-ns3/svc3/tcp/p80 goto service-4AT6LBPK-ns3/svc3/tcp/p80
add chain ip kube-proxy endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80
add rule ip kube-proxy endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80 ip saddr 10.180.0.3 jump mark-for-masquerade
add rule ip kube-proxy endpoint-UEIP74TE-ns3/svc3/tcp/p80__10.180.0.3/80 meta l4proto tcp dnat to 10.180.0.3:80
add element ip kube-proxy cluster-ips { 172.30.0.43 }
add element ip kube-proxy service-ips { 172.30.0.43 . tcp . 80 : goto service-4AT6LBPK-ns3/svc3/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3003 : goto external-4AT6LBPK-ns3/svc3/tcp/p80 }

# svc4
add chain ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80
add rule ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80 ip daddr 172.30.0.44 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80 numgen random mod 2 vmap { 0 : goto endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80 , 1 : goto endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80 }
add chain ip kube-proxy external-LAUZTJTB-ns4/svc4/tcp/p80
add rule ip kube-proxy external-LAUZTJTB-ns4/svc4/tcp/p80 jump mark-for-masquerade
add rule ip kube-proxy external-LAUZTJTB-ns4/svc4/tcp/p80 goto service-LAUZTJTB-ns4/svc4/tcp/p80
add chain ip kube-proxy endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80
add rule ip kube-proxy endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80 ip saddr 10.180.0.5 jump mark-for-masquerade
add rule ip kube-proxy endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80 meta l4proto tcp dnat to 10.180.0.5:80
add chain ip kube-proxy endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80
add rule ip kube-proxy endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80 ip saddr 10.180.0.4 jump mark-for-masquerade
add rule ip kube-proxy endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80 meta l4proto tcp dnat to 10.180.0.4:80
add element ip kube-proxy cluster-ips { 172.30.0.44 }
add element ip kube-proxy service-ips { 172.30.0.44 . tcp . 80 : goto service-LAUZTJTB-ns4/svc4/tcp/p80 }
add element ip kube-proxy service-ips { 192.168.99.33 . tcp . 80 : goto external-LAUZTJTB-ns4/svc4/tcp/p80 }

# svc5
add set ip kube-proxy affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }
add chain ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 ip daddr 172.30.0.45 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 }
add chain ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80
add rule ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80 jump mark-for-masquerade
add rule ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80 goto service-HVFWP5L3-ns5/svc5/tcp/p80
add chain ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 ip saddr 10.180.0.3 jump mark-for-masquerade
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 update @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { ip saddr }
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 meta l4proto tcp dnat to 10.180.0.3:80
add chain ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80
add rule ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr != { 203.0.113.0/25 } drop
add element ip kube-proxy cluster-ips { 172.30.0.45 }
add element ip kube-proxy service-ips { 172.30.0.45 . tcp . 80 : goto service-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy service-ips { 5.6.7.8 . tcp . 80 : goto external-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3002 : goto external-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy firewall-ips { 5.6.7.8 . tcp . 80 : goto firewall-HVFWP5L3-ns5/svc5/tcp/p80 }

# svc6
add element ip kube-proxy cluster-ips { 172.30.0.46 }
add element ip kube-proxy no-endpoint-services { 172.30.0.46 . tcp . 80 comment "ns6/svc6:p80" : goto reject-chain }
"#;

/// `NewFakeProxier` of `pkg/proxy/nftables/proxier_test.go`: NodePort addresses
/// `192.168.0.2/32` and `2001:db8::1/128`, ServiceCIDR `172.30.0.0/16`.
fn fake_nft_proxy() -> Proxy {
    let mut p = fake_proxy(Mode::Nftables);
    p.node_port_addresses = vec!["192.168.0.2/32".into(), "2001:db8::1/128".into()];
    p.service_cidrs = vec!["172.30.0.0/16".into()];
    p
}

#[test]
fn nftables_overall_dump_matches_kube_proxy() {
    let r = render(&fake_nft_proxy(), &overall_services()).expect("render");
    let got = nft_fold(&fake_mark(nft_script(&r)));
    let want = nft_canonical(&format!("{NFT_BASE}{NFT_OVERALL_SERVICES}"));
    assert_eq!(want.len(), 122, "the whole expectation is compared");
    assert_eq!(
        got,
        want,
        "\n--- got ---\n{}\n--- want ---\n{}",
        got.join("\n"),
        want.join("\n")
    );
}

#[test]
fn nftables_first_sync_remakes_base_chains_and_flushes_containers() {
    let r = render(&fake_nft_proxy(), &overall_services()).expect("render");
    let script = nft_script(&r);
    let lines: Vec<&str> = script.lines().collect();
    // The first line makes the table; every base chain is added and deleted
    // before it is made with its hook (`flushed` is false on a first sync).
    assert_eq!(
        lines[0],
        "add table ip kube-proxy { comment \"rules for kube-proxy\" ; }"
    );
    assert_eq!(lines[1], "add chain ip kube-proxy filter-prerouting");
    assert_eq!(lines[2], "delete chain ip kube-proxy filter-prerouting");
    for container in [
        "flush set ip kube-proxy cluster-ips",
        "flush map ip kube-proxy service-ips",
        "flush map ip kube-proxy service-nodeports",
        "flush map ip kube-proxy no-endpoint-services",
        "flush chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80",
    ] {
        assert!(lines.contains(&container), "no `{container}` in\n{script}");
    }
    // The real mark, as NewProxier formats it.
    assert!(script.contains("mark set mark or 0x00004000"));
}

/// `TestLoadBalancer` of `pkg/proxy/ipvs/proxier_test.go`: a LoadBalancer
/// Service (NodePort 3001, LB 1.2.3.4) with one endpoint.
fn ipvs_lb() -> (Proxy, Vec<Service>) {
    let mut p = Proxy::new(Mode::Ipvs, false, "test-node", vec![ip("100.101.102.103")]);
    p.cluster_cidr = Some("10.0.0.0/8".into());
    p.features = Some(Features {
        random_fully: false,
        ..Features::default()
    });
    let svc = Service {
        load_balancer_ips: vec![ip("1.2.3.4")],
        endpoints: vec![Endpoint::new(ip("10.180.0.1"), "")],
        ..Service::new("ns1", "svc1", ip("10.20.30.41"), p80(Some(3001)))
    };
    (p, vec![svc])
}

/// What `writeIptablesRules` and `createAndLinkKubeChain` write for
/// [`ipvs_lb`]: KUBE-SERVICES in `TestLoadBalancer`'s order (RETURN for
/// loopback, the load-balancer set, the cluster-IP masquerade, KUBE-NODE-PORT,
/// ACCEPT for cluster IPs and load balancers).
const IPVS_LB_IPTABLES: &str = r#"*nat
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-LOAD-BALANCER - [0:0]
:KUBE-MARK-MASQ - [0:0]
-A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN
-A KUBE-SERVICES -m comment --comment "Kubernetes service lb portal" -m set --match-set KUBE-LOAD-BALANCER dst,dst -j KUBE-LOAD-BALANCER
-A KUBE-NODE-PORT -p tcp -m comment --comment "Kubernetes nodeport TCP port for masquerade purpose" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT
-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
-A KUBE-SERVICES -m set --match-set KUBE-LOAD-BALANCER dst,dst -j ACCEPT
-A KUBE-POSTROUTING -m mark ! --mark 0x00004000/0x00004000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x00004000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE
-A KUBE-MARK-MASQ -j MARK --or-mark 0x00004000
COMMIT
*filter
:KUBE-FORWARD - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SOURCE-RANGES-FIREWALL - [0:0]
:KUBE-IPVS-FILTER - [0:0]
:KUBE-IPVS-OUT-FILTER - [0:0]
-A KUBE-SOURCE-RANGES-FIREWALL -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x00004000/0x00004000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KUBE-NODE-PORT -m comment --comment "Kubernetes health check node port" -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j ACCEPT
-A KUBE-IPVS-FILTER -m set --match-set KUBE-LOAD-BALANCER dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-CLUSTER-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-EXTERNAL-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-EXTERNAL-IP-LOCAL dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j RETURN
-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT
COMMIT
"#;

#[test]
fn ipvs_load_balancer_matches_kube_proxy() {
    let (p, svcs) = ipvs_lb();
    let r = render(&p, &svcs).expect("render");
    let rules = ipvs_rules(&r);
    assert_eq!(rules.restore, IPVS_LB_IPTABLES, "\n{}", rules.restore);
    // TestLoadBalancer: two virtual servers on the LB address and node port...
    assert_eq!(
        rules.ipvsadm_restore,
        "-A -t 10.20.30.41:80 -s rr\n-a -t 10.20.30.41:80 -r 10.180.0.1:80 -m -w 1\n\
         -A -t 1.2.3.4:80 -s rr\n-a -t 1.2.3.4:80 -r 10.180.0.1:80 -m -w 1\n\
         -A -t 100.101.102.103:3001 -s rr\n-a -t 100.101.102.103:3001 -r 10.180.0.1:80 -m -w 1\n"
    );
    // ... the LB entry in KUBE-LOAD-BALANCER; every set made, IPv4 flavour.
    let set = |n: &str| rules.sets.iter().find(|s| s.name == n).expect("set");
    assert_eq!(
        set("KUBE-LOAD-BALANCER").entries.iter().collect::<Vec<_>>(),
        ["1.2.3.4,tcp:80"]
    );
    assert_eq!(
        set("KUBE-CLUSTER-IP").entries.iter().collect::<Vec<_>>(),
        ["10.20.30.41,tcp:80"]
    );
    assert_eq!(
        set("KUBE-NODE-PORT-TCP").entries.iter().collect::<Vec<_>>(),
        ["3001"]
    );
    assert_eq!(
        set("KUBE-IPVS-IPS").entries.iter().collect::<Vec<_>>(),
        ["1.2.3.4", "10.20.30.41"]
    );
    assert_eq!(rules.sets.len(), 17);
    assert!(rules.ipset_restore.starts_with(
        "create KUBE-LOOP-BACK hash:ip,port,ip family inet hashsize 1024 maxelem 65536\n"
    ));
    assert!(rules
        .ipset_restore
        .contains("create KUBE-NODE-PORT-TCP bitmap:port range 0-65535\n"));
    assert!(rules
        .ipset_restore
        .contains("add KUBE-CLUSTER-IP 10.20.30.41,tcp:80\n"));
    assert_eq!(rules.bind, [ip("10.20.30.41"), ip("1.2.3.4")]);
    // The sysctls NewProxier sets, none with a kernel from 5.9 on for
    // conn_reuse_mode.
    let names: Vec<&str> = r.sysctls.iter().map(|s| s.name).collect();
    assert!(names.contains(&"net.ipv4.vs.conntrack"));
    assert!(names.contains(&"net.ipv4.vs.expire_nodest_conn"));
    assert!(names.contains(&"net.ipv4.vs.expire_quiescent_template"));
    assert!(names.contains(&"net.ipv4.ip_forward"));
    assert!(!names.contains(&"net.ipv4.vs.conn_reuse_mode"));
}

// ---------------------------------------------------------------------------
// The cases Sluice's Service tests use, per mode.

const NODE: &str = "node-a";

fn node_proxy(mode: Mode, ipv6: bool) -> Proxy {
    let (node_ip, cidr) = if ipv6 {
        (ip("fd00:50::1"), "fd00:22::/48")
    } else {
        (ip("192.168.50.1"), "10.22.0.0/16")
    };
    let mut p = Proxy::new(mode, ipv6, NODE, vec![node_ip]);
    p.cluster_cidr = Some(cidr.into());
    p.features = Some(Features::default());
    p
}

/// ClusterIP with two endpoints (one local), a NodePort with
/// externalTrafficPolicy Local, an external IP, a load-balancer IP, a Service
/// without endpoints.
fn sluice_services() -> Vec<Service> {
    let web = Service {
        endpoints: vec![
            Endpoint::new(ip("10.22.0.5"), NODE),
            Endpoint::new(ip("10.22.1.5"), "node-b"),
        ],
        ..Service::new(
            "default",
            "web",
            ip("10.96.0.10"),
            vec![Port::new("http", Protocol::Tcp, 80, 8080)],
        )
    };
    let mut np = Port::new("http", Protocol::Tcp, 80, 8080);
    np.node_port = Some(30080);
    let local = Service {
        external_traffic_local: true,
        endpoints: vec![
            Endpoint::new(ip("10.22.0.6"), NODE),
            Endpoint::new(ip("10.22.1.6"), "node-b"),
        ],
        ..Service::new("default", "local", ip("10.96.0.11"), vec![np])
    };
    let ext = Service {
        external_ips: vec![ip("203.0.113.10")],
        load_balancer_ips: vec![ip("198.51.100.7")],
        endpoints: vec![Endpoint::new(ip("10.22.0.7"), NODE)],
        ..Service::new(
            "default",
            "ext",
            ip("10.96.0.12"),
            vec![Port::new("dns", Protocol::Udp, 53, 5353)],
        )
    };
    let empty = Service::new(
        "default",
        "empty",
        ip("10.96.0.13"),
        vec![Port::new("", Protocol::Tcp, 81, 81)],
    );
    vec![web, local, ext, empty]
}

#[test]
fn iptables_structure() {
    let r = render(&node_proxy(Mode::Iptables, false), &sluice_services()).expect("render");
    let rules = iptables_rules(&r);
    let t = &rules.restore;
    let has = |l: &str| assert!(t.lines().any(|x| x == l), "no `{l}` in\n{t}");
    let svc = format!(
        "KUBE-SVC-{}",
        super::hash::port_proto_hash("default/web:http", "tcp")
    );
    // Two endpoints: the first with probability 1/2, sorted by address.
    has(&format!(
        "-A {svc} -m comment --comment \"default/web:http -> 10.22.0.5:8080\" -m statistic --mode random --probability 0.5000000000 -j {}",
        super::hash::endpoint_chain("default/web:http", "tcp", "10.22.0.5:8080")
    ));
    has(&format!(
        "-A {svc} -m comment --comment \"default/web:http cluster IP\" -m tcp -p tcp -d 10.96.0.10 --dport 80 ! -s 10.22.0.0/16 -j KUBE-MARK-MASQ"
    ));
    // externalTrafficPolicy Local: only the local endpoint in KUBE-SVL.
    let h = super::hash::port_proto_hash("default/local:http", "tcp");
    has(&format!("-A KUBE-NODEPORTS -m comment --comment default/local:http -m tcp -p tcp --dport 30080 -j KUBE-EXT-{h}"));
    has(&format!("-A KUBE-EXT-{h} -j KUBE-SVL-{h}"));
    assert_eq!(t.matches(&format!("-A KUBE-SVL-{h} ")).count(), 1);
    // External and load-balancer IPs go to KUBE-EXT (UDP).
    let e = super::hash::port_proto_hash("default/ext:dns", "udp");
    has(&format!("-A KUBE-SERVICES -m comment --comment \"default/ext:dns external IP\" -m udp -p udp -d 203.0.113.10 --dport 53 -j KUBE-EXT-{e}"));
    has(&format!("-A KUBE-SERVICES -m comment --comment \"default/ext:dns loadbalancer IP\" -m udp -p udp -d 198.51.100.7 --dport 53 -j KUBE-EXT-{e}"));
    // No endpoints: REJECT in filter's KUBE-SERVICES (an unnamed port).
    has("-A KUBE-SERVICES -m comment --comment \"default/empty has no endpoints\" -m tcp -p tcp -d 10.96.0.13 --dport 81 -j REJECT");
    // Node-wide rules: masquerade with --random-fully, INVALID drop counted.
    has("-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully");
    has("-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP");
    has("-A KUBE-MARK-MASQ -j MARK --or-mark 0x00004000");
    // Jumps: 14 ensured rules, route_localnet for localhost NodePorts.
    assert_eq!(rules.jumps.len(), 14);
    assert_eq!(
        rules.jumps[0].args,
        [
            "-m",
            "conntrack",
            "--ctstate",
            "NEW",
            "-m",
            "comment",
            "--comment",
            "kubernetes externally-visible service portals",
            "-j",
            "KUBE-EXTERNAL-SERVICES"
        ]
    );
    assert!(r
        .sysctls
        .iter()
        .any(|s| s.name == "net.ipv4.conf.all.route_localnet" && s.value == 1));
}

#[test]
fn iptables_ipv6() {
    let svc = Service {
        endpoints: vec![
            Endpoint::new(ip("fd00:22::5"), NODE),
            Endpoint::new(ip("10.22.0.5"), NODE),
        ],
        ..Service::new(
            "default",
            "web6",
            ip("fd00:96::10"),
            vec![Port::new("http", Protocol::Tcp, 80, 8080)],
        )
    };
    let v4_only = Service::new(
        "default",
        "v4",
        ip("10.96.0.20"),
        vec![Port::new("http", Protocol::Tcp, 80, 80)],
    );
    let r = render(&node_proxy(Mode::Iptables, true), &[svc, v4_only]).expect("render");
    let rules = iptables_rules(&r);
    let t = &rules.restore;
    assert!(
        t.contains("-j DNAT --to-destination [fd00:22::5]:8080"),
        "{t}"
    );
    assert!(
        !t.contains("10.22.0.5"),
        "the IPv4 endpoint leaked into IPv6 rules:\n{t}"
    );
    assert!(
        !t.contains("10.96.0.20"),
        "the IPv4 Service leaked into IPv6 rules:\n{t}"
    );
    assert!(t.contains("-m addrtype --dst-type LOCAL ! -d ::1/128 -j KUBE-NODEPORTS"));
    assert!(
        !t.contains("KUBE-FIREWALL -m comment"),
        "no localhost NodePorts on IPv6"
    );
    assert!(!r.sysctls.iter().any(|s| s.name.contains("route_localnet")));
}

#[test]
fn nftables_structure() {
    let r = render(&node_proxy(Mode::Nftables, false), &sluice_services()).expect("render");
    let s = nft_script(&r);
    let has = |l: &str| assert!(s.lines().any(|x| x == l), "no `{l}` in\n{s}");
    let web = super::hash::nft_hash_and_truncate("default/web/tcp/http");
    has(&format!(
        "add rule ip kube-proxy service-{web} numgen random mod 2 vmap {{ 0 : goto endpoint-{} , 1 : goto endpoint-{} }}",
        super::hash::nft_hash_and_truncate("default/web/tcp/http__10.22.0.5/8080"),
        super::hash::nft_hash_and_truncate("default/web/tcp/http__10.22.1.5/8080")
    ));
    let local = super::hash::nft_hash_and_truncate("default/local/tcp/http");
    has(&format!(
        "add element ip kube-proxy service-nodeports {{ tcp . 30080 : goto external-{local} }}"
    ));
    has(&format!(
        "add rule ip kube-proxy external-{local} goto local-{local}"
    ));
    let ext = super::hash::nft_hash_and_truncate("default/ext/udp/dns");
    has(&format!(
        "add element ip kube-proxy service-ips {{ 203.0.113.10 . udp . 53 : goto external-{ext} }}"
    ));
    has(&format!(
        "add element ip kube-proxy service-ips {{ 198.51.100.7 . udp . 53 : goto external-{ext} }}"
    ));
    has("add element ip kube-proxy no-endpoint-services { 10.96.0.13 . tcp . 81 comment \"default/empty\" : goto reject-chain }");
    // All node addresses take NodePorts: no nodeport-ips set.
    has("add rule ip kube-proxy services fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports");
    has("delete set ip kube-proxy nodeport-ips");
    assert!(r.sysctls.iter().all(|s| !s.name.contains("route_localnet")));
}

#[test]
fn nftables_ipv6_matches_knftables_dump() {
    // The IPv6 kube-proxy dump of knftables' `fake_test.go` (same era as the
    // followed commit): a NodePort Service with two endpoints.
    let mut p = Proxy::new(Mode::Nftables, true, "test-node", vec![ip("2001:db8::1")]);
    p.cluster_cidr = Some("fd00:10::/64".into());
    p.features = Some(Features::default());
    p.node_port_addresses = vec!["2001:db8::1/128".into()];
    p.service_cidrs = vec!["fd00:10:96::/112".into()];
    let mut port = Port::new("p80", Protocol::Tcp, 80, 80);
    port.node_port = Some(3001);
    let svc = Service {
        endpoints: vec![
            Endpoint::new(ip("fd00:10:180::2:1"), ""),
            Endpoint::new(ip("fd00:10:180::1"), ""),
        ],
        ..Service::new("ns1", "svc1", ip("fd00:172:30::41"), vec![port])
    };
    let r = render(&p, &[svc]).expect("render");
    let s = fake_mark(nft_script(&r));
    for l in [
        "add chain ip6 kube-proxy filter-output-post-dnat { type filter hook output priority -90 ; }",
        "add rule ip6 kube-proxy cluster-ips-check ip6 daddr { fd00:10:96::/112 } drop comment \"Drop traffic to unallocated ClusterIPs\"",
        "add rule ip6 kube-proxy endpoint-2CRNCTTE-ns1/svc1/tcp/p80__fd00.10.180..2.1/80 ip6 saddr fd00:10:180::2:1 jump mark-for-masquerade",
        "add rule ip6 kube-proxy endpoint-2CRNCTTE-ns1/svc1/tcp/p80__fd00.10.180..2.1/80 meta l4proto tcp dnat to [fd00:10:180::2:1]:80",
        "add rule ip6 kube-proxy endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80 meta l4proto tcp dnat to [fd00:10:180::1]:80",
        "add rule ip6 kube-proxy external-ULMVA6XW-ns1/svc1/tcp/p80 jump mark-for-masquerade",
        "add rule ip6 kube-proxy external-ULMVA6XW-ns1/svc1/tcp/p80 goto service-ULMVA6XW-ns1/svc1/tcp/p80",
        "add rule ip6 kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip6 daddr fd00:172:30::41 tcp dport 80 ip6 saddr != fd00:10::/64 jump mark-for-masquerade",
        "add rule ip6 kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 2 vmap { 0 : goto endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80 , 1 : goto endpoint-2CRNCTTE-ns1/svc1/tcp/p80__fd00.10.180..2.1/80 }",
        "add rule ip6 kube-proxy services ip6 daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports",
        "add element ip6 kube-proxy cluster-ips { fd00:172:30::41 }",
        "add element ip6 kube-proxy nodeport-ips { 2001:db8::1 }",
        "add element ip6 kube-proxy service-ips { fd00:172:30::41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }",
        "add element ip6 kube-proxy service-nodeports { tcp . 3001 : goto external-ULMVA6XW-ns1/svc1/tcp/p80 }",
    ] {
        assert!(s.lines().any(|x| x == l), "no `{l}` in\n{s}");
    }
}

#[test]
fn ipvs_structure_and_ipv6_names() {
    let r = render(&node_proxy(Mode::Ipvs, false), &sluice_services()).expect("render");
    let rules = ipvs_rules(&r);
    let vs = |a: &str| {
        rules
            .virtual_servers
            .iter()
            .find(|v| v.addr.to_string() == a)
            .unwrap_or_else(|| panic!("no virtual server {a}"))
    };
    assert_eq!(vs("10.96.0.10:80").real_servers.len(), 2);
    // externalTrafficPolicy Local: the NodePort server has the local endpoint only.
    assert_eq!(
        vs("192.168.50.1:30080").real_servers,
        ["10.22.0.6:8080".parse().expect("addr")]
    );
    assert_eq!(vs("10.96.0.11:80").real_servers.len(), 2);
    assert_eq!(vs("203.0.113.10:53").protocol, Protocol::Udp);
    assert!(vs("10.96.0.13:81").real_servers.is_empty());
    assert!(rules
        .ipvsadm_restore
        .contains("-A -u 198.51.100.7:53 -s rr\n"));
    assert!(rules.bind.contains(&ip("203.0.113.10")));
    assert!(!rules.bind.contains(&ip("192.168.50.1")));
    assert!(rules.restore.contains("-m set --match-set KUBE-EXTERNAL-IP dst,dst -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT"));
    assert!(rules.restore.contains(
        "-A KUBE-NODE-PORT -p tcp -m comment --comment \"Kubernetes nodeport TCP port with externalTrafficPolicy=local\" -m set --match-set KUBE-NODE-PORT-LOCAL-TCP dst -j RETURN"
    ));
    // Hairpin entries for the local endpoints.
    let lb = rules
        .sets
        .iter()
        .find(|s| s.name == "KUBE-LOOP-BACK")
        .expect("set");
    assert!(lb.entries.contains("10.22.0.5,tcp:8080,10.22.0.5"));

    let r6 = render(&node_proxy(Mode::Ipvs, true), &[]).expect("render");
    let names: Vec<&str> = ipvs_rules(&r6)
        .sets
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert!(names.contains(&"KUBE-6-CLUSTER-IP"));
    assert!(
        names.contains(&"KUBE-6-LOAD-BALANCER-SOURCE-CID"),
        "cut to 31 characters: {names:?}"
    );
    assert!(ipvs_rules(&r6)
        .restore
        .contains("-A KUBE-SERVICES -s ::1/128 -j RETURN"));
    assert!(ipvs_rules(&r6).ipset_restore.contains("family inet6"));
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let p = node_proxy(Mode::Iptables, false);
    let bad_name = Service::new(
        "Bad_NS",
        "web",
        ip("10.96.0.1"),
        vec![Port::new("http", Protocol::Tcp, 80, 80)],
    );
    assert!(render(&p, &[bad_name]).is_err());
    let zero = Service::new(
        "default",
        "web",
        ip("10.96.0.1"),
        vec![Port::new("http", Protocol::Tcp, 0, 80)],
    );
    assert!(render(&p, &[zero]).is_err());
    let mut bad_cidr = p.clone();
    bad_cidr.cluster_cidr = Some("10.22.0.0/99".into());
    assert!(render(&bad_cidr, &[]).is_err());
    let mut wrong_family = p.clone();
    wrong_family.cluster_cidr = Some("fd00::/64".into());
    assert!(render(&wrong_family, &[]).is_err());
    let mut bit = p;
    bit.masquerade_bit = 40;
    assert!(render(&bit, &[]).is_err());
}

#[test]
fn large_cluster_drops_endpoint_comments() {
    let endpoints = (0..1001u32)
        .map(|i| Endpoint::new(IpAddr::V4(Ipv4Addr::from(0x0a16_0000 + i)), "node-b"))
        .collect();
    let svc = Service {
        endpoints,
        ..Service::new(
            "default",
            "big",
            ip("10.96.0.30"),
            vec![Port::new("http", Protocol::Tcp, 80, 80)],
        )
    };
    let r = render(&node_proxy(Mode::Iptables, false), &[svc]).expect("render");
    let t = &iptables_rules(&r).restore;
    assert!(
        !t.contains("-> 10.22.0.1:80"),
        "largeClusterMode keeps no per-endpoint comment"
    );
    assert!(t.contains("--probability 0.0009990010 -j KUBE-SEP-"));
}
