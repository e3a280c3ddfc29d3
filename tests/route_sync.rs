//! `sluice-node route-sync` (issue 19) on two dual-stack nodes joined by a wire, each
//! watching the Nodes of an API server (the stand-in of `harness/apiserver.rs`:
//! no kube-apiserver can be had from the registries here) through kube-rs, as
//! in a cluster. Masquerade is on and no node has a static `nodes` list, so a
//! pod reaches the other node's pods only through what the agents make:
//! `podCIDR via InternalIP` routes (proto 83) and the other node's range in the
//! datapath's non-masquerade prefixes (the server sees the client pod's own
//! address). Then Nodes come, change address and go, and the routes and
//! prefixes follow; an ADD keeps the agent's prefixes; an operator's route of
//! another proto is never touched; SIGTERM ends the agent and leaves the routes.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use std::{fs, net::IpAddr, path::Path, time::Duration};

use nix::{sys::signal::Signal, unistd::Pid};
use serde_json::{json, Value};
use sluice_tests::{
    apiserver::ApiServer,
    exec,
    fixtures::{add, del, ipv6},
    host::wire,
    leaks::map_entries,
    look,
    masq::wait_for,
    traffic::tcp_echo,
    Node,
};

const WIRE: &str = "w0";
const A_CIDR: &str = "10.93.1.0/24";
const B_CIDR: &str = "10.93.2.0/24";
const C_CIDR: &str = "10.93.3.0/24";
const A_IP: &str = "192.168.61.1";
const B_IP: &str = "192.168.61.2";
const A_CIDR6: &str = "fd93:1::/64";
const B_CIDR6: &str = "fd93:2::/64";
const A_IP6: &str = "fd61::1";
const B_IP6: &str = "fd61::2";
/// Longest the agents get to follow a change.
const FOLLOW: Duration = Duration::from_secs(20);

/// The agent's IPv4 routes in `node`: (dst, gateway).
fn agent_routes(node: &Node) -> Vec<(String, String)> {
    agent_routes_of(node, "-4")
}

/// The agent's routes of one family (`-4`, `-6`) in `node`: (dst, gateway).
fn agent_routes_of(node: &Node, family: &str) -> Vec<(String, String)> {
    look::ip_json(node.name(), &[family, "route", "show", "proto", "83"])
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["dst"].as_str().unwrap_or_default().to_string(),
                r["gateway"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn hex_bytes(v: &Value) -> Vec<u8> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|b| u8::from_str_radix(b.as_str()?.trim_start_matches("0x"), 16).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The non-masquerade prefixes of `node`'s datapath, both families:
/// (prefix, owner bits).
fn non_masq(node: &Node) -> Vec<(String, u8)> {
    let mut out = Vec::new();
    for map in ["sl_nonmasq", "sl_nonmasq6"] {
        for e in map_entries(node, map).unwrap() {
            let (k, v) = (hex_bytes(&e["key"]), hex_bytes(&e["value"]));
            let len = u32::from_le_bytes(k[0..4].try_into().unwrap());
            let ip = match k.len() {
                8 => IpAddr::from(<[u8; 4]>::try_from(&k[4..8]).unwrap()),
                _ => IpAddr::from(<[u8; 16]>::try_from(&k[4..20]).unwrap()),
            };
            out.push((format!("{ip}/{len}"), v[0]));
        }
    }
    out
}

fn owner_of(node: &Node, prefix: &str) -> Option<u8> {
    non_masq(node)
        .into_iter()
        .find(|(p, _)| p == prefix)
        .map(|(_, o)| o)
}

/// Starts `sluice-node route-sync` for `name` in `node`, reaching the API at
/// `host`; its log goes to `<node dir>/agent.log` (see [`follow`]).
fn agent(node: &Node, api: &ApiServer, host: &str, name: &str) -> exec::Running {
    let kubeconfig = node.dir().join("kubeconfig");
    fs::write(&kubeconfig, api.kubeconfig(host)).unwrap();
    let bin = sluice_tests::sluice_node_bin().unwrap();
    exec::spawn(
        Some(&node.netns_path()),
        Path::new("/bin/sh"),
        &[
            "-c",
            "exec \"$0\" \"$@\" 2>>\"$AGENT_LOG\"",
            &bin.display().to_string(),
            "route-sync",
            "--node-name",
            name,
            "--pin-root",
            &node.pin_root().display().to_string(),
            "--resync-secs",
            "2",
        ],
        &[
            ("KUBECONFIG".to_string(), kubeconfig.display().to_string()),
            (
                "AGENT_LOG".to_string(),
                node.dir().join("agent.log").display().to_string(),
            ),
        ],
        b"",
    )
    .unwrap()
}

/// Waits for `cond`; on failure shows both agents' logs.
#[track_caller]
fn follow(what: &str, nodes: [&Node; 2], cond: impl FnMut() -> bool) {
    if !wait_for(FOLLOW, cond) {
        let logs: Vec<String> = nodes
            .iter()
            .map(|n| fs::read_to_string(n.dir().join("agent.log")).unwrap_or_default())
            .collect();
        panic!(
            "no {what} within {FOLLOW:?}; agent logs:\n{}",
            logs.join("\n---\n")
        );
    }
}

#[test]
fn routes_and_non_masquerade_ranges_follow_the_nodes() {
    let a = Node::new().unwrap();
    let b = Node::new().unwrap();
    wire(
        a.name(),
        WIRE,
        &format!("{A_IP}/24"),
        b.name(),
        WIRE,
        &format!("{B_IP}/24"),
    )
    .unwrap();
    for (n, ip) in [(&a, A_IP6), (&b, B_IP6)] {
        let addr = format!("{ip}/64");
        sluice_testbed::netns::ip(n.name(), &["addr", "add", &addr, "dev", WIRE, "nodad"]).unwrap();
    }
    let conf = |n: &Node, cidr: &str, cidr6: &str| {
        let mut c = n.conf("1.0.0", cidr);
        c["ipam"] = json!({
            "type": "sluice",
            "ranges": [[{"subnet": cidr}], [{"subnet": cidr6}]],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
            "dataDir": n.ipam_dir(),
        });
        c["uplink"] = json!(WIRE);
        c["ipMasq"] = json!(true);
        c
    };
    let (conf_a, conf_b) = (conf(&a, A_CIDR, A_CIDR6), conf(&b, B_CIDR, B_CIDR6));
    let (pa, pb) = (a.pod("a").unwrap(), b.pod("b").unwrap());
    let added_a = add(&a, &conf_a, "rs-a", &pa);
    let added_b = add(&b, &conf_b, "rs-b", &pb);
    assert_eq!(owner_of(&a, B_CIDR), None, "{:?}", non_masq(&a));

    // The API server listens in a's namespace; b's agent reaches it over the wire.
    let api = ApiServer::start(&a.netns_path(), "0.0.0.0:0").unwrap();
    api.set_node("node-a", &[A_CIDR, A_CIDR6], &[A_IP, A_IP6]);
    api.set_node("node-b", &[B_CIDR, B_CIDR6], &[B_IP, B_IP6]);
    let agent_a = agent(&a, &api, "127.0.0.1", "node-a");
    let agent_b = agent(&b, &api, A_IP, "node-b");
    let log = [&a, &b];

    follow(
        "routes to the other node's pods, both families",
        log,
        || {
            agent_routes(&a) == [(B_CIDR.into(), B_IP.into())]
                && agent_routes(&b) == [(A_CIDR.into(), A_IP.into())]
                && agent_routes_of(&a, "-6") == [(B_CIDR6.into(), B_IP6.into())]
                && agent_routes_of(&b, "-6") == [(A_CIDR6.into(), A_IP6.into())]
        },
    );
    follow(
        "the other node's ranges in the non-masquerade prefixes",
        log,
        || {
            [(&a, B_CIDR), (&a, B_CIDR6), (&b, A_CIDR), (&b, A_CIDR6)]
                .iter()
                .all(|(n, c)| owner_of(n, c) == Some(2))
        },
    );
    // The config's own prefixes are the config's (bit 1), not the agent's.
    assert_eq!(owner_of(&a, A_CIDR), Some(1), "{:?}", non_masq(&a));
    assert_eq!(owner_of(&a, A_CIDR6), Some(1), "{:?}", non_masq(&a));

    // Pod to pod across the nodes, not masqueraded: the server sees the pod.
    let seen = tcp_echo(&pb, added_b.ip(), &pa, 64 << 10).unwrap();
    assert_eq!(
        seen.ip(),
        added_a.ip(),
        "pod a's traffic to pod b was translated"
    );
    let (a6, b6) = (ipv6(&added_a), ipv6(&added_b));
    let seen = tcp_echo(&pb, b6, &pa, 64 << 10).unwrap();
    assert_eq!(
        seen.ip(),
        a6,
        "pod a's IPv6 traffic to pod b was translated"
    );

    // An ADD rewrites the config's prefixes and keeps the agent's.
    let pa2 = a.pod("a2").unwrap();
    add(&a, &conf_a, "rs-a2", &pa2);
    assert_eq!(owner_of(&a, B_CIDR), Some(2), "{:?}", non_masq(&a));

    // An operator's route of another proto stays whatever the agent does.
    sluice_testbed::netns::ip(
        a.name(),
        &["route", "add", "10.93.9.0/24", "via", "192.168.61.9"],
    )
    .unwrap();

    // A node joins, moves, leaves.
    api.set_node("node-c", &[C_CIDR], &["192.168.61.3"]);
    follow("a route to a new node", log, || {
        agent_routes(&a).contains(&(C_CIDR.into(), "192.168.61.3".into()))
            && owner_of(&a, C_CIDR) == Some(2)
    });
    api.set_node("node-c", &[C_CIDR], &["192.168.61.4"]);
    follow("the route moving with the node's address", log, || {
        agent_routes(&a).contains(&(C_CIDR.into(), "192.168.61.4".into()))
            && !agent_routes(&a).contains(&(C_CIDR.into(), "192.168.61.3".into()))
    });
    api.delete_node("node-c");
    follow("the route and prefix of a deleted node gone", log, || {
        !agent_routes(&a).iter().any(|(d, _)| d == C_CIDR)
            && !agent_routes(&b).iter().any(|(d, _)| d == C_CIDR)
            && owner_of(&a, C_CIDR).is_none()
    });
    let routes = look::routes4(a.name()).unwrap();
    assert!(look::route(&routes, "10.93.9.0/24").is_some(), "{routes:?}");

    // It watched (not polled), on both nodes.
    let watches = api
        .requests()
        .iter()
        .filter(|r| r.contains("watch=true"))
        .count();
    assert!(watches >= 2, "{:?}", api.requests());

    // SIGTERM: a clean exit, and the routes stay for the pods.
    for (agent, node) in [(agent_a, &a), (agent_b, &b)] {
        let pid = Pid::from_raw(i32::try_from(agent.pid().unwrap()).unwrap());
        nix::sys::signal::kill(pid, Signal::SIGTERM).unwrap();
        let out = agent.wait(Duration::from_secs(10)).unwrap();
        assert!(out.success(), "{out}");
        let log = fs::read_to_string(node.dir().join("agent.log")).unwrap();
        assert!(log.contains("route added"), "{log}");
        assert_eq!(agent_routes(node).len(), 1, "{log}");
        assert_eq!(agent_routes_of(node, "-6").len(), 1, "{log}");
    }
    let seen = tcp_echo(&pa, added_a.ip(), &pb, 64 << 10).unwrap();
    assert_eq!(seen.ip(), added_b.ip());

    del(&a, &conf_a, "rs-a", &pa);
    del(&a, &conf_a, "rs-a2", &pa2);
    del(&b, &conf_b, "rs-b", &pb);
}
