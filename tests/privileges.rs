//! What Sluice leaves on the node is root's alone: the pin root and its
//! directories are 0700, every pinned map, program and link 0600, attachment
//! records and IPAM reservations 0600 in 0700 directories.
#![cfg(test)]
use std::{os::unix::fs::MetadataExt, path::Path};

use sluice_tests::{
    fixtures::{add, del},
    Node,
};

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .mode()
        & 0o7777
}

/// Every entry under `dir` (itself included): directories `want_dir`, files `want_file`.
fn assert_tree(dir: &Path, want_dir: u32, want_file: u32) -> usize {
    let mut n = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        assert_eq!(mode(&d), want_dir, "{} is {:o}", d.display(), mode(&d));
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let md = std::fs::symlink_metadata(&p).unwrap();
            assert_eq!(md.uid(), 0, "{} is not root's", p.display());
            if md.is_dir() {
                stack.push(p);
            } else {
                assert_eq!(mode(&p), want_file, "{} is {:o}", p.display(), mode(&p));
                n += 1;
            }
        }
    }
    n
}

#[test]
fn pins_records_and_reservations_are_root_only() {
    let node = Node::new().unwrap();
    let a = node.pod("a").unwrap();
    let conf = node.conf("1.1.0", "10.94.9.0/24");
    add(&node, &conf, "priv-a", &a);
    let pins = assert_tree(node.pin_root(), 0o700, 0o600);
    assert!(pins >= 20, "maps, programs and links pinned: {pins}");
    let records = assert_tree(&node.state_dir().join(sluice_tests::NETWORK), 0o700, 0o600);
    assert_eq!(records, 1, "one attachment record");
    let ipam = assert_tree(&node.ipam_dir().join(sluice_tests::NETWORK), 0o700, 0o600);
    assert!(ipam >= 2, "lock and reservation: {ipam}");
    del(&node, &conf, "priv-a", &a);
}

/// Root without `CAP_NET_ADMIN` and `CAP_BPF/CAP_SYS_ADMIN` (a container's root, a
/// `setpriv` shell) can open the 0600 pins, and a map fd needs no capability to
/// be written: `sluicectl`'s write commands check the capabilities themselves
/// and refuse, changing nothing. Reads still work.
#[test]
fn sluicectl_writes_refuse_without_capabilities() {
    let node = Node::new().unwrap();
    let a = node.pod("a").unwrap();
    let mut conf = node.conf("1.1.0", "10.94.10.0/24");
    conf["runtimeConfig"] = serde_json::json!({"bandwidth": {"egressRate": 50_000_000u64, "egressBurst": 5_000_000u64}});
    let added = add(&node, &conf, "caps-a", &a);
    let ip = added.ip().to_string();
    let bin = sluice_tests::sluicectl_bin().unwrap();
    let root = node.pin_root().display().to_string();
    let stripped = |args: &[&str]| {
        let mut all = vec![
            "--bounding-set=-net_admin,-bpf,-sys_admin,-perfmon",
            "--inh-caps=-net_admin,-bpf,-sys_admin,-perfmon",
            "--",
        ];
        let b = bin.display().to_string();
        all.push(&b);
        all.extend_from_slice(&["--pin-root", &root]);
        all.extend_from_slice(args);
        sluice_tests::exec::run(
            Some(&node.netns_path()),
            Path::new("setpriv"),
            &all,
            &[],
            b"",
        )
        .unwrap()
    };
    for args in [
        vec![
            "ports",
            "add",
            "--host-port",
            "9000",
            "--pod",
            &ip,
            "--container-port",
            "80",
        ],
        vec!["ports", "del", "--host-port", "9000"],
        vec!["bandwidth", "set", &ip, "--clear-egress"],
        vec!["nat", "flush", "--all"],
        vec!["datapath", "detach-all", "--yes"],
    ] {
        let out = stripped(&args);
        assert_eq!(out.status, Some(1), "{out}");
        assert!(
            out.stderr
                .contains("needs CAP_NET_ADMIN and CAP_BPF (or CAP_SYS_ADMIN)"),
            "{out}"
        );
    }
    // Nothing changed: no mapping, the limit is still there, links still pinned.
    let ports = node.sluicectl_json(&["ports", "list", "--json"]).unwrap();
    assert_eq!(ports, serde_json::json!([]));
    let bw = node
        .sluicectl_json(&["bandwidth", "get", &ip, "--json"])
        .unwrap();
    assert_eq!(bw["egress"]["rate"], 50_000_000u64, "{bw:#}");
    // A read works without them (the pins' file permissions guard reads).
    let out = stripped(&["endpoints", "--json"]);
    assert_eq!(out.status, Some(0), "{out}");
    del(&node, &conf, "caps-a", &a);
}
