//! What real runtimes send (issue 13), through the real binary: containerd's
//! go-cni spells capability keys the Go way (`HostPort`, `IngressRate`) and
//! fills "no burst" with 4294967295 and the direction without an annotation
//! with zeros; CRI-O sends 34359738359. DEL and GC must succeed whatever
//! `runtimeConfig` holds (a pod whose ADD failed on it must still go away);
//! ADD and CHECK stay strict and name the key as the runtime wrote it.
//!
//! The containerd CRI end-to-end test (`tests/cri.rs`) drives the same through a
//! real containerd; these tests pin down each case on the plugin alone.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use std::net::{IpAddr, SocketAddr};

use serde_json::{json, Value};
use sluice_tests::{
    bandwidth::{bw_list, default_burst_bits},
    fixtures,
    hostport::{ports_list, HpWorld},
    masq::EchoServer,
    Node, NETWORK,
};

const HP: u16 = 18090;
const CPORT: u16 = 8080;

/// `runtimeConfig` exactly as containerd 1.6's CRI plugin sends it for a pod
/// with a TCP and a UDP hostPort and an ingress-bandwidth annotation of 100M.
fn containerd_runtime_config() -> Value {
    json!({
        "portMappings": [
            {"HostPort": HP, "ContainerPort": CPORT, "Protocol": "tcp", "HostIP": ""},
            {"HostPort": HP, "ContainerPort": CPORT, "Protocol": "udp", "HostIP": ""}
        ],
        "bandwidth": {
            "IngressRate": 100_000_000u64, "IngressBurst": 4_294_967_295u64,
            "EgressRate": 0, "EgressBurst": 0
        }
    })
}

fn world(subnet: &str) -> HpWorld {
    HpWorld::new(subnet, "off", &json!({})).unwrap()
}

fn conf_with_runtime(w: &HpWorld, rc: &Value) -> Value {
    let mut c = w.conf.clone();
    c["capabilities"] = json!({"portMappings": true, "bandwidth": true});
    c["runtimeConfig"] = rc.clone();
    c
}

/// Asserts that nothing of `cid` is left: veths, records, reservations,
/// endpoints, hostPort mappings and bandwidth entries.
#[track_caller]
fn assert_gone(node: &Node) {
    node.assert_clean(NETWORK);
    assert!(node.endpoints().unwrap().is_empty(), "endpoints left");
    assert!(
        ports_list(node, &[]).unwrap().is_empty(),
        "hostPort mappings left"
    );
    assert!(bw_list(node).unwrap().is_empty(), "bandwidth entries left");
}

#[test]
fn containerd_spelling_maps_ports_and_limits_with_the_default_burst() {
    let w = world("10.93.1.0/24");
    let pod = w.node.pod("ctrd").unwrap();
    let conf = conf_with_runtime(&w, &containerd_runtime_config());
    let added = fixtures::add(&w.node, &conf, "ctrd", &pod);
    let ip = added.ip();

    // The mappings are live: the external host reaches the pod through them.
    let server = EchoServer::start(&pod.path, SocketAddr::new(ip, CPORT)).unwrap();
    let to = SocketAddr::new(IpAddr::V4(sluice_tests::hostport::node_ip()), HP);
    w.ext_tcp(to, 7).unwrap();
    w.ext_udp(to).unwrap();
    drop(server);
    let ports = ports_list(&w.node, &[]).unwrap();
    assert_eq!(ports.len(), 2, "{ports:#?}");

    // 4294967295 is containerd's "no burst": the default burst, not 43 s of rate.
    let bw = bw_list(&w.node).unwrap();
    assert_eq!(bw.len(), 1, "{bw:#?}");
    let rate = 100_000_000u64;
    assert_eq!(bw[0]["ingress"]["rate"].as_u64(), Some(rate), "{bw:#?}");
    assert_eq!(
        bw[0]["ingress"]["burst"].as_u64(),
        Some(default_burst_bits(rate)),
        "{bw:#?}"
    );
    // EgressRate 0 (no egress annotation) is no egress limit.
    assert!(bw[0]["egress"].is_null(), "{bw:#?}");

    // CHECK with the same config passes (the record holds what was parsed).
    let c = sluice_tests::with_prev_result(&conf, &added.result);
    w.node
        .cni("CHECK", &c, "ctrd", "eth0", Some(&pod), &[])
        .unwrap()
        .ok_silent();
    fixtures::del(&w.node, &conf, "ctrd", &pod);
    assert_gone(&w.node);
}

#[test]
fn crio_burst_and_lowercase_keys_get_the_default_burst() {
    let w = world("10.93.2.0/24");
    let pod = w.node.pod("crio").unwrap();
    let rc = json!({
        "bandwidth": {
            "ingressrate": 10_000_000u64, "ingressburst": 34_359_738_359u64,
            "EGRESSRATE": 20_000_000u64, "EGRESSBURST": 34_359_738_359u64
        },
        "dns": {"Servers": ["10.96.0.10"], "Searches": ["svc.cluster.local"], "Options": ["ndots:5"]}
    });
    let conf = conf_with_runtime(&w, &rc);
    let added = fixtures::add(&w.node, &conf, "crio", &pod);
    let bw = bw_list(&w.node).unwrap();
    assert_eq!(
        bw[0]["ingress"]["burst"].as_u64(),
        Some(default_burst_bits(10_000_000)),
        "{bw:#?}"
    );
    assert_eq!(
        bw[0]["egress"]["burst"].as_u64(),
        Some(default_burst_bits(20_000_000)),
        "{bw:#?}"
    );
    // The dns capability (conventions: servers/searches/options) is in the result.
    assert_eq!(
        added.result["dns"],
        json!({"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"], "options": ["ndots:5"]}),
        "{:#}",
        added.result
    );
    fixtures::del(&w.node, &conf, "crio", &pod);
    assert_gone(&w.node);
}

/// A `runtimeConfig` no command can act on: every member is invalid.
fn broken_runtime_config() -> Value {
    json!({
        "portMappings": [{"HostPort": "x", "ContainerPort": 80}],
        "bandwidth": {"egressRate": -1},
        "mac": "not-a-mac",
        "ips": ["10.1.1.300"],
        "dns": {"servers": "nope"},
        "ipRanges": [[{"subnet": "garbage"}]]
    })
}

#[test]
fn del_with_an_unparseable_runtime_config_removes_everything() {
    let w = world("10.93.3.0/24");
    let pod = w.node.pod("a").unwrap();
    let good = conf_with_runtime(&w, &containerd_runtime_config());
    fixtures::add(&w.node, &good, "del-broken", &pod);
    assert_eq!(ports_list(&w.node, &[]).unwrap().len(), 2);

    let mut bad = conf_with_runtime(&w, &broken_runtime_config());
    // Other keys only ADD acts on, broken too.
    bad["mtu"] = json!(1);
    bad["prevResult"] = json!({"ips": [{"address": "x"}]});
    bad["args"] = json!({"cni": {"ips": ["x"]}});
    bad["podAttach"] = json!("carrier-pigeon");
    // ... and CNI_ARGS with a key nobody knows and no IgnoreUnknown.
    let env = [("CNI_ARGS", "NOBODY_KNOWS=1")];
    for _ in 0..2 {
        let out = w
            .node
            .cni("DEL", &bad, "del-broken", "eth0", Some(&pod), &env)
            .unwrap();
        out.ok_silent();
    }
    assert_gone(&w.node);
}

#[test]
fn an_add_refused_for_its_runtime_config_can_be_deleted() {
    let w = world("10.93.4.0/24");
    // A pod already running, so the datapath is loaded and its maps can be read.
    let other = w.node.pod("other").unwrap();
    let good = conf_with_runtime(&w, &containerd_runtime_config());
    fixtures::add(&w.node, &good, "other", &other);
    let pod = w.node.pod("a").unwrap();
    let rc = json!({"portMappings": [{"HostPort": 0, "ContainerPort": 80, "Protocol": "tcp"}]});
    let conf = conf_with_runtime(&w, &rc);
    let out = w
        .node
        .cni("ADD", &conf, "wedge", "eth0", Some(&pod), &[])
        .unwrap();
    // Strict, naming the key as containerd wrote it.
    let e = out.error(7);
    e.assert_names(&["runtimeConfig.portMappings[0].HostPort", "0"]);
    // The kubelet's StopPodSandbox: DEL with the same config succeeds.
    w.node
        .cni("DEL", &conf, "wedge", "eth0", Some(&pod), &[])
        .unwrap()
        .ok_silent();
    // Only the other pod is left, with its mappings.
    assert_eq!(w.node.records(NETWORK).unwrap().len(), 1);
    assert_eq!(w.node.endpoints().unwrap().len(), 1);
    assert_eq!(ports_list(&w.node, &[]).unwrap().len(), 2);
    fixtures::del(&w.node, &good, "other", &other);
    assert_gone(&w.node);
}

#[test]
fn check_stays_strict_about_runtime_config() {
    let w = world("10.93.5.0/24");
    let pod = w.node.pod("a").unwrap();
    let good = conf_with_runtime(&w, &containerd_runtime_config());
    let added = fixtures::add(&w.node, &good, "chk", &pod);
    let bad = sluice_tests::with_prev_result(
        &conf_with_runtime(
            &w,
            &json!({"bandwidth": {"IngressRate": 1000, "IngressBurst": 0}}),
        ),
        &added.result,
    );
    let out = w
        .node
        .cni("CHECK", &bad, "chk", "eth0", Some(&pod), &[])
        .unwrap();
    out.error(7)
        .assert_names(&["runtimeConfig.bandwidth.IngressBurst", "0"]);
    fixtures::del(&w.node, &good, "chk", &pod);
    assert_gone(&w.node);
}

#[test]
fn gc_with_an_unparseable_runtime_config_removes_stale_attachments() {
    let w = world("10.93.6.0/24");
    let pod = w.node.pod("a").unwrap();
    let good = conf_with_runtime(&w, &containerd_runtime_config());
    fixtures::add(&w.node, &good, "gc-broken", &pod);
    let mut bad = conf_with_runtime(&w, &broken_runtime_config());
    bad["cniVersion"] = json!("1.1.0");
    bad["natMaxFlows"] = json!("lots");
    bad["cni.dev/valid-attachments"] = json!([]);
    w.node
        .cni("GC", &bad, "", "", None, &[])
        .unwrap()
        .ok_silent();
    assert_gone(&w.node);
}
