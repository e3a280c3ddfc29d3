//! A datapath lost with its pins (a reboot empties bpffs; an operator deletes
//! the pin root): the pods attached before keep their veths and routes, and the
//! next ADD loads a new datapath and re-attaches them from their attachment
//! records — endpoint entries, programs, bandwidth limits — so that their
//! traffic goes through the new programs and maps again.
#![cfg(test)]
use std::process::Command;

use serde_json::json;
use sluice_tests::{
    fixtures::{add, del},
    traffic::tcp_echo,
    Node,
};

#[test]
fn the_next_add_re_attaches_pods_after_the_pins_are_deleted() {
    let node = Node::new().unwrap();
    let a = node.pod("a").unwrap();
    let b = node.pod("b").unwrap();
    let c = node.pod("c").unwrap();
    let conf = node.conf("1.1.0", "10.94.7.0/24");
    let mut limited = conf.clone();
    limited["runtimeConfig"] =
        json!({"bandwidth": {"egressRate": 100_000_000u64, "egressBurst": 10_000_000u64}});
    let added_a = add(&node, &limited, "repair-a", &a);
    let added_b = add(&node, &conf, "repair-b", &b);
    tcp_echo(&b, added_b.ip(), &a, 64 << 10).unwrap();

    // As after a reboot: nothing pinned any more.
    std::fs::remove_dir_all(node.pin_root()).unwrap();
    let eps_gone = node.sluicectl(&["endpoints", "--json"]).unwrap();
    assert!(!eps_gone.success(), "no datapath must be found: {eps_gone}");

    let added_c = add(&node, &conf, "repair-c", &c);
    let eps = node.endpoints().unwrap();
    let ips: Vec<&str> = eps.iter().filter_map(|e| e["ip"].as_str()).collect();
    for want in [added_a.ip(), added_b.ip(), added_c.ip()] {
        assert!(
            ips.contains(&want.to_string().as_str()),
            "{want} missing from the new datapath's endpoints {ips:?}"
        );
    }
    // a's limit came back from its record.
    let bw = node
        .sluicectl_json(&["bandwidth", "list", "--json"])
        .unwrap();
    assert_eq!(
        bw.as_array().map(Vec::len),
        Some(1),
        "one limited pod expected: {bw:#}"
    );
    assert_eq!(bw[0]["egress"]["rate"], 100_000_000u64, "{bw:#}");

    // a -> b goes through the new programs: pod-to-pod redirects and the
    // endpoint counters of the new maps rise.
    let before = node.counters().unwrap();
    tcp_echo(&b, added_b.ip(), &a, 256 << 10).unwrap();
    let d = node.counters().unwrap().since(&before);
    assert!(d.get("from_pod_to_local_pod") > 0, "counters: {d}");

    // The filters on a's veth run the new pinned program (the old ones are freed).
    let pinned = node.status().unwrap()["programs"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == "from_pod"))
        .and_then(|p| p["id"].as_u64())
        .expect("from_pod in status");
    let out = Command::new("nsenter")
        .arg(format!("--net={}", node.netns_path().display()))
        .args(["tc", "filter", "show", "dev", &added_a.host_veth, "ingress"])
        .output()
        .unwrap();
    let filters = String::from_utf8_lossy(&out.stdout);
    assert!(
        filters.contains(&format!(" id {pinned} ")),
        "a's ingress filter must run from_pod id {pinned}: {filters}"
    );

    for (id, p) in [("repair-a", &a), ("repair-b", &b), ("repair-c", &c)] {
        del(&node, &conf, id, p);
    }
}

/// Unmounts a bpffs mounted by the test when dropped (also on panic), before
/// the node removes its pin root directory.
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A reboot for real: the pins live in a bpffs instance of their own, which is
/// unmounted (every pin in it goes with it); the next ADD loads into the bpffs
/// beneath and re-attaches the pods.
#[test]
fn the_next_add_re_attaches_pods_after_bpffs_is_unmounted() {
    let node = Node::new().unwrap();
    let a = node.pod("a").unwrap();
    let b = node.pod("b").unwrap();
    let c = node.pod("c").unwrap();
    std::fs::create_dir_all(node.pin_root()).unwrap();
    let st = Command::new("mount")
        .args(["-t", "bpf", "bpf"])
        .arg(node.pin_root())
        .status()
        .unwrap();
    assert!(
        st.success(),
        "mounting a bpffs on {}",
        node.pin_root().display()
    );
    let mounted = Mounted(node.pin_root().to_path_buf());
    let conf = node.conf("1.1.0", "10.94.8.0/24");
    let added_a = add(&node, &conf, "unmount-a", &a);
    let added_b = add(&node, &conf, "unmount-b", &b);
    tcp_echo(&b, added_b.ip(), &a, 64 << 10).unwrap();

    let st = Command::new("umount")
        .arg(node.pin_root())
        .status()
        .unwrap();
    assert!(st.success(), "unmounting {}", node.pin_root().display());
    drop(mounted);
    assert!(
        !node.pin_root().join("maps").exists(),
        "the pins went with the bpffs instance"
    );

    let added_c = add(&node, &conf, "unmount-c", &c);
    let eps = node.endpoints().unwrap();
    assert_eq!(eps.len(), 3, "a, b and c in the new datapath: {eps:#?}");
    let before = node.counters().unwrap();
    tcp_echo(&b, added_b.ip(), &a, 256 << 10).unwrap();
    tcp_echo(&c, added_c.ip(), &a, 64 << 10).unwrap();
    let d = node.counters().unwrap().since(&before);
    assert!(d.get("from_pod_to_local_pod") > 0, "counters: {d}");
    let _ = added_a;
    for (id, p) in [("unmount-a", &a), ("unmount-b", &b), ("unmount-c", &c)] {
        del(&node, &conf, id, p);
    }
}
