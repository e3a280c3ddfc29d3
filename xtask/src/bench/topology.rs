//! The testbeds of one run, same shape: a bare veth pair (the limit), the
//! reference plugins (bridge + host-local) and Sluice, each of the latter a node
//! namespace with two pods and an "external" host behind its uplink; and both
//! plugins again with `ipMasq: true`, where the external host has no route to the
//! pods, so only masqueraded traffic gets answers: once with IPv4 pods, once with
//! dual-stack pods measured on IPv6 (the uplink then has an IPv6 subnet too); and
//! both plugins again with kube-proxy's iptables-mode rules for one Service in
//! the node namespace (the ClusterIP table). The port-mapping table has its own
//! nodes, one per plugin and number of mappings.
use std::{net::IpAddr, path::Path};

use serde_json::{json, Value};
use sluice_testbed::kube_proxy::{self, Endpoint, Mode, Port, Protocol, Proxy, Service};

use super::{
    agent_apply,
    conflist::Conflist,
    hostport::{self, Mapping},
};
use crate::{build::Binaries, testbed::Testbed};

use anyhow::{bail, Context, Result};

/// The address family a setup's traffic figures use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Family {
    /// IPv4 pods, IPv4 uplink.
    V4,
    /// Dual-stack pods and uplink, measured on IPv6.
    V6,
}

impl Family {
    /// The pods' range of node `n` in this family.
    fn pods(self, n: u8) -> String {
        match self {
            Self::V4 => format!("10.{n}.0.0/24"),
            Self::V6 => format!("fd00:{n}::/64"),
        }
    }

    /// The `ipam` keys of node `n`: 10.`n`.0.0/24 with a default route; for
    /// IPv6 dual-stack, with `fd00:<n>::/64` and a default IPv6 route beside it.
    fn ipam(self, n: u8) -> Value {
        match self {
            Self::V4 => json!({
                "subnet": Self::V4.pods(n),
                "routes": [{"dst": "0.0.0.0/0"}],
            }),
            Self::V6 => json!({
                "ranges": [[{"subnet": Self::V4.pods(n)}], [{"subnet": Self::V6.pods(n)}]],
                "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
            }),
        }
    }

    /// Whether `ip` (an address, no prefix) is of this family.
    fn has(self, ip: &str) -> bool {
        ip.contains(':') == (self == Self::V6)
    }

    /// `iptables-save` or `ip6tables-save`.
    fn iptables_save(self) -> &'static str {
        match self {
            Self::V4 => "iptables-save",
            Self::V6 => "ip6tables-save",
        }
    }
}

/// The uplink's IPv6 subnet of node `n`: `fd01:<n>::1` the node,
/// `fd01:<n>::2` the external host.
fn uplink6(n: u8) -> (String, String) {
    (format!("fd01:{n}::1"), format!("fd01:{n}::2"))
}

/// Where traffic of each figure goes, for one setup.
pub(super) struct Setup {
    /// Namespace indexes in the testbed.
    pub pod1: usize,
    pub pod2: usize,
    pub pod2_ip: String,
    pub pod1_ip: String,
    pub ext: usize,
    pub ext_ip: String,
    /// The node's uplink address the external host sees masqueraded traffic
    /// come from (none for the bare veth pair).
    pub node_ip: Option<String>,
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
        node_ip: None,
        cni: None,
    })
}

/// A node with an uplink to an external host and two pods attached by `plugin`
/// with `conf`, its traffic figures in `family`. `n` numbers the subnets so the
/// setups never overlap. With `masq`, the external host has no route to the
/// pods, and masquerade is checked to be at work (the external host sees the
/// node's address) before anything is measured.
fn node_with_pods(
    tb: &mut Testbed,
    tag: &str,
    (n, family): (u8, Family),
    plugin: &std::path::Path,
    conf: Value,
    masq: bool,
) -> Result<Setup> {
    let pods = Family::V4.pods(n);
    let (node, ext, up) = tb.node_with_uplink(tag, n, (!masq).then_some(pods.as_str()))?;
    let (node_ip, ext_ip) = match family {
        Family::V4 => (up.node_ip, up.ext_ip),
        Family::V6 => {
            let (node_ip, ext_ip) = uplink6(n);
            let pods6 = family.pods(n);
            tb.uplink6(
                node,
                ext,
                &up,
                (&node_ip, &ext_ip),
                (!masq).then_some(&pods6),
            )?;
            (node_ip, ext_ip)
        }
    };
    let pod1 = tb.netns(&format!("{tag}-p1"))?;
    let pod2 = tb.netns(&format!("{tag}-p2"))?;
    let mut ips = Vec::new();
    for (i, pod) in [pod1, pod2].into_iter().enumerate() {
        let r = tb.cni(node, plugin, "ADD", &conf, &format!("{tag}{i}"), Some(pod))?;
        ips.push(pod_address(&r, family)?);
    }
    let s = Setup {
        pod1,
        pod2,
        pod1_ip: ips[0].clone(),
        pod2_ip: ips[1].clone(),
        ext,
        ext_ip,
        node_ip: Some(node_ip),
        cni: Some(CniSetup {
            node,
            conf,
            plugin: plugin.to_path_buf(),
        }),
    };
    if masq {
        check_masquerade(tb, tag, &s, family)?;
    }
    Ok(s)
}

/// The pod's first address of `family` in an ADD result (without its prefix).
fn pod_address(result: &Value, family: Family) -> Result<String> {
    result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["address"].as_str())
        .map(|a| a.split('/').next().unwrap_or(a))
        .find(|a| family.has(a))
        .map(str::to_string)
        .with_context(|| format!("ADD result without an {family:?} address: {result}"))
}

/// Fails unless a TCP connection from the setup's first pod reaches the
/// external host with the node's uplink address as its source.
fn check_masquerade(tb: &Testbed, tag: &str, s: &Setup, family: Family) -> Result<()> {
    let node_ip = s
        .node_ip
        .as_deref()
        .context("a masquerade setup without a node")?;
    let seen =
        super::measure::source_seen(tb.ns(s.pod1), tb.ns(s.ext), &s.ext_ip).with_context(|| {
            format!(
                "{tag}: pod {} -> external host {}: is masquerade on?{}",
                s.pod1_ip,
                s.ext_ip,
                if family == Family::V6 {
                    " (Sluice masquerades IPv6 on kernels with the NAT sweeper, 5.15 on: docs/kernels.md)"
                } else {
                    ""
                }
            )
        })?;
    if seen.to_string() != node_ip {
        bail!(
            "{tag}: the external host saw pod {} -> {} come from {seen}, not from the node's {node_ip}: not masqueraded",
            s.pod1_ip,
            s.ext_ip
        );
    }
    eprintln!(
        "bench: {tag}: pod {} -> {} arrives from {seen} (masqueraded)",
        s.pod1_ip, s.ext_ip
    );
    Ok(())
}

/// bridge + host-local, as the reference plugins' users run them.
pub(super) fn reference(tb: &mut Testbed) -> Result<Setup> {
    reference_with(tb, "ref", (81, Family::V4), false)
}

/// The same with `ipMasq: true`: the bridge plugin adds an iptables (for an
/// IPv6 range, ip6tables) MASQUERADE chain in the node namespace, which
/// `nf_conntrack` and `nf_nat` carry out. `V6`: dual-stack pods, both
/// families masqueraded.
pub(super) fn reference_masq(tb: &mut Testbed, family: Family) -> Result<Setup> {
    match family {
        Family::V4 => reference_with(tb, "rmq", (83, family), true),
        Family::V6 => reference_with(tb, "rm6", (93, family), true),
    }
}

/// The reference bridge plugin's config: a gateway bridge `bridge`, host-local
/// on `family`'s ranges of node `n` (see [`Family::ipam`]), its data under the
/// testbed's dir.
pub(super) fn bridge_conf(
    tb: &Testbed,
    tag: &str,
    bridge: &str,
    (n, family): (u8, Family),
    masq: bool,
) -> Value {
    let mut ipam = family.ipam(n);
    ipam["type"] = json!("host-local");
    ipam["dataDir"] = json!(tb.dir.join(format!("{tag}-ipam")));
    json!({
        "type": "bridge",
        "bridge": bridge,
        "isGateway": true,
        "ipMasq": masq,
        "ipam": ipam,
    })
}

fn reference_with(tb: &mut Testbed, tag: &str, at: (u8, Family), masq: bool) -> Result<Setup> {
    let mut conf = bridge_conf(tb, tag, &format!("br{tag}0"), at, masq);
    conf["cniVersion"] = json!("1.0.0");
    conf["name"] = json!(format!("bench{tag}"));
    let s = node_with_pods(
        tb,
        tag,
        at,
        std::path::Path::new("/usr/lib/cni/bridge"),
        conf,
        masq,
    )?;
    if masq {
        check_masquerade_rule(tb, tag, &s, at.1)?;
    }
    Ok(s)
}

/// Fails unless the node namespace's (ip6)tables nat table has the bridge
/// plugin's MASQUERADE rule (in the node's namespace: the host's own rules are
/// never read or touched).
fn check_masquerade_rule(tb: &Testbed, tag: &str, s: &Setup, family: Family) -> Result<()> {
    let node = tb.ns(s
        .cni
        .as_ref()
        .context("a reference setup without a node")?
        .node);
    let save = family.iptables_save();
    let rules = crate::cmd::stdout(node.command(save).args(["-t", "nat"]))?;
    if !rules.lines().any(|l| l.contains("-j MASQUERADE")) {
        bail!(
            "{tag}: no MASQUERADE rule in {}'s {save} -t nat:\n{rules}",
            node.name()
        );
    }
    Ok(())
}

/// Sluice's config (without name/cniVersion) for node `tag`: its own pin
/// root, state and IPAM directories, the built-in IPAM on `family`'s ranges of
/// node `n` (see [`Family::ipam`]), and the keys of `extra`.
pub(super) fn sluice_conf(
    tb: &Testbed,
    tag: &str,
    (n, family): (u8, Family),
    extra: Value,
) -> Value {
    let mut ipam = family.ipam(n);
    ipam["type"] = json!("sluice");
    ipam["dataDir"] = json!(tb.dir.join(format!("{tag}-ipam")));
    let mut conf = json!({
        "type": "sluice",
        "pinRoot": tb.pin_root(tag),
        "stateDir": tb.dir.join(format!("{tag}-state")),
        "ipam": ipam,
    });
    if let (Some(c), Value::Object(extra)) = (conf.as_object_mut(), extra) {
        c.extend(extra);
    }
    conf
}

/// Sluice with its defaults (`cls_bpf` pod attachment, XDP auto on the uplink).
pub(super) fn sluice(tb: &mut Testbed, bins: &Binaries) -> Result<Setup> {
    sluice_with(tb, bins, "sl", (82, Family::V4), false, json!({}))
}

/// The same with `ipMasq: true`: SNAT on the uplink's tc egress, replies back
/// through its tc ingress (Sluice's own NAT maps, no `nf_conntrack`). `V6`:
/// dual-stack pods, IPv6 leaving with the uplink's first global IPv6 address
/// (the default `masqueradeAddress`).
///
/// The node runs the node agent's NAT sweep (`sluice-node sweep`), as a
/// cluster node's `route-sync` does: idle flows go from process context, and
/// the in-kernel sweeper, in hard interrupt context, stands back. Its log is
/// `<tag>-agent.log` in the testbed's directory.
pub(super) fn sluice_masq(tb: &mut Testbed, bins: &Binaries, family: Family) -> Result<Setup> {
    let (tag, n) = masq_node(family);
    let setup = sluice_with(tb, bins, tag, (n, family), true, json!({}))?;
    let pin_root = setup
        .cni
        .as_ref()
        .and_then(|c| c.conf["pinRoot"].as_str())
        .context("the masquerade node's config has no pinRoot")?
        .to_string();
    if !start_agent(tb, bins, tag, "sweep", None, &pin_root)? {
        eprintln!("bench: no sluice-node binary: the masquerade node's in-kernel sweeper sweeps");
    }
    Ok(setup)
}

/// Starts `sluice-node <duty>` for the datapath pinned at `pin_root`, inside
/// the namespace `netns` when given (a duty that follows the node's
/// addresses must run there), kept until the testbed goes. Its log is
/// `<tag>-agent.log` in the testbed's directory. `false`: no `sluice-node`
/// binary (a guest's prebuilt binaries may come without it).
pub(super) fn start_agent(
    tb: &mut Testbed,
    bins: &Binaries,
    tag: &str,
    duty: &str,
    netns: Option<&Path>,
    pin_root: &str,
) -> Result<bool> {
    if !bins.node.is_file() {
        return Ok(false);
    }
    let log_path = tb.dir.join(format!("{tag}-agent.log"));
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    // Into `netns` with `nsenter` (which execs the agent, one process), not
    // from a thread that entered it: `PR_SET_PDEATHSIG` fires when the thread
    // that made the child ends, and such a thread ends at once.
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = std::process::Command::new("nsenter");
            c.arg(format!("--net={}", ns.display()))
                .arg("--")
                .arg(&bins.node);
            c
        }
        None => std::process::Command::new(&bins.node),
    };
    cmd.args([duty, "--pin-root", pin_root])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log);
    // An interrupted bench leaves no agent behind.
    sluice_testbed::exec::die_with_parent(&mut cmd);
    let agent = cmd
        .spawn()
        .with_context(|| format!("starting {} {duty}", bins.node.display()))?;
    tb.keep_process(agent);
    Ok(true)
}

/// The tag and subnet number of Sluice's masquerade node for `family`.
const fn masq_node(family: Family) -> (&'static str, u8) {
    match family {
        Family::V4 => ("smq", 84),
        Family::V6 => ("sm6", 94),
    }
}

/// What the node agent on the masquerade node `family` said of its sweep
/// passes: its last report (what they removed, how long a pass took), or
/// why there is none.
pub(super) fn agent_report(tb: &Testbed, family: Family) -> String {
    let (tag, _) = masq_node(family);
    let Ok(log) = std::fs::read_to_string(tb.dir.join(format!("{tag}-agent.log"))) else {
        return "none: the agent did not run (no sluice-node binary), the in-kernel sweeper swept"
            .into();
    };
    log.lines()
        .rev()
        .find(|l| l.contains("a pass took"))
        .map_or_else(
            || "none yet (it reports once a minute, when it removed flows)".into(),
            |l| format!("`{l}`"),
        )
}

/// Sluice with netkit pods (`podDevice: netkit`, Linux 6.7+), otherwise as
/// [`sluice`]: `None` where the kernel makes no netkit devices.
pub(super) fn sluice_netkit(tb: &mut Testbed, bins: &Binaries) -> Result<Option<Setup>> {
    if !has_netkit(tb)? {
        return Ok(None);
    }
    sluice_with(
        tb,
        bins,
        "snk",
        (95, Family::V4),
        false,
        json!({"podDevice": "netkit"}),
    )
    .map(Some)
}

/// Whether this kernel makes netkit pairs, tried in a namespace of the
/// testbed's own (removed with it).
fn has_netkit(tb: &mut Testbed) -> Result<bool> {
    let ns = tb.netns("nkprobe")?;
    Ok(tb.ns(ns).makes_netkit())
}

/// Sluice's node `tag` with `ipMasq: masq` and the config keys `extra`.
fn sluice_with(
    tb: &mut Testbed,
    bins: &Binaries,
    tag: &str,
    at: (u8, Family),
    masq: bool,
    mut extra: Value,
) -> Result<Setup> {
    extra["ipMasq"] = json!(masq);
    let mut conf = sluice_conf(tb, tag, at, extra);
    conf["cniVersion"] = json!("1.1.0");
    conf["name"] = json!(format!("bench{tag}"));
    node_with_pods(tb, tag, at, &bins.sluice, conf, masq)
}

/// The Service range of the ClusterIP table's nodes (Sluice's `serviceCIDRs`).
pub(super) const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The ClusterIP of the one Service on those nodes.
pub(super) const CLUSTER_IP: &str = "10.96.0.10";
/// kube-proxy's `--hostname-override` on those nodes (the endpoint's node).
const KUBE_NODE: &str = "bench-node";

/// bridge + host-local (`ipMasq` false, as [`reference`]) with kube-proxy's
/// iptables-mode rules for one Service in the node namespace.
pub(super) fn clusterip_reference(tb: &mut Testbed) -> Result<Setup> {
    let (tag, at) = ("rci", (97, Family::V4));
    let s = reference_with(tb, tag, at, false)?;
    check_bridge_nf(tb, tag, &s)?;
    with_kube_proxy(tb, tag, at.0, &s)?;
    check_cluster_ip(tb, tag, &s, None)?;
    Ok(s)
}

/// Sluice (as [`sluice`]) with `serviceCIDRs`, and kube-proxy's iptables-mode
/// rules for one Service in the node namespace.
pub(super) fn clusterip_sluice(tb: &mut Testbed, bins: &Binaries) -> Result<Setup> {
    let (tag, at) = ("sci", (98, Family::V4));
    let extra = json!({"serviceCIDRs": [SERVICE_CIDR]});
    let s = sluice_with(tb, bins, tag, at, false, extra)?;
    with_kube_proxy(tb, tag, at.0, &s)?;
    check_cluster_ip(tb, tag, &s, Some(bins))?;
    Ok(s)
}

/// The ClusterIP table's Service: [`CLUSTER_IP`] with the sockperf and
/// `conn-loop` ports (TCP), each onto the same port of the setup's second pod,
/// so only the address changes.
fn bench_service(s: &Setup) -> Result<Service> {
    let vip: IpAddr = CLUSTER_IP.parse()?;
    let pod2: IpAddr = s
        .pod2_ip
        .parse()
        .with_context(|| format!("pod address {}", s.pod2_ip))?;
    let port = |name: &str, p: u16| Port::new(name, Protocol::Tcp, p, p);
    let mut svc = Service::new(
        "default",
        "bench",
        vip,
        vec![
            port("sockperf", super::measure::SOCKPERF_PORT),
            port("conn-loop", super::measure::CONN_LOOP_PORT),
        ],
    );
    svc.endpoints = vec![Endpoint::new(pod2, KUBE_NODE)];
    Ok(svc)
}

/// Writes kube-proxy's iptables-mode rules for [`bench_service`] into the
/// setup's node namespace (`sluice_testbed::kube_proxy`: the real
/// `iptables-restore`, kube-proxy's chains and sysctls): node IP the uplink's
/// address, `--cluster-cidr` the node's pod subnet (`n`), so pods' traffic is
/// not masqueraded.
fn with_kube_proxy(tb: &Testbed, tag: &str, n: u8, s: &Setup) -> Result<()> {
    let cni = s.cni.as_ref().context("a ClusterIP setup without a node")?;
    let node_ip: IpAddr = s
        .node_ip
        .as_deref()
        .context("a ClusterIP setup without a node address")?
        .parse()?;
    let mut proxy = Proxy::new(Mode::Iptables, false, KUBE_NODE, vec![node_ip]);
    proxy.cluster_cidr = Some(Family::V4.pods(n));
    let svc = bench_service(s)?;
    let rendered = kube_proxy::apply(&tb.ns(cni.node).path(), &proxy, &[svc])
        .map_err(|e| anyhow::anyhow!("{tag}: kube-proxy's rules: {e}"))?;
    eprintln!(
        "bench: {tag}: kube-proxy's iptables-mode rules for {CLUSTER_IP} written ({} lines)",
        rendered.to_string().lines().count()
    );
    Ok(())
}

/// Fails unless the reference ClusterIP node's bridge hands bridged packets
/// to iptables (`net.bridge.bridge-nf-call-iptables` 1 in the node namespace,
/// `br_netfilter`; the kernel's default for a new namespace), as kube-proxy
/// needs of a bridge CNI: an endpoint's replies to a pod on the same bridge
/// would otherwise skip conntrack and never be translated back. Read, never
/// written.
fn check_bridge_nf(tb: &Testbed, tag: &str, s: &Setup) -> Result<()> {
    const KEY: &str = "net.bridge.bridge-nf-call-iptables";
    let cni = s.cni.as_ref().context("a ClusterIP setup without a node")?;
    let node = tb.ns(cni.node);
    let out = crate::cmd::stdout(node.command("sysctl").args(["-n", KEY])).with_context(|| {
        format!(
            "{tag}: reading {KEY} in {} (is br_netfilter there?)",
            node.name()
        )
    })?;
    if out.trim() != "1" {
        bail!(
            "{tag}: {KEY} is {} in {}: the bridge would not pass the endpoint's replies \
             to conntrack (kube-proxy needs br_netfilter and this at 1)",
            out.trim(),
            node.name()
        );
    }
    Ok(())
}

/// Fails unless a TCP connection from the setup's first pod to each port of
/// the Service at [`CLUSTER_IP`] is answered by a listener on the second pod's
/// address (a byte each way), which sees the first pod's own address; on a
/// Sluice node (`bins` given), unless its counters say it handed the packets
/// to the stack (`from_pod_to_service`) and remembered the flows the stack
/// delivered (`kernel_flow_new`).
fn check_cluster_ip(tb: &Testbed, tag: &str, s: &Setup, bins: Option<&Binaries>) -> Result<()> {
    let vip: IpAddr = CLUSTER_IP.parse()?;
    let pod2: IpAddr = s.pod2_ip.parse()?;
    for port in [
        super::measure::SOCKPERF_PORT,
        super::measure::CONN_LOOP_PORT,
    ] {
        let to = std::net::SocketAddr::new(vip, port);
        let listen = std::net::SocketAddr::new(pod2, port);
        let seen = super::measure::answered_through(tb.ns(s.pod1), tb.ns(s.pod2), to, listen)
            .with_context(|| {
                format!(
                    "{tag}: pod {} -> ClusterIP {to} -> pod {listen}: are kube-proxy's rules \
                     and the Service's path at work?",
                    s.pod1_ip
                )
            })?;
        if seen.to_string() != s.pod1_ip {
            bail!(
                "{tag}: pod {listen} saw pod {}'s connection to {to} come from {seen}, not from \
                 the pod's own address",
                s.pod1_ip
            );
        }
    }
    if let Some(bins) = bins {
        let mut c = std::process::Command::new(&bins.sluicectl);
        c.args(["--pin-root", &tb.pin_root(tag).display().to_string()])
            .args(["counters", "--json"]);
        let out = crate::cmd::stdout(&mut c)?;
        let v: Value =
            serde_json::from_str(&out).with_context(|| format!("sluicectl counters: {out}"))?;
        for counter in ["from_pod_to_service", "kernel_flow_new"] {
            if v["node"][counter].as_u64().unwrap_or(0) == 0 {
                bail!(
                    "{tag}: the connections to {CLUSTER_IP} were answered, but Sluice's counter \
                     {counter} is 0: not the Service path (sluicectl counters: {out})"
                );
            }
        }
    }
    eprintln!(
        "bench: {tag}: pod {} -> {CLUSTER_IP} answered by pod {} (through kube-proxy's rules)",
        s.pod1_ip, s.pod2_ip
    );
    Ok(())
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
    let pod_ip = pod_address(&a.result, Family::V4)?;
    Ok(HpSetup {
        tag,
        node,
        ext,
        pod,
        node_ip: up.node_ip,
        pod_ip,
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
                bridge_conf(tb, &tag, &format!("br{tag}"), (n, Family::V4), false),
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
                (n, Family::V4),
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
    let pods = Family::V4.pods(n);
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
            s.pods.push((pod, pod_address(&a.result, Family::V4)?));
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
                bridge_conf(tb, tag, &format!("br{tag}"), (n, Family::V4), false),
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
            sluice_conf(
                tb,
                tag,
                (n, Family::V4),
                json!({"capabilities": {"bandwidth": true}}),
            ),
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

// --- the Services table -----------------------------------------------------------

/// Services in the cluster of each Services-table node, one node per count
/// and way of translating them.
pub(super) const SVC_SIZES: [usize; 3] = [1, 1_000, 10_000];

/// The Services of a node with `n` of them: [`bench_service`] in the middle
/// of the list (kube-proxy writes one `KUBE-SERVICES` rule per Service port
/// in its map's order, so a connection passes half of them on average), the
/// others on `10.96.1.1` on, port 80, each with the second pod as endpoint.
fn many_services(s: &Setup, n: usize) -> Result<Vec<Service>> {
    let pod2: IpAddr = s.pod2_ip.parse()?;
    let mut out = Vec::with_capacity(n);
    for k in 0..n.saturating_sub(1) {
        let vip = IpAddr::from([
            10,
            96,
            u8::try_from(1 + k / 250)?,
            u8::try_from(k % 250 + 1)?,
        ]);
        let mut svc = Service::new(
            "default",
            &format!("svc-{k:05}"),
            vip,
            vec![Port::new("http", Protocol::Tcp, 80, 80)],
        );
        svc.endpoints = vec![Endpoint::new(pod2, KUBE_NODE)];
        out.push(svc);
    }
    out.insert(out.len() / 2, bench_service(s)?);
    Ok(out)
}

/// Sluice with `serviceCIDRs` and kube-proxy's iptables-mode rules for
/// `n` Services (Services-table node `i`).
pub(super) fn services_kube_proxy(
    tb: &mut Testbed,
    bins: &Binaries,
    n: usize,
    i: usize,
) -> Result<Setup> {
    let tag = format!("skp{i}");
    let at = (120 + u8::try_from(i)?, Family::V4);
    let extra = json!({"serviceCIDRs": [SERVICE_CIDR]});
    let s = sluice_with(tb, bins, &tag, at, false, extra)?;
    let cni = s.cni.as_ref().context("a Services setup without a node")?;
    let node_ip: IpAddr = s
        .node_ip
        .as_deref()
        .context("a Services setup without a node address")?
        .parse()?;
    let mut proxy = Proxy::new(Mode::Iptables, false, KUBE_NODE, vec![node_ip]);
    proxy.cluster_cidr = Some(Family::V4.pods(at.0));
    let rendered = kube_proxy::apply(&tb.ns(cni.node).path(), &proxy, &many_services(&s, n)?)
        .map_err(|e| anyhow::anyhow!("{tag}: kube-proxy's rules: {e}"))?;
    eprintln!(
        "bench: {tag}: kube-proxy's iptables-mode rules for {n} Services written ({} lines)",
        rendered.to_string().lines().count()
    );
    check_cluster_ip(tb, &tag, &s, Some(bins))?;
    Ok(s)
}

/// Sluice translating `n` Services itself (Services-table node `i`):
/// `sluice-node proxy` against the stand-in API server (`apiserver`, the
/// tests' own) serving the Services and their EndpointSlices writes the
/// node's Service maps and attaches the socket hooks to `cgroup`, which
/// the figures' clients join; its apply times come back with the node.
pub(super) fn services_sluice(
    tb: &mut Testbed,
    bins: &Binaries,
    (apiserver, cgroup): (&Path, &Path),
    n: usize,
    i: usize,
) -> Result<(Setup, ApplyTimes)> {
    let tag = format!("ssv{i}");
    let at = (123 + u8::try_from(i)?, Family::V4);
    let s = sluice_with(tb, bins, &tag, at, false, json!({}))?;
    let cni = s.cni.as_ref().context("a Services setup without a node")?;
    let netns = tb.ns(cni.node).path();
    let mut api = agent_apply::StandIn::start(apiserver, &netns)?;
    let services = many_services(&s, n)?;
    let mut ports = 0;
    for svc in &services {
        let (service, slice) = agent_apply::objects(svc);
        api.put("services", &service)?;
        api.put("endpointslices", &slice)?;
        ports += svc.ports.len();
    }
    let kubeconfig = agent_apply::kubeconfig_file(&tag, &api.kubeconfig())?;
    let pin = tb.pin_root(&tag);
    let started =
        agent_apply::Agent::start(&bins.node, &netns, &kubeconfig, (&pin, cgroup, KUBE_NODE));
    // The agent reads its kubeconfig at its start: the file goes once it
    // has written everything (or failed).
    let cold = started.and_then(|(mut agent, t0)| {
        let written = agent.wait_for(agent_apply::COLD, |l| agent_apply::wrote(l, ports))?;
        Ok((agent, written - t0))
    });
    let _ = std::fs::remove_file(&kubeconfig);
    let (mut agent, cold) = cold?;
    agent.wait_for(agent_apply::CHANGE, |l| {
        l.contains("Service socket hooks attached")
    })?;
    let mut times = ApplyTimes {
        cold_ms: cold.as_secs_f64() * 1e3,
        change_ms: Vec::new(),
    };
    // One endpoint change at a time, on a Service the figures do not use:
    // a second endpoint added, then taken away again.
    let bench_vip: IpAddr = CLUSTER_IP.parse()?;
    if let Some(probe) = services.iter().find(|x| x.cluster_ip != bench_vip) {
        let pod2: IpAddr = s.pod2_ip.parse()?;
        let extra = IpAddr::from([10, 255, 0, 7]);
        for k in 0..APPLY_CHANGES {
            let eps: Vec<(IpAddr, &str)> = if k % 2 == 0 {
                vec![(pod2, KUBE_NODE), (extra, KUBE_NODE)]
            } else {
                vec![(pod2, KUBE_NODE)]
            };
            let stored = api.put("endpointslices", &agent_apply::slice(probe, &eps))?;
            let seen = agent.wait_for(agent_apply::CHANGE, |l| agent_apply::wrote(l, 1))?;
            times.change_ms.push((seen - stored).as_secs_f64() * 1e3);
        }
    }
    eprintln!(
        "bench: {tag}: sluice-node proxy wrote {ports} Service ports ({} Services) in {:.0} ms, socket hooks on {}",
        services.len(),
        times.cold_ms,
        cgroup.display()
    );
    // The maps and hooks stay when the agent stops (as on a node).
    drop(agent);
    drop(api);
    Ok((s, times))
}

/// Endpoint changes timed per Sluice node of the Services table.
const APPLY_CHANGES: usize = 40;

/// The agent's apply times on one node (milliseconds).
#[derive(Clone, Debug, Default)]
pub(super) struct ApplyTimes {
    /// From its start to every Service port written.
    pub cold_ms: f64,
    /// From one EndpointSlice stored in the API to its port rewritten.
    pub change_ms: Vec<f64>,
}

// --- the NetworkPolicy table -------------------------------------------------------

/// Sluice with its defaults (as [`sluice`]) for NetworkPolicy-table node `i`:
/// the first pod the client, the second the server. Whether policy is on is
/// up to the agent the table starts (or not) on it.
pub(super) fn policy_node(tb: &mut Testbed, bins: &Binaries, i: usize) -> Result<(String, Setup)> {
    let tag = format!("spo{i}");
    let at = (130 + u8::try_from(i)?, Family::V4);
    let s = sluice_with(tb, bins, &tag, at, false, json!({}))?;
    Ok((tag, s))
}
