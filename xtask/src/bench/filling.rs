//! The "node filling up" table: how ADD and DEL cost changes as a node goes
//! from no pods to `FILL_PODS`. Four nodes (bridge + host-local and Sluice,
//! each once without mappings and once with a hostPort per pod, the reference
//! then with portmap) take the same pods one by one, then give them back in
//! reverse, one node at a time: while a node fills, the machine holds only its
//! pods, as a real node holds only its own plugin's. (Filling all four at once
//! measured each plugin among 4,000 veth pairs, three quarters of them another
//! node's: the kernel's machine-wide lists, such as the tc blocks every clsact
//! qdisc joins, grew with pods no real node has.) "At N pods" is the median of
//! the `FILL_WINDOW` ADDs that brought the node to N pods, and of the
//! `FILL_WINDOW` DELs that started from N pods, once per round: the nodes
//! take turns `FILL_ROUNDS` times and the table shows the median round with
//! the range (one round's growth moved by about 0.2x between runs, as much as
//! the 1.2x target leaves). Beside each Sluice node's pods in those windows,
//! a bare veth pair made and removed with `ip` (`KERNEL_FILL`) is the limit:
//! what the kernel itself takes for the pair every plugin's ADD and DEL pay.
use std::{
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::{Context, Result};
use serde_json::{json, Value};
use sluice_testbed::exec;

use super::{
    conflist::in_netns,
    conflist::{Attachment, Conflist},
    hostport::Cgroup,
    measure,
    report::{filling, Figure, Report, KERNEL_FILL, REFERENCE_FILL, SLUICE_FILL},
    topology,
};
use crate::{build::Binaries, testbed::Testbed};

/// Pods each node takes.
pub(super) const FILL_PODS: usize = 1_000;
/// The node sizes the table shows (each at most `FILL_PODS`, at least `FILL_WINDOW`).
pub(super) const FILL_AT: [usize; 3] = [20, 500, 1_000];
/// Seconds between one node's last DEL and the next node's first ADD.
pub(super) const FILL_SETTLE_SECS: u64 = 3;
/// ADDs (DELs) each median is taken over.
pub(super) const FILL_WINDOW: usize = 20;
/// Times each node fills and empties.
pub(super) const FILL_ROUNDS: usize = 3;
/// The pods' interface (each node runs alone, so all use the runtime's usual name).
const POD_IFNAME: &str = "eth0";
/// The container port of every mapping, and the first host port.
const CONTAINER_PORT: u16 = 80;
const FIRST_HOST_PORT: u16 = 40_000;

/// One node of the table.
pub(super) struct FillSetup {
    tag: String,
    node: usize,
    list: Conflist,
    /// A hostPort mapping per pod.
    hostport: bool,
    /// Setup index in the report (see [`filling`]).
    index: usize,
    /// The log of the node agent keeping this node's addresses, if one runs.
    agent_log: Option<PathBuf>,
}

/// The four nodes; `cgroup` for the Sluice node with mappings (its socket hooks).
pub(super) fn setups(tb: &mut Testbed, bins: &Binaries, cgroup: &Cgroup) -> Result<Vec<FillSetup>> {
    let mut out = Vec::new();
    for (k, hostport) in [false, true].into_iter().enumerate() {
        let n = 71 + 2 * u8::try_from(k)?;
        let tag = format!("rfl{k}");
        let mut plugins = vec![(
            "/usr/lib/cni/bridge".into(),
            wide(topology::bridge_conf(
                tb,
                &tag,
                &format!("br{tag}"),
                (n, topology::Family::V4),
                false,
            )),
        )];
        if hostport {
            plugins.push((
                "/usr/lib/cni/portmap".into(),
                json!({"type": "portmap", "capabilities": {"portMappings": true}}),
            ));
        }
        out.push(node(
            tb,
            tag,
            n,
            plugins,
            "1.0.0",
            (hostport, REFERENCE_FILL),
        )?);
        let n = n + 1;
        let tag = format!("sfl{k}");
        let extra = if hostport {
            json!({"capabilities": {"portMappings": true}, "hostPortCgroup": cgroup.path})
        } else {
            json!({})
        };
        let conf = wide(topology::sluice_conf(
            tb,
            &tag,
            (n, topology::Family::V4),
            extra,
        ));
        let pin_root = conf["pinRoot"]
            .as_str()
            .context("the filling node's config has no pinRoot")?
            .to_string();
        let plugins = vec![(bins.sluice.clone(), conf)];
        let mut setup = node(tb, tag, n, plugins, "1.1.0", (hostport, SLUICE_FILL))?;
        // The node agent keeps the node's addresses for hostPorts, as a
        // cluster node's route-sync does: ADDs then leave them alone.
        let ns = tb.ns(setup.node).path();
        if hostport
            && topology::start_agent(tb, bins, &setup.tag, "node-addrs", Some(&ns), &pin_root)?
        {
            setup.agent_log = Some(tb.dir.join(format!("{}-agent.log", setup.tag)));
        }
        out.push(setup);
    }
    Ok(out)
}

/// The plugin config with a /20 pod range (4,094 addresses) instead of the /24.
fn wide(mut conf: Value) -> Value {
    if let Some(s) = conf["ipam"]["subnet"].as_str() {
        let wide = s.replace("/24", "/20");
        conf["ipam"]["subnet"] = json!(wide);
    }
    conf
}

fn node(
    tb: &mut Testbed,
    tag: String,
    n: u8,
    plugins: Vec<(std::path::PathBuf, Value)>,
    cni_version: &str,
    (hostport, base): (bool, usize),
) -> Result<FillSetup> {
    let (node, _, _) = tb.node_with_uplink(&tag, n, None)?;
    Ok(FillSetup {
        list: Conflist {
            name: format!("bench{tag}"),
            cni_version: cni_version.into(),
            plugins,
        },
        tag,
        node,
        hostport,
        index: base,
        agent_log: None,
    })
}

/// Fills each node to `FILL_PODS` pods and empties it again, one node at a
/// time (the others hold no pods meanwhile, as on a real node only one
/// plugin's pods are), `FILL_ROUNDS` times in turn, timing each ADD and DEL,
/// and records each round's medians at `FILL_AT`.
pub(super) fn run(tb: &mut Testbed, setups: &[FillSetup], r: &mut Report) -> Result<()> {
    let pods = (0..FILL_PODS)
        .map(|i| tb.netns(&format!("fl{i}")))
        .collect::<Result<Vec<_>>>()?;
    for round in 0..FILL_ROUNDS {
        for s in setups {
            settle();
            eprintln!(
                "bench: filling: {} alone, round {}/{FILL_ROUNDS}",
                s.tag,
                round + 1
            );
            let (times, kernel) = fill_and_empty(tb, s, &pods, round)?;
            let hostport = s.hostport;
            for (at, n) in FILL_AT.iter().enumerate() {
                let window = n - FILL_WINDOW..*n;
                for (base, (adds, dels)) in [(s.index, &times), (KERNEL_FILL, &kernel)] {
                    if adds.is_empty() {
                        continue;
                    }
                    let (add, _) = measure::p50_p99(adds[window.clone()].to_vec());
                    let (del, _) = measure::p50_p99(dels[window.clone()].to_vec());
                    let index = filling(base, at);
                    r.add(Figure::FillAddP50 { hostport }, index, add);
                    r.add(Figure::FillDelP50 { hostport }, index, del);
                }
            }
        }
    }
    Ok(())
}

/// Lets the kernel's deferred work from the node before (veth teardown,
/// namespace cleanup, `nf_tables`) finish before the next node starts.
fn settle() {
    std::thread::sleep(std::time::Duration::from_secs(FILL_SETTLE_SECS));
}

/// ADD and DEL times (ms), both indexed by pod.
type Times = (Vec<f64>, Vec<f64>);

/// ADDs every pod to node `s`, first to last, then DELs them, last first;
/// returns the ADD and DEL times (ms), both indexed by pod (`dels[i]`: the DEL
/// of pod `i`, taken from a node holding `i + 1` pods). On a Sluice node, also
/// the kernel's own veth pair (see [`KernelPair`]) beside each pod of the
/// `FILL_AT` windows, the others' times 0; empty on the reference's.
fn fill_and_empty(
    tb: &Testbed,
    s: &FillSetup,
    pods: &[usize],
    round: usize,
) -> Result<(Times, Times)> {
    let node = tb.ns(s.node).path();
    let in_window = |i: usize| FILL_AT.iter().any(|n| (n - FILL_WINDOW..*n).contains(&i));
    let with_kernel = s.index == SLUICE_FILL;
    let mut kernel = if with_kernel {
        (vec![0.0; pods.len()], vec![0.0; pods.len()])
    } else {
        (Vec::new(), Vec::new())
    };
    let mut pairs: Vec<Option<KernelPair>> = Vec::with_capacity(pods.len());
    let mut adds = Vec::with_capacity(pods.len());
    let mut attached: Vec<Attachment> = Vec::with_capacity(pods.len());
    for (i, pod) in pods.iter().enumerate() {
        let host_port = FIRST_HOST_PORT + u16::try_from(i)?;
        let rc = if s.hostport {
            topology::port_mappings(&[(host_port, CONTAINER_PORT)])
        } else {
            json!({})
        };
        let (a, ms) = s
            .list
            .add_as(
                &node,
                (&format!("{}-{round}-{i}", s.tag), POD_IFNAME),
                &tb.ns(*pod).path(),
                rc,
            )
            .with_context(|| format!("{}: ADD of pod {i}", s.tag))?;
        adds.push(ms);
        attached.push(a);
        if i == 0 {
            if let Some(log) = &s.agent_log {
                wait_for_agent(log)?;
            }
        }
        pairs.push(if with_kernel && in_window(i) {
            let (pair, ms) = KernelPair::add(&node, i, tb.ns(*pod).name())?;
            kernel.0[i] = ms;
            Some(pair)
        } else {
            None
        });
        if (i + 1) % 250 == 0 {
            eprintln!("bench: filling: {} pods on {}", i + 1, s.tag);
        }
    }
    let mut dels = vec![0.0; pods.len()];
    for i in (0..pods.len()).rev() {
        if let Some(pair) = pairs.pop().flatten() {
            kernel.1[i] = pair.del(&node)?;
        }
        let a = attached
            .pop()
            .context("a pod attached fewer times than it was filled")?;
        dels[i] = s
            .list
            .del(&node, &a)
            .with_context(|| format!("{}: DEL of pod {i}", s.tag))?;
    }
    Ok(((adds, dels), kernel))
}

/// Waits (at most 10 s) until the node agent whose log is `log` keeps the
/// node's addresses: the first ADD loads the datapath, and the agent takes
/// its lease within a second of that; the ADDs timed after it then run as on
/// a node whose agent was there first.
fn wait_for_agent(log: &Path) -> Result<()> {
    let started = Instant::now();
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let last = text
            .lines()
            .rev()
            .find(|l| l.contains("kept for") || l.contains("read them themselves"));
        if last.is_some_and(|l| l.contains("kept for")) {
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "the node agent did not take the node addresses within 10 s; {}:\n{text}",
            log.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The limit of the filling table: a bare veth pair from the node into a pod's
/// namespace, made by one `ip link add` (host end up) and removed by one `ip
/// link del`, each a process spawned in the node namespace as a plugin is. Its
/// pod end is set up (untimed) before the removal, so the removal closes two
/// running devices as a pod's DEL does. It stays while its pod does, so the
/// removal is taken from a node holding as many pods as the pod's DEL.
struct KernelPair {
    host: String,
}

impl KernelPair {
    /// The pair beside pod `i` (in the namespace named `pod`); the time in ms.
    fn add(node: &Path, i: usize, pod: &str) -> Result<(Self, f64)> {
        let host = format!("klim{i}");
        let ms = ip_in(
            node,
            &[
                "link", "add", &host, "up", "type", "veth", "peer", "name", "klim", "netns", pod,
            ],
        )?;
        ip_in(node, &["-n", pod, "link", "set", "klim", "up"])?;
        Ok((Self { host }, ms))
    }

    /// Removes the pair; the time in ms.
    fn del(self, node: &Path) -> Result<f64> {
        ip_in(node, &["link", "del", &self.host])
    }
}

/// `ip args` run from a thread in `node`; the time in ms.
fn ip_in(node: &Path, args: &[&str]) -> Result<f64> {
    in_netns(node, || {
        let started = Instant::now();
        let out = exec::run(None, Path::new("ip"), args, &[], b"")?;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        anyhow::ensure!(out.success(), "ip {}: {out}", args.join(" "));
        Ok(ms)
    })
}
