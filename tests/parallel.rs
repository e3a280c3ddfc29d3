//! Many ADDs and DELs at once, as a runtime starting a node full of pods does:
//! every ADD succeeds with its own address, and the DELs leave nothing.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use std::{collections::BTreeSet, thread};

use sluice_tests::{attached::pod_programs, look, schema::check_add_result, Node, NETWORK};

const PODS: usize = 32;

#[test]
fn parallel_adds_get_distinct_ips_and_parallel_dels_leave_nothing() {
    let node = Node::new().unwrap();
    let conf = node.conf("1.1.0", "10.81.0.0/24");
    let pods: Vec<_> = (0..PODS)
        .map(|i| node.pod(&format!("p{i}")).unwrap())
        .collect();

    let added: Vec<_> = thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, pod)| {
                let (node, conf) = (&node, &conf);
                s.spawn(move || {
                    let out = node
                        .cni("ADD", conf, &format!("par-{i}"), "eth0", Some(pod), &[])
                        .unwrap();
                    check_add_result(&out.result(), "1.1.0", "eth0", pod)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });

    let ips: BTreeSet<_> = added.iter().map(sluice_tests::schema::Added::ip).collect();
    assert_eq!(
        ips.len(),
        PODS,
        "duplicate addresses: {:?}",
        added
            .iter()
            .map(sluice_tests::schema::Added::ip)
            .collect::<Vec<_>>()
    );
    let veths: BTreeSet<_> = added.iter().map(|a| a.host_veth.clone()).collect();
    assert_eq!(veths.len(), PODS);
    assert_eq!(
        node.host_veths()
            .unwrap()
            .into_iter()
            .collect::<BTreeSet<_>>(),
        veths
    );
    assert_eq!(
        node.reservations(NETWORK)
            .unwrap()
            .into_iter()
            .collect::<BTreeSet<_>>(),
        ips
    );
    assert_eq!(node.records(NETWORK).unwrap().len(), PODS);
    // cls_bpf filters (the default) pin no links.
    assert!(node.link_pins().unwrap().is_empty());
    for a in &added {
        let link = look::link(node.name(), &a.host_veth).unwrap().unwrap();
        pod_programs(&node, &a.host_veth, link["ifindex"].as_u64().unwrap());
    }
    let listed: BTreeSet<String> = node
        .endpoints()
        .unwrap()
        .iter()
        .filter_map(|e| e["ip"].as_str().map(str::to_string))
        .collect();
    assert_eq!(listed, ips.iter().map(ToString::to_string).collect());

    thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, pod)| {
                let (node, conf) = (&node, &conf);
                s.spawn(move || {
                    node.cni("DEL", conf, &format!("par-{i}"), "eth0", Some(pod), &[])
                        .unwrap()
                        .ok_silent();
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    });
    node.assert_clean(NETWORK);
    assert!(node.endpoints().unwrap().is_empty());
}
