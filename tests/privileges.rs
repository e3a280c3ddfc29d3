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
