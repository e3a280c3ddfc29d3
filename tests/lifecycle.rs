//! ADD -> CHECK -> DEL at every supported cniVersion with the built-in IPAM:
//! the result's schema and version-specific shape, everything ADD must make (pod
//! and node addressing, the pinned tcx attachment surviving the plugin), CHECK
//! where the version has it (code 1 where not), and nothing left after DEL.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use serde_json::json;
use sluice_tests::{
    attached::{assert_attached, assert_detached},
    exec, look, raw,
    schema::check_add_result,
    with_prev_result, Node, NETWORK,
};

const MTU: u64 = 1450;

fn has_check(version: &str) -> bool {
    !version.starts_with("0.3.")
}

fn lifecycle(version: &str) {
    lifecycle_with(version, None);
}

/// `pod_attach`: `podAttach` to set (the default, `cls_bpf`, when `None`).
fn lifecycle_with(version: &str, pod_attach: Option<&str>) {
    let node = Node::new().unwrap();
    let pod = node.pod("a").unwrap();
    let mut conf = node.conf(version, "10.77.0.0/24");
    conf["mtu"] = json!(MTU);
    if let Some(a) = pod_attach {
        conf["podAttach"] = json!(a);
    }
    let cid = format!("life-{version}");

    let out = node
        .cni("ADD", &conf, &cid, "eth0", Some(&pod), &[])
        .unwrap();
    let added = check_add_result(&out.result(), version, "eth0", &pod);
    // host-local's order: the first address of the subnet that is not the gateway.
    assert_eq!(added.ips, vec![("10.77.0.2".parse().unwrap(), 24)], "{out}");
    assert_eq!(
        added.gateways,
        vec!["10.77.0.1".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(
        added.result["routes"],
        json!([{"dst": "0.0.0.0/0"}]),
        "{out}"
    );
    if version == "1.1.0" {
        for i in 0..2 {
            assert_eq!(added.result["interfaces"][i]["mtu"], MTU, "{out}");
        }
    }
    assert_attached(&node, &pod, "eth0", &added, Some(MTU));
    assert_eq!(
        node.records(NETWORK).unwrap(),
        vec![format!("{cid}.eth0.json")]
    );
    assert_eq!(node.reservations(NETWORK).unwrap(), vec![added.ip()]);
    let owner = node.reservation_owner(NETWORK, added.ip()).unwrap();
    assert!(owner.starts_with(&cid), "reservation owner {owner:?}");

    let with_prev = with_prev_result(&conf, &added.result);
    let out = node
        .cni("CHECK", &with_prev, &cid, "eth0", Some(&pod), &[])
        .unwrap();
    if has_check(version) {
        out.ok_silent();
    } else {
        let e = out.error(1);
        e.assert_names(&[version, "CHECK"]);
        assert_eq!(e.cni_version.as_deref(), Some(version));
    }
    if version != "1.1.0" {
        for cmd in ["GC", "STATUS"] {
            let e = node.cni(cmd, &conf, "", "", None, &[]).unwrap().error(1);
            e.assert_names(&[version, cmd]);
        }
    }
    // The failed or successful CHECK changed nothing.
    assert_attached(&node, &pod, "eth0", &added, Some(MTU));

    // Runtimes pass the cached result to DEL from 0.4.0 on.
    let del_conf = if has_check(version) {
        &with_prev
    } else {
        &conf
    };
    node.cni("DEL", del_conf, &cid, "eth0", Some(&pod), &[])
        .unwrap()
        .ok_silent();
    assert_detached(&node, &cid, "eth0", Some(&pod), &added);
    node.assert_clean(NETWORK);
    // The pod namespace is as it was: only lo.
    assert_eq!(look::link_names(&pod.name).unwrap(), vec!["lo"]);
}

#[test]
fn lifecycle_0_3_0() {
    lifecycle("0.3.0");
}

#[test]
fn lifecycle_0_3_1() {
    lifecycle("0.3.1");
}

#[test]
fn lifecycle_0_4_0() {
    lifecycle("0.4.0");
}

#[test]
fn lifecycle_1_0_0() {
    lifecycle("1.0.0");
}

#[test]
fn lifecycle_1_1_0() {
    lifecycle("1.1.0");
}

/// The same with pinned tcx links instead of `cls_bpf` filters.
#[test]
fn lifecycle_1_1_0_tcx() {
    lifecycle_with("1.1.0", Some("tcx"));
}

/// CHECK compares the pod with prevResult and Sluice's own state, and says what
/// differs (code 105).
#[test]
fn check_reports_what_changed() {
    let node = Node::new().unwrap();
    let pod = node.pod("a").unwrap();
    let conf = node.conf("1.0.0", "10.77.0.0/24");
    let out = node
        .cni("ADD", &conf, "life-chk", "eth0", Some(&pod), &[])
        .unwrap();
    let added = check_add_result(&out.result(), "1.0.0", "eth0", &pod);
    let with_prev = with_prev_result(&conf, &added.result);

    // The pod's programs taken off behind the plugin's back: its clsact qdisc,
    // which joins its veth to the node's pod filter blocks, deleted (a filter
    // of a shared block cannot be deleted for one veth: the kernel refuses
    // filter changes through a device on a shared block). CHECK names the
    // first missing program.
    let blocks = sluice_tests::exec::tool(
        Some(&node.netns_path()),
        "tc",
        &["qdisc", "show", "dev", &added.host_veth],
    )
    .unwrap();
    assert!(
        blocks.contains("ingress_block") && blocks.contains("egress_block"),
        "the host veth's clsact must join the shared pod blocks: {blocks}"
    );
    sluice_tests::exec::tool(
        Some(&node.netns_path()),
        "tc",
        &["qdisc", "del", "dev", &added.host_veth, "clsact"],
    )
    .unwrap();
    let e = node
        .cni("CHECK", &with_prev, "life-chk", "eth0", Some(&pod), &[])
        .unwrap()
        .error(105);
    e.assert_names(&["from_pod"]);

    // The pod's address removed behind the plugin's back.
    let addr = format!("{}/24", added.ip());
    sluice_tests::exec::tool(
        None,
        "ip",
        &["-n", &pod.name, "addr", "del", &addr, "dev", "eth0"],
    )
    .unwrap();
    let e = node
        .cni("CHECK", &with_prev, "life-chk", "eth0", Some(&pod), &[])
        .unwrap()
        .error(105);
    e.assert_names(&[&addr]);

    // The pod interface gone (with it, its host veth peer).
    sluice_tests::exec::tool(None, "ip", &["-n", &pod.name, "link", "del", "eth0"]).unwrap();
    let e = node
        .cni("CHECK", &with_prev, "life-chk", "eth0", Some(&pod), &[])
        .unwrap()
        .error(105);
    e.assert_names(&["eth0"]);

    // DEL still cleans up what is left: pins, record, reservation.
    node.cni("DEL", &with_prev, "life-chk", "eth0", Some(&pod), &[])
        .unwrap()
        .ok_silent();
    assert_detached(&node, "life-chk", "eth0", Some(&pod), &added);
    node.assert_clean(NETWORK);
}

/// Dual-stack: an IPv4 and an IPv6 range give the pod one address of each, with
/// the IPv6 side made like the IPv4 one.
#[test]
fn lifecycle_dual_stack() {
    let node = Node::new().unwrap();
    let pod = node.pod("a").unwrap();
    let mut conf = node.conf("1.1.0", "unused");
    conf["ipam"] = json!({
        "type": "sluice",
        "ranges": [[{"subnet": "10.77.0.0/24"}], [{"subnet": "fd00:77::/64"}]],
        "dataDir": node.ipam_dir(),
    });
    let out = node
        .cni("ADD", &conf, "life-ds", "eth0", Some(&pod), &[])
        .unwrap();
    let added = check_add_result(&out.result(), "1.1.0", "eth0", &pod);
    let mut ips: Vec<String> = added
        .ips
        .iter()
        .map(|(ip, p)| format!("{ip}/{p}"))
        .collect();
    ips.sort();
    assert_eq!(ips, vec!["10.77.0.2/24", "fd00:77::2/64"], "{out}");
    assert_attached(&node, &pod, "eth0", &added, None);

    // IPv6: address in the pod, gateway route and neighbour, /128 route and
    // neighbour on the node, forwarding on.
    let v6 = look::ip_json(&pod.name, &["-6", "route", "show"]).unwrap();
    let gw6 = added
        .gateways
        .iter()
        .find(|g| g.is_ipv6())
        .map_or_else(|| "fe80::1".to_string(), ToString::to_string);
    assert!(
        look::route(&v6, &gw6).is_some(),
        "no route to {gw6}: {v6:?}"
    );
    assert!(
        look::route(&v6, "fd00:77::/64").is_some_and(|r| r["gateway"] == gw6.as_str()),
        "no subnet route via {gw6}: {v6:?}"
    );
    let neigh = look::neighbours(&pod.name, "eth0").unwrap();
    assert!(
        look::is_permanent_neighbour(&neigh, &gw6, &added.host_mac),
        "{neigh:?}"
    );
    let node_v6 = look::ip_json(node.name(), &["-6", "route", "show"]).unwrap();
    assert!(
        look::route(&node_v6, "fd00:77::2").is_some_and(|r| r["dev"] == added.host_veth.as_str()),
        "no /128 route on the node: {node_v6:?}"
    );
    let node_neigh = look::neighbours(node.name(), &added.host_veth).unwrap();
    assert!(
        look::is_permanent_neighbour(&node_neigh, "fd00:77::2", &added.pod_mac),
        "{node_neigh:?}"
    );
    assert_eq!(
        look::sysctl(&node.netns_path(), "net/ipv6/conf/all/forwarding").unwrap(),
        "1"
    );
    let mut reserved = node.reservations(NETWORK).unwrap();
    reserved.sort();
    assert_eq!(reserved.len(), 2);

    let with_prev = with_prev_result(&conf, &added.result);
    node.cni("CHECK", &with_prev, "life-ds", "eth0", Some(&pod), &[])
        .unwrap()
        .ok_silent();
    node.cni("DEL", &with_prev, "life-ds", "eth0", Some(&pod), &[])
        .unwrap()
        .ok_silent();
    assert_detached(&node, "life-ds", "eth0", Some(&pod), &added);
    node.assert_clean(NETWORK);
}

/// The host veth gets no automatic IPv6 link-local address (each would add a
/// DAD run, an MLD join and an `fe80::/64` route beside every other veth's in
/// the node namespace); a pod whose IPv6 gateway is the default link-local
/// `fe80::1` still reaches it from its own link-local address, through the
/// gateway's `fe80::1/64`, and the node answers it. The pod's link-scope
/// multicast stops at the host veth, except neighbour discovery.
#[test]
fn host_veths_have_no_link_local_and_pod_link_local_traffic_is_sorted() {
    let node = Node::new().unwrap();
    let v4 = node.pod("a").unwrap();
    let v6 = node.pod("b").unwrap();
    let conf = node.conf("1.0.0", "10.77.0.0/24");
    let added4 = sluice_tests::fixtures::add(&node, &conf, "life-ll4", &v4);
    let host4 = look::addrs(node.name(), &added4.host_veth).unwrap();
    assert!(
        host4.is_empty(),
        "an IPv4 pod's host veth must hold no address: {host4:?}"
    );

    // Static IPAM gives no gateway: the pod's is fe80::1.
    let mut conf6 = conf.clone();
    conf6["ipam"] = json!({"type": "static", "addresses": [{"address": "fd00:78::2/64"}]});
    let added6 = sluice_tests::fixtures::add(&node, &conf6, "life-ll6", &v6);
    let host6 = look::addrs(node.name(), &added6.host_veth).unwrap();
    assert_eq!(host6, vec!["fe80::1/64".to_string()], "host veth addresses");

    // Once the pod's own link-local address has passed DAD, a connection
    // from it (the source a link-local destination picks) to fe80::1 is
    // answered by the node.
    let pod_ll = (0..50)
        .find_map(|_| {
            let a = look::ip_json(&v6.name, &["-6", "addr", "show", "dev", "eth0"]).unwrap();
            let ll = a
                .iter()
                .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
                .find(|i| {
                    i["scope"] == "link" && i["tentative"].is_null() && i["dadfailed"].is_null()
                })
                .and_then(|i| i["local"].as_str().map(str::to_string));
            if ll.is_none() {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            ll
        })
        .expect("the pod's link-local address never left DAD");
    let index = |ns: &str, dev: &str| {
        look::link(ns, dev)
            .unwrap()
            .and_then(|l| l["ifindex"].as_u64())
            .and_then(|i| u32::try_from(i).ok())
            .unwrap_or_else(|| panic!("no {dev} in {ns}"))
    };
    let gw: std::net::Ipv6Addr = "fe80::1".parse().unwrap();
    let bind = std::net::SocketAddrV6::new(gw, 0, 0, index(node.name(), &added6.host_veth));
    let connect = std::net::SocketAddrV6::new(gw, 0, 0, index(&v6.name, "eth0"));
    // A connection from the pod to the node's fe80::1: the address the node
    // saw it come from.
    let to_gateway = || {
        sluice_tests::traffic::tcp_echo_via(
            &node.netns_path(),
            bind.into(),
            &v6.path,
            connect.into(),
            4 << 10,
        )
        .unwrap()
    };
    let seen = to_gateway();
    assert_eq!(
        seen.ip().to_string(),
        pod_ll,
        "the pod must have spoken from its link-local address"
    );

    // Link-scope multicast from the pod's link-local address is consumed at
    // the host veth (`from_pod_link_multicast`): a datagram to ff02::1 (all
    // nodes, which every IPv6 device of the node has joined) never reaches a
    // node socket.
    let port: u16 = 4790;
    let before = node.counters().unwrap().get("from_pod_link_multicast");
    let rx = raw::UdpReceiver::start(
        &node.netns_path(),
        format!("[::]:{port}").parse().unwrap(),
        1,
        std::time::Duration::from_secs(2),
    )
    .unwrap();
    let all_nodes =
        std::net::SocketAddrV6::new("ff02::1".parse().unwrap(), port, 0, index(&v6.name, "eth0"));
    for _ in 0..3 {
        raw::udp_send(
            &v6.path,
            "[::]:0".parse().unwrap(),
            all_nodes.into(),
            b"all nodes",
        )
        .unwrap();
    }
    let got = rx.finish().unwrap();
    assert!(
        got.is_empty(),
        "the node received the pod's multicast: {got:?}"
    );
    let consumed = node.counters().unwrap().get("from_pod_link_multicast") - before;
    assert!(consumed >= 3, "3 datagrams sent, {consumed} consumed");

    // A neighbour solicitation from the pod's link-local address still
    // reaches the node: without its permanent entry for the gateway, the pod
    // resolves fe80::1 again (to its solicited-node multicast address).
    exec::tool(
        None,
        "ip",
        &[
            "-n", &v6.name, "-6", "neigh", "del", "fe80::1", "dev", "eth0",
        ],
    )
    .unwrap();
    to_gateway();
    let neigh = look::neighbours(&v6.name, "eth0").unwrap();
    let gw_entry = neigh.iter().find(|n| n["dst"] == "fe80::1");
    assert!(
        gw_entry.is_some_and(|n| n["lladdr"].is_string()),
        "the pod did not resolve fe80::1: {neigh:?}"
    );

    for (id, pod, c) in [("life-ll4", &v4, &conf), ("life-ll6", &v6, &conf6)] {
        sluice_tests::fixtures::del(&node, c, id, pod);
    }
    node.assert_clean(NETWORK);
}

/// The addresses and MAC a runtime asks for: `CNI_ARGS` `IP=` and `MAC=`, and the
/// `mac` and `ips` capabilities in runtimeConfig.
#[test]
fn requested_ip_and_mac_are_used() {
    let node = Node::new().unwrap();
    let conf = node.conf("1.0.0", "10.77.0.0/24");
    let a = node.pod("a").unwrap();
    let args = [("CNI_ARGS", "IP=10.77.0.40;MAC=02:00:00:00:00:40")];
    let out = node
        .cni("ADD", &conf, "life-req-a", "eth0", Some(&a), &args)
        .unwrap();
    let added_a = check_add_result(&out.result(), "1.0.0", "eth0", &a);
    assert_eq!(added_a.ip().to_string(), "10.77.0.40");
    assert_eq!(added_a.pod_mac, "02:00:00:00:00:40");
    assert_attached(&node, &a, "eth0", &added_a, None);

    let b = node.pod("b").unwrap();
    let mut conf_b = conf.clone();
    conf_b["runtimeConfig"] = json!({"mac": "02:00:00:00:00:41", "ips": ["10.77.0.41/24"]});
    let out = node
        .cni("ADD", &conf_b, "life-req-b", "eth0", Some(&b), &[])
        .unwrap();
    let added_b = check_add_result(&out.result(), "1.0.0", "eth0", &b);
    assert_eq!(added_b.ip().to_string(), "10.77.0.41");
    assert_eq!(added_b.pod_mac, "02:00:00:00:00:41");
    assert_attached(&node, &b, "eth0", &added_b, None);

    // A requested address that is taken: code 103, nothing made.
    let c = node.pod("c").unwrap();
    let args = [("CNI_ARGS", "IP=10.77.0.40")];
    let e = node
        .cni("ADD", &conf, "life-req-c", "eth0", Some(&c), &args)
        .unwrap()
        .error(103);
    e.assert_names(&["10.77.0.40"]);
    assert!(look::link(&c.name, "eth0").unwrap().is_none());
    assert_eq!(node.host_veths().unwrap().len(), 2);

    for (cid, pod) in [("life-req-a", &a), ("life-req-b", &b)] {
        node.cni("DEL", &conf, cid, "eth0", Some(pod), &[])
            .unwrap()
            .ok_silent();
    }
    node.assert_clean(NETWORK);
}
