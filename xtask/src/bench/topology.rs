//! The three testbeds of one run, same shape: a bare veth pair (the limit), the
//! reference plugins (bridge + host-local) and Sluice, each of the latter two a
//! node namespace with two pods and an "external" host behind its uplink.
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
    tb.ns(ext)
        .ip(&["route", "add", &format!("10.{n}.0.0/24"), "via", &node_ip])?;
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
    let n = 81;
    let conf = json!({
        "cniVersion": "1.0.0",
        "name": "benchref",
        "type": "bridge",
        "bridge": "brbench0",
        "isGateway": true,
        "ipam": {
            "type": "host-local",
            "subnet": format!("10.{n}.0.0/24"),
            "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": tb.dir.join("ref-ipam"),
        },
    });
    node_with_pods(
        tb,
        "bridge+host-local",
        "ref",
        n,
        std::path::Path::new("/usr/lib/cni/bridge"),
        conf,
    )
}

/// Sluice with its defaults (cls_bpf pod attachment, XDP auto on the uplink).
pub fn sluice(tb: &mut Testbed, bins: &Binaries) -> Result<Setup> {
    let n = 82;
    let conf = json!({
        "cniVersion": "1.1.0",
        "name": "benchsl",
        "type": "sluice",
        "pinRoot": tb.pin_root("bench"),
        "stateDir": tb.dir.join("sl-state"),
        "ipam": {
            "type": "sluice",
            "subnet": format!("10.{n}.0.0/24"),
            "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": tb.dir.join("sl-ipam"),
        },
    });
    node_with_pods(tb, "sluice", "sl", n, &bins.sluice, conf)
}
