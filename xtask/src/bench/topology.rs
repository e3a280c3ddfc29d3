//! The testbeds of one run, same shape: a bare veth pair (the limit), the
//! reference plugins (bridge + host-local) and Sluice, each of the latter a node
//! namespace with two pods and an "external" host behind its uplink; and both
//! plugins again with `ipMasq: true`, where the external host has no route to the
//! pods, so only masqueraded traffic gets answers.
use serde_json::{json, Value};

use crate::{
    build::Binaries,
    testbed::{Cni, Testbed},
};

use anyhow::{Context, Result};

/// Where traffic of each figure goes, for one setup.
pub struct Setup {
    pub name: &'static str,
    /// Namespace indexes in the testbed.
    pub pod1: usize,
    pub pod2: usize,
    pub pod2_ip: String,
    pub pod1_ip: String,
    pub ext: usize,
    pub ext_ip: String,
    /// For ADD/DEL timing (none for the bare veth pair).
    pub cni: Option<CniSetup>,
}

pub struct CniSetup {
    pub node: usize,
    pub conf: Value,
    pub plugin: std::path::PathBuf,
}

/// The bare veth pair: "pods" and "external host" are the two ends.
pub fn limit(tb: &mut Testbed) -> Result<Setup> {
    let a = tb.netns("lim-a")?;
    let b = tb.netns("lim-b")?;
    tb.wire(a, "eth0", "10.99.0.1/24", b, "eth0", "10.99.0.2/24")?;
    Ok(Setup {
        name: "bare veth",
        pod1: a,
        pod2: b,
        pod1_ip: "10.99.0.1".into(),
        pod2_ip: "10.99.0.2".into(),
        ext: b,
        ext_ip: "10.99.0.2".into(),
        cni: None,
    })
}

/// A node with an uplink to an external host and two pods attached by `plugin`
/// with `conf`. `n` numbers the subnets so the setups never overlap.
fn node_with_pods(
    tb: &mut Testbed,
    name: &'static str,
    tag: &str,
    n: u8,
    plugin: &std::path::Path,
    conf: Value,
    masq: bool,
) -> Result<Setup> {
    let node = tb.netns(&format!("{tag}-node"))?;
    let ext = tb.netns(&format!("{tag}-ext"))?;
    let pod1 = tb.netns(&format!("{tag}-p1"))?;
    let pod2 = tb.netns(&format!("{tag}-p2"))?;
    let (node_ip, ext_ip) = (format!("192.168.{n}.1"), format!("192.168.{n}.2"));
    tb.wire(
        node,
        "up0",
        &format!("{node_ip}/24"),
        ext,
        "eth0",
        &format!("{ext_ip}/24"),
    )?;
    tb.ns(node)
        .ip(&["route", "add", "default", "via", &ext_ip])?;
    if !masq {
        tb.ns(ext)
            .ip(&["route", "add", &format!("10.{n}.0.0/24"), "via", &node_ip])?;
    }
    let cni = Cni {
        node: tb.ns(node),
        plugin,
        cni_path: "/usr/lib/cni",
    };
    let mut ips = Vec::new();
    for (i, pod) in [pod1, pod2].into_iter().enumerate() {
        let r = cni.run("ADD", &conf, &format!("{tag}{i}"), "eth0", Some(tb.ns(pod)))?;
        let a = r["ips"][0]["address"]
            .as_str()
            .context("ADD result without an address")?;
        ips.push(a.split('/').next().unwrap_or(a).to_string());
    }
    Ok(Setup {
        name,
        pod1,
        pod2,
        pod1_ip: ips[0].clone(),
        pod2_ip: ips[1].clone(),
        ext,
        ext_ip,
        cni: Some(CniSetup {
            node,
            conf,
            plugin: plugin.to_path_buf(),
        }),
    })
}

/// bridge + host-local, as the reference plugins' users run them.
pub fn reference(tb: &mut Testbed) -> Result<Setup> {
    reference_with(tb, "bridge+host-local", "ref", 81, false)
}

/// The same with `ipMasq: true`: the bridge plugin adds an iptables MASQUERADE
/// chain in the node namespace, which nf_conntrack and nf_nat carry out.
pub fn reference_masq(tb: &mut Testbed) -> Result<Setup> {
    reference_with(tb, "bridge ipMasq", "rmq", 83, true)
}

fn reference_with(
    tb: &mut Testbed,
    name: &'static str,
    tag: &str,
    n: u8,
    masq: bool,
) -> Result<Setup> {
    let conf = json!({
        "cniVersion": "1.0.0",
        "name": format!("bench{tag}"),
        "type": "bridge",
        "bridge": format!("br{tag}0"),
        "isGateway": true,
        "ipMasq": masq,
        "ipam": {
            "type": "host-local",
            "subnet": format!("10.{n}.0.0/24"),
            "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": tb.dir.join(format!("{tag}-ipam")),
        },
    });
    node_with_pods(
        tb,
        name,
        tag,
        n,
        std::path::Path::new("/usr/lib/cni/bridge"),
        conf,
        masq,
    )
}

/// Sluice with its defaults (cls_bpf pod attachment, XDP auto on the uplink).
pub fn sluice(tb: &mut Testbed, bins: &Binaries) -> Result<Setup> {
    sluice_with(tb, bins, "sluice", "sl", 82, false)
}

/// The same with `ipMasq: true`: SNAT on the uplink's tc egress, replies back
/// through its tc ingress (Sluice's own NAT maps, no nf_conntrack).
pub fn sluice_masq(tb: &mut Testbed, bins: &Binaries) -> Result<Setup> {
    sluice_with(tb, bins, "sluice ipMasq", "smq", 84, true)
}

fn sluice_with(
    tb: &mut Testbed,
    bins: &Binaries,
    name: &'static str,
    tag: &str,
    n: u8,
    masq: bool,
) -> Result<Setup> {
    let conf = json!({
        "cniVersion": "1.1.0",
        "name": format!("bench{tag}"),
        "type": "sluice",
        "ipMasq": masq,
        "pinRoot": tb.pin_root(tag),
        "stateDir": tb.dir.join(format!("{tag}-state")),
        "ipam": {
            "type": "sluice",
            "subnet": format!("10.{n}.0.0/24"),
            "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": tb.dir.join(format!("{tag}-ipam")),
        },
    });
    node_with_pods(tb, name, tag, n, &bins.sluice, conf, masq)
}
