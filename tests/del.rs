//! DEL (spec section 2): idempotent, works without `CNI_NETNS`, without
//! prevResult and after the pod's namespace is gone, and always frees the
//! address, which the same or another container can then request again.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use serde_json::Value;
use sluice_tests::{
    attached::assert_detached,
    look,
    schema::{check_add_result, Added},
    with_prev_result, Node, Pod, NETWORK,
};

const VERSION: &str = "1.0.0";

fn add(node: &Node, conf: &Value, cid: &str, pod: &Pod, ip: Option<&str>) -> Added {
    let arg = ip.map(|ip| format!("IP={ip}"));
    let env: Vec<(&str, &str)> = arg.iter().map(|a| ("CNI_ARGS", a.as_str())).collect();
    let out = node.cni("ADD", conf, cid, "eth0", Some(pod), &env).unwrap();
    let added = check_add_result(&out.result(), VERSION, "eth0", pod);
    assert_eq!(node.reservations(NETWORK).unwrap(), vec![added.ip()]);
    added
}

/// The address `added` had is free: a new container gets exactly it on request.
fn assert_ip_reusable(node: &Node, conf: &Value, added: &Added) {
    assert!(
        !node.reservations(NETWORK).unwrap().contains(&added.ip()),
        "{} is still reserved",
        added.ip()
    );
    let pod = node.pod("reuse").unwrap();
    let ip = added.ip().to_string();
    let again = add(node, conf, "del-reuse", &pod, Some(&ip));
    assert_eq!(again.ip(), added.ip());
    node.cni("DEL", conf, "del-reuse", "eth0", Some(&pod), &[])
        .unwrap()
        .ok_silent();
    node.assert_clean(NETWORK);
}

#[test]
fn del_twice_in_a_row() {
    let node = Node::new().unwrap();
    let pod = node.pod("a").unwrap();
    let conf = node.conf(VERSION, "10.80.0.0/24");
    let added = add(&node, &conf, "del-twice", &pod, None);
    let with_prev = with_prev_result(&conf, &added.result);
    for _ in 0..2 {
        node.cni("DEL", &with_prev, "del-twice", "eth0", Some(&pod), &[])
            .unwrap()
            .ok_silent();
        assert_detached(&node, "del-twice", "eth0", Some(&pod), &added);
    }
    node.assert_clean(NETWORK);
    assert_ip_reusable(&node, &conf, &added);
}

#[test]
fn del_without_netns_and_without_prev_result() {
    let node = Node::new().unwrap();
    let pod = node.pod("a").unwrap();
    let conf = node.conf(VERSION, "10.80.0.0/24");
    let added = add(&node, &conf, "del-nons", &pod, None);
    node.cni("DEL", &conf, "del-nons", "eth0", None, &[])
        .unwrap()
        .ok_silent();
    // Deleting the host veth took the pod end with it.
    assert_detached(&node, "del-nons", "eth0", Some(&pod), &added);
    node.assert_clean(NETWORK);
    assert_ip_reusable(&node, &conf, &added);
}

#[test]
fn del_after_the_pod_netns_is_deleted() {
    let node = Node::new().unwrap();
    let pod = node.pod("a").unwrap();
    let conf = node.conf(VERSION, "10.80.0.0/24");
    let added = add(&node, &conf, "del-gone", &pod, None);
    let with_prev = with_prev_result(&conf, &added.result);
    node.delete_pod(&pod).unwrap();
    assert!(!pod.path.exists());

    // The runtime still passes the old CNI_NETNS path; it no longer exists.
    node.cni("DEL", &with_prev, "del-gone", "eth0", Some(&pod), &[])
        .unwrap()
        .ok_silent();
    assert_detached(&node, "del-gone", "eth0", None, &added);
    node.assert_clean(NETWORK);
    assert_ip_reusable(&node, &conf, &added);
}

#[test]
fn del_of_an_attachment_that_never_was() {
    let node = Node::new().unwrap();
    let pod = node.pod("a").unwrap();
    let conf = node.conf(VERSION, "10.80.0.0/24");
    // Nothing was ever added on this node: no pins, no records, no reservations.
    node.cni("DEL", &conf, "del-never", "eth0", Some(&pod), &[])
        .unwrap()
        .ok_silent();
    // Another attachment's DEL does not touch an existing one.
    let added = add(&node, &conf, "del-keep", &pod, None);
    node.cni("DEL", &conf, "del-other", "eth0", None, &[])
        .unwrap()
        .ok_silent();
    assert!(look::link(&pod.name, "eth0").unwrap().is_some());
    assert_eq!(node.host_veths().unwrap(), vec![added.host_veth.clone()]);
    assert_eq!(node.reservations(NETWORK).unwrap(), vec![added.ip()]);
    assert_eq!(node.records(NETWORK).unwrap(), vec!["del-keep.eth0.json"]);
    node.cni("DEL", &conf, "del-keep", "eth0", Some(&pod), &[])
        .unwrap()
        .ok_silent();
    node.assert_clean(NETWORK);
}

/// After a reboot bpffs is empty: DEL still removes the veth, the record and the
/// reservation.
#[test]
fn del_after_the_pin_root_is_gone() {
    let node = Node::new().unwrap();
    let pod = node.pod("a").unwrap();
    let conf = node.conf(VERSION, "10.80.0.0/24");
    let added = add(&node, &conf, "del-nopins", &pod, None);
    std::fs::remove_dir_all(node.pin_root()).unwrap();
    node.cni("DEL", &conf, "del-nopins", "eth0", Some(&pod), &[])
        .unwrap()
        .ok_silent();
    assert_detached(&node, "del-nopins", "eth0", Some(&pod), &added);
    node.assert_clean(NETWORK);
}
