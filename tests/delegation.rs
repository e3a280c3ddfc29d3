//! IPAM delegation (spec section 4): `"ipam": {"type": "host-local"}` runs the
//! reference host-local plugin from `CNI_PATH` for ADD, CHECK and DEL, and a
//! failed ADD gives the address back through it.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use serde_json::{json, Value};
use sluice_tests::{
    attached::{assert_attached, assert_detached},
    schema::check_add_result,
    with_prev_result, Node, NETWORK,
};

/// host-local supports CNI up to 1.0.0.
const VERSION: &str = "1.0.0";

fn host_local_conf(node: &Node) -> Value {
    let mut c = node.conf(VERSION, "unused");
    c["ipam"] = json!({
        "type": "host-local",
        "ranges": [[{"subnet": "10.78.0.0/24"}]],
        "dataDir": node.ipam_dir(),
        "routes": [{"dst": "0.0.0.0/0"}],
    });
    c
}

#[test]
fn host_local_add_check_del() {
    let node = Node::new().unwrap();
    let pod = node.pod("a").unwrap();
    let conf = host_local_conf(&node);

    let out = node
        .cni("ADD", &conf, "deleg-a", "eth0", Some(&pod), &[])
        .unwrap();
    let added = check_add_result(&out.result(), VERSION, "eth0", &pod);
    assert_eq!(
        added.gateways,
        vec!["10.78.0.1".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_attached(&node, &pod, "eth0", &added, None);
    // The reservation is host-local's: a file named after the address in its
    // dataDir, owned by this container.
    assert_eq!(node.reservations(NETWORK).unwrap(), vec![added.ip()]);
    let owner = node.reservation_owner(NETWORK, added.ip()).unwrap();
    assert!(owner.starts_with("deleg-a"), "owner {owner:?}");
    assert_eq!(node.records(NETWORK).unwrap(), vec!["deleg-a.eth0.json"]);

    let check = with_prev_result(&conf, &added.result);
    node.cni("CHECK", &check, "deleg-a", "eth0", Some(&pod), &[])
        .unwrap()
        .ok_silent();

    node.cni("DEL", &check, "deleg-a", "eth0", Some(&pod), &[])
        .unwrap()
        .ok_silent();
    assert_detached(&node, "deleg-a", "eth0", Some(&pod), &added);
    assert!(node.reservations(NETWORK).unwrap().is_empty());
    node.assert_clean(NETWORK);
}

#[test]
fn host_local_check_fails_once_the_reservation_is_gone() {
    let node = Node::new().unwrap();
    let pod = node.pod("a").unwrap();
    let conf = host_local_conf(&node);
    let out = node
        .cni("ADD", &conf, "deleg-c", "eth0", Some(&pod), &[])
        .unwrap();
    let added = check_add_result(&out.result(), VERSION, "eth0", &pod);

    // Lose the reservation behind the plugin's back: CHECK must say so, with the
    // error host-local gives (CHECK is delegated too).
    let file = node.ipam_dir().join(NETWORK).join(added.ip().to_string());
    std::fs::remove_file(&file).unwrap();
    let check = with_prev_result(&conf, &added.result);
    let out = node
        .cni("CHECK", &check, "deleg-c", "eth0", Some(&pod), &[])
        .unwrap();
    let e = out.any_error();
    assert!(
        e.text().contains("deleg-c") || e.text().contains(&added.ip().to_string()),
        "{e:?}"
    );

    node.cni("DEL", &check, "deleg-c", "eth0", Some(&pod), &[])
        .unwrap()
        .ok_silent();
    node.assert_clean(NETWORK);
}

#[test]
fn failed_add_after_ipam_gives_the_address_back() {
    let node = Node::new().unwrap();
    let pod = node.pod("a").unwrap();
    let mut conf = host_local_conf(&node);
    // Not on a bpffs: ADD gets its address and veth, then fails at the datapath.
    let not_bpffs = node.dir().join("notbpffs");
    conf["pinRoot"] = json!(not_bpffs);

    let out = node
        .cni("ADD", &conf, "deleg-f", "eth0", Some(&pod), &[])
        .unwrap();
    let e = out.error(7);
    e.assert_names(&["pinRoot", &not_bpffs.display().to_string()]);
    // The delegated DEL ran: host-local holds nothing, and nothing else is left.
    assert!(node.reservations(NETWORK).unwrap().is_empty());
    assert!(sluice_tests::look::link(&pod.name, "eth0")
        .unwrap()
        .is_none());
    assert!(!not_bpffs.exists(), "created {}", not_bpffs.display());
    node.assert_clean(NETWORK);

    // And the address is free again: asking host-local for it (CNI_ARGS IP=,
    // passed on to the delegate) gets it.
    conf["pinRoot"] = json!(node.pin_root());
    let args = [("CNI_ARGS", "IP=10.78.0.2")];
    let out = node
        .cni("ADD", &conf, "deleg-g", "eth0", Some(&pod), &args)
        .unwrap();
    let added = check_add_result(&out.result(), VERSION, "eth0", &pod);
    assert_eq!(added.ip().to_string(), "10.78.0.2");
    node.cni("DEL", &conf, "deleg-g", "eth0", Some(&pod), &[])
        .unwrap()
        .ok_silent();
    node.assert_clean(NETWORK);
}
