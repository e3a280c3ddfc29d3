//! Sluice first in a chain, as a runtime runs a conflist `[sluice, portmap,
//! bandwidth]` at cniVersion 1.0.0 (the newest the reference plugins speak):
//! ADD in order with each result as the next prevResult, CHECK each with the
//! final result, DEL in reverse order; the chained plugins find Sluice's
//! interfaces and act on them, and nothing is left.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use std::net::SocketAddr;

use serde_json::{json, Value};
use sluice_tests::{
    attached::assert_attached, exec, kernel, look, schema::check_add_result, traffic::tcp_echo_via,
    with_prev_result, Node, NETWORK,
};

const VERSION: &str = "1.0.0";
const CID: &str = "chain-a";
const HOST_PORT: u16 = 18080;
const CONTAINER_PORT: u16 = 8080;

/// The conflist's plugin configs as the runtime hands them to each plugin
/// (name and cniVersion from the list, runtimeConfig for declared capabilities).
fn plugins(node: &Node) -> Vec<(String, Value)> {
    let mut sluice = node.conf(VERSION, "10.83.0.0/24");
    // The reference bandwidth plugin adds an `ingress` qdisc for pod egress limits,
    // which cannot coexist with the clsact qdisc of Sluice's default cls_bpf
    // attachment; tcx attachment needs no qdisc (README, `podAttach`). Without
    // tcx (Linux < 6.6) Sluice falls back to clsact, and the chained plugin can
    // limit pod ingress only (a tbf root qdisc; no ifb): docs/kernels.md.
    sluice["podAttach"] = serde_json::json!("tcx");
    let limits = if kernel::tcx() {
        json!({
            "ingressRate": 100_000_000, "ingressBurst": 8_000_000,
            "egressRate": 100_000_000, "egressBurst": 8_000_000
        })
    } else {
        json!({"ingressRate": 100_000_000, "ingressBurst": 8_000_000})
    };
    let portmap = json!({
        "cniVersion": VERSION,
        "name": NETWORK,
        "type": "portmap",
        "capabilities": {"portMappings": true},
        "runtimeConfig": {"portMappings": [
            {"hostPort": HOST_PORT, "containerPort": CONTAINER_PORT, "protocol": "tcp"}
        ]},
    });
    let bandwidth = json!({
        "cniVersion": VERSION,
        "name": NETWORK,
        "type": "bandwidth",
        "capabilities": {"bandwidth": true},
        "runtimeConfig": {"bandwidth": limits},
    });
    vec![
        ("sluice".into(), sluice),
        ("portmap".into(), portmap),
        ("bandwidth".into(), bandwidth),
    ]
}

fn run(
    node: &Node,
    plugin: &str,
    cmd: &str,
    conf: &Value,
    pod: &sluice_tests::Pod,
) -> sluice_tests::CniOutput {
    if plugin == "sluice" {
        node.cni(cmd, conf, CID, "eth0", Some(pod), &[]).unwrap()
    } else {
        node.reference(plugin, cmd, conf, CID, "eth0", Some(pod))
            .unwrap()
    }
}

fn iptables_save(node: &Node) -> String {
    exec::tool(Some(&node.netns_path()), "iptables-save", &[]).unwrap()
}

fn ifb_devices(node: &Node) -> Vec<String> {
    look::links(node.name())
        .unwrap()
        .iter()
        .filter(|l| look::kind(l) == Some("ifb"))
        .filter_map(|l| l["ifname"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn sluice_portmap_bandwidth_chain() {
    let node = Node::new().unwrap();
    let pod = node.pod("a").unwrap();
    let chain = plugins(&node);

    // ADD in order, each getting the previous result.
    let mut prev: Option<Value> = None;
    for (plugin, conf) in &chain {
        let mut conf = conf.clone();
        if let Some(p) = &prev {
            conf["prevResult"] = p.clone();
        }
        let out = run(&node, plugin, "ADD", &conf, &pod);
        let r = out.result();
        assert_eq!(r["cniVersion"], VERSION, "{plugin}: {out}");
        prev = Some(r);
    }
    let Some(fin) = prev else {
        panic!("no result");
    };

    // The final result still carries Sluice's interfaces and addresses.
    let mut first = fin.clone();
    // bandwidth appends its ifb device; the rest is Sluice's.
    let ifs = fin["interfaces"].as_array().cloned().unwrap_or_default();
    assert!(ifs.len() >= 2, "{fin:#}");
    first["interfaces"] = json!(ifs[..2]);
    let added = check_add_result(&first, VERSION, "eth0", &pod);
    assert_attached(&node, &pod, "eth0", &added, None);

    // portmap and bandwidth acted on Sluice's attachment.
    let rules = iptables_save(&node);
    assert!(rules.contains(CID), "no portmap rule for {CID}:\n{rules}");
    assert!(rules.contains(&HOST_PORT.to_string()), "{rules}");
    let ifbs = ifb_devices(&node);
    if kernel::tcx() {
        assert_eq!(ifbs.len(), 1, "bandwidth made no ifb: {ifbs:?}");
        assert!(ifs.iter().any(|i| i["name"] == ifbs[0].as_str()), "{fin:#}");
    } else {
        assert!(
            ifbs.is_empty(),
            "an ifb for an ingress-only limit: {ifbs:?}"
        );
    }
    let qdiscs = exec::tool(
        None,
        "tc",
        &[
            "-n",
            node.name(),
            "-j",
            "qdisc",
            "show",
            "dev",
            &added.host_veth,
        ],
    )
    .unwrap();
    assert!(
        qdiscs.contains("tbf"),
        "no tbf on {}: {qdiscs}",
        added.host_veth
    );

    // A connection to the hostPort on the node reaches the pod: the DNAT of
    // portmap and Sluice's routes and datapath agree.
    let gw = added.gateway4().unwrap();
    tcp_echo_via(
        &pod.path,
        SocketAddr::new(added.ip(), CONTAINER_PORT),
        &node.netns_path(),
        SocketAddr::new(gw, HOST_PORT),
        64 << 10,
    )
    .unwrap();

    // CHECK each plugin against the final result.
    for (plugin, conf) in &chain {
        let conf = with_prev_result(conf, &fin);
        let out = run(&node, plugin, "CHECK", &conf, &pod);
        if plugin == "portmap" && !out.success() {
            // portmap 1.1.1 (Debian) looks for IPv6 rules it never made for an
            // IPv4-only pod, whatever the main plugin (also after ptp):
            // containernetworking/plugins#819. Only that failure is tolerated.
            out.any_error().assert_names(&["could not check ipv6 dnat"]);
            continue;
        }
        out.ok_silent();
    }

    // DEL in reverse order.
    for (plugin, conf) in chain.iter().rev() {
        let conf = with_prev_result(conf, &fin);
        run(&node, plugin, "DEL", &conf, &pod).ok_silent();
    }
    node.assert_clean(NETWORK);
    assert!(ifb_devices(&node).is_empty());
    let rules = iptables_save(&node);
    assert!(!rules.contains(CID), "portmap rules left:\n{rules}");
    assert!(look::link(&pod.name, "eth0").unwrap().is_none());
}
