//! The state an ADD must leave behind, and the absence of it after DEL.
use std::net::IpAddr;

use serde_json::Value;

use crate::{
    look::{self, TcxLink},
    node::{Node, Pod},
    schema::Added,
};

/// `ip` prints a /32 (/128) route destination as the bare address and 0/0 as
/// `default`.
fn ip_route_dst(dst: &str) -> String {
    match dst {
        "0.0.0.0/0" | "::/0" => "default".into(),
        d => d
            .strip_suffix("/32")
            .or_else(|| d.strip_suffix("/128"))
            .unwrap_or(d)
            .to_string(),
    }
}

fn network_of(ip: IpAddr, prefix: u8) -> String {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            format!("{}/{prefix}", std::net::Ipv4Addr::from(bits & mask))
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            format!("{}/{prefix}", std::net::Ipv6Addr::from(bits & mask))
        }
    }
}

#[track_caller]
fn must<T>(r: crate::Result<T>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

/// The programs attached to `host_veth`, read from the kernel: (`from_pod` id,
/// `to_pod` id). Pinned netkit links on a netkit pod (`from_netkit_pod` and
/// `to_netkit_pod` in their place; hook and device checked), pinned tcx links
/// (`podAttach: tcx`; their interface and direction are checked against
/// `host_ifindex`) or `cls_bpf` filters on the clsact hooks (`podAttach: tc`,
/// the default).
#[track_caller]
pub fn pod_programs(node: &Node, host_veth: &str, host_ifindex: u64) -> (u64, u64) {
    let links = node.pin_root().join("links");
    let netkit_pin = links.join(format!("{host_veth}-from_netkit_pod"));
    if netkit_pin.exists() {
        // The peer hook's link is on the peer (the pod's device, whose index
        // the host device reports as its link).
        let peer_index = must(look::link(node.name(), host_veth))
            .and_then(|l| l["link_index"].as_u64())
            .unwrap_or_else(|| panic!("{host_veth} has no peer index"));
        let mut ids = [0u64; 2];
        for (i, (pin, peer, name)) in [
            (netkit_pin, true, "from_netkit_pod"),
            (
                links.join(format!("{host_veth}-to_netkit_pod")),
                false,
                "to_netkit_pod",
            ),
        ]
        .into_iter()
        .enumerate()
        {
            let (_, prog, ifindex, on_peer) = must(look::netkit_link(&pin));
            let want = if peer { peer_index } else { host_ifindex };
            assert_eq!(u64::from(ifindex), want, "{name} netkit link ifindex");
            assert_eq!(on_peer, peer, "{name} netkit link hook (peer?)");
            ids[i] = u64::from(prog);
        }
        return (ids[0], ids[1]);
    }
    let tcx_pin = node
        .pin_root()
        .join("links")
        .join(format!("{host_veth}-from_pod"));
    if tcx_pin.exists() {
        let (from_pod, to_pod) = tcx_links(node, host_veth);
        let listed: Vec<u64> = must(look::bpf_links())
            .iter()
            .filter_map(|l| l["id"].as_u64())
            .collect();
        for (link, ingress, name) in [(&from_pod, true, "from_pod"), (&to_pod, false, "to_pod")] {
            assert_eq!(u64::from(link.ifindex), host_ifindex, "{name} link ifindex");
            assert_eq!(link.ingress, ingress, "{name} link direction");
            assert!(
                listed.contains(&u64::from(link.id)),
                "bpftool link show does not list {name} link {}",
                link.id
            );
        }
        return (u64::from(from_pod.prog_id), u64::from(to_pod.prog_id));
    }
    let one = |ingress: bool, name: &str| -> u64 {
        let filters = must(look::tc_bpf_filters(&node.netns_path(), host_veth, ingress));
        match filters.as_slice() {
            [(n, id)] if n == name => *id,
            other => panic!("{host_veth}: expected one {name} filter, found {other:?}"),
        }
    };
    (one(true, "from_pod"), one(false, "to_pod"))
}

/// The tcx links pinned for `host_veth`: (`from_pod`, `to_pod`).
#[track_caller]
pub fn tcx_links(node: &Node, host_veth: &str) -> (TcxLink, TcxLink) {
    let pin = |p: &str| {
        node.pin_root()
            .join("links")
            .join(format!("{host_veth}-{p}"))
    };
    (
        must(look::tcx_link(&pin("from_pod"))),
        must(look::tcx_link(&pin("to_pod"))),
    )
}

/// Asserts what an ADD of `ifname` in `pod` (described by its result `a`) made:
/// - pod: a veth `ifname`, up, with the result's MAC and (when given) `mtu`, the
///   addresses, a `gw/32 scope link` route, the subnet and IPAM routes via the
///   gateway, a permanent neighbour gateway -> host veth MAC;
/// - node: the host veth, up, the pod interface's peer, with the gateway address,
///   a /32 route and a permanent neighbour per pod address, `ip_forward` = 1;
/// - datapath: maps and programs pinned; the pinned `from_pod`/`to_pod` programs
///   attached to the host veth (ingress, egress) after the plugin exited, as
///   `cls_bpf` filters or pinned tcx links (see [`pod_programs`]); `sluicectl
///   endpoints` lists every address.
#[track_caller]
pub fn assert_attached(node: &Node, pod: &Pod, ifname: &str, a: &Added, mtu: Option<u64>) {
    let ctx = |what: &str| format!("{what} (pod {}, result {:#})", pod.name, a.result);

    // Pod side.
    let Some(pod_link) = must(look::link(&pod.name, ifname)) else {
        panic!("{}", ctx(&format!("{ifname} missing from the pod")));
    };
    assert_eq!(
        look::kind(&pod_link),
        Some("veth"),
        "{}",
        ctx("pod link kind")
    );
    assert!(look::is_up(&pod_link), "{}", ctx("pod link down"));
    assert_eq!(pod_link["address"], a.pod_mac, "{}", ctx("pod MAC"));
    if let Some(m) = mtu {
        assert_eq!(pod_link["mtu"], m, "{}", ctx("pod MTU"));
    }
    let pod_addrs = must(look::addrs(&pod.name, ifname));
    for (ip, prefix) in &a.ips {
        let want = format!("{ip}/{prefix}");
        assert!(
            pod_addrs.contains(&want),
            "{}",
            ctx(&format!("{want} not in {pod_addrs:?}"))
        );
    }
    let routes = must(look::routes4(&pod.name));
    // IPv4 is looked at in detail; without an IPAM gateway Sluice uses 169.254.1.1.
    let gw = a
        .gateway4()
        .map_or_else(|| "169.254.1.1".to_string(), |g| g.to_string());
    let Some(gw_route) = look::route(&routes, &gw) else {
        panic!(
            "{}",
            ctx(&format!("no {gw}/32 route in the pod: {routes:?}"))
        );
    };
    assert_eq!(gw_route["dev"], ifname, "{}", ctx("gateway route device"));
    assert_eq!(gw_route["scope"], "link", "{}", ctx("gateway route scope"));
    for (ip, prefix) in a.ips.iter().filter(|(ip, _)| ip.is_ipv4()) {
        let subnet = network_of(*ip, *prefix);
        let Some(r) = look::route(&routes, &ip_route_dst(&subnet)) else {
            panic!("{}", ctx(&format!("no subnet route {subnet}: {routes:?}")));
        };
        assert_eq!(r["gateway"], gw.as_str(), "{}", ctx("subnet route gateway"));
    }
    for r in a.result["routes"].as_array().cloned().unwrap_or_default() {
        let dst = r["dst"].as_str().unwrap_or_default();
        if dst.contains(':') {
            continue;
        }
        let Some(have) = look::route(&routes, &ip_route_dst(dst)) else {
            panic!("{}", ctx(&format!("IPAM route {dst} missing: {routes:?}")));
        };
        let via = r["gw"].as_str().unwrap_or(&gw).to_string();
        assert_eq!(
            have["gateway"],
            via.as_str(),
            "{}",
            ctx("IPAM route gateway")
        );
        assert_eq!(have["dev"], ifname, "{}", ctx("IPAM route device"));
    }
    let neigh = must(look::neighbours(&pod.name, ifname));
    assert!(
        look::is_permanent_neighbour(&neigh, &gw, &a.host_mac),
        "{}",
        ctx(&format!(
            "no permanent neighbour {gw} -> {}: {neigh:?}",
            a.host_mac
        ))
    );

    // Node side.
    let Some(host_link) = must(look::link(node.name(), &a.host_veth)) else {
        panic!("{}", ctx(&format!("host veth {} missing", a.host_veth)));
    };
    assert_eq!(
        look::kind(&host_link),
        Some("veth"),
        "{}",
        ctx("host link kind")
    );
    assert!(look::is_up(&host_link), "{}", ctx("host veth down"));
    assert_eq!(host_link["address"], a.host_mac, "{}", ctx("host MAC"));
    assert_eq!(
        host_link["link_index"],
        pod_link["ifindex"],
        "{}",
        ctx("the host veth is not the pod interface's peer")
    );
    assert_eq!(
        pod_link["link_index"],
        host_link["ifindex"],
        "{}",
        ctx("the pod interface is not the host veth's peer")
    );
    if let Some(m) = mtu {
        assert_eq!(host_link["mtu"], m, "{}", ctx("host MTU"));
    }
    // The IPv4 gateway is the node's once, on its loopback device; the host
    // veth carries no IPv4 address.
    let lo_addrs = must(look::addrs(node.name(), "lo"));
    assert!(
        lo_addrs.contains(&format!("{gw}/32")),
        "{}",
        ctx(&format!(
            "gateway {gw}/32 not on the node's lo: {lo_addrs:?}"
        ))
    );
    let host_addrs = must(look::addrs(node.name(), &a.host_veth));
    assert!(
        host_addrs.iter().all(|h| h.contains(':')),
        "{}",
        ctx(&format!("an IPv4 address on the host veth: {host_addrs:?}"))
    );
    let node_routes = must(look::routes4(node.name()));
    let node_neigh = must(look::neighbours(node.name(), &a.host_veth));
    for (ip, _) in a.ips.iter().filter(|(ip, _)| ip.is_ipv4()) {
        let ip = ip.to_string();
        let Some(r) = look::route(&node_routes, &ip) else {
            panic!(
                "{}",
                ctx(&format!(
                    "no /32 route to {ip} on the node: {node_routes:?}"
                ))
            );
        };
        assert_eq!(
            r["dev"],
            a.host_veth.as_str(),
            "{}",
            ctx("node route device")
        );
        assert!(
            look::is_permanent_neighbour(&node_neigh, &ip, &a.pod_mac),
            "{}",
            ctx(&format!(
                "no permanent neighbour {ip} on the node: {node_neigh:?}"
            ))
        );
    }
    assert_eq!(
        must(look::sysctl(&node.netns_path(), "net/ipv4/ip_forward")),
        "1",
        "{}",
        ctx("ip_forward in the node namespace")
    );

    // Datapath.
    for f in [
        "maps/sl_endpoints",
        "maps/sl_ep_stats",
        "maps/sl_ep_slots",
        "maps/sl_ep_info",
        "maps/sl_meta",
    ]
    .iter()
    .chain(&["progs/from_pod", "progs/to_pod"])
    {
        let p = node.pin_root().join(f);
        assert!(
            p.exists(),
            "{}",
            ctx(&format!("{} is not pinned", p.display()))
        );
    }
    let host_ifindex = host_link["ifindex"].as_u64().unwrap_or(0);
    let (from_pod, to_pod) = pod_programs(node, &a.host_veth, host_ifindex);
    for (id, name) in [(from_pod, "from_pod"), (to_pod, "to_pod")] {
        let prog = must(look::bpf_prog(id));
        assert_eq!(prog["name"], name, "{}", ctx("attached program"));
        assert_eq!(prog["type"], "sched_cls", "{}", ctx("program type"));
        let pinned = must(look::pinned_prog_id(
            &node.pin_root().join("progs").join(name),
        ));
        assert_eq!(
            id,
            pinned,
            "{}",
            ctx(&format!("{name} attached is not the pinned one"))
        );
    }

    let eps = must(node.endpoints());
    for (ip, _) in &a.ips {
        let ip = ip.to_string();
        let Some(ep) = eps.iter().find(|e| e["ip"] == ip.as_str()) else {
            panic!(
                "{}",
                ctx(&format!("sluicectl endpoints does not list {ip}: {eps:?}"))
            );
        };
        assert_eq!(
            ep["hostIfname"],
            a.host_veth.as_str(),
            "{}",
            ctx("endpoint hostIfname")
        );
        assert_eq!(ep["ifindex"], host_ifindex, "{}", ctx("endpoint ifindex"));
        assert_eq!(ep["ifname"], ifname, "{}", ctx("endpoint ifname"));
        assert!(
            ep["podMac"]
                .as_str()
                .is_some_and(|m| m.eq_ignore_ascii_case(&a.pod_mac)),
            "{}",
            ctx("endpoint podMac")
        );
        assert!(
            ep["hostMac"]
                .as_str()
                .is_some_and(|m| m.eq_ignore_ascii_case(&a.host_mac)),
            "{}",
            ctx("endpoint hostMac")
        );
    }
}

/// Asserts that nothing of the attachment `container_id`/`ifname` (ADD result
/// `a`) is left: no host veth, no pod interface (when the pod still exists), no
/// link pins, no record, none of its reservations, no endpoint entry.
#[track_caller]
pub fn assert_detached(
    node: &Node,
    container_id: &str,
    ifname: &str,
    pod: Option<&Pod>,
    a: &Added,
) {
    let veths = must(node.host_veths());
    assert!(
        !veths.contains(&a.host_veth),
        "{} is still on the node",
        a.host_veth
    );
    if let Some(p) = pod {
        assert!(
            must(look::link(&p.name, ifname)).is_none(),
            "{ifname} is still in pod {}",
            p.name
        );
    }
    let pins = must(node.link_pins());
    assert!(
        !pins.iter().any(|p| p.starts_with(&a.host_veth)),
        "links of {} still pinned: {pins:?}",
        a.host_veth
    );
    let record = format!("{container_id}.{ifname}.json");
    assert!(
        !must(node.records(crate::NETWORK)).contains(&record),
        "record {record} is still there"
    );
    let reserved = must(node.reservations(crate::NETWORK));
    for (ip, _) in &a.ips {
        assert!(!reserved.contains(ip), "{ip} is still reserved");
    }
    if node.pin_root().join("maps").exists() {
        let eps: Vec<Value> = must(node.endpoints());
        for (ip, _) in &a.ips {
            assert!(
                !eps.iter().any(|e| e["ip"] == ip.to_string().as_str()),
                "sluicectl still lists {ip}: {eps:?}"
            );
        }
    }
}
