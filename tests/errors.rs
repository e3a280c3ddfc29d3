//! Bad input: each case gets the CNI error code the spec (or Sluice's contract)
//! gives it, a message naming the offending key, variable or value, and leaves
//! nothing behind: no `sl*` veth on the node, no record, no reservation, no
//! pinned link.
#![cfg(test)] // Everything here is test code (lets clippy's test exemptions apply).
use serde_json::{json, Value};
use sluice_tests::{cni_path, look, schema::check_add_result, Node, Pod, NETWORK};

/// A complete, valid ADD environment for `pod`, with `cid` and `ifname`.
fn add_env(cmd: &str, cid: &str, ifname: &str, pod: &Pod) -> Vec<(String, String)> {
    vec![
        ("CNI_COMMAND".into(), cmd.into()),
        ("CNI_CONTAINERID".into(), cid.into()),
        ("CNI_IFNAME".into(), ifname.into()),
        ("CNI_NETNS".into(), pod.netns()),
        ("CNI_PATH".into(), cni_path().display().to_string()),
    ]
}

fn borrowed(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

#[test]
fn malformed_json_is_code_6() {
    let node = Node::new().unwrap();
    let pod = node.pod("a").unwrap();
    let env = add_env("ADD", "err-json", "eth0", &pod);
    for stdin in [
        &b"{\"cniVersion\": \"1.0.0\", \"name\": "[..],
        b"not json",
        b"",
    ] {
        let out = node.cni_raw(&borrowed(&env), stdin).unwrap();
        let e = out.error(6);
        e.assert_names(&["config"]);
        node.assert_clean(NETWORK);
    }
    // A JSON value that is not an object cannot be decoded as a config either.
    let out = node.cni_raw(&borrowed(&env), b"[1, 2]").unwrap();
    out.error(6);
    node.assert_clean(NETWORK);
}

#[test]
fn unsupported_cni_version_is_code_1() {
    let node = Node::new().unwrap();
    let pod = node.pod("a").unwrap();
    for v in ["9.9.9", "0.2.0", "1.2.0"] {
        let conf = node.conf(v, "10.82.0.0/24");
        let out = node
            .cni("ADD", &conf, "err-ver", "eth0", Some(&pod), &[])
            .unwrap();
        let e = out.error(1);
        e.assert_names(&[v]);
        node.assert_clean(NETWORK);
    }
}

#[test]
fn invalid_config_values_are_code_7_naming_key_and_value() {
    let node = Node::new().unwrap();
    let pod = node.pod("a").unwrap();
    let base = node.conf("1.0.0", "10.82.0.0/24");
    let with = |path: &[&str], v: Value| {
        let mut c = base.clone();
        let mut at = &mut c;
        for k in &path[..path.len() - 1] {
            at = &mut at[*k];
        }
        at[path[path.len() - 1]] = v;
        c
    };
    let cases = [
        (
            with(&["ipam", "subnet"], json!("10.82.0.0/33")),
            "ipam.subnet",
            "10.82.0.0/33",
        ),
        (
            with(&["ipam", "subnet"], json!("not-a-cidr")),
            "ipam.subnet",
            "not-a-cidr",
        ),
        (
            with(&["ipam", "subnet"], json!("10.82.0.300/24")),
            "ipam.subnet",
            "10.82.0.300/24",
        ),
        (with(&["mtu"], json!(20)), "mtu", "20"),
        (
            with(&["pinRoot"], json!("/sys/fs/bpf/a.b")),
            "pinRoot",
            "/sys/fs/bpf/a.b",
        ),
        (
            with(&["pinRoot"], json!("relative/pins")),
            "pinRoot",
            "relative/pins",
        ),
        (with(&["name"], json!("-bad name")), "name", "-bad name"),
        (with(&["ipam", "type"], json!("../x")), "ipam.type", "../x"),
        (
            with(&["runtimeConfig"], json!({"mac": "zz"})),
            "runtimeConfig.mac",
            "zz",
        ),
    ];
    for (conf, key, value) in cases {
        let out = node
            .cni("ADD", &conf, "err-conf", "eth0", Some(&pod), &[])
            .unwrap();
        let e = out.error(7);
        e.assert_names(&[key, value]);
        assert_eq!(e.cni_version.as_deref(), Some("1.0.0"));
        node.assert_clean(NETWORK);
        assert!(look::link(&pod.name, "eth0").unwrap().is_none());
    }
}

/// `serviceCIDRs` overlapping the pod range would hand pods' traffic to their
/// peers to the node's stack as Service traffic: code 7 naming the entry
/// (`serviceCIDRs[i]`), its value and the pod range, after IPAM, so the ADD
/// rolls back. An entry that is no CIDR is code 7 too.
#[test]
fn service_cidrs_overlapping_the_pod_range_are_code_7() {
    let node = Node::new().unwrap();
    let pod = node.pod("a").unwrap();
    let base = node.conf("1.0.0", "10.82.0.0/24");
    let cases: [(Value, &[&str]); 4] = [
        (
            json!(["10.82.0.0/16"]),
            &["serviceCIDRs[0]", "10.82.0.0/16", "10.82.0.0/24"],
        ),
        (
            json!(["10.82.0.128/25", "10.96.0.0/12"]),
            &["serviceCIDRs[0]", "10.82.0.128/25", "10.82.0.0/24"],
        ),
        (
            json!(["10.96.0.0/12", "10.0.0.0/8"]),
            &["serviceCIDRs[1]", "10.0.0.0/8", "10.82.0.0/24"],
        ),
        (json!(["not-a-cidr"]), &["serviceCIDRs[0]", "not-a-cidr"]),
    ];
    for (cidrs, names) in cases {
        let mut conf = base.clone();
        conf["serviceCIDRs"] = cidrs;
        let out = node
            .cni("ADD", &conf, "err-svc", "eth0", Some(&pod), &[])
            .unwrap();
        let e = out.error(7);
        e.assert_names(names);
        assert_eq!(e.cni_version.as_deref(), Some("1.0.0"));
        node.assert_clean(NETWORK);
        assert!(look::link(&pod.name, "eth0").unwrap().is_none());
    }
    // Ranges beside the pods' are taken.
    let mut conf = base.clone();
    conf["serviceCIDRs"] = json!(["10.96.0.0/12"]);
    let out = node
        .cni("ADD", &conf, "err-svc", "eth0", Some(&pod), &[])
        .unwrap();
    check_add_result(&out.result(), "1.0.0", "eth0", &pod);
    let out = node
        .cni("DEL", &conf, "err-svc", "eth0", Some(&pod), &[])
        .unwrap();
    out.ok_silent();
    node.assert_clean(NETWORK);
}

#[test]
fn missing_environment_is_code_4_naming_every_variable() {
    let node = Node::new().unwrap();
    let pod = node.pod("a").unwrap();
    let conf = node.conf("1.0.0", "10.82.0.0/24").to_string();
    let path = cni_path().display().to_string();

    let out = node
        .cni_raw(
            &[("CNI_COMMAND", "ADD"), ("CNI_PATH", &path)],
            conf.as_bytes(),
        )
        .unwrap();
    out.error(4)
        .assert_names(&["CNI_CONTAINERID", "CNI_IFNAME", "CNI_NETNS"]);

    let out = node
        .cni_raw(&[("CNI_PATH", &path)], conf.as_bytes())
        .unwrap();
    out.error(4).assert_names(&["CNI_COMMAND"]);

    let out = node
        .cni_raw(
            &[("CNI_COMMAND", "JUMP"), ("CNI_PATH", &path)],
            conf.as_bytes(),
        )
        .unwrap();
    out.error(4).assert_names(&["CNI_COMMAND", "JUMP"]);

    // CHECK needs CNI_NETNS too; DEL does not (see del.rs).
    let mut env = add_env("CHECK", "err-env", "eth0", &pod);
    env.retain(|(k, _)| k != "CNI_NETNS");
    let out = node.cni_raw(&borrowed(&env), conf.as_bytes()).unwrap();
    out.error(4).assert_names(&["CNI_NETNS"]);

    // A CNI_NETNS that is not a network namespace.
    let mut env = add_env("ADD", "err-env", "eth0", &pod);
    env.retain(|(k, _)| k != "CNI_NETNS");
    env.push(("CNI_NETNS".into(), "/run/netns/slt-does-not-exist".into()));
    let out = node.cni_raw(&borrowed(&env), conf.as_bytes()).unwrap();
    out.error(4)
        .assert_names(&["CNI_NETNS", "/run/netns/slt-does-not-exist"]);

    node.assert_clean(NETWORK);
}

#[test]
fn bad_ifnames_are_code_4() {
    let node = Node::new().unwrap();
    let pod = node.pod("a").unwrap();
    let conf = node.conf("1.0.0", "10.82.0.0/24").to_string();
    for ifname in ["a-very-long-name", "et/h0", ".", "..", "eth 0", "eth:0"] {
        let env = add_env("ADD", "err-if", ifname, &pod);
        let out = node.cni_raw(&borrowed(&env), conf.as_bytes()).unwrap();
        out.error(4).assert_names(&["CNI_IFNAME", ifname]);
        node.assert_clean(NETWORK);
    }
    // 15 bytes is the kernel's limit and fine.
    let out = node
        .cni(
            "ADD",
            &node.conf("1.0.0", "10.82.0.0/24"),
            "err-if",
            "abcdefghijklmno",
            Some(&pod),
            &[],
        )
        .unwrap();
    check_add_result(&out.result(), "1.0.0", "abcdefghijklmno", &pod);
    node.cni(
        "DEL",
        &node.conf("1.0.0", "10.82.0.0/24"),
        "err-if",
        "abcdefghijklmno",
        None,
        &[],
    )
    .unwrap()
    .ok_silent();
    node.assert_clean(NETWORK);
}

#[test]
fn bad_container_ids_are_code_4() {
    let node = Node::new().unwrap();
    let pod = node.pod("a").unwrap();
    let conf = node.conf("1.0.0", "10.82.0.0/24").to_string();
    for cid in [
        "-leading-dash",
        "has/slash",
        "has space",
        ".hidden",
        "../up",
    ] {
        let env = add_env("ADD", cid, "eth0", &pod);
        let out = node.cni_raw(&borrowed(&env), conf.as_bytes()).unwrap();
        out.error(4).assert_names(&["CNI_CONTAINERID", cid]);
        node.assert_clean(NETWORK);
    }
}

#[test]
fn exhausted_range_is_code_102() {
    let node = Node::new().unwrap();
    // A /30 has two host addresses, one of them the gateway.
    let conf = node.conf("1.0.0", "10.82.0.0/30");
    let mut held = Vec::new();
    let mut failure = None;
    for i in 0..4 {
        let pod = node.pod(&format!("p{i}")).unwrap();
        let cid = format!("err-full-{i}");
        let out = node
            .cni("ADD", &conf, &cid, "eth0", Some(&pod), &[])
            .unwrap();
        if out.success() {
            held.push((cid, pod));
        } else {
            failure = Some((cid, pod, out));
            break;
        }
    }
    let Some((cid, pod, out)) = failure else {
        panic!("a /30 took {} pods", held.len());
    };
    assert_eq!(held.len(), 1, "a /30 holds one pod besides the gateway");
    let e = out.error(102);
    e.assert_names(&["10.82.0."]);
    // The failed ADD left nothing of its own.
    assert!(look::link(&pod.name, "eth0").unwrap().is_none());
    assert_eq!(node.host_veths().unwrap().len(), held.len());
    assert_eq!(node.records(NETWORK).unwrap().len(), held.len());
    assert!(!node
        .records(NETWORK)
        .unwrap()
        .contains(&format!("{cid}.eth0.json")));
    assert_eq!(node.reservations(NETWORK).unwrap().len(), held.len());
    // The default cls_bpf attachment pins no links; the held pods' filters are
    // checked when they are deleted below.
    assert!(node.link_pins().unwrap().is_empty());

    for (cid, pod) in &held {
        node.cni("DEL", &conf, cid, "eth0", Some(pod), &[])
            .unwrap()
            .ok_silent();
    }
    node.assert_clean(NETWORK);
}

#[test]
fn existing_interface_in_the_pod_is_refused_and_left_alone() {
    let node = Node::new().unwrap();
    let pod = node.pod("a").unwrap();
    let ip = |args: &[&str]| {
        let mut all = vec!["-n", pod.name.as_str()];
        all.extend_from_slice(args);
        sluice_tests::exec::tool(None, "ip", &all).unwrap();
    };
    // A veth pair inside the pod (this kernel has no dummy driver).
    ip(&[
        "link", "add", "eth0", "type", "veth", "peer", "name", "other0",
    ]);
    ip(&["addr", "add", "192.0.2.9/24", "dev", "eth0"]);
    ip(&["link", "set", "eth0", "up"]);
    let before = look::link(&pod.name, "eth0").unwrap().unwrap();

    let conf = node.conf("1.0.0", "10.82.0.0/24");
    let out = node
        .cni("ADD", &conf, "err-exists", "eth0", Some(&pod), &[])
        .unwrap();
    out.error(4).assert_names(&["CNI_IFNAME", "eth0"]);

    let after = look::link(&pod.name, "eth0").unwrap().unwrap();
    assert_eq!(look::kind(&after), Some("veth"));
    assert!(look::link(&pod.name, "other0").unwrap().is_some());
    assert_eq!(after["ifindex"], before["ifindex"]);
    assert_eq!(after["address"], before["address"]);
    assert!(look::is_up(&after));
    assert_eq!(
        look::addrs(&pod.name, "eth0").unwrap(),
        vec!["192.0.2.9/24".to_string()]
    );
    node.assert_clean(NETWORK);
}

#[test]
fn oversized_stdin_is_code_5() {
    let node = Node::new().unwrap();
    let pod = node.pod("a").unwrap();
    let mut conf = node.conf("1.0.0", "10.82.0.0/24");
    // A valid config made larger than the 8 MiB limit by an unknown key.
    conf["padding"] = json!("x".repeat(9 << 20));
    let env = add_env("ADD", "err-big", "eth0", &pod);
    let out = node
        .cni_raw(&borrowed(&env), conf.to_string().as_bytes())
        .unwrap();
    out.error(5).assert_names(&["stdin"]);
    node.assert_clean(NETWORK);
}

#[test]
fn commands_newer_than_the_config_version_are_code_1() {
    let node = Node::new().unwrap();
    let pod = node.pod("a").unwrap();
    let mut conf = node.conf("0.3.1", "10.82.0.0/24");
    conf["prevResult"] = json!({"cniVersion": "0.3.1", "interfaces": [], "ips": []});
    let out = node
        .cni("CHECK", &conf, "err-cmd", "eth0", Some(&pod), &[])
        .unwrap();
    let e = out.error(1);
    e.assert_names(&["0.3.1", "CHECK"]);
    assert_eq!(e.cni_version.as_deref(), Some("0.3.1"));

    let conf = node.conf("1.0.0", "10.82.0.0/24");
    for cmd in ["GC", "STATUS"] {
        let e = node.cni(cmd, &conf, "", "", None, &[]).unwrap().error(1);
        e.assert_names(&["1.0.0", cmd]);
        assert_eq!(e.cni_version.as_deref(), Some("1.0.0"));
    }
    node.assert_clean(NETWORK);
}

#[test]
fn failed_add_after_ipam_rolls_everything_back() {
    let node = Node::new().unwrap();
    let pod = node.pod("a").unwrap();
    let mut conf = node.conf("1.0.0", "10.82.0.0/24");
    // Not on a bpffs: ADD reserves an address and makes the veth, then fails
    // at the datapath and must undo both.
    let not_bpffs = node.dir().join("notbpffs");
    conf["pinRoot"] = json!(not_bpffs);
    let out = node
        .cni("ADD", &conf, "err-late", "eth0", Some(&pod), &[])
        .unwrap();
    out.error(7)
        .assert_names(&["pinRoot", &not_bpffs.display().to_string()]);
    assert!(look::link(&pod.name, "eth0").unwrap().is_none());
    assert!(!not_bpffs.exists(), "created {}", not_bpffs.display());
    node.assert_clean(NETWORK);
    // The pod's namespace keeps only lo; the node's only lo.
    for ns in [pod.name.as_str(), node.name()] {
        assert_eq!(look::link_names(ns).unwrap(), vec!["lo"], "{ns}");
    }
}

/// A second ADD of an attachment that exists (same container id and ifname,
/// e.g. a runtime retrying into a new sandbox) fails, and its rollback must not
/// take down what the first ADD made.
#[test]
fn repeated_add_of_an_existing_attachment_leaves_it_alone() {
    let node = Node::new().unwrap();
    let first = node.pod("a").unwrap();
    let second = node.pod("b").unwrap();
    let conf = node.conf("1.0.0", "10.82.0.0/24");
    let out = node
        .cni("ADD", &conf, "err-dup", "eth0", Some(&first), &[])
        .unwrap();
    let added = check_add_result(&out.result(), "1.0.0", "eth0", &first);

    let out = node
        .cni("ADD", &conf, "err-dup", "eth0", Some(&second), &[])
        .unwrap();
    out.error(4)
        .assert_names(&["CNI_CONTAINERID", "CNI_IFNAME", "err-dup", "already exists"]);
    assert!(look::link(&second.name, "eth0").unwrap().is_none());

    sluice_tests::attached::assert_attached(&node, &first, "eth0", &added, None);
    assert_eq!(node.reservations(NETWORK).unwrap(), vec![added.ip()]);
    assert_eq!(node.records(NETWORK).unwrap(), vec!["err-dup.eth0.json"]);
    node.cni(
        "CHECK",
        &sluice_tests::with_prev_result(&conf, &added.result),
        "err-dup",
        "eth0",
        Some(&first),
        &[],
    )
    .unwrap()
    .ok_silent();

    node.cni("DEL", &conf, "err-dup", "eth0", Some(&first), &[])
        .unwrap()
        .ok_silent();
    node.assert_clean(NETWORK);
}
