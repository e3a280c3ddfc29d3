//! GC and STATUS (spec 1.1.0) with the built-in IPAM: GC removes every
//! attachment no valid attachment owns (veth, record, reservation, links) and
//! leaves the others working; STATUS says whether an ADD can succeed.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use serde_json::{json, Value};
use sluice_tests::{
    attached::{assert_attached, assert_detached},
    look,
    schema::{check_add_result, Added},
    traffic::tcp_echo,
    with_prev_result, Node, Pod, NETWORK,
};

const VERSION: &str = "1.1.0";

fn add(node: &Node, conf: &Value, cid: &str, pod: &Pod) -> Added {
    let out = node.cni("ADD", conf, cid, "eth0", Some(pod), &[]).unwrap();
    check_add_result(&out.result(), VERSION, "eth0", pod)
}

fn gc(node: &Node, conf: &Value, valid: &[&str]) {
    let mut c = conf.clone();
    c["cni.dev/valid-attachments"] = json!(valid
        .iter()
        .map(|cid| json!({"containerID": cid, "ifname": "eth0"}))
        .collect::<Vec<_>>());
    node.cni("GC", &c, "", "", None, &[]).unwrap().ok_silent();
}

fn check(node: &Node, conf: &Value, cid: &str, pod: &Pod, added: &Added) {
    let c = with_prev_result(conf, &added.result);
    node.cni("CHECK", &c, cid, "eth0", Some(pod), &[])
        .unwrap()
        .ok_silent();
}

#[test]
fn gc_removes_the_attachment_no_one_owns_and_keeps_the_others() {
    let node = Node::new().unwrap();
    let conf = node.conf(VERSION, "10.85.0.0/24");
    let pods: Vec<Pod> = ["a", "b", "c"]
        .iter()
        .map(|p| node.pod(p).unwrap())
        .collect();
    let cids = ["gc-a", "gc-b", "gc-c"];
    let added: Vec<Added> = cids
        .iter()
        .zip(&pods)
        .map(|(cid, pod)| add(&node, &conf, cid, pod))
        .collect();

    gc(&node, &conf, &cids[..2]);

    // The pods left use the gateway: it stays on the node's lo.
    assert!(gateway_on_lo(&node), "GC removed the gateway in use");
    assert_detached(&node, "gc-c", "eth0", Some(&pods[2]), &added[2]);
    assert_eq!(node.records(NETWORK).unwrap().len(), 2);
    assert_eq!(node.reservations(NETWORK).unwrap().len(), 2);
    // cls_bpf filters pin nothing; assert_attached reads them from the kernel.
    assert!(node.link_pins().unwrap().is_empty());
    for i in 0..2 {
        assert_attached(&node, &pods[i], "eth0", &added[i], None);
        check(&node, &conf, cids[i], &pods[i], &added[i]);
    }
    tcp_echo(&pods[1], added[1].ip(), &pods[0], 64 << 10).unwrap();

    // GC is idempotent and a GC naming every attachment removes nothing.
    gc(&node, &conf, &cids[..2]);
    for i in 0..2 {
        check(&node, &conf, cids[i], &pods[i], &added[i]);
    }

    // GC with no valid attachment at all empties the network, and takes the
    // gateway no pod uses any more off lo (DEL leaves it there).
    gc(&node, &conf, &[]);
    for i in 0..2 {
        assert_detached(&node, cids[i], "eth0", Some(&pods[i]), &added[i]);
    }
    node.assert_clean(NETWORK);
    assert!(!gateway_on_lo(&node), "GC left the unused gateway on lo");
    // The next ADD puts it back (assert_attached checks lo).
    let again = add(&node, &conf, "gc-d", &pods[0]);
    assert_attached(&node, &pods[0], "eth0", &again, None);
    node.cni("DEL", &conf, "gc-d", "eth0", Some(&pods[0]), &[])
        .unwrap()
        .ok_silent();
}

/// Whether the network's gateway (10.85.0.1, the range's first address) is on
/// the node's lo.
fn gateway_on_lo(node: &Node) -> bool {
    look::addrs(node.name(), "lo")
        .unwrap()
        .contains(&"10.85.0.1/32".to_string())
}

#[test]
fn gc_removes_an_attachment_whose_record_was_lost() {
    let node = Node::new().unwrap();
    let conf = node.conf(VERSION, "10.85.0.0/24");
    let a = node.pod("a").unwrap();
    let b = node.pod("b").unwrap();
    let added_a = add(&node, &conf, "gc-keep", &a);
    let added_b = add(&node, &conf, "gc-lost", &b);
    let record = node
        .state_dir()
        .join(NETWORK)
        .join("attachments")
        .join("gc-lost.eth0.json");
    std::fs::remove_file(&record).unwrap();

    // The veth, the datapath entries and the reservation are still found.
    gc(&node, &conf, &["gc-keep"]);
    assert_detached(&node, "gc-lost", "eth0", Some(&b), &added_b);
    assert_attached(&node, &a, "eth0", &added_a, None);
    check(&node, &conf, "gc-keep", &a, &added_a);

    node.cni("DEL", &conf, "gc-keep", "eth0", Some(&a), &[])
        .unwrap()
        .ok_silent();
    node.assert_clean(NETWORK);
}

#[test]
fn gc_needs_the_valid_attachments() {
    let node = Node::new().unwrap();
    let conf = node.conf(VERSION, "10.85.0.0/24");
    let e = node.cni("GC", &conf, "", "", None, &[]).unwrap().error(7);
    e.assert_names(&["cni.dev/valid-attachments"]);
}

#[test]
fn status_is_ok_until_the_range_is_exhausted() {
    let node = Node::new().unwrap();
    // One address besides the gateway.
    let conf = node.conf(VERSION, "10.85.0.0/30");
    let status = || node.cni("STATUS", &conf, "", "", None, &[]).unwrap();

    // Nothing loaded yet: an ADD could still succeed.
    status().ok_silent();
    let pod = node.pod("a").unwrap();
    let added = add(&node, &conf, "status-a", &pod);
    status().error(50);

    // The failing ADD STATUS predicted.
    let other = node.pod("b").unwrap();
    node.cni("ADD", &conf, "status-b", "eth0", Some(&other), &[])
        .unwrap()
        .error(102);

    node.cni("DEL", &conf, "status-a", "eth0", Some(&pod), &[])
        .unwrap()
        .ok_silent();
    assert_detached(&node, "status-a", "eth0", Some(&pod), &added);
    status().ok_silent();
    node.assert_clean(NETWORK);
}

/// Container ids have no length limit in the spec; GC must recognise a valid
/// attachment whatever the length of its id (the datapath's owner entry keeps
/// only the first 64 bytes): a runtime's usual 64-hex-digit id and a longer one.
#[test]
fn gc_keeps_valid_attachments_with_long_container_ids() {
    let node = Node::new().unwrap();
    let conf = node.conf(VERSION, "10.85.0.0/24");
    let ids = [
        "0123456789abcdef".repeat(4),
        format!("gc-{}", "0123456789abcdef".repeat(6)),
    ];
    assert_eq!(ids[0].len(), 64);
    let pods: Vec<Pod> = ["a", "b"].iter().map(|p| node.pod(p).unwrap()).collect();
    let added: Vec<Added> = ids
        .iter()
        .zip(&pods)
        .map(|(cid, pod)| add(&node, &conf, cid, pod))
        .collect();

    gc(&node, &conf, &[&ids[0], &ids[1]]);
    for i in 0..2 {
        assert_attached(&node, &pods[i], "eth0", &added[i], None);
        check(&node, &conf, &ids[i], &pods[i], &added[i]);
    }

    for i in 0..2 {
        node.cni("DEL", &conf, &ids[i], "eth0", Some(&pods[i]), &[])
            .unwrap()
            .ok_silent();
        assert_detached(&node, &ids[i], "eth0", Some(&pods[i]), &added[i]);
    }
    node.assert_clean(NETWORK);
}

/// STATUS says when an ADD cannot succeed because the datapath cannot load: a
/// datapath of another map layout pinned at the pin root (an old `sluice`'s, or
/// a newer one's after a downgrade). The ADD it predicts fails too, leaving
/// nothing behind, and the pinned datapath is left as it was.
#[test]
fn status_reports_a_datapath_that_cannot_load() {
    let node = Node::new().unwrap();
    let conf = node.conf(VERSION, "10.85.2.0/24");
    sluice_tests::ctl::fake_meta(node.pin_root(), 99).unwrap();
    let out = node.cni("STATUS", &conf, "", "", None, &[]).unwrap();
    let e = out.error(50);
    assert!(
        e.details.contains("layout v99"),
        "STATUS must say why: {:?}",
        e.details
    );
    let pod = node.pod("a").unwrap();
    let add = node
        .cni("ADD", &conf, "status-layout", "eth0", Some(&pod), &[])
        .unwrap();
    let failed = add.any_error();
    assert!(failed.code != 0, "the ADD must fail: {add}");
    assert!(
        node.pin_root().join("maps").join("sl_meta").exists(),
        "the other layout's pins are left alone"
    );
    node.assert_clean(NETWORK);
}
