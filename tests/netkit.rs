//! `podDevice: netkit`: the pod gets a netkit pair (Linux 6.7+), whose host end
//! carries the pod programs on netkit's own hooks as pinned netkit links; on a
//! kernel without netkit the ADD fails with the key and the reason named, and
//! leaves nothing behind. (Traffic through netkit pods is in `routing`,
//! `masquerade`, `hostport` and `upgrade`, with `podDevice: auto`.)
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use serde_json::json;
use sluice_tests::{
    attached::pod_programs,
    fixtures::{add, check, del},
    kernel, look,
    traffic::tcp_echo,
    Node, NETWORK,
};

#[test]
fn explicit_netkit_makes_netkit_pairs_or_fails_naming_the_kernel() {
    let node = Node::new().unwrap();
    let a = node.pod("a").unwrap();
    let mut conf = node.conf("1.0.0", "10.94.1.0/24");
    conf["podDevice"] = json!("netkit");
    if !kernel::has_netkit() {
        let out = node
            .cni("ADD", &conf, "nk-a", "eth0", Some(&a), &[])
            .unwrap();
        let e = out.error(7);
        e.assert_names(&["podDevice", "netkit", "Linux 6.7"]);
        node.assert_clean(NETWORK);
        return;
    }
    let b = node.pod("b").unwrap();
    let added_a = add(&node, &conf, "nk-a", &a);
    let added_b = add(&node, &conf, "nk-b", &b);
    for (added, pod) in [(&added_a, &a), (&added_b, &b)] {
        kernel::assert_device_kind(&node, &added.host_veth, "netkit");
        // The pod's own end is the netkit peer, with the MAC the result gives.
        let inside = look::link(&pod.name, "eth0").unwrap().unwrap();
        assert_eq!(look::kind(&inside), Some("netkit"), "{inside}");
        // Its programs: from_netkit_pod on the peer hook, to_netkit_pod on
        // the primary's, both the pinned programs.
        let ifindex = look::ifindex(node.name(), &added.host_veth).unwrap();
        let (from, to) = pod_programs(&node, &added.host_veth, ifindex);
        for (id, name) in [(from, "from_netkit_pod"), (to, "to_netkit_pod")] {
            assert_eq!(look::bpf_prog(id).unwrap()["name"], name);
            let pinned = look::pinned_prog_id(&node.pin_root().join("progs").join(name)).unwrap();
            assert_eq!(
                id, pinned,
                "{name} on {} is not the pinned one",
                added.host_veth
            );
        }
    }
    tcp_echo(&b, added_b.ip(), &a, 64 << 10).unwrap();
    check(&node, &conf, "nk-a", &a, &added_a);
    check(&node, &conf, "nk-b", &b, &added_b);
    del(&node, &conf, "nk-a", &a);
    del(&node, &conf, "nk-b", &b);
    node.assert_clean(NETWORK);
}
