//! Real traffic: two pods on the node exchange TCP data both ways, and the
//! per-endpoint counters `sluicectl endpoints --json` reads from the pinned maps
//! rise by at least what went through each host veth.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use serde_json::Value;
use sluice_tests::{schema::check_add_result, traffic::tcp_echo, Node, NETWORK};

/// Bytes of each echo (sent one way, then echoed back).
const BYTES: usize = 256 << 10;

/// (fromPodPackets, fromPodBytes, toPodPackets, toPodBytes) of `ip`.
fn counters(eps: &[Value], ip: &str) -> [u64; 4] {
    let Some(ep) = eps.iter().find(|e| e["ip"] == ip) else {
        panic!("sluicectl does not list {ip}: {eps:?}");
    };
    [
        "fromPodPackets",
        "fromPodBytes",
        "toPodPackets",
        "toPodBytes",
    ]
    .map(|k| {
        ep[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{k} of {ip} is not a number: {ep}"))
    })
}

#[test]
fn pods_exchange_tcp_and_endpoint_counters_rise() {
    let node = Node::new().unwrap();
    let a = node.pod("a").unwrap();
    let b = node.pod("b").unwrap();
    let conf = node.conf("1.0.0", "10.79.0.0/24");
    let added_a = check_add_result(
        &node
            .cni("ADD", &conf, "traffic-a", "eth0", Some(&a), &[])
            .unwrap()
            .result(),
        "1.0.0",
        "eth0",
        &a,
    );
    let added_b = check_add_result(
        &node
            .cni("ADD", &conf, "traffic-b", "eth0", Some(&b), &[])
            .unwrap()
            .result(),
        "1.0.0",
        "eth0",
        &b,
    );
    let (ip_a, ip_b) = (added_a.ip(), added_b.ip());
    assert_ne!(ip_a, ip_b);

    let before = node.endpoints().unwrap();
    let (a0, b0) = (
        counters(&before, &ip_a.to_string()),
        counters(&before, &ip_b.to_string()),
    );

    // a -> b and back, then b -> a and back: each host veth carries BYTES of
    // payload in each direction per echo, so 2 * BYTES in all.
    let seen = tcp_echo(&b, ip_b, &a, BYTES).unwrap();
    assert_eq!(seen.ip(), ip_a, "pod traffic must not be translated");
    let seen = tcp_echo(&a, ip_a, &b, BYTES).unwrap();
    assert_eq!(seen.ip(), ip_b, "pod traffic must not be translated");

    let after = node.endpoints().unwrap();
    let (a1, b1) = (
        counters(&after, &ip_a.to_string()),
        counters(&after, &ip_b.to_string()),
    );
    let names = [
        "fromPodPackets",
        "fromPodBytes",
        "toPodPackets",
        "toPodBytes",
    ];
    for (pod, c0, c1) in [("a", a0, a1), ("b", b0, b1)] {
        for i in 0..4 {
            let rose = c1[i].saturating_sub(c0[i]);
            let want = if i % 2 == 1 { 2 * BYTES as u64 } else { 2 };
            assert!(
                rose >= want,
                "{} of pod {pod} rose by {rose}, expected at least {want} \
                 (before {c0:?}, after {c1:?})",
                names[i]
            );
        }
    }

    for (cid, pod) in [("traffic-a", &a), ("traffic-b", &b)] {
        node.cni("DEL", &conf, cid, "eth0", Some(pod), &[])
            .unwrap()
            .ok_silent();
    }
    node.assert_clean(NETWORK);
    assert!(node.endpoints().unwrap().is_empty());
}

#[test]
fn dual_stack_pods_exchange_tcp_over_ipv6() {
    let node = Node::new().unwrap();
    let a = node.pod("a").unwrap();
    let b = node.pod("b").unwrap();
    let mut conf = node.conf("1.1.0", "unused");
    conf["ipam"] = serde_json::json!({
        "type": "sluice",
        "ranges": [[{"subnet": "10.79.0.0/24"}], [{"subnet": "fd00:79::/64"}]],
        "dataDir": node.ipam_dir(),
    });
    let mut v6 = Vec::new();
    for (cid, pod) in [("traffic6-a", &a), ("traffic6-b", &b)] {
        let out = node.cni("ADD", &conf, cid, "eth0", Some(pod), &[]).unwrap();
        let added = check_add_result(&out.result(), "1.1.0", "eth0", pod);
        let Some((ip, _)) = added.ips.iter().find(|(ip, _)| ip.is_ipv6()) else {
            panic!("no IPv6 address: {out}");
        };
        v6.push(*ip);
    }
    let before = node.endpoints().unwrap();
    let seen = tcp_echo(&b, v6[1], &a, BYTES).unwrap();
    assert_eq!(seen.ip(), v6[0]);
    let after = node.endpoints().unwrap();
    for (i, ip) in v6.iter().enumerate() {
        let (c0, c1) = (
            counters(&before, &ip.to_string()),
            counters(&after, &ip.to_string()),
        );
        for k in [1, 3] {
            assert!(
                c1[k] - c0[k] >= BYTES as u64,
                "pod {i} ({ip}): counter {k} rose by {} (before {c0:?}, after {c1:?})",
                c1[k] - c0[k]
            );
        }
    }
    for (cid, pod) in [("traffic6-a", &a), ("traffic6-b", &b)] {
        node.cni("DEL", &conf, cid, "eth0", Some(pod), &[])
            .unwrap()
            .ok_silent();
    }
    node.assert_clean(NETWORK);
}
