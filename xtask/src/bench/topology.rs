//! The testbeds of one run, same shape: a bare veth pair (the limit), the
//! reference plugins (bridge + host-local) and Sluice, each of the latter a node
//! namespace with two pods and an "external" host behind its uplink; and both
//! plugins again with `ipMasq: true`, where the external host has no route to the
//! pods, so only masqueraded traffic gets answers. The port-mapping table has
//! its own nodes, one per plugin and number of mappings.
use serde_json::{json, Value};

use super::{
    conflist::Conflist,
    hostport::{self, Mapping},
};
use crate::{build::Binaries, testbed::Testbed};

use anyhow::{Context, Result};

/// Where traffic of each figure goes, for one setup.
pub(super) struct Setup {
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

pub(super) struct CniSetup {
    pub node: usize,
    pub conf: Value,
    pub plugin: std::path::PathBuf,
}

/// The bare veth pair: "pods" and "external host" are the two ends.
pub(super) fn limit(tb: &mut Testbed) -> Result<Setup> {
    let a = tb.netns("lim-a")?;
    let b = tb.netns("lim-b")?;
    tb.wire(a, "eth0", "10.99.0.1/24", b, "eth0", "10.99.0.2/24")?;
    Ok(Setup {
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
    tag: &str,
    n: u8,
    plugin: &std::path::Path,
    conf: Value,
    masq: bool,
) -> Result<Setup> {
    let pods = format!("10.{n}.0.0/24");
    let (node, ext, up) = tb.node_with_uplink(tag, n, (!masq).then_some(pods.as_str()))?;
    let pod1 = tb.netns(&format!("{tag}-p1"))?;
    let pod2 = tb.netns(&format!("{tag}-p2"))?;
    let mut ips = Vec::new();
    for (i, pod) in [pod1, pod2].into_iter().enumerate() {
        let r = tb.cni(node, plugin, "ADD", &conf, &format!("{tag}{i}"), Some(pod))?;
        let a = r["ips"][0]["address"]
            .as_str()
            .context("ADD result without an address")?;
        ips.push(a.split('/').next().unwrap_or(a).to_string());
    }
    Ok(Setup {
        pod1,
        pod2,
        pod1_ip: ips[0].clone(),
        pod2_ip: ips[1].clone(),
        ext,
        ext_ip: up.ext_ip,
        cni: Some(CniSetup {
            node,
            conf,
            plugin: plugin.to_path_buf(),
        }),
    })
}

/// bridge + host-local, as the reference plugins' users run them.
pub(super) fn reference(tb: &mut Testbed) -> Result<Setup> {
    reference_with(tb, "ref", 81, false)
}

/// The same with `ipMasq: true`: the bridge plugin adds an iptables MASQUERADE
/// chain in the node namespace, which `nf_conntrack` and `nf_nat` carry out.
pub(super) fn reference_masq(tb: &mut Testbed) -> Result<Setup> {
    reference_with(tb, "rmq", 83, true)
}

/// The reference bridge plugin's config: a gateway bridge `bridge`, host-local
/// on 10.`n`.0.0/24 with a default route, its data under the testbed's dir.
fn bridge_conf(tb: &Testbed, tag: &str, bridge: &str, n: u8, masq: bool) -> Value {
    json!({
        "type": "bridge",
        "bridge": bridge,
        "isGateway": true,
        "ipMasq": masq,
        "ipam": {
            "type": "host-local",
            "subnet": format!("10.{n}.0.0/24"),
            "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": tb.dir.join(format!("{tag}-ipam")),
        },
    })
}

fn reference_with(tb: &mut Testbed, tag: &str, n: u8, masq: bool) -> Result<Setup> {
    let mut conf = bridge_conf(tb, tag, &format!("br{tag}0"), n, masq);
    conf["cniVersion"] = json!("1.0.0");
    conf["name"] = json!(format!("bench{tag}"));
    node_with_pods(
        tb,
        tag,
        n,
        std::path::Path::new("/usr/lib/cni/bridge"),
        conf,
        masq,
    )
}

/// Sluice's config (without name/cniVersion) for node `tag`: its own pin
/// root, state and IPAM directories, the built-in IPAM on 10.`n`.0.0/24 with a
/// default route, and the keys of `extra`.
fn sluice_conf(tb: &Testbed, tag: &str, n: u8, extra: Value) -> Value {
    let mut conf = json!({
        "type": "sluice",
        "pinRoot": tb.pin_root(tag),
        "stateDir": tb.dir.join(format!("{tag}-state")),
        "ipam": {
            "type": "sluice",
            "subnet": format!("10.{n}.0.0/24"),
            "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": tb.dir.join(format!("{tag}-ipam")),
        },
    });
    if let (Some(c), Value::Object(extra)) = (conf.as_object_mut(), extra) {
        c.extend(extra);
    }
    conf
}

/// Sluice with its defaults (`cls_bpf` pod attachment, XDP auto on the uplink).
pub(super) fn sluice(tb: &mut Testbed, bins: &Binaries) -> Result<Setup> {
    sluice_with(tb, bins, "sl", 82, false)
}

/// The same with `ipMasq: true`: SNAT on the uplink's tc egress, replies back
/// through its tc ingress (Sluice's own NAT maps, no `nf_conntrack`).
pub(super) fn sluice_masq(tb: &mut Testbed, bins: &Binaries) -> Result<Setup> {
    sluice_with(tb, bins, "smq", 84, true)
}

fn sluice_with(tb: &mut Testbed, bins: &Binaries, tag: &str, n: u8, masq: bool) -> Result<Setup> {
    let mut conf = sluice_conf(tb, tag, n, json!({"ipMasq": masq}));
    conf["cniVersion"] = json!("1.1.0");
    conf["name"] = json!(format!("bench{tag}"));
    node_with_pods(tb, tag, n, &bins.sluice, conf, masq)
}

/// Mappings on each port-mapping node, one node per count and plugin.
pub(super) const HP_SIZES: [usize; 3] = [1, 1_000, 10_000];
/// The measured pod's mapping (the servers listen on the container port).
pub(super) const HP_HOST_PORT: u16 = 30080;
pub(super) const HP_CONTAINER_PORT: u16 = 80;
/// Pods whose ADD is timed on each port-mapping node of the reference and of
/// Sluice (multiples of the number of sizes: each size is timed first as often).
pub(super) const HP_TIMED_PODS_REFERENCE: usize = 6;
pub(super) const HP_TIMED_PODS_SLUICE: usize = 24;

/// A node with `mappings` port mappings: an uplink to an external host, the
/// measured pod with one mapping, and a filler container holding the other
/// mappings. The external host has no route to the pods: it reaches the pod
/// only through node address:hostPort.
pub(super) struct HpSetup {
    pub tag: String,
    pub node: usize,
    pub ext: usize,
    pub pod: usize,
    pub node_ip: String,
    pub pod_ip: String,
    pub list: Conflist,
    /// bridge + portmap (else Sluice).
    pub reference: bool,
}

/// A `portMappings` runtimeConfig entry list.
pub(super) fn port_mappings(m: &[Mapping]) -> Value {
    json!({
        "portMappings": m
            .iter()
            .map(|(h, c)| json!({"hostPort": h, "containerPort": c, "protocol": "tcp"}))
            .collect::<Vec<_>>()
    })
}

/// The filler's mappings for a node with `n` in all: host ports 20000..,
/// container ports 10000.. (neither the measured pod's nor the ADD-timed pods').
fn filler_mappings(n: usize) -> Vec<Mapping> {
    (0..n.saturating_sub(1))
        .map(|j| {
            let j = u16::try_from(j).unwrap_or(u16::MAX - 20_000);
            (20_000 + j, 10_000 + j)
        })
        .collect()
}

fn hostport_node(
    tb: &mut Testbed,
    tag: String,
    n: u8,
    list: Conflist,
    mappings: usize,
    reference: bool,
) -> Result<HpSetup> {
    let (node, ext, up) = tb.node_with_uplink(&tag, n, None)?;
    let pod = tb.netns(&format!("{tag}-pod"))?;
    let fill = tb.netns(&format!("{tag}-fill"))?;
    let node_path = tb.ns(node).path();
    let fillers = filler_mappings(mappings);
    let fill_id = format!("{tag}-fill");
    let through_cni = if reference && fillers.len() > hostport::CNI_MAPPINGS {
        hostport::CNI_MAPPINGS
    } else {
        fillers.len()
    };
    let (_, ms) = list.add(
        &node_path,
        &fill_id,
        &tb.ns(fill).path(),
        port_mappings(&fillers[..through_cni]),
    )?;
    if through_cni < fillers.len() {
        hostport::extend_portmap(tb.ns(node), &fill_id, &fillers, through_cni)?;
    }
    eprintln!(
        "bench: {tag}: filler ADD with {through_cni} mappings through CNI: {ms:.0} ms{}",
        if through_cni < fillers.len() {
            format!(
                ", {} more appended (iptables-restore)",
                fillers.len() - through_cni
            )
        } else {
            String::new()
        }
    );
    let (a, _) = list.add(
        &node_path,
        &format!("{tag}-pod"),
        &tb.ns(pod).path(),
        port_mappings(&[(HP_HOST_PORT, HP_CONTAINER_PORT)]),
    )?;
    let ip = a.result["ips"][0]["address"]
        .as_str()
        .context("ADD result without an address")?;
    Ok(HpSetup {
        tag,
        node,
        ext,
        pod,
        node_ip: up.node_ip,
        pod_ip: ip.split('/').next().unwrap_or(ip).to_string(),
        list,
        reference,
    })
}

/// bridge + host-local + portmap, chained as its users run them: the bridge
/// without ipMasq, portmap with `capabilities: {portMappings: true}` (its
/// defaults: SNAT for hairpin and localhost, iptables in the node namespace).
/// `i` indexes `HP_SIZES`.
pub(super) fn hostport_reference(tb: &mut Testbed, i: usize) -> Result<HpSetup> {
    let tag = format!("rhp{i}");
    let n = 85 + u8::try_from(i)?;
    let list = Conflist {
        name: format!("bench{tag}"),
        cni_version: "1.0.0".into(),
        plugins: vec![
            (
                "/usr/lib/cni/bridge".into(),
                bridge_conf(tb, &tag, &format!("br{tag}"), n, false),
            ),
            (
                "/usr/lib/cni/portmap".into(),
                json!({"type": "portmap", "capabilities": {"portMappings": true}}),
            ),
        ],
    };
    hostport_node(tb, tag, n, list, HP_SIZES[i], true)
}

/// Sluice with `capabilities: {portMappings: true}` and its socket hooks on
/// `cgroup` (one made for this node).
pub(super) fn hostport_sluice(
    tb: &mut Testbed,
    bins: &Binaries,
    cgroup: &std::path::Path,
    i: usize,
) -> Result<HpSetup> {
    let tag = format!("shp{i}");
    let n = 88 + u8::try_from(i)?;
    let list = Conflist {
        name: format!("bench{tag}"),
        cni_version: "1.1.0".into(),
        plugins: vec![(
            bins.sluice.clone(),
            sluice_conf(
                tb,
                &tag,
                n,
                json!({"capabilities": {"portMappings": true}, "hostPortCgroup": cgroup}),
            ),
        )],
    };
    hostport_node(tb, tag, n, list, HP_SIZES[i], false)
}

/// The limits of the bandwidth table, bits per second: one pod per limit and
/// burst on each bandwidth node, limited to it both ways.
pub(super) const BW_RATES: [u64; 3] = [10_000_000, 100_000_000, 1_000_000_000];
/// The bursts of the bandwidth table, in ms of the rate: the 10 ms users of
/// the reference plugin configure (a tbf bucket), 100 ms, and 300 ms (Sluice's
/// default, and the least depth it gives any bucket).
pub(super) const BW_BURSTS_MS: [u64; 3] = [10, 100, 300];
/// The burst (index into `BW_BURSTS_MS`) of the UDP and CPU figures.
pub(super) const BW_DEFAULT_BURST: usize = 2;

/// Index into `BwSetup::pods` of the pod limited to `BW_RATES[rate]` with
/// `BW_BURSTS_MS[burst]`.
pub(super) const fn bw_pod(rate: usize, burst: usize) -> usize {
    rate * BW_BURSTS_MS.len() + burst
}

/// A node with an uplink to an external host (which routes the pod subnet to
/// the node) and one pod per `BW_RATES` limit and `BW_BURSTS_MS` burst, each
/// with that limit and burst on ingress and egress.
pub(super) struct BwSetup {
    pub tag: String,
    pub node: usize,
    pub ext: usize,
    pub ext_ip: String,
    /// (namespace, address) of each pod, by [`bw_pod`].
    pub pods: Vec<(usize, String)>,
    pub list: Conflist,
    pub attached: Vec<super::conflist::Attachment>,
}

/// The `runtimeConfig` of a pod limited to `rate` both ways with bursts of
/// `burst_ms` of the rate (bits, as the CNI conventions count them).
fn bandwidth_runtime(rate: u64, burst_ms: u64) -> Value {
    let burst = rate * burst_ms / 1000;
    json!({ "bandwidth": {
        "ingressRate": rate, "egressRate": rate,
        "ingressBurst": burst, "egressBurst": burst,
    }})
}

fn bandwidth_node(tb: &mut Testbed, tag: &str, n: u8, list: Conflist) -> Result<BwSetup> {
    let pods = format!("10.{n}.0.0/24");
    let (node, ext, up) = tb.node_with_uplink(tag, n, Some(&pods))?;
    let mut s = BwSetup {
        tag: tag.to_string(),
        node,
        ext,
        ext_ip: up.ext_ip,
        pods: Vec::new(),
        list,
        attached: Vec::new(),
    };
    for (r, rate) in BW_RATES.iter().enumerate() {
        for (b, burst_ms) in BW_BURSTS_MS.iter().enumerate() {
            let i = bw_pod(r, b);
            let pod = tb.netns(&format!("{tag}-p{i}"))?;
            let (a, _) = s.list.add(
                &tb.ns(node).path(),
                &format!("{tag}-p{i}"),
                &tb.ns(pod).path(),
                bandwidth_runtime(*rate, *burst_ms),
            )?;
            let ip = a.result["ips"][0]["address"]
                .as_str()
                .context("ADD result without an address")?;
            s.pods
                .push((pod, ip.split('/').next().unwrap_or(ip).to_string()));
            s.attached.push(a);
        }
    }
    Ok(s)
}

/// bridge + host-local + the reference `bandwidth` plugin, chained as its users
/// run them (`capabilities: {bandwidth: true}`). It puts a tbf qdisc on the
/// host veth (ingress, i.e. into the pod) and redirects the host veth's
/// ingress to an ifb device with a tbf qdisc (egress); all of it in the node
/// namespace (the conflist runs every plugin from inside it), so the ifb goes
/// with that namespace at the latest.
pub(super) fn bandwidth_reference(tb: &mut Testbed) -> Result<BwSetup> {
    let (tag, n) = ("rbw", 91);
    let list = Conflist {
        name: format!("bench{tag}"),
        cni_version: "1.0.0".into(),
        plugins: vec![
            (
                "/usr/lib/cni/bridge".into(),
                bridge_conf(tb, tag, &format!("br{tag}"), n, false),
            ),
            (
                "/usr/lib/cni/bandwidth".into(),
                json!({"type": "bandwidth", "capabilities": {"bandwidth": true}}),
            ),
        ],
    };
    bandwidth_node(tb, tag, n, list)
}

/// Sluice with `capabilities: {bandwidth: true}`, the same rates and bursts.
pub(super) fn bandwidth_sluice(tb: &mut Testbed, bins: &Binaries) -> Result<BwSetup> {
    let (tag, n) = ("sbw", 92);
    let list = Conflist {
        name: format!("bench{tag}"),
        cni_version: "1.1.0".into(),
        plugins: vec![(
            bins.sluice.clone(),
            sluice_conf(tb, tag, n, json!({"capabilities": {"bandwidth": true}})),
        )],
    };
    bandwidth_node(tb, tag, n, list)
}

/// DEL of every pod of a bandwidth node (the reference plugin removes its ifb
/// and qdiscs); the namespaces go with the testbed.
pub(super) fn bandwidth_del(tb: &Testbed, s: &mut BwSetup) -> Result<()> {
    for a in s.attached.drain(..).rev() {
        s.list
            .del(&tb.ns(s.node).path(), &a)
            .with_context(|| format!("{}: DEL {}", s.tag, a.container_id))?;
    }
    Ok(())
}
