//! `sluice-node policy`: NetworkPolicy in the datapath. The agent watches
//! `NetworkPolicy`, `Pod` and `Namespace` objects (kube-rs reflector stores), compiles
//! them for the pods on this node ([`super::compile`]) and keeps the
//! datapath's policy maps in step (`sluice_maps::policy`).
//!
//! The pods here are the addresses in the datapath's endpoint map, polled
//! every [`LOCAL_POLL`]. The plugin's attachment records name each
//! address's pod (`K8S_POD_NAMESPACE`, `K8S_POD_NAME` in `CNI_ARGS`), so a
//! pod is compiled at the next poll after its ADD, from its Pod object's
//! labels and ports, before the kubelet reports its addresses. Until then
//! it has no entry in `sl_pol_pods` and the datapath refuses its flows both
//! ways (pending): never open by accident.
//!
//! Policy is switched on (`sl_pol_config`) only after the first complete
//! pass, so an agent that starts on a node with running pods does not make
//! them pending while it lists the cluster. `--stop` switches it off.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use futures::StreamExt;
use ipnetwork::IpNetwork;
use k8s_openapi::api::{
    core::v1::{Namespace, Pod},
    networking::v1::NetworkPolicy,
};
use kube::{
    runtime::{
        reflector::{self, Store},
        watcher, WatchStreamExt,
    },
    Api, Client,
};
use sluice_common::{
    maps, pod_policy, policy_dir, policy_flags, PolicyConfig, PolicyKey, PolicyPod, PolicyRules,
    PortRange,
};
use sluice_maps::{endpoint::Endpoints, policy as pmaps, PinRoot};

use super::compile::{Compiled, Compiler};
use crate::{
    error::Result,
    log,
    services::{drain, slim, take_event, Ev},
    shutdown::Shutdown,
};

/// How often the datapath's endpoints are read: a new pod waits at most
/// this long for its policy (the plugin's ADD waits for it, see
/// `cni-plugin/src/pod/policy_wait.rs`).
const LOCAL_POLL: Duration = Duration::from_millis(100);

pub(crate) struct Options {
    pub(crate) pin_root: PathBuf,
    /// Audit (dry run): would-be drops counted and reported, not dropped.
    pub(crate) audit: bool,
    /// Where the compiled policy is written for `sluicectl policy`.
    pub(crate) state_file: PathBuf,
    /// The plugin's state directory: its attachment records name the pod
    /// of each address here.
    pub(crate) cni_state_dir: PathBuf,
    /// Everything is compared again this often even without a change.
    pub(crate) resync: Duration,
}

/// The three watches' progress.
#[derive(Default)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "one flag per watch, and the change"
)]
struct Watches {
    policies: bool,
    pods: bool,
    namespaces: bool,
    dirty: bool,
}

impl Watches {
    fn take<K>(ready: &mut bool, dirty: &mut bool, what: &str, ev: Ev<K>) -> Result<()> {
        take_event("policy", what, (ready, dirty), ev)
    }

    fn ready(&self) -> bool {
        self.policies && self.pods && self.namespaces
    }
}

fn store<K>(
    api: Api<K>,
) -> (
    Store<K>,
    impl futures::Stream<Item = std::result::Result<watcher::Event<K>, watcher::Error>>,
)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher(api, watcher::Config::default()).modify(slim),
    )
    .default_backoff();
    (reader, stream)
}

pub(crate) async fn run(client: Client, opts: &Options, mut shutdown: Shutdown) -> Result<()> {
    let (policies, pol_stream) = store(Api::<NetworkPolicy>::all(client.clone()));
    let (pods, pod_stream) = store(Api::<Pod>::all(client.clone()));
    let (namespaces, ns_stream) = store(Api::<Namespace>::all(client));
    futures::pin_mut!(pol_stream, pod_stream, ns_stream);
    let root = PinRoot::new(&opts.pin_root);
    let mut resync = tokio::time::interval(opts.resync);
    let mut poll = tokio::time::interval(LOCAL_POLL);
    let mut w = Watches::default();
    let mut state = State::default();
    log(&format!(
        "policy: watching NetworkPolicies, Pods and Namespaces; datapath {}; {}",
        opts.pin_root.display(),
        if opts.audit {
            "audit mode: would-be drops are reported, not dropped"
        } else {
            "enforcing"
        }
    ));
    loop {
        tokio::select! {
            ev = pol_stream.next() => Watches::take(&mut w.policies, &mut w.dirty, "NetworkPolicies", ev)?,
            ev = pod_stream.next() => Watches::take(&mut w.pods, &mut w.dirty, "Pods", ev)?,
            ev = ns_stream.next() => Watches::take(&mut w.namespaces, &mut w.dirty, "Namespaces", ev)?,
            _ = resync.tick() => w.dirty = true,
            _ = poll.tick() => {}
            () = &mut shutdown => return Ok(()),
        }
        drain(&mut pol_stream, |ev| {
            Watches::take(&mut w.policies, &mut w.dirty, "NetworkPolicies", ev)
        })?;
        drain(&mut pod_stream, |ev| {
            Watches::take(&mut w.pods, &mut w.dirty, "Pods", ev)
        })?;
        drain(&mut ns_stream, |ev| {
            Watches::take(&mut w.namespaces, &mut w.dirty, "Namespaces", ev)
        })?;
        if !w.ready() {
            continue;
        }
        let new_maps = state.follow(&root);
        let Some(local) = local_addrs(&root) else {
            state.say(format!(
                "policy: no datapath at {} yet (no pod attached); waiting",
                root.path().display()
            ));
            continue;
        };
        let node = node_addrs();
        let local_changed = local != state.local || node != state.node;
        if !(w.dirty || new_maps || local_changed) {
            continue;
        }
        let started = Instant::now();
        let (p, o, n) = (policies.state(), pods.state(), namespaces.state());
        let p: Vec<NetworkPolicy> = p.iter().map(|x| (**x).clone()).collect();
        let attached = attached_pods(&opts.cni_state_dir);
        let o: Vec<Pod> = o
            .iter()
            .map(|x| with_attached((**x).clone(), &attached))
            .collect();
        let n: Vec<Namespace> = n.iter().map(|x| (**x).clone()).collect();
        let compiler = state
            .compiler
            .get_or_insert_with(|| Compiler::new(first_set(&root)));
        let compiled = compiler.compile(&p, &o, &n, &local);
        state.warnings(&compiled.warnings);
        if state.apply(&root, &compiled, &node, opts) {
            w.dirty = false;
            state.local = local;
            state.node = node;
            write_state(&opts.state_file, &compiled, opts.audit);
            if state.changed {
                log(&format!(
                    "policy: {} NetworkPolicies, {} pods here ({} isolated), {} rule entries; applied in {} ms",
                    p.len(),
                    compiled.pods.len(),
                    compiled.pods.values().filter(|x| x.flags != 0).count(),
                    compiled.rules.len(),
                    started.elapsed().as_millis()
                ));
            }
        }
    }
}

/// (namespace, name) -> addresses of the pods the plugin attached here,
/// from its attachment records (`<state dir>/<network>/attachments/*.json`,
/// whose `pod` the runtime's `CNI_ARGS` named). Unreadable records are
/// skipped: their pods wait for the kubelet's report.
fn attached_pods(state_dir: &Path) -> BTreeMap<(String, String), Vec<IpAddr>> {
    let mut out: BTreeMap<(String, String), Vec<IpAddr>> = BTreeMap::new();
    for v in crate::records::all(state_dir) {
        let (Some(ns), Some(name)) = (v["pod"]["namespace"].as_str(), v["pod"]["name"].as_str())
        else {
            continue;
        };
        let ips = v["ips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x.as_str()?.parse::<IpNetwork>().ok())
            .map(|n| n.ip());
        out.entry((ns.to_string(), name.to_string()))
            .or_default()
            .extend(ips);
    }
    out
}

/// `pod` with the addresses its attachment record gives, when its status
/// has none yet (the kubelet reports them after the ADD).
fn with_attached(mut pod: Pod, attached: &BTreeMap<(String, String), Vec<IpAddr>>) -> Pod {
    let key = (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    );
    let Some(ips) = attached.get(&key).filter(|ips| !ips.is_empty()) else {
        return pod;
    };
    let status = pod.status.get_or_insert_with(Default::default);
    let has = status.pod_ip.as_deref().is_some_and(|s| !s.is_empty())
        || status.pod_ips.as_ref().is_some_and(|v| !v.is_empty());
    if !has {
        status.pod_ip = Some(ips[0].to_string());
        status.pod_ips = Some(
            ips.iter()
                .map(|ip| k8s_openapi::api::core::v1::PodIP { ip: ip.to_string() })
                .collect(),
        );
    }
    pod
}

/// The pod addresses on this node; `None` without a datapath.
fn local_addrs(root: &PinRoot) -> Option<BTreeSet<IpAddr>> {
    if !root.has(&maps::POL_PODS) {
        return None;
    }
    let eps = Endpoints::open(root).ok()?;
    Some(eps.list().into_iter().map(|(ip, _)| ip).collect())
}

/// Every address of the node's interfaces but loopback: the sources the
/// node's own connections to pods (kubelet's probes) leave with.
fn node_addrs() -> BTreeSet<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return BTreeSet::new();
    };
    addrs
        .filter_map(|a| {
            let s = a.address?;
            if let Some(v4) = s.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .filter(|ip| !ip.is_loopback())
        .collect()
}

/// What the node may send into a pod: anything (rule 0, the node's).
fn from_node() -> PolicyRules {
    let mut r = PolicyRules {
        count: 1,
        ..PolicyRules::default()
    };
    r.ranges[0] = PortRange {
        proto: 0,
        _pad: 0,
        rule: 0,
        first: 0,
        last: u16::MAX,
    };
    r
}

/// 1 + the largest set id in the datapath (a restarted agent never gives
/// an old id to other rules: flows kept under it would pass).
fn first_set(root: &PinRoot) -> u32 {
    let pods = pmaps::pods(root).unwrap_or_default();
    let rules = pmaps::rules(root).unwrap_or_default();
    let max = pods
        .values()
        .map(|p| p.set)
        .chain(rules.iter().map(|(k, _)| k.set))
        .max()
        .unwrap_or(0);
    max.saturating_add(1)
}

/// Writes what `sluicectl policy` shows; a failure is logged, not fatal.
fn write_state(path: &std::path::Path, c: &Compiled, audit: bool) {
    let body = serde_json::json!({
        "mode": if audit { "audit" } else { "enforce" },
        "report": c.report,
    });
    let text = match serde_json::to_string_pretty(&body) {
        Ok(t) => t,
        Err(e) => {
            log(&format!("policy: encoding the state: {e}"));
            return;
        }
    };
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Err(e) = crate::atomic::replace(path, text.as_bytes(), 0o644) {
        log(&format!("policy: writing {}: {e}", path.display()));
    }
}

/// What the agent wrote last.
#[derive(Default)]
struct State {
    compiler: Option<Compiler>,
    pods: BTreeMap<IpAddr, PolicyPod>,
    rules: BTreeMap<KeyBytes, PolicyRules>,
    /// Read back from the maps once (a new agent removes what an older one
    /// left).
    loaded: bool,
    local: BTreeSet<IpAddr>,
    /// The node's addresses last written.
    node: BTreeSet<IpAddr>,
    maps_ino: Option<u64>,
    warned: BTreeSet<String>,
    said: Option<String>,
    /// The last pass changed a map.
    changed: bool,
}

/// [`PolicyKey`] ordered by its bytes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct KeyBytes(u32, u32, u8, [u8; 16]);

impl KeyBytes {
    fn of(k: &PolicyKey) -> Self {
        Self(k.set, k.prefixlen, k.dir, k.peer.addr)
    }

    fn key(self) -> PolicyKey {
        PolicyKey {
            prefixlen: self.1,
            set: self.0,
            dir: self.2,
            _pad: [0; 3],
            peer: sluice_common::IpKey { addr: self.3 },
        }
    }
}

impl State {
    fn say(&mut self, msg: String) {
        if self.said.as_ref() != Some(&msg) {
            log(&msg);
            self.said = Some(msg);
        }
    }

    fn warnings(&mut self, warnings: &[String]) {
        let now: BTreeSet<String> = warnings.iter().cloned().collect();
        for n in now.difference(&self.warned) {
            log(&format!("policy: {n}"));
        }
        self.warned = now;
    }

    /// Whether the policy maps are new (first load, or a datapath loaded
    /// again): then everything is written again.
    fn follow(&mut self, root: &PinRoot) -> bool {
        let ino = std::fs::metadata(root.map_path(&maps::POL_PODS))
            .ok()
            .map(|m| m.ino());
        if ino != self.maps_ino {
            self.loaded = false;
            self.maps_ino = ino;
            return ino.is_some();
        }
        false
    }

    /// Writes `c` into the maps, in the order that never opens a pod:
    /// a set's rules before the pods that name it, pods before the rules
    /// they no longer use go; then policy on. `false` on a failure (tried
    /// again at the next poll).
    fn apply(
        &mut self,
        root: &PinRoot,
        c: &Compiled,
        node: &BTreeSet<IpAddr>,
        opts: &Options,
    ) -> bool {
        self.changed = false;
        if !self.loaded {
            match (pmaps::pods(root), pmaps::rules(root)) {
                (Ok(p), Ok(r)) => {
                    self.pods = p;
                    self.rules = r.iter().map(|(k, v)| (KeyBytes::of(k), *v)).collect();
                    self.loaded = true;
                }
                (Err(e), _) | (_, Err(e)) => {
                    self.say(format!("policy: reading the policy maps: {e}"));
                    return false;
                }
            }
        }
        let mut want_rules: BTreeMap<KeyBytes, PolicyRules> = c
            .rules
            .iter()
            .map(|(k, v)| (KeyBytes::of(&k.policy_key()), *v))
            .collect();
        // "The only allowed connections into the pod are those from the
        // pod's node and those allowed by the ingress list" (the
        // NetworkPolicy API): the node's addresses, any port, in every set
        // isolated for ingress.
        let ingress_sets: BTreeSet<u32> = c
            .pods
            .values()
            .filter(|p| p.flags & pod_policy::INGRESS != 0)
            .map(|p| p.set)
            .collect();
        for set in ingress_sets {
            for ip in node {
                let net = IpNetwork::from(*ip);
                let k = pmaps::key(set, policy_dir::INGRESS, net);
                want_rules.insert(KeyBytes::of(&k), from_node());
            }
        }
        let res = (|| -> sluice_maps::Result<()> {
            for (k, v) in &want_rules {
                if self.rules.get(k) != Some(v) {
                    pmaps::put_rules(root, &k.key(), v)?;
                    self.rules.insert(*k, *v);
                    self.changed = true;
                }
            }
            for (ip, p) in &c.pods {
                if self.pods.get(ip) != Some(p) {
                    pmaps::put_pod(root, *ip, p)?;
                    self.pods.insert(*ip, *p);
                    self.changed = true;
                }
            }
            let gone: Vec<IpAddr> = self
                .pods
                .keys()
                .filter(|ip| !c.pods.contains_key(ip))
                .copied()
                .collect();
            for ip in gone {
                pmaps::remove_pod(root, ip)?;
                self.pods.remove(&ip);
                self.changed = true;
            }
            let stale: Vec<KeyBytes> = self
                .rules
                .keys()
                .filter(|k| !want_rules.contains_key(k))
                .copied()
                .collect();
            for k in stale {
                pmaps::remove_rules(root, &k.key())?;
                self.rules.remove(&k);
                self.changed = true;
            }
            let flags = policy_flags::ON | if opts.audit { policy_flags::AUDIT } else { 0 };
            let cfg = PolicyConfig { flags, _pad: 0 };
            if pmaps::config(root)?.as_ref() != Some(&cfg) {
                pmaps::write_config(root, &cfg)?;
                log(&format!(
                    "policy: NetworkPolicy on ({})",
                    if opts.audit { "audit" } else { "enforcing" }
                ));
            }
            Ok(())
        })();
        match res {
            Ok(()) => {
                self.said = None;
                true
            }
            Err(e) => {
                self.say(format!("policy: writing the policy maps: {e}"));
                false
            }
        }
    }
}

/// `policy --stop`: the datapath stops checking (every flow passes); the
/// maps stay until the datapath goes.
pub(crate) fn stop(pin_root: &std::path::Path) -> Result<()> {
    let root = PinRoot::new(pin_root);
    pmaps::write_config(&root, &PolicyConfig::default())?;
    log("policy: NetworkPolicy off: every flow passes");
    Ok(())
}
