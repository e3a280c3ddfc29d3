//! The NetworkPolicy table: a client pod's new connections and round trips
//! to a server pod on the same Sluice node, with 0, 100 and 1,000 rules
//! selecting the server (ingress), `sluice-node policy` running against the
//! tests' stand-in API server, beside the same node with policy off (no
//! agent at all: the datapath's one array read). Setups interleaved, the
//! order rotated from round to round, one value per round each; medians
//! with their range, as ratios against the node where policy is on and no
//! rule selects the pod. Also the agent's apply times: from its start to
//! its first "applied" line with every policy compiled, and from one
//! policy added or removed in the API to its next "applied" line.
//!
//! The rules: N policies (NetworkPolicy) each selecting the server pod
//! (`podSelector: {matchLabels: {app: server}}`) with one ingress rule
//! allowing a /32 of its own (10.200.x.y, see [`block_address`]) on TCP
//! [`BLOCK_PORT`], and one more allowing the client pod (by `podSelector`)
//! on the two benchmark ports: the client's flows are let in by one rule of
//! N+1, and the server's rule set holds N+1 prefixes in `sl_pol_rules`.
//!
//! Every measured connection is a new flow to the datapath's policy check:
//! the client's connections come from a port range (`1024-65535`, every
//! node's client alike) that one measurement never wraps, and before each
//! measurement on a node with rules, one of its policies changes port and
//! back again by turns ([`fresh_set`]), so the agent gives the server a new
//! rule set and no verdict of an earlier round (the same ports come round
//! again) is used. The `policy_new` counter, read around each measurement,
//! shows how many connections were checked.
use std::{
    cell::Cell,
    collections::BTreeMap,
    ffi::{OsStr, OsString},
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    path::Path,
    time::Duration,
};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::{
    agent_apply::{self, Agent, StandIn},
    conflist::in_netns,
    measure,
    report::thousands,
    topology::{self, Setup},
};
use crate::{
    build::Binaries,
    testbed::{Netns, Testbed},
};

/// Rules selecting the server pod on each node where policy is on.
pub(super) const RULES: [usize; 3] = [0, 100, 1_000];
/// The pods' namespace (a Namespace object of that name is served).
const NAMESPACE: &str = "bench";
/// The pods' `spec.nodeName`.
const NODE: &str = "bench-node";
/// The port of the ipBlock rules (no traffic of the bench uses it).
const BLOCK_PORT: u16 = 8080;
/// A port of the server no rule allows: a connection to it must be refused
/// where rules select the server (policy is enforced), and answered
/// elsewhere.
const CLOSED_PORT: u16 = 5999;
/// Policy changes timed on the node with the most rules (a policy added,
/// then removed again, in turn).
const CHANGES: usize = 20;
/// The name of the policy allowing the client.
const CLIENT_POLICY: &str = "allow-client";
/// The client pods' `ip_local_port_range`: more even ports (what `connect`
/// takes first) than the connections of one measurement.
const CLIENT_PORTS: &str = "1024 65535";

/// A column of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Column {
    /// No agent: policy off in the datapath.
    Off,
    /// `sluice-node policy` running, this many rules selecting the server.
    Rules(usize),
}

impl Column {
    fn all() -> Vec<Self> {
        let mut v = vec![Self::Off];
        v.extend(RULES.iter().map(|n| Self::Rules(*n)));
        v
    }

    fn name(self) -> String {
        match self {
            Self::Off => "policy off (no agent)".into(),
            Self::Rules(0) => "policy on, no rule selects the pod".into(),
            Self::Rules(n) => format!("{} rules", thousands(n)),
        }
    }

    /// Short, for the ratio columns.
    fn short(self) -> String {
        match self {
            Self::Off => "off".into(),
            Self::Rules(0) => "no rule".into(),
            Self::Rules(n) => format!("{} rules", thousands(n)),
        }
    }
}

/// One node of the table.
pub(super) struct PolSetup {
    column: Column,
    tag: String,
    setup: Setup,
    /// The agent and its stand-in API server (none with policy off), both
    /// running through the table; the agent stops first.
    agent: Option<(Agent, StandIn)>,
    /// Rule sets made by [`fresh_set`] so far.
    fresh: usize,
}

/// What the agent's "applied" line says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Counts {
    policies: usize,
    pods: usize,
    isolated: usize,
    entries: usize,
}

/// What the agent must report on a node with `blocks` ipBlock policies:
/// none at all for 0 (no rule selects the server), else those and the
/// client's, the server isolated, one rule entry per policy. Both pods are
/// on the node.
fn counts(blocks: usize) -> Counts {
    if blocks == 0 {
        return Counts {
            policies: 0,
            pods: 2,
            isolated: 0,
            entries: 0,
        };
    }
    Counts {
        policies: blocks + 1,
        pods: 2,
        isolated: 1,
        entries: blocks + 1,
    }
}

/// The agent's line after a pass that changed the maps: `sluice-node:
/// policy: N NetworkPolicies, M pods here (K isolated), R rule entries;
/// applied in X ms`: its counts and X.
fn applied(line: &str) -> Option<(Counts, f64)> {
    let rest = line.strip_prefix("sluice-node: policy: ")?;
    let (policies, rest) = rest.split_once(" NetworkPolicies, ")?;
    let (pods, rest) = rest.split_once(" pods here (")?;
    let (isolated, rest) = rest.split_once(" isolated), ")?;
    let (entries, rest) = rest.split_once(" rule entries; applied in ")?;
    let ms = rest.strip_suffix(" ms")?;
    Some((
        Counts {
            policies: policies.parse().ok()?,
            pods: pods.parse().ok()?,
            isolated: isolated.parse().ok()?,
            entries: entries.parse().ok()?,
        },
        ms.parse().ok()?,
    ))
}

/// The /32 of ipBlock policy `k`: 10.200.0.1 on, 250 per /24 (never a
/// pod's or node's address of the testbed).
fn block_address(k: usize) -> Ipv4Addr {
    let hi = u8::try_from(k / 250).unwrap_or(u8::MAX);
    let lo = u8::try_from(k % 250 + 1).unwrap_or(u8::MAX);
    Ipv4Addr::new(10, 200, hi, lo)
}

fn block_name(k: usize) -> String {
    format!("block-{k:05}")
}

/// The server's selector.
fn server_selector() -> Value {
    json!({"matchLabels": {"app": "server"}})
}

/// NetworkPolicy `k`: the server pod, ingress from [`block_address`]`(k)`
/// on TCP [`BLOCK_PORT`].
fn block_policy(k: usize) -> Value {
    block_policy_on(k, BLOCK_PORT)
}

/// The same on TCP `port`.
fn block_policy_on(k: usize, port: u16) -> Value {
    json!({
        "metadata": {"name": block_name(k), "namespace": NAMESPACE},
        "spec": {
            "podSelector": server_selector(),
            "policyTypes": ["Ingress"],
            "ingress": [{
                "from": [{"ipBlock": {"cidr": format!("{}/32", block_address(k))}}],
                "ports": [{"protocol": "TCP", "port": port}],
            }],
        },
    })
}

/// The policy letting the client pod reach the server on `ports` (TCP).
fn client_policy(ports: &[u16]) -> Value {
    json!({
        "metadata": {"name": CLIENT_POLICY, "namespace": NAMESPACE},
        "spec": {
            "podSelector": server_selector(),
            "policyTypes": ["Ingress"],
            "ingress": [{
                "from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                "ports": ports.iter().map(|p| json!({"protocol": "TCP", "port": p})).collect::<Vec<_>>(),
            }],
        },
    })
}

/// Pod `name` of [`NAMESPACE`] labelled `app: <app>`, running on [`NODE`]
/// with address `ip` (what the kubelet reports).
fn pod_object(name: &str, app: &str, ip: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": app}},
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "c0", "image": "registry.k8s.io/pause:3.10"}],
        },
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
    })
}

/// Namespace `name`, with the label kube-apiserver gives every namespace.
fn namespace_object(name: &str) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    })
}

/// Every node of the table, each checked (the closed port refused exactly
/// where rules select the server); the agent's apply times go to `r`.
pub(super) fn setups(
    tb: &mut Testbed,
    bins: &Binaries,
    apiserver: &Path,
    r: &mut Results,
) -> Result<Vec<PolSetup>> {
    if !bins.node.is_file() {
        bail!("the NetworkPolicy table needs sluice-node ($SLUICE_NODE_BIN with --prebuilt)");
    }
    let mut out = Vec::new();
    for (i, column) in Column::all().into_iter().enumerate() {
        let (tag, setup) = topology::policy_node(tb, bins, i)?;
        let range = format!("net.ipv4.ip_local_port_range={CLIENT_PORTS}");
        crate::cmd::run(tb.ns(setup.pod1).command("sysctl").args(["-qw", &range]))
            .with_context(|| format!("{tag}: the client's port range"))?;
        let agent = match column {
            Column::Off => None,
            Column::Rules(n) => Some(
                start_policy(tb, bins, apiserver, (&tag, &setup), n, r)
                    .with_context(|| format!("{tag}: sluice-node policy with {n} rules"))?,
            ),
        };
        let (client, server) = (tb.ns(setup.pod1), tb.ns(setup.pod2));
        let open = reaches(client, server, &setup.pod2_ip, CLOSED_PORT)?;
        let want_open = matches!(column, Column::Off | Column::Rules(0));
        if open != want_open {
            bail!(
                "{tag} ({}): a connection from the client to port {CLOSED_PORT} of the server \
                 (no rule allows it) was {}, not {}: is policy {}?",
                column.name(),
                if open { "answered" } else { "refused" },
                if want_open { "answered" } else { "refused" },
                if want_open {
                    "off for this pod"
                } else {
                    "enforced"
                },
            );
        }
        out.push(PolSetup {
            column,
            tag,
            setup,
            agent,
            fresh: 0,
        });
    }
    Ok(out)
}

/// On a node with rules: policy 0 moved to the other port (then back, by
/// turns), so that the server gets a rule set of a new id, and the agent's
/// pass done. The verdicts the datapath keeps are then stale: the next
/// connections are checked anew.
fn fresh_set(p: &mut PolSetup) -> Result<()> {
    let Column::Rules(n) = p.column else {
        return Ok(());
    };
    let Some((agent, api)) = &mut p.agent else {
        return Ok(());
    };
    if n == 0 {
        return Ok(());
    }
    p.fresh += 1;
    let port = if p.fresh % 2 == 1 {
        BLOCK_PORT + 1
    } else {
        BLOCK_PORT
    };
    api.put("networkpolicies", &block_policy_on(0, port))?;
    let want = counts(n);
    let seen = Cell::new(None);
    agent.wait_for(agent_apply::CHANGE, |l| {
        seen.set(applied(l).map(|(c, _)| c));
        seen.get().is_some()
    })?;
    if seen.get() != Some(want) {
        bail!(
            "{}: after policy 0's port change the agent applied {:?}, not {want:?}",
            p.tag,
            seen.get()
        );
    }
    Ok(())
}

/// The node's `policy_new` counter (new flows policy let in).
fn policy_new(bins: &Binaries, tb: &Testbed, tag: &str) -> Result<u64> {
    let mut c = std::process::Command::new(&bins.sluicectl);
    c.args(["--pin-root", &tb.pin_root(tag).display().to_string()])
        .args(["counters", "--json"]);
    let out = crate::cmd::stdout(&mut c)?;
    let v: Value =
        serde_json::from_str(&out).with_context(|| format!("sluicectl counters: {out}"))?;
    Ok(v["node"]["policy_new"].as_u64().unwrap_or(0))
}

/// Whether a TCP connection from `client` to `ip:port` is answered (a
/// listener of `server`'s there) within a second.
fn reaches(client: &Netns, server: &Netns, ip: &str, port: u16) -> Result<bool> {
    let ip: IpAddr = ip
        .parse()
        .with_context(|| format!("{ip}: not an address"))?;
    let to = SocketAddr::new(ip, port);
    let _listener = in_netns(&server.path(), || {
        TcpListener::bind(to).with_context(|| format!("binding {to} in {}", server.name()))
    })?;
    in_netns(&client.path(), || {
        Ok(TcpStream::connect_timeout(&to, Duration::from_secs(1)).is_ok())
    })
}

/// The stand-in API server with the Namespace, both Pods and `n` rules'
/// policies, then `sluice-node policy` on the node, timed to its first
/// "applied" line with every count as expected; on the node with the
/// most rules, [`CHANGES`] policy changes timed too.
fn start_policy(
    tb: &Testbed,
    bins: &Binaries,
    apiserver: &Path,
    (tag, s): (&str, &Setup),
    n: usize,
    r: &mut Results,
) -> Result<(Agent, StandIn)> {
    let cni = s.cni.as_ref().context("a policy setup without a node")?;
    let netns = tb.ns(cni.node).path();
    let state_dir = cni.conf["stateDir"]
        .as_str()
        .context("the policy node's config has no stateDir")?
        .to_string();
    let mut api = StandIn::start(apiserver, &netns)?;
    api.put("namespaces", &namespace_object(NAMESPACE))?;
    api.put("pods", &pod_object("client", "client", &s.pod1_ip))?;
    api.put("pods", &pod_object("server", "server", &s.pod2_ip))?;
    for k in 0..n {
        api.put("networkpolicies", &block_policy(k))?;
    }
    if n > 0 {
        let ports = [measure::SOCKPERF_PORT, measure::CONN_LOOP_PORT];
        api.put("networkpolicies", &client_policy(&ports))?;
    }
    let kubeconfig = agent_apply::kubeconfig_file(tag, &api.kubeconfig())?;
    let pin = tb.pin_root(tag);
    let args: Vec<OsString> = vec![
        "policy".into(),
        "--pin-root".into(),
        pin.into_os_string(),
        "--state-file".into(),
        tb.dir.join(format!("{tag}-policy.json")).into_os_string(),
    ];
    // The node's own attachment records (an agent that reads them finds
    // the pods' addresses there too), never the host's default directory.
    let env = [("SLUICE_CNI_STATE_DIR", OsStr::new(&state_dir))];
    let started = Agent::start_with(&bins.node, &netns, &kubeconfig, &args, &env);
    let want = counts(n);
    // The pass that has every policy (the last thing to arrive); the rest
    // of its counts are checked after, so that a surprise fails at once
    // instead of after the wait's limit.
    let own = Cell::new(None);
    let is_want = |l: &str, want: Counts| match applied(l) {
        Some((c, ms)) if c.policies == want.policies => {
            own.set(Some((c, ms)));
            true
        }
        _ => false,
    };
    let took = |want: Counts| -> Result<f64> {
        match own.take() {
            Some((c, ms)) if c == want => Ok(ms),
            got => bail!("the agent applied {got:?}, not {want:?}"),
        }
    };
    // The agent reads its kubeconfig at its start: the file goes once it
    // has applied everything (or failed).
    let cold = started.and_then(|(mut agent, t0)| {
        let done = agent.wait_for(agent_apply::COLD, |l| is_want(l, want))?;
        Ok((agent, done - t0))
    });
    let _ = std::fs::remove_file(&kubeconfig);
    let (mut agent, cold) = cold?;
    let own_ms = took(want)?;
    r.cold.insert(
        n,
        Apply {
            wall_ms: vec![cold.as_secs_f64() * 1e3],
            agent_ms: vec![own_ms],
        },
    );
    eprintln!(
        "bench: {tag}: sluice-node policy applied {} NetworkPolicies ({} rule entries) in {:.0} ms from its start ({:.0} ms its own pass)",
        want.policies,
        want.entries,
        cold.as_secs_f64() * 1e3,
        own_ms
    );
    if n == RULES[RULES.len() - 1] && n > 0 {
        // One more ipBlock policy added, then removed again, in turn.
        let mut change = Apply::default();
        for k in 0..CHANGES {
            let (stored, want) = if k % 2 == 0 {
                (api.put("networkpolicies", &block_policy(n))?, counts(n + 1))
            } else {
                (
                    api.delete("networkpolicies", NAMESPACE, &block_name(n))?,
                    counts(n),
                )
            };
            let seen = agent.wait_for(agent_apply::CHANGE, |l| is_want(l, want))?;
            change.wall_ms.push((seen - stored).as_secs_f64() * 1e3);
            change.agent_ms.push(took(want)?);
        }
        r.change = Some((n, change));
    }
    Ok((agent, api))
}

/// A figure of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fig {
    ConnsPerSec,
    RttP50,
    RttP99,
    /// New flows policy let in (`policy_new`) per connection measured.
    Checked,
}

impl Fig {
    const ALL: [Self; 4] = [Self::ConnsPerSec, Self::RttP50, Self::RttP99, Self::Checked];

    fn name(self) -> &'static str {
        match self {
            Self::ConnsPerSec => "new TCP connections/s client -> server",
            Self::RttP50 => "TCP RTT median (us)",
            Self::RttP99 => "TCP RTT p99 (us)",
            Self::Checked => "policy checks per new connection (policy_new)",
        }
    }

    /// Decimals of its cells.
    fn decimals(self) -> usize {
        match self {
            Self::Checked => 2,
            _ => 1,
        }
    }
}

/// The agent's times (milliseconds): from the start or the API's change
/// to its "applied" line, and the pass's own time that line gives.
#[derive(Clone, Debug, Default)]
struct Apply {
    wall_ms: Vec<f64>,
    agent_ms: Vec<f64>,
}

/// Every value, by (figure, column); the agent's apply times.
#[derive(Default)]
pub(super) struct Results {
    values: BTreeMap<(Fig, Column), Vec<f64>>,
    /// Cold start, per number of rules.
    cold: BTreeMap<usize, Apply>,
    /// Policy changes, on the node with this many rules.
    change: Option<(usize, Apply)>,
}

/// One value of each figure for every node, interleaved, the order rotated
/// by `round` (no setup always first after the previous figure's load).
pub(super) fn round(
    tb: &Testbed,
    bins: &Binaries,
    setups: &mut [PolSetup],
    round: usize,
    secs: u32,
    r: &mut Results,
) -> Result<()> {
    let order: Vec<usize> = (0..setups.len())
        .map(|j| (j + round) % setups.len())
        .collect();
    for &k in &order {
        let p = &setups[k];
        let (c, srv) = (tb.ns(p.setup.pod1), tb.ns(p.setup.pod2));
        let (p50, p99) = measure::tcp_rtt_us(c, srv, &p.setup.pod2_ip, secs)
            .with_context(|| format!("{} ({}): RTT", p.tag, p.column.name()))?;
        r.add(Fig::RttP50, p.column, p50);
        r.add(Fig::RttP99, p.column, p99);
    }
    for &k in &order {
        let p = &mut setups[k];
        fresh_set(p)?;
        let (c, srv) = (tb.ns(p.setup.pod1), tb.ns(p.setup.pod2));
        let before = policy_new(bins, tb, &p.tag)?;
        let (done, seconds) = measure::conns(c, srv, &p.setup.pod2_ip, secs)
            .with_context(|| format!("{} ({}): new connections", p.tag, p.column.name()))?;
        let checked = policy_new(bins, tb, &p.tag)?.saturating_sub(before);
        r.add(Fig::ConnsPerSec, p.column, done / seconds);
        #[expect(
            clippy::cast_precision_loss,
            reason = "a counter of at most some 10^5 flows"
        )]
        r.add(Fig::Checked, p.column, checked as f64 / done);
    }
    for p in setups.iter_mut() {
        if let Some((agent, _)) = &mut p.agent {
            agent
                .check_running()
                .with_context(|| format!("{}: sluice-node policy", p.tag))?;
            for l in agent.unread() {
                eprintln!("bench: {}: {l}", p.tag);
            }
        }
    }
    Ok(())
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(f64::NAN)
}

impl Results {
    fn add(&mut self, f: Fig, c: Column, v: f64) {
        self.values.entry((f, c)).or_default().push(v);
    }

    /// Median, lowest, highest.
    fn cell(&self, f: Fig, c: Column) -> Option<(f64, f64, f64)> {
        let v = self.values.get(&(f, c))?;
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some((median(v), lo, hi))
    }

    fn med(&self, f: Fig, c: Column) -> Option<f64> {
        self.cell(f, c).map(|(m, _, _)| m)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.values.is_empty() && self.cold.is_empty()
    }

    /// The ratios shown: no rule against off (the cost of policy on), then
    /// each number of rules against no rule.
    fn ratio_pairs() -> Vec<(Column, Column)> {
        let mut v = vec![(Column::Rules(0), Column::Off)];
        v.extend(
            RULES
                .iter()
                .filter(|n| **n > 0)
                .map(|n| (Column::Rules(*n), Column::Rules(0))),
        );
        v
    }

    fn rows(&self) -> (Vec<String>, Vec<Vec<String>>) {
        let cols = Column::all();
        let mut header = vec!["figure".to_string()];
        header.extend(cols.iter().map(|c| c.name()));
        header.extend(
            Self::ratio_pairs()
                .iter()
                .map(|(a, b)| format!("{}/{}", a.short(), b.short())),
        );
        let mut rows = Vec::new();
        for f in Fig::ALL {
            let mut row = vec![f.name().to_string()];
            let d = f.decimals();
            for c in &cols {
                row.push(self.cell(f, *c).map_or("-".into(), |(m, lo, hi)| {
                    format!("{m:.d$} ({lo:.d$}-{hi:.d$})")
                }));
            }
            for (a, b) in Self::ratio_pairs() {
                row.push(match (self.med(f, a), self.med(f, b)) {
                    (Some(x), Some(y)) if y > 0.0 => format!("{:.2}x", x / y),
                    _ => "-".into(),
                });
            }
            rows.push(row);
        }
        (header, rows)
    }

    /// The targets (printed, not asserted), each with the figures
    /// it is judged on.
    fn targets(&self) -> Vec<String> {
        let check = |ok: bool| if ok { "met" } else { "NOT met" };
        let most = Column::Rules(RULES[RULES.len() - 1]);
        let (off, none) = (Column::Off, Column::Rules(0));
        let mut out = Vec::new();
        if let (Some((m, _, _)), Some((o, lo, hi)), Some(z)) = (
            self.cell(Fig::RttP50, most),
            self.cell(Fig::RttP50, off),
            self.med(Fig::RttP50, none),
        ) {
            // Noise: policy off's own spread over the rounds, at least 5%.
            let spread = ((hi - lo) / o).max(0.05);
            let ratio = m / o;
            out.push(format!(
                "established traffic within noise of no policy: TCP RTT median at {}: {ratio:.3}x policy off \
                 ({:.3}x no rule); noise taken as policy off's spread over the rounds or 5%, whichever is \
                 larger (here {:.1}%): {}",
                most.short(),
                m / z,
                spread * 100.0,
                check((ratio - 1.0).abs() <= spread)
            ));
        }
        for base in [none, off] {
            if let (Some(m), Some(b)) = (
                self.med(Fig::ConnsPerSec, most),
                self.med(Fig::ConnsPerSec, base),
            ) {
                out.push(format!(
                    "new connections/s at {} >= 0.9x {}: {:.3}x, {}",
                    most.short(),
                    base.name(),
                    m / b,
                    check(m / b >= 0.9)
                ));
            }
        }
        out
    }

    /// The agent's apply times.
    fn apply_lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .cold
            .iter()
            .map(|(n, a)| {
                let c = counts(*n);
                format!(
                    "{} rules ({} NetworkPolicies, {} rule entries): sluice-node policy from its start to its \
                     \"applied\" line {:.0} ms (its own pass: {:.0} ms)",
                    thousands(*n),
                    thousands(c.policies),
                    thousands(c.entries),
                    median(&a.wall_ms),
                    median(&a.agent_ms)
                )
            })
            .collect();
        if let Some((n, a)) = &self.change {
            let (p50, p99) = measure::p50_p99(a.wall_ms.clone());
            let (o50, o99) = measure::p50_p99(a.agent_ms.clone());
            out.push(format!(
                "one policy added or removed at {} rules: from the API's change to the agent's next \"applied\" \
                 line p50 {p50:.1} ms, p99 {p99:.1} ms ({} changes; its own pass p50 {o50:.1} ms, p99 {o99:.1} ms)",
                thousands(*n),
                a.wall_ms.len()
            ));
        }
        out
    }

    const TITLE: &'static str = "NetworkPolicy (client pod -> server pod on one node; 0, 100, 1,000 rules select the server)";

    /// Plain text, for the terminal.
    pub(super) fn text(&self) -> String {
        let (header, rows) = self.rows();
        let mut out = format!("\n{}:\n", Self::TITLE);
        let _ = writeln!(out, "{}", header.join(" | "));
        for r in rows {
            let _ = writeln!(out, "{}", r.join(" | "));
        }
        for t in self.targets() {
            let _ = writeln!(out, "  {t}");
        }
        let _ = writeln!(out, "Agent apply times (against the stand-in API server):");
        for l in self.apply_lines() {
            let _ = writeln!(out, "  {l}");
        }
        out
    }

    /// A markdown section at heading `level`.
    pub(super) fn markdown(&self, level: &str) -> String {
        let (header, rows) = self.rows();
        let mut md = format!("{level} {}\n\n", Self::TITLE);
        let _ = writeln!(md, "| {} |", header.join(" | "));
        let _ = writeln!(md, "|{}", " --- |".repeat(header.len()));
        for r in rows {
            let _ = writeln!(md, "| {} |", r.join(" | "));
        }
        let _ = write!(
            md,
            "\nOne Sluice node per column, each with a client and a server pod. Policy off: no agent, \
             the datapath's policy switch off. The others run the real `sluice-node policy` against the \
             tests' stand-in API server (`sluice-test-apiserver`), which serves the Namespace, both Pods \
             (labels, `status.podIPs` their real addresses, `spec.nodeName`) and the policies: with N rules, \
             N NetworkPolicies each selecting the server (`app: server`) with one ingress rule allowing a \
             /32 of its own (10.200.x.y) on TCP {BLOCK_PORT}, and one more allowing the client pod (by \
             `podSelector`) on TCP {} and {}, so the client's flows are let in by one rule of N+1 and the \
             server's rule set holds N+1 prefixes; with 0 rules no policy at all (policy on, every pod \
             known, none selected). Before anything is measured, a connection from the client to port \
             {CLOSED_PORT} of the server must be refused exactly where rules select the server. RTT: \
             sockperf ping-pong on one connection (established traffic); new connections: `cargo xtask \
             conn-loop`, each connection a new flow the server's ingress checks: the clients' port range \
             is {CLIENT_PORTS} (more even ports than one measurement's connections), and before each \
             measurement on a node with rules one ipBlock policy moves to port {} and back by turns, so \
             the server's rule set gets a new id and no verdict kept from an earlier round is used (the \
             `policy_new` row: checks per connection). Setups interleaved, the order rotated from round \
             to round; the agents run throughout.\n\nTargets (printed, not asserted):\n\n",
            measure::SOCKPERF_PORT,
            measure::CONN_LOOP_PORT,
            BLOCK_PORT + 1
        );
        for t in self.targets() {
            let _ = writeln!(md, "- {t}");
        }
        md.push_str(
            "\nThe agent's apply times (a cold start: from the agent's start to its first \"applied\" \
             log line with every policy compiled; a change: from the stand-in API server storing the \
             change to the next \"applied\" line):\n\n",
        );
        for l in self.apply_lines() {
            let _ = writeln!(md, "- {l}");
        }
        md.push('\n');
        md
    }
}

/// Checks every agent is still running at the end of the table.
pub(super) fn finish(setups: &mut [PolSetup]) -> Result<()> {
    for p in setups {
        if let Some((agent, _)) = &mut p.agent {
            agent
                .check_running()
                .with_context(|| format!("{}: sluice-node policy", p.tag))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_applied_line_is_parsed() {
        let l = "sluice-node: policy: 1001 NetworkPolicies, 2 pods here (1 isolated), 1001 rule entries; applied in 37 ms";
        assert_eq!(applied(l), Some((counts(1000), 37.0)));
        assert_eq!(
            applied("sluice-node: policy: 0 NetworkPolicies, 2 pods here (0 isolated), 0 rule entries; applied in 0 ms"),
            Some((counts(0), 0.0))
        );
        assert_eq!(
            applied("sluice-node: policy: NetworkPolicy on (enforcing)"),
            None
        );
        assert_eq!(applied("sluice-node: proxy: 1 Service ports written"), None);
    }

    #[test]
    fn policies_select_the_server_each_with_a_block_of_its_own() {
        let p = block_policy(0);
        assert_eq!(p["metadata"]["name"], "block-00000");
        assert_eq!(p["metadata"]["namespace"], NAMESPACE);
        assert_eq!(p["spec"]["podSelector"]["matchLabels"]["app"], "server");
        assert_eq!(p["spec"]["policyTypes"], json!(["Ingress"]));
        let rule = &p["spec"]["ingress"][0];
        assert_eq!(rule["from"][0]["ipBlock"]["cidr"], "10.200.0.1/32");
        assert_eq!(
            rule["ports"],
            json!([{"protocol": "TCP", "port": BLOCK_PORT}])
        );
        let blocks: std::collections::BTreeSet<Ipv4Addr> =
            (0..=RULES[RULES.len() - 1]).map(block_address).collect();
        assert_eq!(blocks.len(), RULES[RULES.len() - 1] + 1, "distinct");
        assert!(blocks
            .iter()
            .all(|a| a.octets()[..2] == [10, 200] && a.octets()[3] != 0 && a.octets()[3] <= 250));
        let c = client_policy(&[11311, 5302]);
        assert_eq!(c["spec"]["podSelector"]["matchLabels"]["app"], "server");
        let rule = &c["spec"]["ingress"][0];
        assert_eq!(
            rule["from"][0]["podSelector"]["matchLabels"]["app"],
            "client"
        );
        assert_eq!(
            rule["ports"],
            json!([{"protocol": "TCP", "port": 11311}, {"protocol": "TCP", "port": 5302}])
        );
    }

    #[test]
    fn the_fresh_set_moves_policy_zero_only_by_its_port() {
        let (a, b) = (block_policy(0), block_policy_on(0, BLOCK_PORT + 1));
        assert_eq!(a["metadata"], b["metadata"]);
        assert_eq!(
            a["spec"]["ingress"][0]["from"],
            b["spec"]["ingress"][0]["from"]
        );
        assert_ne!(
            a["spec"]["ingress"][0]["ports"],
            b["spec"]["ingress"][0]["ports"]
        );
    }

    #[test]
    fn pods_and_namespaces_are_what_the_compiler_reads() {
        let p = pod_object("server", "server", "10.130.0.3");
        assert_eq!(p["metadata"]["namespace"], NAMESPACE);
        assert_eq!(p["metadata"]["labels"]["app"], "server");
        assert_eq!(p["spec"]["nodeName"], NODE);
        assert_eq!(p["status"]["podIP"], "10.130.0.3");
        assert_eq!(p["status"]["podIPs"], json!([{"ip": "10.130.0.3"}]));
        assert_eq!(p["status"]["phase"], "Running");
        let n = namespace_object("bench");
        assert_eq!(
            n["metadata"]["labels"]["kubernetes.io/metadata.name"],
            "bench"
        );
    }

    #[test]
    fn rows_ratios_and_targets_use_the_medians() {
        let mut r = Results::default();
        for c in Column::all() {
            let (cps, rtt) = match c {
                Column::Off => (1000.0, 20.0),
                Column::Rules(0) => (980.0, 20.2),
                Column::Rules(_) => (950.0, 20.4),
            };
            for d in [0.0, -10.0, 10.0] {
                r.add(Fig::ConnsPerSec, c, cps + d);
            }
            r.add(Fig::RttP50, c, rtt);
        }
        r.add(Fig::Checked, Column::Rules(1000), 1.0);
        let (header, rows) = r.rows();
        assert_eq!(header.len(), 1 + 4 + 3);
        assert_eq!(rows[3][4], "1.00 (1.00-1.00)");
        assert_eq!(rows[3][7], "-", "no ratio to nothing");
        assert_eq!(header[5], "no rule/off");
        assert_eq!(header[7], "1,000 rules/no rule");
        assert_eq!(rows.len(), Fig::ALL.len());
        assert_eq!(rows[0][1], "1000.0 (990.0-1010.0)");
        assert_eq!(rows[0][5], "0.98x");
        assert_eq!(rows[0][7], "0.97x");
        assert_eq!(rows[2][1], "-", "no p99 measured");
        let t = r.targets();
        assert_eq!(t.len(), 3, "{t:?}");
        assert!(
            t[0].contains("1.020x policy off") && t[0].ends_with(": met"),
            "{t:?}"
        );
        assert!(t[1].contains("0.969x, met"), "{t:?}");
        assert!(t[2].contains("0.950x, met"), "{t:?}");
        r.cold.insert(
            1000,
            Apply {
                wall_ms: vec![300.0],
                agent_ms: vec![40.0],
            },
        );
        r.change = Some((
            1000,
            Apply {
                wall_ms: vec![10.0, 12.0],
                agent_ms: vec![5.0, 6.0],
            },
        ));
        let lines = r.apply_lines();
        assert!(lines[0].starts_with("1,000 rules (1,001 NetworkPolicies, 1,001 rule entries)"));
        assert!(lines[1].contains("2 changes"), "{lines:?}");
        assert!(r.markdown("##").contains("| new TCP connections/s"));
    }
}
