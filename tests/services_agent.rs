//! `sluice-node`'s Service duty (`route-sync`, and `sluice-node services`
//! alone) against an API server (the stand-in of `harness/apiserver.rs`: no
//! kube-apiserver can be had from the registries here) through the real
//! kube-rs client, on a node whose datapath a pod's ADD loaded with a
//! `serviceCIDRs` of its own. The datapath's Service tries (`sl_svc`,
//! `sl_svc6`, read with bpftool, and as `sluicectl services list` shows
//! them) must hold, as the agent's (owner bit 2): the ServiceCIDRs' ranges,
//! the external IPs, the load balancer IPs of VIP mode (not Proxy), and, on
//! a cluster without the ServiceCIDR API (404), each ClusterIP; and follow Services and ServiceCIDRs that change and go.
//! The config's range (owner bit 1) stays through all of it, also when a
//! ServiceCIDR names it too (both bits, then the config's again). An agent
//! started before the first pod waits for the datapath; an upgraded
//! cluster's new ServiceCIDR API is found, and its ranges replace the single
//! addresses. A restarted agent changes nothing until it has listed the
//! cluster, then removes what went meanwhile. A watch from an expired resource version (`410 Expired`,
//! at the watch's start or inside an open one) makes kube-rs list again, and
//! the agent converges; bookmarks keep the watches' resource versions current,
//! so that an expiry after other resources' changes costs no relist. SIGTERM
//! ends the agent cleanly and leaves the entries. `sluice-node install`
//! writes `serviceCIDRs` into the conflist from `--service-cidrs` (a bad value
//! is refused by name) and from the ServiceCIDR objects, and none where the
//! API is absent.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use std::{collections::BTreeMap, fs, net::IpAddr, path::Path, thread, time::Duration};

use serde_json::{json, Value};
use sluice_tests::{
    agent::{log_of, start as agent, stop},
    apiserver::{ApiServer, Resource},
    exec,
    fixtures::add,
    leaks::map_entries,
    masq::wait_for,
    Node,
};

const CIDR: &str = "10.94.0.0/24";
/// The config's own Service range (owner CONFIG).
const CONFIG_RANGE: &str = "10.111.0.0/16";
const RANGE4: &str = "10.96.0.0/16";
const RANGE6: &str = "fd96::/112";
/// Longest the agent gets to follow a change.
const FOLLOW: Duration = Duration::from_secs(20);
const CONFIG: u8 = 1;
const AGENT: u8 = 2;

fn hex_bytes(v: &Value) -> Vec<u8> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|b| u8::from_str_radix(b.as_str()?.trim_start_matches("0x"), 16).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The Service tries of `node`'s datapath, both families: prefix -> owner bits.
fn svc(node: &Node) -> BTreeMap<String, u8> {
    let mut out = BTreeMap::new();
    for map in ["sl_svc", "sl_svc6"] {
        for e in map_entries(node, map).unwrap() {
            let (k, v) = (hex_bytes(&e["key"]), hex_bytes(&e["value"]));
            let len = u32::from_le_bytes(k[0..4].try_into().unwrap());
            let ip = match k.len() {
                8 => IpAddr::from(<[u8; 4]>::try_from(&k[4..8]).unwrap()),
                _ => IpAddr::from(<[u8; 16]>::try_from(&k[4..20]).unwrap()),
            };
            out.insert(format!("{ip}/{len}"), v[0]);
        }
    }
    out
}

/// The expected tries: the config's range plus `agent`'s prefixes.
fn want(agent: &[&str]) -> BTreeMap<String, u8> {
    let mut m: BTreeMap<String, u8> = agent.iter().map(|p| ((*p).to_string(), AGENT)).collect();
    m.insert(CONFIG_RANGE.into(), CONFIG);
    m
}

/// The same as `sluicectl services list --json` shows it: prefix -> who set it.
fn sluicectl_view(node: &Node) -> BTreeMap<String, String> {
    let v = node
        .sluicectl_json(&["services", "list", "--json"])
        .unwrap();
    v["ranges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["cidr"].as_str().unwrap().to_string(),
                r["owner"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn owner_names(m: &BTreeMap<String, u8>) -> BTreeMap<String, String> {
    m.iter()
        .map(|(p, o)| {
            let name = match *o {
                CONFIG => "config",
                AGENT => "agent",
                _ => "both",
            };
            (p.clone(), name.to_string())
        })
        .collect()
}

/// Attaches a pod to `node` through a config with its own Service range:
/// the first ADD loads the datapath.
fn attach_pod(node: &Node) {
    let mut conf = node.conf("1.0.0", CIDR);
    conf["serviceCIDRs"] = json!([CONFIG_RANGE]);
    let pod = node.pod("p").unwrap();
    add(node, &conf, "svc-agent", &pod);
}

/// A node with one pod attached (see [`attach_pod`]).
fn node_with_datapath() -> Node {
    let node = Node::new().unwrap();
    attach_pod(&node);
    assert_eq!(svc(&node), want(&[]));
    node
}

/// Waits for the tries to be `expected`; on failure shows them and the log.
#[track_caller]
fn follow(what: &str, node: &Node, log: &str, expected: &BTreeMap<String, u8>) {
    let mut last = BTreeMap::new();
    if !wait_for(FOLLOW, || {
        last = svc(node);
        last == *expected
    }) {
        panic!(
            "no {what} within {FOLLOW:?}:\n  want {expected:?}\n  have {last:?}\nagent log:\n{}",
            log_of(node, log)
        );
    }
}

/// How many times the Services were listed (not watched).
fn service_lists(api: &ApiServer) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.starts_with("GET /api/v1/services?") && !r.contains("watch="))
        .count()
}

fn web_spec(external: &[&str]) -> Value {
    json!({
        "type": "LoadBalancer",
        "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "fd96::10"],
        "ipFamilies": ["IPv4", "IPv6"],
        "externalIPs": external,
        "ports": [{"port": 80, "protocol": "TCP"}],
    })
}

fn lb_status() -> Value {
    json!({"loadBalancer": {"ingress": [
        {"ip": "198.51.100.10"},
        {"ip": "198.51.100.11", "ipMode": "VIP"},
        {"ip": "2001:db8:51::11", "ipMode": "VIP"},
        {"ip": "198.51.100.12", "ipMode": "Proxy"},
        {"hostname": "lb.example"},
    ]}})
}

fn plain(ip: &str, external: &[&str]) -> Value {
    json!({"clusterIP": ip, "clusterIPs": [ip], "externalIPs": external, "ports": [{"port": 80}]})
}

#[test]
fn route_sync_keeps_the_service_addresses_kube_proxy_translates() {
    let node = node_with_datapath();
    let api = ApiServer::start(&node.netns_path(), "127.0.0.1:0").unwrap();
    api.set_bookmark_interval(Duration::from_millis(300));
    // Pages of two: kube-rs's watcher follows the continue tokens.
    api.set_max_page(Some(2));
    api.set_node("node-a", &[CIDR], &["192.168.70.1"]);
    api.set_service_cidr("kubernetes", &[RANGE4, RANGE6]);
    api.set_service("default", "web", &web_spec(&["203.0.113.10"]), &lb_status());
    // Not proxied by kube-proxy: nothing of these goes in.
    api.set_service(
        "default",
        "headless",
        &json!({"clusterIP": "None", "externalIPs": ["203.0.113.90"]}),
        &json!({}),
    );
    api.set_service(
        "default",
        "dns",
        &json!({"type": "ExternalName", "externalName": "example.com", "externalIPs": ["203.0.113.91"]}),
        &json!({}),
    );
    api.set_service(
        "other",
        "elsewhere",
        &json!({"clusterIP": "10.96.0.92", "externalIPs": ["203.0.113.92"]}),
        &json!({}),
    );
    // A ClusterIP outside every ServiceCIDR, and a value that is no address.
    api.set_service(
        "kube-system",
        "odd",
        &plain("10.99.0.5", &["203.0.113.300"]),
        &json!({}),
    );
    api.put(
        Resource::Services,
        json!({
            "metadata": {"name": "proxied-elsewhere", "namespace": "other",
                "labels": {"service.kubernetes.io/service-proxy-name": "someone-else"}},
            "spec": plain("10.96.0.93", &["203.0.113.93"]),
        }),
    );

    let log = "route-sync.log";
    let a = agent(
        &node,
        api.port(),
        &["route-sync", "--node-name", "node-a"],
        log,
    )
    .unwrap();
    let base = [
        RANGE4,
        RANGE6,
        "10.99.0.5/32",
        "203.0.113.10/32",
        "203.0.113.92/32",
        "198.51.100.10/32",
        "198.51.100.11/32",
        "2001:db8:51::11/128",
    ];
    follow(
        "ServiceCIDRs, external and VIP load balancer IPs",
        &node,
        log,
        &want(&base),
    );
    // sluicectl tells the same, by owner.
    assert_eq!(sluicectl_view(&node), owner_names(&want(&base)));
    assert!(
        api.requests().iter().any(|r| r.contains("continue=")),
        "the lists were not paged: {:?}",
        api.requests()
    );

    // A Service changes, then goes; a ServiceCIDR comes, then goes.
    api.set_service("default", "web", &web_spec(&["203.0.113.11"]), &lb_status());
    let changed: Vec<&str> = base
        .iter()
        .map(|p| {
            if *p == "203.0.113.10/32" {
                "203.0.113.11/32"
            } else {
                p
            }
        })
        .collect();
    follow("a changed externalIP", &node, log, &want(&changed));
    api.delete_service("default", "web");
    let without_web = [RANGE4, RANGE6, "10.99.0.5/32", "203.0.113.92/32"];
    follow(
        "a deleted Service's addresses gone",
        &node,
        log,
        &want(&without_web),
    );
    api.set_service_cidr("extra", &["10.99.0.0/16"]);
    follow(
        "a new ServiceCIDR (holding the odd ClusterIP)",
        &node,
        log,
        &want(&[RANGE4, RANGE6, "10.99.0.0/16", "203.0.113.92/32"]),
    );
    api.delete_service_cidr("extra");
    follow(
        "a deleted ServiceCIDR gone",
        &node,
        log,
        &want(&without_web),
    );
    // A range both the config and a ServiceCIDR name: both own it, and the
    // ServiceCIDR's going leaves the config's.
    api.set_service_cidr("same", &[CONFIG_RANGE]);
    let mut both = want(&without_web);
    both.insert(CONFIG_RANGE.into(), CONFIG | AGENT);
    follow("a range owned by both", &node, log, &both);
    assert_eq!(sluicectl_view(&node), owner_names(&both));
    api.delete_service_cidr("same");
    follow("the config's range kept", &node, log, &want(&without_web));

    // 410 at a watch's start: changes the open watches never delivered, the
    // history compacted, every watch closed. kube-rs lists again.
    let (lists, expired) = (service_lists(&api), api.expired_watches());
    api.hold_watches();
    api.set_service(
        "default",
        "late",
        &plain("10.96.0.20", &["203.0.113.20"]),
        &json!({}),
    );
    api.delete_service("other", "elsewhere");
    api.expire();
    let after_410 = [RANGE4, RANGE6, "10.99.0.5/32", "203.0.113.20/32"];
    follow("convergence after a 410", &node, log, &want(&after_410));
    assert!(api.expired_watches() > expired, "{:?}", api.requests());
    assert!(service_lists(&api) > lists, "{:?}", api.requests());

    // 410 inside an open watch: the history compacted under it.
    let (lists, expired) = (service_lists(&api), api.expired_watches());
    api.hold_watches();
    api.set_service(
        "default",
        "later",
        &plain("10.96.0.21", &["203.0.113.21"]),
        &json!({}),
    );
    api.compact();
    let after_410b = [
        RANGE4,
        RANGE6,
        "10.99.0.5/32",
        "203.0.113.20/32",
        "203.0.113.21/32",
    ];
    follow(
        "convergence after a 410 in a watch",
        &node,
        log,
        &want(&after_410b),
    );
    assert!(api.expired_watches() > expired, "{:?}", api.requests());
    assert!(service_lists(&api) > lists, "{:?}", api.requests());

    // Bookmarks: Nodes change (the one resource version moves on), the
    // Service and ServiceCIDR watches learn it from bookmarks, so after an
    // expiry they watch on from there: no 410, no relist.
    thread::sleep(Duration::from_secs(1));
    for i in 0..3 {
        // (no pod CIDRs: route-sync has no route to make)
        api.set_node("node-b", &[], &[&format!("192.168.70.{}", i + 2)]);
    }
    let bookmarks = api.bookmarks_sent();
    assert!(
        wait_for(Duration::from_secs(5), || api.bookmarks_sent()
            >= bookmarks + 3),
        "no bookmarks"
    );
    thread::sleep(Duration::from_millis(700));
    let (lists, expired) = (service_lists(&api), api.expired_watches());
    let watches = api.requests().len();
    api.expire();
    assert!(
        wait_for(Duration::from_secs(5), || api
            .requests()
            .iter()
            .skip(watches)
            .filter(|r| r.contains("watch=true"))
            .count()
            >= 3),
        "the watches did not come back: {:?}",
        api.requests()
    );
    thread::sleep(Duration::from_secs(2));
    assert_eq!(api.expired_watches(), expired, "{:?}", api.requests());
    assert_eq!(service_lists(&api), lists, "{:?}", api.requests());

    // Each bad value said once, however many passes ran.
    let text = log_of(&node, log);
    assert_eq!(text.matches("\"203.0.113.300\"").count(), 1, "{text}");
    assert!(text.contains("ServiceCIDR API found"), "{text}");

    // SIGTERM: a clean exit, the entries stay.
    stop(a, &node, log).unwrap();
    assert_eq!(svc(&node), want(&after_410b));

    // Meanwhile the cluster changes.
    api.delete_service("default", "late");
    api.set_service(
        "default",
        "fresh",
        &plain("10.96.0.30", &["203.0.113.30"]),
        &json!({}),
    );
    // An agent that cannot list yet (no API at that port) changes nothing.
    let unreachable = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let blind = agent(
        &node,
        unreachable,
        &["route-sync", "--node-name", "node-a"],
        "blind.log",
    )
    .unwrap();
    thread::sleep(Duration::from_secs(3));
    assert_eq!(
        svc(&node),
        want(&after_410b),
        "{}",
        log_of(&node, "blind.log")
    );
    stop(blind, &node, "blind.log").unwrap();

    // Restarted: the stale entry goes, the new one comes, the config's stays.
    let b = agent(
        &node,
        api.port(),
        &["route-sync", "--node-name", "node-a"],
        log,
    )
    .unwrap();
    follow(
        "a restart's reconciliation",
        &node,
        log,
        &want(&[
            RANGE4,
            RANGE6,
            "10.99.0.5/32",
            "203.0.113.21/32",
            "203.0.113.30/32",
        ]),
    );
    stop(b, &node, log).unwrap();
}

#[test]
fn without_the_servicecidr_api_each_cluster_ip_goes_in() {
    let node = Node::new().unwrap();
    let api = ApiServer::start(&node.netns_path(), "127.0.0.1:0").unwrap();
    api.set_service_cidr_api(false);
    api.set_service(
        "default",
        "dual",
        &json!({
            "clusterIP": "10.96.5.5", "clusterIPs": ["10.96.5.5", "fd96::5"],
            "externalIPs": ["2001:db8::5"], "ports": [{"port": 53}],
        }),
        &json!({}),
    );
    api.set_service("default", "one", &plain("10.96.5.6", &[]), &json!({}));
    // Started before any pod: the agent waits for the datapath.
    let log = "services.log";
    let a = agent(&node, api.port(), &["services"], log).unwrap();
    assert!(
        wait_for(FOLLOW, || log_of(&node, log)
            .contains("no ServiceCIDR API (404")),
        "{}",
        log_of(&node, log)
    );
    assert!(!node.pin_root().join("maps").join("sl_svc").exists());
    attach_pod(&node);
    follow(
        "each ClusterIP",
        &node,
        log,
        &want(&[
            "10.96.5.5/32",
            "10.96.5.6/32",
            "fd96::5/128",
            "2001:db8::5/128",
        ]),
    );
    api.delete_service("default", "one");
    follow(
        "a deleted Service's ClusterIP gone",
        &node,
        log,
        &want(&["10.96.5.5/32", "fd96::5/128", "2001:db8::5/128"]),
    );
    // The cluster is upgraded: the API appears, the ranges replace the
    // single addresses (the agent looks again every resync period).
    api.set_service_cidr_api(true);
    api.set_service_cidr("kubernetes", &[RANGE4, RANGE6]);
    follow(
        "the ranges once the API is there",
        &node,
        log,
        &want(&[RANGE4, RANGE6, "2001:db8::5/128"]),
    );
    stop(a, &node, log).unwrap();
    assert_eq!(svc(&node), want(&[RANGE4, RANGE6, "2001:db8::5/128"]));
}

/// The conflist `sluice-node install` wrote into `conf_dir`.
fn conflist(conf_dir: &Path) -> Value {
    serde_json::from_slice(&fs::read(conf_dir.join("10-sluice.conflist")).unwrap()).unwrap()
}

#[test]
fn install_writes_service_cidrs_from_the_flag_and_from_the_api() {
    let node = Node::new().unwrap();
    let api = ApiServer::start(&node.netns_path(), "127.0.0.1:0").unwrap();
    api.set_node("node-i", &[CIDR], &["192.168.70.9"]);
    api.set_service_cidr("kubernetes", &["10.96.0.0/12", "fd00:10:96::/112"]);
    let from = node.dir().join("image");
    fs::create_dir(&from).unwrap();
    fs::write(from.join("sluice"), b"#!/bin/true\n").unwrap();
    let kubeconfig = node.dir().join("kubeconfig");
    fs::write(&kubeconfig, api.kubeconfig("127.0.0.1")).unwrap();
    let bin = sluice_tests::sluice_node_bin().unwrap();
    let run = |n: u32, flags: &[&str], env: &[(&str, &str)]| {
        let (b, c) = (
            node.dir().join(format!("bin{n}")),
            node.dir().join(format!("conf{n}")),
        );
        for d in [&b, &c] {
            fs::create_dir(d).unwrap();
        }
        let (from, b_s, c_s) = (
            from.display().to_string(),
            b.display().to_string(),
            c.display().to_string(),
        );
        let mut args = vec![
            "install",
            "--from",
            &from,
            "--cni-bin-dir",
            &b_s,
            "--cni-conf-dir",
            &c_s,
            "--wait-secs",
            "5",
        ];
        args.extend(flags);
        let mut vars = vec![("KUBECONFIG".to_string(), kubeconfig.display().to_string())];
        vars.extend(
            env.iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string())),
        );
        let out = exec::run(Some(&node.netns_path()), &bin, &args, &vars, b"").unwrap();
        (out, c)
    };

    // From the flag (spaces as a ConfigMap may have them), no API read for it.
    let before = api.requests().len();
    let (out, conf) = run(
        1,
        &[
            "--pod-cidrs",
            CIDR,
            "--service-cidrs",
            "10.96.0.0/12, fd00:10:96::/112",
        ],
        &[],
    );
    assert!(out.success(), "{out}");
    assert_eq!(
        conflist(&conf)["plugins"][0]["serviceCIDRs"],
        json!(["10.96.0.0/12", "fd00:10:96::/112"])
    );
    assert_eq!(api.requests().len(), before, "{:?}", api.requests());

    // A bad value is refused by name, before anything is written.
    let (out, conf) = run(
        2,
        &["--pod-cidrs", CIDR, "--service-cidrs", "10.96.0.0/33"],
        &[],
    );
    assert!(!out.success(), "{out}");
    assert!(out.stderr.contains("10.96.0.0/33"), "{out}");
    assert!(!conf.join("10-sluice.conflist").exists());

    // From the ServiceCIDR objects, the way the DaemonSet runs it: the
    // Node's pod CIDRs, the ConfigMap's keys empty.
    let (out, conf) = run(
        3,
        &["--node-name", "node-i"],
        &[("SLUICE_SERVICE_CIDRS", ""), ("SLUICE_CLUSTER_CIDRS", "")],
    );
    assert!(out.success(), "{out}");
    let list = conflist(&conf);
    assert_eq!(
        list["plugins"][0]["serviceCIDRs"],
        json!(["10.96.0.0/12", "fd00:10:96::/112"]),
        "{list:#}"
    );
    assert_eq!(list["plugins"][0]["ipam"]["ranges"][0][0]["subnet"], CIDR);
    assert!(
        api.requests()
            .iter()
            .any(|r| r.starts_with("GET /apis/networking.k8s.io/v1/servicecidrs")),
        "{:?}",
        api.requests()
    );

    // A cluster without the API: no serviceCIDRs, and no failure.
    api.set_service_cidr_api(false);
    let (out, conf) = run(4, &["--node-name", "node-i"], &[]);
    assert!(out.success(), "{out}");
    let list = conflist(&conf);
    assert!(list["plugins"][0].get("serviceCIDRs").is_none(), "{list:#}");
    assert!(out.stderr.contains("no ServiceCIDR API"), "{out}");
}
