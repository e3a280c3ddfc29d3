//! NetworkPolicy in the datapath (`sluice-node policy`), checked the way
//! Cyclonus checks a CNI: pods in three namespaces serve TCP and UDP on two
//! ports, every pod (and the node) probes every other pod on every port and
//! protocol with real traffic, and the whole truth table must equal the
//! one the NetworkPolicy API defines for the policies of each case. The
//! cases are data ([`cases`]), served by the stand-in API server to the
//! agent's real kube-rs watches; they port the upstream network-policy e2e
//! cases that apply to one node: default deny, pod and namespace
//! selectors alone, together (AND) and as two peers (OR), ports, endPort,
//! named ports, ipBlock with except, egress, egress replies, and the
//! union of policies.
//!
//! The other tests: a policy that tightens under an open connection cuts it
//! at its next packet; a pod the agent has not compiled is refused both ways
//! (pending) until its Pod object is known; audit mode lets would-be drops
//! through and counts them; drops are counted by direction.
#![cfg(test)]
use std::{
    collections::BTreeMap,
    io::{Read, Write},
    net::{IpAddr, SocketAddr, TcpStream},
    path::Path,
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use sluice_tests::{
    agent::{log_of, start as agent, stop},
    apiserver::ApiServer,
    counters::Counters,
    ctl::{wait_lease, CtlChild},
    fixtures::{add, external_host, EXT_IP, UPLINK},
    host::Host,
    hostport::{client_in, Cgroup},
    masq::EchoServer,
    reach::{self, Case, Probe, Proto},
    traffic::enter_netns,
    Node, Pod,
};

const CLIENT: &str = env!("CARGO_BIN_EXE_sluice-test-client");
const CIDR: &str = "10.94.0.0/24";
const CIDR6: &str = "fd00:94::/64";
const LOG: &str = "policy.log";
/// The servers' ports; `SERVE` is also named "serve" on pod a's containers.
const P80: u16 = 80;
const P81: u16 = 81;
/// Longest a case gets to reach its table (the agent polls every 200 ms).
const CONVERGE: Duration = Duration::from_secs(15);

/// The pods: (namespace, name, labels).
const PODS: [(&str, &str, &str); 5] = [
    ("x", "a", "a"),
    ("x", "b", "b"),
    ("y", "a", "a"),
    ("y", "b", "b"),
    ("z", "c", "c"),
];

struct World {
    node: Node,
    /// A host beyond the node's uplink ("ext" in the tables), routed to the
    /// pods: traffic from outside the cluster, through `uplink_in`.
    ext: Host,
    api: ApiServer,
    /// "ns/name" -> (pod, its IPv4 address, its servers).
    pods: BTreeMap<String, (Pod, IpAddr, Vec<EchoServer>)>,
    /// "ns/name" -> its IPv6 address (the pods are dual-stack).
    ip6: BTreeMap<String, IpAddr>,
    agent: Option<sluice_tests::exec::Running>,
    /// The Service hooks' cgroup ([`Mode::RouteSyncServices`]).
    cgroup: Option<Cgroup>,
}

/// How the agent runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `sluice-node policy`.
    Enforce,
    /// `sluice-node policy --audit`.
    Audit,
    /// `sluice-node route-sync --network-policy enforce`, as the DaemonSet.
    RouteSync,
    /// The same with Sluice's Services (`--service-proxy`), its socket
    /// hooks on a cgroup of the test's own.
    RouteSyncServices,
}

impl World {
    fn new(audit: bool) -> Self {
        Self::with(if audit { Mode::Audit } else { Mode::Enforce })
    }

    fn with(mode: Mode) -> Self {
        let node = Node::new().unwrap();
        let ext = external_host(&node, CIDR).unwrap();
        let mut conf = node.conf("1.0.0", CIDR);
        conf["uplink"] = json!(UPLINK);
        // Masquerade on: connections from outside into a pod with policy
        // (delivered through the kernel) must still have their replies
        // leave untranslated.
        conf["ipMasq"] = json!(true);
        conf["ipam"]["ranges"] = json!([[{"subnet": CIDR}], [{"subnet": CIDR6}]]);
        conf["ipam"].as_object_mut().unwrap().remove("subnet");
        let api = ApiServer::start(&node.netns_path(), "127.0.0.1:0").unwrap();
        api.set_bookmark_interval(Duration::from_millis(300));
        for ns in ["x", "y", "z"] {
            api.set_namespace(ns, &[("ns", ns)]);
        }
        let mut pods = BTreeMap::new();
        let mut ip6 = BTreeMap::new();
        for (ns, name, label) in PODS {
            let pod = node.pod(&format!("{ns}{name}")).unwrap();
            let added = add(&node, &conf, &format!("pol-{ns}-{name}"), &pod);
            let ip = added
                .ips
                .iter()
                .map(|(ip, _)| *ip)
                .find(IpAddr::is_ipv4)
                .unwrap();
            let v6 = added
                .ips
                .iter()
                .map(|(ip, _)| *ip)
                .find(IpAddr::is_ipv6)
                .unwrap();
            let servers = [P80, P81]
                .iter()
                .flat_map(|p| [SocketAddr::new(ip, *p), SocketAddr::new(v6, *p)])
                .map(|a| EchoServer::start(&pod.path, a).unwrap())
                .collect();
            api.set_pod(
                ns,
                name,
                node.name(),
                &[("pod", label)],
                &[&ip.to_string(), &v6.to_string()],
                &json!([[{"name": "serve", "containerPort": P81, "protocol": "TCP"}],
                         [{"name": "other", "containerPort": P80, "protocol": "UDP"}]]),
            );
            pods.insert(format!("{ns}/{name}"), (pod, ip, servers));
            ip6.insert(format!("{ns}/{name}"), v6);
        }
        let mut w = Self {
            node,
            ext,
            api,
            pods,
            ip6,
            agent: None,
            cgroup: (mode == Mode::RouteSyncServices).then(|| Cgroup::new().unwrap()),
        };
        w.api.set_node(w.node.name(), &[CIDR], &[]);
        w.start_agent(mode);
        w.wait_applied();
        w
    }

    /// Waits until the agent's first pass is in the datapath: it writes its
    /// state file after switching policy on (an open table says nothing
    /// before that).
    fn wait_applied(&self) {
        let start = Instant::now();
        while !Path::new(&self.state_file()).exists() {
            assert!(
                start.elapsed() < CONVERGE,
                "the agent wrote no state within {CONVERGE:?}:\n{}",
                log_of(&self.node, LOG)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn start_agent(&mut self, mode: Mode) {
        let state = self.state_file();
        let records = self.node.state_dir().display().to_string();
        let name = self.node.name().to_string();
        let cg = self
            .cgroup
            .as_ref()
            .map(Cgroup::display)
            .unwrap_or_default();
        let mut args = match mode {
            Mode::Enforce | Mode::Audit => vec!["policy", "--state-file", &state],
            Mode::RouteSyncServices => vec![
                "route-sync",
                "--node-name",
                &name,
                "--network-policy",
                "enforce",
                "--policy-state-file",
                &state,
                "--service-proxy",
                "--service-cgroup",
                &cg,
            ],
            Mode::RouteSync => vec![
                "route-sync",
                "--node-name",
                &name,
                "--network-policy",
                "enforce",
                "--policy-state-file",
                &state,
            ],
        };
        args.extend(["--cni-state-dir", &records]);
        if mode == Mode::Audit {
            args.push("--audit");
        }
        self.agent = Some(agent(&self.node, self.api.port(), &args, LOG).unwrap());
    }

    fn stop_agent(&mut self) {
        if let Some(a) = self.agent.take() {
            stop(a, &self.node, LOG).unwrap();
        }
    }

    fn state_file(&self) -> String {
        self.node.dir().join("policy.json").display().to_string()
    }

    fn ip(&self, pod: &str) -> IpAddr {
        self.pods[pod].1
    }

    /// Every probe: each pod, the node and the outside host to each other
    /// pod, both ports, both protocols, over IPv4; over IPv6 (`v6`) without
    /// the outside host (no IPv6 route to the pods there).
    fn probes_of(&self, v6: bool) -> Vec<Probe> {
        let mut clients: Vec<(String, std::path::PathBuf)> = self
            .pods
            .iter()
            .map(|(k, (p, _, _))| (k.clone(), p.path.clone()))
            .collect();
        clients.push(("node".into(), self.node.netns_path()));
        if !v6 {
            clients.push(("ext".into(), self.ext.netns_path()));
        }
        let mut v = Vec::new();
        for (from, netns) in &clients {
            for (to, (_, ip4, _)) in &self.pods {
                if from == to {
                    continue;
                }
                let ip = if v6 { &self.ip6[to] } else { ip4 };
                for port in [P80, P81] {
                    for proto in [Proto::Tcp, Proto::Udp] {
                        v.push(Probe {
                            from: from.clone(),
                            to: to.clone(),
                            proto,
                            port,
                            from_netns: netns.clone(),
                            addr: SocketAddr::new(*ip, port),
                        });
                    }
                }
            }
        }
        v
    }

    /// The truth table `allowed` defines over every probe.
    fn table(&self, allowed: impl Fn(&str, &str, u16, Proto) -> bool) -> BTreeMap<Case, bool> {
        self.table_of(false, allowed)
    }

    fn table_of(
        &self,
        v6: bool,
        allowed: impl Fn(&str, &str, u16, Proto) -> bool,
    ) -> BTreeMap<Case, bool> {
        self.probes_of(v6)
            .into_iter()
            .map(|p| {
                let ok = allowed(&p.from, &p.to, p.port, p.proto);
                ((p.from, p.to, p.port, p.proto), ok)
            })
            .collect()
    }

    /// Probes until the table is `want` (at most [`CONVERGE`]); the time it
    /// took, or the last difference.
    fn converge(&self, what: &str, want: &BTreeMap<Case, bool>) -> Duration {
        self.converge_of(false, what, want)
    }

    fn converge_of(&self, v6: bool, what: &str, want: &BTreeMap<Case, bool>) -> Duration {
        let start = Instant::now();
        let probes = self.probes_of(v6);
        loop {
            let got = reach::run(&probes).unwrap();
            let d = reach::diff(&got, want);
            if d.is_empty() {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < CONVERGE,
                "case {what}: the reachability table differs from NetworkPolicy's after {CONVERGE:?}:\n{d}\nagent log:\n{}",
                log_of(&self.node, LOG)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn counters(&self) -> Counters {
        self.node.counters().unwrap()
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if let Some(a) = self.agent.take() {
            let _ = stop(a, &self.node, LOG);
        }
    }
}

/// Which probes get through: (from, to, port, protocol).
type Allowed = Box<dyn Fn(&str, &str, u16, Proto) -> bool>;

/// One case: its name, the policies (namespace, name, spec), and which
/// probes get through (from, to, port, protocol; "node" is the node).
struct PolicyCase {
    name: &'static str,
    policies: Vec<(&'static str, &'static str, Value)>,
    allowed: Allowed,
}

fn ns(pod: &str) -> &str {
    pod.split('/').next().unwrap_or("")
}

fn label(pod: &str) -> &str {
    pod.split('/').nth(1).unwrap_or("")
}

/// The cases, as data: the upstream e2e's and Cyclonus's shapes on one node
/// ("node" is the node itself, "ext" a host beyond its uplink).
fn cases(ip_of: &dyn Fn(&str) -> IpAddr) -> Vec<PolicyCase> {
    let ya = ip_of("y/a");
    vec![
        PolicyCase {
            name: "no policy: everything open",
            policies: vec![],
            allowed: Box::new(|_, _, _, _| true),
        },
        PolicyCase {
            name: "default deny ingress in x (the node still reaches its pods)",
            policies: vec![("x", "deny", json!({"podSelector": {}, "policyTypes": ["Ingress"]}))],
            allowed: Box::new(|from, to, _, _| from == "node" || ns(to) != "x"),
        },
        PolicyCase {
            name: "x/a from pods of x labelled pod=b (podSelector alone)",
            policies: vec![("x", "allow-b", json!({
                "podSelector": {"matchLabels": {"pod": "a"}},
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}))],
            allowed: Box::new(|from, to, _, _| to != "x/a" || from == "node" || from == "x/b"),
        },
        PolicyCase {
            name: "x/a from every pod of namespace y (namespaceSelector alone)",
            policies: vec![("x", "allow-y", json!({
                "podSelector": {"matchLabels": {"pod": "a"}},
                "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}))],
            allowed: Box::new(|from, to, _, _| to != "x/a" || from == "node" || ns(from) == "y"),
        },
        PolicyCase {
            name: "x/a from pod=a in namespace y (both selectors in one peer: AND)",
            policies: vec![("x", "allow-y-a", json!({
                "podSelector": {"matchLabels": {"pod": "a"}},
                "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}},
                                       "podSelector": {"matchLabels": {"pod": "a"}}}]}]}))],
            allowed: Box::new(|from, to, _, _| to != "x/a" || from == "node" || from == "y/a"),
        },
        PolicyCase {
            name: "x/a from namespace y or from pod=b of x (two peers: OR)",
            policies: vec![("x", "allow-y-or-b", json!({
                "podSelector": {"matchLabels": {"pod": "a"}},
                "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}},
                                      {"podSelector": {"matchLabels": {"pod": "b"}}}]}]}))],
            allowed: Box::new(|from, to, _, _| {
                to != "x/a" || from == "node" || ns(from) == "y" || from == "x/b"
            }),
        },
        PolicyCase {
            name: "x/a from all namespaces (empty namespaceSelector) on TCP 80 only",
            policies: vec![("x", "tcp80", json!({
                "podSelector": {"matchLabels": {"pod": "a"}},
                "ingress": [{"from": [{"namespaceSelector": {}}],
                             "ports": [{"protocol": "TCP", "port": 80}]}]}))],
            allowed: Box::new(|from, to, port, proto| {
                to != "x/a" || from == "node" || (from != "ext" && port == P80 && proto == Proto::Tcp)
            }),
        },
        PolicyCase {
            name: "x/a on TCP 80-81 (endPort), UDP not at all",
            policies: vec![("x", "range", json!({
                "podSelector": {"matchLabels": {"pod": "a"}},
                "ingress": [{"ports": [{"protocol": "TCP", "port": 80, "endPort": 81}]}]}))],
            allowed: Box::new(|from, to, _, proto| {
                to != "x/a" || from == "node" || proto == Proto::Tcp
            }),
        },
        PolicyCase {
            name: "x/a on its named ports: TCP \"serve\" (81), UDP \"other\" (80), two containers",
            policies: vec![("x", "named", json!({
                "podSelector": {"matchLabels": {"pod": "a"}},
                "ingress": [{"ports": [{"protocol": "TCP", "port": "serve"},
                                       {"protocol": "UDP", "port": "other"}]}]}))],
            allowed: Box::new(|from, to, port, proto| {
                to != "x/a"
                    || from == "node"
                    || (port == P81 && proto == Proto::Tcp)
                    || (port == P80 && proto == Proto::Udp)
            }),
        },
        PolicyCase {
            name: "x/a from the pod CIDR except y/a's address (ipBlock except)",
            policies: vec![("x", "block", json!({
                "podSelector": {"matchLabels": {"pod": "a"}},
                "ingress": [{"from": [{"ipBlock": {"cidr": CIDR, "except": [format!("{ya}/32")]}}]}]}))],
            allowed: Box::new(|from, to, _, _| {
                to != "x/a" || from == "node" || (from != "y/a" && from != "ext")
            }),
        },
        PolicyCase {
            name: "x/a from the external host's address only (ipBlock /32, traffic from the uplink)",
            policies: vec![("x", "ext-only", json!({
                "podSelector": {"matchLabels": {"pod": "a"}},
                "ingress": [{"from": [{"ipBlock": {"cidr": format!("{EXT_IP}/32")}}]}]}))],
            allowed: Box::new(|from, to, _, _| to != "x/a" || from == "node" || from == "ext"),
        },
        PolicyCase {
            name: "two policies select x/a: their rules add up (union)",
            policies: vec![
                ("x", "from-b", json!({
                    "podSelector": {"matchLabels": {"pod": "a"}},
                    "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}],
                                 "ports": [{"port": 80}]}]})),
                ("x", "from-z", json!({
                    "podSelector": {"matchLabels": {"pod": "a"}},
                    "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "z"}}}]}]})),
            ],
            allowed: Box::new(|from, to, port, proto| {
                to != "x/a"
                    || from == "node"
                    || ns(from) == "z"
                    || (from == "x/b" && port == P80 && proto == Proto::Tcp)
            }),
        },
        PolicyCase {
            name: "default deny egress of x/b: it reaches nobody; others still reach it (replies pass)",
            policies: vec![("x", "no-egress", json!({
                "podSelector": {"matchLabels": {"pod": "b"}}, "policyTypes": ["Egress"]}))],
            allowed: Box::new(|from, _, _, _| from != "x/b"),
        },
        PolicyCase {
            name: "egress of x/b to namespace y on UDP 80 only (DNS-like)",
            policies: vec![("x", "udp-to-y", json!({
                "podSelector": {"matchLabels": {"pod": "b"}},
                "policyTypes": ["Egress"],
                "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}],
                            "ports": [{"protocol": "UDP", "port": 80}]}]}))],
            allowed: Box::new(|from, to, port, proto| {
                from != "x/b" || (ns(to) == "y" && port == P80 && proto == Proto::Udp)
            }),
        },
        PolicyCase {
            name: "ingress and egress: y/b only talks to x/a, only x/a talks to y/b",
            policies: vec![("y", "pair", json!({
                "podSelector": {"matchLabels": {"pod": "b"}},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "x"}},
                                       "podSelector": {"matchLabels": {"pod": "a"}}}]}],
                "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "x"}},
                                    "podSelector": {"matchLabels": {"pod": "a"}}}]}]}))],
            allowed: Box::new(|from, to, _, _| {
                if from == "y/b" {
                    return to == "x/a";
                }
                to != "y/b" || from == "node" || from == "x/a"
            }),
        },
        PolicyCase {
            name: "matchExpressions: x/a from pods whose label pod is not in (b, c)",
            policies: vec![("x", "expr", json!({
                "podSelector": {"matchLabels": {"pod": "a"}},
                "ingress": [{"from": [{"namespaceSelector": {},
                    "podSelector": {"matchExpressions": [{"key": "pod", "operator": "NotIn", "values": ["b", "c"]}]}}]}]}))],
            allowed: Box::new(|from, to, _, _| to != "x/a" || from == "node" || label(from) == "a"),
        },
    ]
}

fn apply(
    api: &ApiServer,
    old: &[(&str, &str, Value)],
    new: &[(&'static str, &'static str, Value)],
) {
    for (ns, name, _) in old {
        api.delete_network_policy(ns, name);
    }
    for (ns, name, spec) in new {
        api.set_network_policy(ns, name, spec);
    }
}

#[test]
fn every_case_gives_network_policys_truth_table() {
    let w = World::new(false);
    let ip_of = |p: &str| w.ip(p);
    let mut applied: Vec<(&str, &str, Value)> = Vec::new();
    let mut report = Vec::new();
    for case in cases(&ip_of) {
        apply(&w.api, &applied, &case.policies);
        let want = w.table(&case.allowed);
        let took = w.converge(case.name, &want);
        report.push(format!("{:>6} ms  {}", took.as_millis(), case.name));
        applied = case.policies;
    }
    // Drops are counted by direction.
    let c = w.counters();
    assert!(c.get("drop_policy_ingress") > 0, "{c:?}");
    assert!(c.get("drop_policy_egress") > 0, "{c:?}");
    assert!(c.get("policy_new") > 0, "{c:?}");
    eprintln!(
        "cases, each with the time to its table:\n{}",
        report.join("\n")
    );

    // `sluicectl policy`: the last case's policy, its pods and rules.
    let state = w.state_file();
    let all = w
        .node
        .sluicectl_json(&["policy", "--json", "--state", &state])
        .unwrap();
    assert_eq!(all["mode"], "enforce", "{all:#}");
    // Five dual-stack pods.
    assert_eq!(all["maps"]["pods"], 10, "{all:#}");
    let xa = w
        .node
        .sluicectl_json(&["policy", "--json", "--state", &state, "--pod", "x/a"])
        .unwrap();
    let pods = xa["pods"].as_array().unwrap();
    assert_eq!(pods.len(), 1, "{xa:#}");
    assert_eq!(pods[0]["ingressIsolated"], true, "{xa:#}");
    assert_eq!(pods[0]["policies"], json!(["x/expr"]), "{xa:#}");
    let rules = xa["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 1, "{xa:#}");
    assert_eq!(rules[0]["policy"], "x/expr", "{xa:#}");
    assert_eq!(rules[0]["direction"], "ingress", "{xa:#}");
    assert!(
        rules[0]["flows"].as_u64().unwrap() > 0,
        "the rule let no flow in: {xa:#}"
    );
    assert!(
        xa["counters"]["drop_policy_ingress"].as_u64().unwrap() > 0,
        "{xa:#}"
    );
    // By address too, and the text form names the policy.
    let by_ip = w
        .node
        .sluicectl_json(&[
            "policy",
            "--json",
            "--state",
            &state,
            "--pod",
            &w.ip("x/a").to_string(),
        ])
        .unwrap();
    assert_eq!(by_ip["pods"], xa["pods"], "{by_ip:#}");
    let text = w.node.sluicectl(&["policy", "--state", &state]).unwrap();
    let text = text.stdout.clone();
    assert!(
        text.contains("NetworkPolicy: enforce") && text.contains("x/expr"),
        "{text}"
    );

    // The metrics: the mode, each rule's flows under its policy's name, the
    // drops by direction.
    let m = w
        .node
        .sluicectl(&["metrics", "--policy-state", &state])
        .unwrap()
        .stdout;
    assert!(m.contains("sluice_policy_info{mode=\"enforce\"} 1"), "{m}");
    let rule = m
        .lines()
        .find(|l| {
            l.starts_with(
                "sluice_policy_rule_flows_total{policy=\"x/expr\",direction=\"ingress\",rule=\"0\"}",
            )
        })
        .unwrap_or_else(|| panic!("no series of x/expr's rule: {m}"));
    let flows: u64 = rule.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(flows > 0, "{rule}");
    for (reason, direction) in [("policy_ingress", "ingress"), ("policy_egress", "egress")] {
        let series =
            format!("sluice_drop_count_total{{reason=\"{reason}\",direction=\"{direction}\"}}");
        let line = m
            .lines()
            .find(|l| l.starts_with(&series))
            .unwrap_or_else(|| panic!("no {series}: {m}"));
        assert!(!line.ends_with(" 0"), "{line}");
    }
    // The last case isolates x/a for ingress only.
    assert!(
        m.contains("sluice_policy_pods{isolated=\"ingress\"} 1"),
        "{m}"
    );
}

/// Policy drops in the monitor carry the direction and the policies that
/// select the pod.
#[test]
fn the_monitor_shows_policy_drops_with_their_direction_and_policies() {
    let w = World::new(false);
    w.api.set_network_policy(
        "x",
        "deny-a",
        &json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress"]}),
    );
    let want = w.table(|from, to, _, _| to != "x/a" || from == "node");
    w.converge("deny x/a", &want);
    let state = w.state_file();
    let m = CtlChild::monitor(
        &w.node,
        &["--json", "--type", "policy", "--policy-state", &state],
    )
    .unwrap();
    wait_lease(&w.node, true, Duration::from_secs(5)).unwrap();
    let probe = Probe {
        from: "x/b".into(),
        to: "x/a".into(),
        proto: Proto::Tcp,
        port: P80,
        from_netns: w.pods["x/b"].0.path.clone(),
        addr: SocketAddr::new(w.ip("x/a"), P80),
    };
    let got = m.wait_for(Duration::from_secs(20), |evs| {
        if evs.is_empty() {
            let _ = reach::run(std::slice::from_ref(&probe));
        }
        !evs.is_empty()
    });
    let end = m.stop(Duration::from_secs(3)).unwrap();
    assert!(got, "no policy event: {end:#?}");
    let events = end.json();
    let e = &events[0];
    assert_eq!(e["type"], "drop", "{e:#}");
    assert_eq!(e["reason"], "drop_policy_ingress", "{e:#}");
    assert_eq!(e["direction"], "ingress", "{e:#}");
    assert_eq!(e["policies"], json!(["x/deny-a"]), "{e:#}");
    assert_eq!(e["dst"], w.ip("x/a").to_string(), "{e:#}");
    assert_eq!(e["src"], w.ip("x/b").to_string(), "{e:#}");
}

/// `route-sync --network-policy enforce` runs the policy agent, as the
/// DaemonSet does; started again without it, it switches policy off.
#[test]
fn route_sync_runs_policy_and_switches_it_off_without_the_flag() {
    let mut w = World::with(Mode::RouteSync);
    w.api.set_network_policy(
        "y",
        "deny",
        &json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
    );
    let want = w.table(|from, to, _, _| ns(to) != "y" || from == "node");
    w.converge("route-sync: deny y", &want);
    w.stop_agent();
    let name = w.node.name().to_string();
    let records = w.node.state_dir().display().to_string();
    w.agent = Some(
        agent(
            &w.node,
            w.api.port(),
            &[
                "route-sync",
                "--node-name",
                &name,
                "--cni-state-dir",
                &records,
            ],
            LOG,
        )
        .unwrap(),
    );
    let open = w.table(|_, _, _, _| true);
    w.converge("route-sync without --network-policy", &open);
    assert!(
        log_of(&w.node, LOG).contains("NetworkPolicy off"),
        "{}",
        log_of(&w.node, LOG)
    );
}

/// IPv6 gets the same tables: the cases whose peers are pods and blocks,
/// over the pods' IPv6 addresses (the node included).
#[test]
fn ipv6_flows_get_the_same_truth_tables() {
    let w = World::new(false);
    let ya6 = w.ip6["y/a"];
    let cases: Vec<PolicyCase> = vec![
        PolicyCase {
            name: "IPv6: default deny ingress in x",
            policies: vec![(
                "x",
                "deny",
                json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
            )],
            allowed: Box::new(|from, to, _, _| from == "node" || ns(to) != "x"),
        },
        PolicyCase {
            name: "IPv6: x/a from pod=a in namespace y (AND) on TCP",
            policies: vec![(
                "x",
                "allow-y-a",
                json!({
                "podSelector": {"matchLabels": {"pod": "a"}},
                "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}},
                                       "podSelector": {"matchLabels": {"pod": "a"}}}],
                             "ports": [{"protocol": "TCP"}]}]}),
            )],
            allowed: Box::new(|from, to, _, proto| {
                to != "x/a" || from == "node" || (from == "y/a" && proto == Proto::Tcp)
            }),
        },
        PolicyCase {
            name: "IPv6: x/a from the IPv6 pod range except y/a's address",
            policies: vec![(
                "x",
                "block6",
                json!({
                "podSelector": {"matchLabels": {"pod": "a"}},
                "ingress": [{"from": [{"ipBlock": {"cidr": CIDR6, "except": [format!("{ya6}/128")]}}]}]}),
            )],
            allowed: Box::new(|from, to, _, _| to != "x/a" || from == "node" || from != "y/a"),
        },
        PolicyCase {
            name: "IPv6: egress of x/b to namespace y on UDP 80 only",
            policies: vec![(
                "x",
                "udp-to-y",
                json!({
                "podSelector": {"matchLabels": {"pod": "b"}},
                "policyTypes": ["Egress"],
                "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}],
                            "ports": [{"protocol": "UDP", "port": 80}]}]}),
            )],
            allowed: Box::new(|from, to, port, proto| {
                from != "x/b" || (ns(to) == "y" && port == P80 && proto == Proto::Udp)
            }),
        },
    ];
    let mut applied: Vec<(&str, &str, Value)> = Vec::new();
    for case in cases {
        apply(&w.api, &applied, &case.policies);
        let want = w.table_of(true, &case.allowed);
        let took = w.converge_of(true, case.name, &want);
        eprintln!("{:>6} ms  {}", took.as_millis(), case.name);
        applied = case.policies;
    }
}

/// Egress rules apply to a Service's backend, not its ClusterIP: Sluice's
/// Services pick the backend at the socket, so the pod's packets carry the
/// backend's address when the policy looks at them. x/b may send to pod a
/// of namespace y on UDP 80 only; its datagrams to the ClusterIP pass while
/// y/a is the endpoint and are refused once the endpoint is z/c, whom x/a
/// (not isolated) still reaches through the same ClusterIP.
#[test]
fn egress_rules_apply_to_the_service_backend_not_the_cluster_ip() {
    const CLUSTER_IP: &str = "10.96.9.10";
    let w = World::with(Mode::RouteSyncServices);
    w.api.set_service(
        "y",
        "web",
        &json!({"clusterIP": CLUSTER_IP, "clusterIPs": [CLUSTER_IP],
                "ports": [{"name": "u", "port": P80, "protocol": "UDP", "targetPort": P80}]}),
        &json!({}),
    );
    let backend = |pod: &str| {
        w.api.set_endpoint_slice(
            "y",
            "web-1",
            "web",
            "IPv4",
            &json!([{"addresses": [w.ip(pod).to_string()], "nodeName": w.node.name(),
                     "conditions": {"ready": true, "serving": true, "terminating": false}}]),
            &json!([{"name": "u", "port": P80, "protocol": "UDP"}]),
        );
    };
    backend("y/a");
    w.api.set_network_policy(
        "x",
        "b-to-y-a",
        &json!({"podSelector": {"matchLabels": {"pod": "b"}},
                "policyTypes": ["Egress"],
                "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "y"}},
                                    "podSelector": {"matchLabels": {"pod": "a"}}}],
                            "ports": [{"protocol": "UDP", "port": P80}]}]}),
    );
    let cg = w.cgroup.as_ref();
    let send = |from: &str| {
        let to = format!("{CLUSTER_IP}:{P80}");
        client_in(
            Path::new(CLIENT),
            &w.pods[from].0.path,
            cg,
            &["udp", &to, "3", "300"],
        )
        .unwrap()
    };
    let until = |what: &str, from: &str, ok: bool| {
        let start = Instant::now();
        loop {
            let r = send(from);
            if r.ok == ok {
                return r;
            }
            assert!(
                start.elapsed() < CONVERGE,
                "{what}: {from} -> {CLUSTER_IP}: {r:?}\n{}",
                log_of(&w.node, LOG)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let r = until("the allowed backend y/a", "x/b", true);
    assert_eq!(
        r.from.map(|f| f.ip().to_string()),
        Some(CLUSTER_IP.to_string()),
        "{r:?}"
    );
    backend("z/c");
    until("the backend z/c, which x/b may not reach", "x/b", false);
    until("x/a, not isolated, to z/c", "x/a", true);
    let c = w.counters();
    assert!(c.get("drop_policy_egress") > 0, "{c:?}");
    assert!(c.get("lb_sock") > 0, "{c:?}");
}

/// Writes `what` on an open connection and reads the echo.
fn exchange(s: &mut TcpStream, what: &[u8]) -> bool {
    let mut buf = vec![0u8; what.len()];
    s.write_all(what).is_ok() && s.read_exact(&mut buf).is_ok() && buf == what
}

#[test]
fn a_policy_that_tightens_cuts_open_flows_at_their_next_packet() {
    let w = World::new(false);
    let open = w.table(|_, _, _, _| true);
    w.converge("open", &open);
    let (from, to) = (w.pods["x/b"].0.path.clone(), w.ip("x/a"));
    // A connection x/b -> x/a opened while everything is allowed.
    let (tx, rx) = std::sync::mpsc::channel::<bool>();
    let (opened_tx, opened_rx) = std::sync::mpsc::channel::<bool>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<bool>();
    let t = std::thread::spawn(move || {
        enter_netns(&from).unwrap();
        let mut s =
            TcpStream::connect_timeout(&SocketAddr::new(to, P80), Duration::from_secs(2)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let _ = opened_tx.send(exchange(&mut s, b"before"));
        // Wait for the policy.
        let _ = rx.recv_timeout(Duration::from_secs(30));
        let _ = done_tx.send(exchange(&mut s, b"after"));
    });
    // The connection is open (and used) before the policy exists.
    let before = opened_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    w.api.set_network_policy(
        "x",
        "deny",
        &json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress"]}),
    );
    let want = w.table(|from, to, _, _| to != "x/a" || from == "node");
    w.converge("deny x/a", &want);
    tx.send(true).unwrap();
    let after = done_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    t.join().unwrap();
    assert!(before, "the connection did not work before the policy");
    assert!(
        !after,
        "the open connection still worked after the policy denied it"
    );
}

#[test]
fn a_pod_without_its_pod_object_is_pending_both_ways_until_it_is_known() {
    let w = World::new(false);
    let open = w.table(|_, _, _, _| true);
    w.converge("open", &open);
    // A new pod attached; its Pod object comes later.
    let conf = w.node.conf("1.0.0", CIDR);
    let pod = w.node.pod("late").unwrap();
    let added = add(&w.node, &conf, "pol-late", &pod);
    let ip = added
        .ips
        .iter()
        .map(|(ip, _)| *ip)
        .find(IpAddr::is_ipv4)
        .unwrap();
    let _server = EchoServer::start(&pod.path, SocketAddr::new(ip, P80)).unwrap();
    let xa = w.ip("x/a");
    let probes = || {
        vec![
            Probe {
                from: "x/a".into(),
                to: "late".into(),
                proto: Proto::Tcp,
                port: P80,
                from_netns: w.pods["x/a"].0.path.clone(),
                addr: SocketAddr::new(ip, P80),
            },
            Probe {
                from: "late".into(),
                to: "x/a".into(),
                proto: Proto::Tcp,
                port: P80,
                from_netns: pod.path.clone(),
                addr: SocketAddr::new(xa, P80),
            },
        ]
    };
    // Pending: give the agent time to see the endpoint (it polls every 200 ms).
    std::thread::sleep(Duration::from_secs(1));
    let got = reach::run(&probes()).unwrap();
    assert!(
        got.values().all(|ok| !ok),
        "a pending pod was reachable: {got:?}"
    );
    let c = w.counters();
    assert!(c.get("drop_policy_pending") > 0, "{c:?}");
    // Known: no policy selects it, so it is open.
    w.api.set_pod(
        "x",
        "late",
        w.node.name(),
        &[("pod", "late")],
        &[&ip.to_string()],
        &json!([]),
    );
    let start = Instant::now();
    loop {
        let got = reach::run(&probes()).unwrap();
        if got.values().all(|ok| *ok) {
            break;
        }
        assert!(
            start.elapsed() < CONVERGE,
            "the pod stayed pending: {got:?}\n{}",
            log_of(&w.node, LOG)
        );
    }
    eprintln!("known after {} ms", start.elapsed().as_millis());
}

/// A pod whose ADD names it (`K8S_POD_NAMESPACE`, `K8S_POD_NAME` in
/// `CNI_ARGS`, as containerd and CRI-O send) is compiled from its Pod
/// object's labels before the kubelet reports its address (the agent reads
/// the plugin's attachment record), and its ADD returns once it is: the pod
/// starts with its policy. Here a default-deny policy selects it.
#[test]
fn a_pod_named_at_add_gets_its_policy_before_its_address_is_reported() {
    let w = World::new(false);
    let open = w.table(|_, _, _, _| true);
    w.converge("open", &open);
    w.api.set_network_policy(
        "x",
        "deny-new",
        &json!({"podSelector": {"matchLabels": {"pod": "new"}}, "policyTypes": ["Ingress"]}),
    );
    // The Pod object as the scheduler leaves it: labels, no address yet.
    w.api.set_pod(
        "x",
        "new",
        w.node.name(),
        &[("pod", "new")],
        &[],
        &json!([]),
    );
    let conf = w.node.conf("1.0.0", CIDR);
    let pod = w.node.pod("new").unwrap();
    let out = w
        .node
        .cni(
            "ADD",
            &conf,
            "pol-new",
            "eth0",
            Some(&pod),
            &[(
                "CNI_ARGS",
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=x;K8S_POD_NAME=new",
            )],
        )
        .unwrap();
    let ip: IpAddr = out.result()["ips"][0]["address"]
        .as_str()
        .and_then(|a| a.split('/').next())
        .and_then(|a| a.parse().ok())
        .unwrap();
    let _server = EchoServer::start(&pod.path, SocketAddr::new(ip, P80)).unwrap();
    let from_a = Probe {
        from: "x/a".into(),
        to: "x/new".into(),
        proto: Proto::Tcp,
        port: P80,
        from_netns: w.pods["x/a"].0.path.clone(),
        addr: SocketAddr::new(ip, P80),
    };
    let to_a = Probe {
        from: "x/new".into(),
        to: "x/a".into(),
        proto: Proto::Tcp,
        port: P80,
        from_netns: pod.path.clone(),
        addr: SocketAddr::new(w.ip("x/a"), P80),
    };
    // Compiled from the record before ADD returned (the plugin waits for
    // it): already isolated for ingress (refused), its egress open; not
    // pending (which would refuse both).
    let got = reach::run(&[from_a, to_a]).unwrap();
    let into = got[&("x/a".to_string(), "x/new".to_string(), P80, Proto::Tcp)];
    let out_of = got[&("x/new".to_string(), "x/a".to_string(), P80, Proto::Tcp)];
    assert!(
        !into && out_of,
        "the pod did not start with its policy: {got:?}\n{}",
        log_of(&w.node, LOG)
    );
    let state = std::fs::read_to_string(w.state_file()).unwrap();
    let st: Value = serde_json::from_str(&state).unwrap();
    let me = st["report"]["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "new")
        .cloned()
        .unwrap_or_default();
    assert_eq!(me["ingressIsolated"], true, "{st:#}");
    assert_eq!(me["ips"], json!([ip.to_string()]), "{st:#}");
}

#[test]
fn audit_mode_lets_would_be_drops_through_and_counts_them() {
    let w = World::new(true);
    w.api.set_network_policy(
        "x",
        "deny",
        &json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
    );
    // Give the agent the policy, then everything must still be open.
    let start = Instant::now();
    loop {
        let state = std::fs::read_to_string(w.state_file()).unwrap_or_default();
        if state.contains("x/deny") {
            break;
        }
        assert!(
            start.elapsed() < CONVERGE,
            "the agent did not compile the policy:\n{}",
            log_of(&w.node, LOG)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let state = w.state_file();
    let m = CtlChild::monitor(
        &w.node,
        &["--json", "--type", "policy", "--policy-state", &state],
    )
    .unwrap();
    wait_lease(&w.node, true, Duration::from_secs(5)).unwrap();
    let open = w.table(|_, _, _, _| true);
    w.converge("audit", &open);
    let got = m.wait_for(Duration::from_secs(10), |evs| {
        evs.iter().any(|e| e["type"] == "policy-audit")
    });
    let end = m.stop(Duration::from_secs(3)).unwrap();
    assert!(got, "no audit event: {end:#?}");
    let events = end.json();
    let e = events.iter().find(|e| e["type"] == "policy-audit").unwrap();
    assert!(
        e["reason"] == "policy_audit_ingress" || e["reason"] == "policy_audit_egress",
        "{e:#}"
    );
    assert_eq!(e["policies"], json!(["x/deny"]), "{e:#}");
    let c = w.counters();
    assert!(c.get("policy_audit_ingress") > 0, "{c:?}");
    assert!(c.get("policy_audit_egress") > 0, "{c:?}");
    assert_eq!(
        c.get("drop_policy_ingress") + c.get("drop_policy_egress"),
        0,
        "{c:?}"
    );
}
