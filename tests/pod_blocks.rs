//! `podAttach: tc` pods share the node's two tc filter blocks: every host
//! veth's clsact qdisc joins them, each block holds exactly one `cls_bpf`
//! filter (the pinned `from_pod` or `to_pod`) however many pods there are, the
//! programs run for every pod through it, a DEL takes its pod off without
//! touching the others, and the last DEL leaves no block behind.
#![cfg(test)]
use std::path::Path;

use serde_json::Value;
use sluice_tests::{
    exec,
    fixtures::{add, del},
    look,
    traffic::tcp_echo,
    Node,
};

/// (ingress block, egress block) of `dev`'s clsact qdisc (`tc -j qdisc show`).
fn blocks_of(netns: &Path, dev: &str) -> (u64, u64) {
    let out = exec::tool(Some(netns), "tc", &["-j", "qdisc", "show", "dev", dev]).unwrap();
    let qdiscs: Value = serde_json::from_str(&out).unwrap();
    let clsact = qdiscs
        .as_array()
        .and_then(|a| a.iter().find(|q| q["kind"] == "clsact"))
        .unwrap_or_else(|| panic!("{dev} has no clsact qdisc: {out}"));
    match (
        clsact["ingress_block"].as_u64(),
        clsact["egress_block"].as_u64(),
    ) {
        (Some(i), Some(e)) => (i, e),
        _ => panic!("{dev}'s clsact joins no shared blocks: {clsact}"),
    }
}

/// The `cls_bpf` filters of `block` (`tc -j filter show block N`): (program
/// name, id). `None` when the block does not exist.
fn block_filters(netns: &Path, block: u64) -> Option<Vec<(String, u64)>> {
    let b = block.to_string();
    let out = exec::tool(Some(netns), "tc", &["-j", "filter", "show", "block", &b]).ok()?;
    Some(look::bpf_filters_of(&out).unwrap())
}

fn pinned_id(node: &Node, name: &str) -> u64 {
    node.status().unwrap()["programs"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == name))
        .and_then(|p| p["id"].as_u64())
        .unwrap_or_else(|| panic!("{name} missing from sluicectl status"))
}

#[test]
fn pods_share_one_filter_per_block_and_the_last_del_frees_the_blocks() {
    let node = Node::new().unwrap();
    let ns = node.netns_path();
    let conf = node.conf("1.1.0", "10.94.9.0/24");
    let pods: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|n| node.pod(n).unwrap())
        .collect();
    let added: Vec<_> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| add(&node, &conf, &format!("blocks-{i}"), p))
        .collect();

    // One pair of blocks for the node: every veth joins the same two.
    let blocks = blocks_of(&ns, &added[0].host_veth);
    for a in &added[1..] {
        assert_eq!(
            blocks_of(&ns, &a.host_veth),
            blocks,
            "{} joins other blocks than {}",
            a.host_veth,
            added[0].host_veth
        );
    }
    assert_ne!(blocks.0, blocks.1, "ingress and egress share a block");

    // Exactly one filter per block, whatever the number of pods: the pinned
    // programs.
    let want_in = vec![("from_pod".to_string(), pinned_id(&node, "from_pod"))];
    let want_out = vec![("to_pod".to_string(), pinned_id(&node, "to_pod"))];
    assert_eq!(block_filters(&ns, blocks.0), Some(want_in.clone()));
    assert_eq!(block_filters(&ns, blocks.1), Some(want_out.clone()));

    // Each veth shows the block's filter as its own (CHECK reads it that way).
    for a in &added {
        let out = exec::tool(
            Some(&ns),
            "tc",
            &["filter", "show", "dev", &a.host_veth, "ingress"],
        )
        .unwrap();
        assert!(
            out.contains(&format!(" id {} ", want_in[0].1)),
            "{}'s ingress must show from_pod: {out}",
            a.host_veth
        );
    }

    // The programs run for every pod through the shared filters: pod-to-pod
    // traffic (a -> b, c -> a; server first) is redirected by them.
    let before = node.counters().unwrap();
    tcp_echo(&pods[1], added[1].ip(), &pods[0], 64 << 10).unwrap();
    tcp_echo(&pods[0], added[0].ip(), &pods[2], 64 << 10).unwrap();
    let d = node.counters().unwrap().since(&before);
    assert!(d.get("from_pod_to_local_pod") > 0, "counters: {d}");

    // A DEL takes its own pod off and leaves the blocks to the others.
    del(&node, &conf, "blocks-0", &pods[0]);
    assert_eq!(block_filters(&ns, blocks.0), Some(want_in));
    assert_eq!(block_filters(&ns, blocks.1), Some(want_out));
    let before = node.counters().unwrap();
    tcp_echo(&pods[2], added[2].ip(), &pods[1], 64 << 10).unwrap();
    let d = node.counters().unwrap().since(&before);
    assert!(
        d.get("from_pod_to_local_pod") > 0,
        "counters after a DEL: {d}"
    );

    // The last DEL frees the blocks with their filters.
    del(&node, &conf, "blocks-1", &pods[1]);
    del(&node, &conf, "blocks-2", &pods[2]);
    for b in [blocks.0, blocks.1] {
        let left = block_filters(&ns, b);
        assert!(
            left.as_ref().is_none_or(Vec::is_empty),
            "block {b:#x} still holds {left:?} after the last DEL"
        );
    }
}
