//! Two nodes joined by a veth wire, each with its own pin root and pod range and
//! a `nodes` entry pointing at the other: ADD installs `podCIDR via nodeIP`, and
//! pod-to-pod TCP across the nodes leaves the sending node through `from_pod`'s
//! FIB redirect and enters the receiving node's pod through `uplink_xdp` or
//! `uplink_in`, with neither node's IP stack forwarding anything.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use std::net::IpAddr;

use serde_json::{json, Value};
use sluice_tests::{
    fixtures::{add, check, del},
    host::{tx_checksum_off, wire},
    look,
    traffic::tcp_echo,
    Counters, Node, Pod,
};

/// Bytes of each echo (sent one way, then echoed back).
const BYTES: usize = 384 << 10;
/// Fewest packets an echo can take in one direction, even as 64 KiB GSO segments.
const MIN_PACKETS: u64 = 6;
const WIRE: &str = "w0";

struct Side {
    node: Node,
    conf: Value,
    cidr: &'static str,
    ip: &'static str,
}

fn side(cidr: &'static str, ip: &'static str) -> Side {
    let node = Node::new().unwrap();
    let conf = node.conf("1.0.0", cidr);
    Side {
        node,
        conf,
        cidr,
        ip,
    }
}

fn forwarded(node: &Node) -> u64 {
    node.snmp().unwrap()["Ip.ForwDatagrams"]
}

fn counters(s: &Side) -> (Counters, u64) {
    (s.node.counters().unwrap(), forwarded(&s.node))
}

/// Asserts what carried an echo from `client` (on `from`) to `server` (on `to`)
/// and back: each node sent by FIB redirect and received through its uplink
/// programs (`xdp_to_pod` alone in native mode), and neither forwarded.
#[track_caller]
fn assert_carried(
    from: &Side,
    to: &Side,
    before: (&(Counters, u64), &(Counters, u64)),
    native: bool,
) {
    for (s, b) in [(from, before.0), (to, before.1)] {
        let (c, fwd) = counters(s);
        let d = c.since(&b.0);
        eprintln!("node {} ({}): {d}", s.node.name(), s.cidr);
        let sent = d.sum(&["from_pod_fib_redirect", "from_pod_fib_neigh"]);
        assert!(
            sent >= MIN_PACKETS,
            "node {}: from_pod_fib_redirect + from_pod_fib_neigh rose by {sent}: {d}",
            s.cidr
        );
        let received = if native {
            d.get("xdp_to_pod")
        } else {
            d.sum(&["xdp_to_pod", "uplink_to_pod"])
        };
        assert!(
            received >= MIN_PACKETS,
            "node {}: {} rose by {received}: {d}",
            s.cidr,
            if native {
                "xdp_to_pod"
            } else {
                "xdp_to_pod + uplink_to_pod"
            }
        );
        assert!(
            fwd - b.1 <= sluice_tests::kernel::kernel_forwarding_allowed(&d),
            "node {}: the kernel forwarded {} packets ({d})",
            s.cidr,
            fwd - b.1
        );
    }
}

/// The route `cidr via gw dev w0` in `node`'s main table.
#[track_caller]
fn assert_route(node: &Node, cidr: &str, gw: &str) {
    let routes = look::routes4(node.name()).unwrap();
    let Some(r) = look::route(&routes, cidr) else {
        panic!("no route to {cidr} on {}: {routes:?}", node.name());
    };
    assert_eq!(r["gateway"], gw, "route to {cidr}: {r}");
    assert_eq!(r["dev"], WIRE, "route to {cidr}: {r}");
}

fn echo(server: &Pod, server_ip: IpAddr, client: &Pod, client_ip: IpAddr) {
    let seen = tcp_echo(server, server_ip, client, BYTES).unwrap();
    assert_eq!(seen.ip(), client_ip, "pod traffic must not be translated");
}

fn two_nodes(xdp: &str, native: bool) {
    // Before 5.13 native XDP falls back to off (tc delivers).
    let native = native && sluice_tests::kernel::xdp_mode("native") == "native";
    let mut a = side("10.92.1.0/24", "192.168.60.1");
    let mut b = side("10.92.2.0/24", "192.168.60.2");
    wire(
        a.node.name(),
        WIRE,
        &format!("{}/24", a.ip),
        b.node.name(),
        WIRE,
        &format!("{}/24", b.ip),
    )
    .unwrap();
    if native {
        // Both ends send into a native-XDP veth: see `tx_checksum_off`.
        for s in [&a, &b] {
            tx_checksum_off(&s.node.netns_path(), WIRE).unwrap();
        }
    }
    let (at_a, at_b) = ((a.cidr, a.ip), (b.cidr, b.ip));
    for (s, other) in [(&mut a, at_b), (&mut b, at_a)] {
        s.conf["uplink"] = json!(WIRE);
        s.conf["xdp"] = json!(xdp);
        s.conf["nodes"] = json!([{"podCIDR": other.0, "nodeIP": other.1}]);
    }
    let pa = a.node.pod("a").unwrap();
    let pa2 = a.node.pod("a2").unwrap();
    let pb = b.node.pod("b").unwrap();
    let added_a = add(&a.node, &a.conf, "two-a", &pa);
    // A second ADD on the node finds the route there and keeps it.
    let added_a2 = add(&a.node, &a.conf, "two-a2", &pa2);
    let added_b = add(&b.node, &b.conf, "two-b", &pb);
    assert_route(&a.node, b.cidr, b.ip);
    assert_route(&b.node, a.cidr, a.ip);
    for s in [&a, &b] {
        let st = s.node.status().unwrap();
        // `auto` attaches no XDP on a veth uplink (README: XDP on a veth uplink).
        let mode = if native { "native" } else { "off" };
        assert_eq!(st["uplink"]["xdp"], mode, "{st:#}");
    }
    let (ip_a, ip_a2, ip_b) = (added_a.ip(), added_a2.ip(), added_b.ip());

    // a -> b and back.
    let (ca, cb) = (counters(&a), counters(&b));
    echo(&pb, ip_b, &pa, ip_a);
    assert_carried(&a, &b, (&ca, &cb), native);
    // b -> a2 and back.
    let (ca, cb) = (counters(&a), counters(&b));
    echo(&pa2, ip_a2, &pb, ip_b);
    assert_carried(&b, &a, (&cb, &ca), native);

    check(&a.node, &a.conf, "two-a", &pa, &added_a);
    check(&a.node, &a.conf, "two-a2", &pa2, &added_a2);
    check(&b.node, &b.conf, "two-b", &pb, &added_b);
    del(&a.node, &a.conf, "two-a", &pa);
    del(&a.node, &a.conf, "two-a2", &pa2);
    del(&b.node, &b.conf, "two-b", &pb);
}

#[test]
fn pods_on_two_nodes_talk_through_the_uplinks_xdp_auto() {
    two_nodes("auto", false);
}

#[test]
fn pods_on_two_nodes_talk_through_the_uplinks_xdp_native() {
    two_nodes("native", true);
}
