//! The NetworkPolicy compiler: from the cluster's policies, Pods and
//! Namespaces, what this node's policy maps must hold (`sl_pol_pods`,
//! `sl_pol_rules`, see `sluice_common::policy`), with a report for
//! `sluicectl policy` and the problems worth a log line. Pure: no I/O, no
//! clock; [`Compiler`] only remembers the ids it handed out.
//!
//! Semantics are networking.k8s.io/v1's:
//!
//! - a policy selects the pods of its namespace its `podSelector` matches;
//!   its `policyTypes` (absent or empty: Ingress, plus Egress if `egress` is
//!   there) isolate them for those directions; what a pod may do in an
//!   isolated direction is the union of the rules of every policy selecting
//!   it for that direction (none: nothing);
//! - a rule without peers allows every address, one without ports every
//!   protocol and port; peers: `podSelector` (the policy's namespace),
//!   `namespaceSelector` (every pod of the namespaces it matches; with a
//!   `podSelector` too, the pods of those namespaces it matches), `ipBlock`
//!   (the CIDR minus its excepts). A namespace's labels always include
//!   `kubernetes.io/metadata.name`; a namespace without a Namespace object
//!   has that label only;
//! - pods are peers and selected pods with their IPs (`status.podIPs`, else
//!   `status.podIP`), except host-network pods and finished ones (phase
//!   Succeeded or Failed), which count as absent;
//! - a named port is resolved against the container ports (of the
//!   containers and the restartable init containers) of the selected pod in
//!   ingress, of the peer pod in egress; in egress an ipBlock peer (or "every
//!   peer") gets nothing for a named port.
//!
//! The rule trie: per set and direction, every prefix involved (each CIDR,
//! each except, each peer pod's /32 or /128) is a key, whose value is every
//! range of every (rule, peer) that allows *all* the addresses that prefix
//! is the longest match of: an ipBlock contributes to the prefixes inside
//! its CIDR and not inside one of its excepts, a pod peer to its own /32 or
//! /128. So an except has an entry, allowing nothing unless something more
//! specific or another block allows it. IPv4 lives in the IPv4-mapped part
//! of the IPv6 space: when an IPv6 prefix of the set covers that part
//! (`::/0`), the set also gets `0.0.0.0/0`, so that IPv4 peers never match
//! an IPv6 block.
//!
//! Ids. A rule's id (its counter in `sl_pol_hits`, 1 to 65535) stays while
//! its policy (namespace/name), direction and index do; new rules get ids
//! never handed out before, until 65535 is reached; then the lowest id no
//! current rule has. A set's id stays while its content (isolation flags
//! and every (direction, prefix) -> ranges entry) does; a content not in the
//! previous compile always gets a new id, so a flow verdict made under a set
//! id is never judged by other rules. Only the rules of policies selecting
//! some pod of this node get ids.
use std::{
    collections::{hash_map, BTreeMap, BTreeSet, HashMap, HashSet},
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use ipnetwork::{IpNetwork, Ipv4Network, Ipv6Network};
use k8s_openapi::{
    api::{
        core::v1::{Namespace, Pod},
        networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec},
    },
    apimachinery::pkg::apis::meta::v1::LabelSelector,
};
use serde::{Deserialize, Serialize};
use sluice_common::{
    pod_policy, policy_dir, IpKey, PolicyKey, PolicyPod, PolicyRules, PortRange, MAX_PORT_RANGES,
};

use super::{
    ports::{self, normalize, proto_name, resolve, NamedPort, PortSpec, Range},
    selector::{self, Labels},
};

/// The label every namespace has, its name.
const NAMESPACE_NAME: &str = "kubernetes.io/metadata.name";
/// Pods named at most in one warning.
const NAMED_MAX: usize = 5;
/// Every IPv4 address, every IPv6 address.
const ALL_V4: Ipv4Network = match Ipv4Network::new_checked(Ipv4Addr::UNSPECIFIED, 0) {
    Some(n) => n,
    None => panic!("prefix 0 is valid"),
};
const ALL_V6: Ipv6Network = match Ipv6Network::new_checked(Ipv6Addr::UNSPECIFIED, 0) {
    Some(n) => n,
    None => panic!("prefix 0 is valid"),
};

/// Key of [`Compiled::rules`]: a [`PolicyKey`] that sorts, with the peer
/// prefix as an [`IpNetwork`] (host bits zero; IPv4 prefixes as `V4`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct PolicyKeyOrd {
    pub(crate) set: u32,
    /// [`policy_dir`].
    pub(crate) dir: u8,
    pub(crate) peer: IpNetwork,
}

impl PolicyKeyOrd {
    /// The trie key: an IPv4 /n is `FIXED_BITS + 96 + n` bits of the
    /// IPv4-mapped address, an IPv6 /n `FIXED_BITS + n`.
    pub(crate) fn policy_key(&self) -> PolicyKey {
        let (bits, peer) = match self.peer {
            IpNetwork::V4(n) => (96 + u32::from(n.prefix()), IpKey::v4(n.network().octets())),
            IpNetwork::V6(n) => (u32::from(n.prefix()), IpKey::v6(n.network().octets())),
        };
        PolicyKey {
            prefixlen: PolicyKey::FIXED_BITS + bits,
            set: self.set,
            dir: self.dir,
            _pad: [0; 3],
            peer,
        }
    }
}

/// What a compile produced.
#[derive(Debug, Default)]
pub(crate) struct Compiled {
    /// Entries of `sl_pol_pods`: every address of `local` that belongs to a
    /// pod (not host-network, not finished). An address no such pod has is
    /// left out: the datapath treats it as pending and refuses its new flows
    /// until a later compile knows its pod. A pod no policy selects has
    /// `flags` 0 and `set` 0 (no rules).
    pub(crate) pods: BTreeMap<IpAddr, PolicyPod>,
    /// The exact content of `sl_pol_rules`: the entries of every set some
    /// entry of `pods` uses, and of no other. A set without entries (default
    /// deny) has no key at all.
    pub(crate) rules: BTreeMap<PolicyKeyOrd, PolicyRules>,
    /// For `sluicectl policy` (a state file).
    pub(crate) report: Report,
    /// Problems worth a log line, each naming the policy or pod and the
    /// value in question.
    pub(crate) warnings: Vec<String>,
}

/// What `sluicectl policy` shows (camelCase JSON).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Report {
    /// The pods of this node (those with an entry in `sl_pol_pods`).
    pub(crate) pods: Vec<PodReport>,
    /// The rules that have an id (policies selecting some pod here).
    pub(crate) rules: Vec<RuleReport>,
    /// Every entry of `sl_pol_rules`.
    pub(crate) sets: Vec<SetReport>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PodReport {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) ips: Vec<String>,
    pub(crate) ingress_isolated: bool,
    pub(crate) egress_isolated: bool,
    /// 0: no rules (not isolated).
    pub(crate) set: u32,
    /// The policies selecting the pod (`namespace/name`).
    pub(crate) policies: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RuleReport {
    pub(crate) id: u16,
    /// `namespace/name`.
    pub(crate) policy: String,
    /// `ingress` or `egress`.
    pub(crate) direction: String,
    /// Index of the rule in the policy's `ingress` or `egress`.
    pub(crate) index: usize,
    /// `any`, `pods ns=prod labels=app=web`, `pods ns=[team=a] labels=any`,
    /// `ipBlock 10.0.0.0/8 except 10.1.0.0/16`, `invalid (ignored)`.
    pub(crate) peers: Vec<String>,
    /// `any`, `TCP/80`, `TCP/8000-8080`, `UDP/any`, `TCP/http (named)`.
    pub(crate) ports: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SetReport {
    pub(crate) set: u32,
    pub(crate) direction: String,
    pub(crate) prefix: String,
    /// Empty: the prefix allows nothing.
    pub(crate) ranges: Vec<RangeReport>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RangeReport {
    /// `TCP`, `UDP`, `SCTP`, or `any` (every protocol and port).
    pub(crate) proto: String,
    pub(crate) first: u16,
    pub(crate) last: u16,
    pub(crate) rule: u16,
}

/// A rule by its place: policy `namespace/name`, [`policy_dir`], index.
type RuleRef = (String, u8, usize);

/// What a set holds: isolation flags and the (direction, prefix) -> ranges
/// entries (ranges as [`normalize`] leaves them).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Content {
    flags: u32,
    entries: BTreeMap<(u8, IpNetwork), Vec<Range>>,
}

/// Compiles, keeping rule and set ids stable from one compile to the next.
#[derive(Debug)]
pub(crate) struct Compiler {
    /// The next set id never handed out.
    next_set: u32,
    /// The sets of the previous compile.
    sets: BTreeMap<Content, u32>,
    /// The next rule id never handed out (65536: all were).
    next_rule: u32,
    /// The rules of the previous compile.
    rule_ids: BTreeMap<RuleRef, u16>,
}

impl Compiler {
    /// `first_set`: the lowest set id to hand out (1 + the largest id in the
    /// pinned maps, so that no id is reused for other rules; 0 counts as 1).
    pub(crate) fn new(first_set: u32) -> Self {
        Self {
            next_set: first_set.max(1),
            sets: BTreeMap::new(),
            next_rule: 1,
            rule_ids: BTreeMap::new(),
        }
    }

    /// What the maps must hold for the pods with addresses in `local` (this
    /// node's endpoints) under `policies`. `pods` are the cluster's (peers
    /// and the local pods' owners), `namespaces` give namespace labels.
    /// Input order does not matter.
    pub(crate) fn compile(
        &mut self,
        policies: &[NetworkPolicy],
        pods: &[Pod],
        namespaces: &[Namespace],
        local: &BTreeSet<IpAddr>,
    ) -> Compiled {
        let mut warnings = Warnings::default();

        let mut infos: Vec<PodInfo> = pods
            .iter()
            .filter_map(|p| PodInfo::new(p, &mut warnings))
            .collect();
        infos.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        let ns_labels = namespace_labels(namespaces, &infos);
        let local_pods = local_owners(&infos, local, &mut warnings);

        // Policies, in name order (ids, rule order, warnings are then
        // independent of the order of the input).
        let mut sorted: Vec<&NetworkPolicy> = policies.iter().collect();
        sorted.sort_by(|a, b| {
            (&a.metadata.namespace, &a.metadata.name)
                .cmp(&(&b.metadata.namespace, &b.metadata.name))
        });
        let ctx = Ctx {
            pods: &infos,
            ns_labels: &ns_labels,
        };
        let mut cpols: Vec<CPolicy> = sorted
            .into_iter()
            .filter_map(|p| ctx.policy(p, &local_pods, &mut warnings))
            .collect();

        // Rule ids.
        let live: BTreeSet<RuleRef> = cpols
            .iter()
            .flat_map(|p| p.rules().map(|r| (p.key.clone(), r.dir, r.index)))
            .collect();
        self.assign_rule_ids(&live, &mut warnings);
        for p in &mut cpols {
            let key = p.key.clone();
            for r in p.dirs.iter_mut().flatten().flatten() {
                r.id = self
                    .rule_ids
                    .get(&(key.clone(), r.dir, r.index))
                    .copied()
                    .unwrap_or(u16::MAX);
            }
        }

        // Each local pod's content; pods selected by the same policies (and
        // with the same named ports, where ingress rules use them) share one.
        let mut misses: BTreeMap<(String, u8, usize, String), BTreeSet<String>> = BTreeMap::new();
        let mut cache: HashMap<CacheKey, usize> = HashMap::new();
        let mut contents: Vec<(Content, Vec<Overflow>)> = Vec::new();
        let mut placed: Vec<Placed> = Vec::new();
        for (&pi, addrs) in &local_pods {
            let pod = &infos[pi];
            let mut by_dir: [Vec<usize>; 2] = Default::default();
            let mut names = Vec::new();
            for (k, cp) in cpols.iter().enumerate() {
                if cp.selected.contains(&pi) {
                    names.push(cp.key.clone());
                    for (d, list) in by_dir.iter_mut().enumerate() {
                        if cp.dirs[d].is_some() {
                            list.push(k);
                        }
                    }
                }
            }
            let mut flags = 0;
            if !by_dir[usize::from(policy_dir::INGRESS)].is_empty() {
                flags |= pod_policy::INGRESS;
            }
            if !by_dir[usize::from(policy_dir::EGRESS)].is_empty() {
                flags |= pod_policy::EGRESS;
            }
            let mut content = None;
            if flags != 0 {
                // Ingress named ports resolve against this pod.
                let ingress = &by_dir[usize::from(policy_dir::INGRESS)];
                let mut named = false;
                for &k in ingress {
                    for r in cpols[k].dir_rules(policy_dir::INGRESS).filter(|r| r.named) {
                        named = true;
                        let (_, missed) = resolve(&r.ports, r.id, Some(&pod.ports));
                        for m in missed {
                            misses
                                .entry((cpols[k].key.clone(), policy_dir::INGRESS, r.index, m))
                                .or_default()
                                .insert(pod.id());
                        }
                    }
                }
                let key = CacheKey {
                    flags,
                    by_dir: by_dir.clone(),
                    ports: named.then(|| pod.ports.clone()),
                };
                let index = match cache.entry(key) {
                    hash_map::Entry::Occupied(o) => *o.get(),
                    hash_map::Entry::Vacant(v) => {
                        contents.push(build(flags, &by_dir, &cpols, &infos, pod, &mut misses));
                        *v.insert(contents.len() - 1)
                    }
                };
                content = Some(index);
            }
            placed.push(Placed {
                pod: pi,
                addrs: addrs.clone(),
                flags,
                content,
                policies: names,
            });
        }

        // Set ids: kept for a content the previous compile had, new otherwise.
        let mut sets: BTreeMap<Content, u32> = BTreeMap::new();
        let mut content_ids = vec![0; contents.len()];
        for p in &placed {
            let Some(ci) = p.content else { continue };
            let content = &contents[ci].0;
            let id = if let Some(&id) = sets.get(content) {
                id
            } else {
                let id = self.sets.get(content).copied().unwrap_or_else(|| {
                    let id = self.next_set;
                    self.next_set = self.next_set.saturating_add(1);
                    id
                });
                sets.insert(content.clone(), id);
                id
            };
            content_ids[ci] = id;
        }

        let mut out = Compiled::default();
        let mut set_pods: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        for p in &placed {
            let pod = &infos[p.pod];
            let set = p.content.map_or(0, |ci| content_ids[ci]);
            for a in &p.addrs {
                out.pods.insert(
                    *a,
                    PolicyPod {
                        flags: p.flags,
                        set,
                    },
                );
            }
            if set != 0 {
                set_pods.entry(set).or_default().push(pod.id());
            }
            out.report.pods.push(PodReport {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                ips: pod.ips.iter().map(ToString::to_string).collect(),
                ingress_isolated: p.flags & pod_policy::INGRESS != 0,
                egress_isolated: p.flags & pod_policy::EGRESS != 0,
                set,
                policies: p.policies.clone(),
            });
        }
        for (content, &set) in &sets {
            for (&(dir, peer), ranges) in &content.entries {
                let mut value = PolicyRules {
                    count: 0,
                    ranges: [PortRange::default(); MAX_PORT_RANGES],
                };
                for (slot, r) in value.ranges.iter_mut().zip(ranges) {
                    *slot = r.port_range();
                    value.count += 1;
                }
                out.rules.insert(PolicyKeyOrd { set, dir, peer }, value);
            }
        }
        for (k, v) in &out.rules {
            out.report.sets.push(SetReport {
                set: k.set,
                direction: dir_name(k.dir).to_owned(),
                prefix: k.peer.to_string(),
                ranges: v.ranges[..v.count as usize]
                    .iter()
                    .map(|r| RangeReport {
                        proto: proto_name(r.proto).to_owned(),
                        first: r.first,
                        last: r.last,
                        rule: r.rule,
                    })
                    .collect(),
            });
        }
        for p in &cpols {
            for r in p.rules() {
                out.report.rules.push(RuleReport {
                    id: r.id,
                    policy: p.key.clone(),
                    direction: dir_name(r.dir).to_owned(),
                    index: r.index,
                    peers: r.peer_text.clone(),
                    ports: r.ports.iter().map(PortSpec::describe).collect(),
                });
            }
        }

        // Warnings found while building: named ports resolving to nothing,
        // ranges over the limit.
        for ((policy, dir, index, port), pods) in misses {
            let whose = if dir == policy_dir::INGRESS {
                "selected pod(s)"
            } else {
                "peer pod(s)"
            };
            warnings.push(format!(
                "policy {policy} {} rule {index}: named port {port} matches no container port of {whose} {}: the rule allows them nothing on it",
                dir_name(dir),
                name_list(&pods.into_iter().collect::<Vec<_>>()),
            ));
        }
        let mut noted = HashSet::new();
        for (ci, (_, overflows)) in contents.iter().enumerate() {
            let set = content_ids[ci];
            if !noted.insert(set) {
                continue;
            }
            for o in overflows {
                warnings.push(format!(
                    "policy set {set} (pod(s) {}): {} peer {}: {} port ranges after merging, over {MAX_PORT_RANGES}: only the first {MAX_PORT_RANGES} are allowed",
                    name_list(set_pods.get(&set).map_or(&[][..], Vec::as_slice)),
                    dir_name(o.dir),
                    o.peer,
                    o.count,
                ));
            }
        }

        self.sets = sets;
        out.warnings = warnings.list;
        out
    }

    /// Ids for `live` (the rules of this compile): those the previous compile
    /// had stay; the others get new ones.
    fn assign_rule_ids(&mut self, live: &BTreeSet<RuleRef>, warnings: &mut Warnings) {
        self.rule_ids.retain(|k, _| live.contains(k));
        let mut used: BTreeSet<u16> = self.rule_ids.values().copied().collect();
        for r in live {
            if self.rule_ids.contains_key(r) {
                continue;
            }
            let id = if let Ok(id) = u16::try_from(self.next_rule) {
                self.next_rule += 1;
                Some(id)
            } else {
                // Every id was handed out once: the lowest no rule has now.
                (1..=u16::MAX).find(|i| !used.contains(i))
            };
            let id = id.unwrap_or_else(|| {
                warnings.push(format!(
                    "policy {} {} rule {}: no rule id left ({} rules): it shares id {}, its hits are counted with that rule's",
                    r.0,
                    dir_name(r.1),
                    r.2,
                    live.len(),
                    u16::MAX
                ));
                u16::MAX
            });
            used.insert(id);
            self.rule_ids.insert(r.clone(), id);
        }
    }
}

/// Warnings, each once, in the order found.
#[derive(Default)]
struct Warnings {
    list: Vec<String>,
    seen: HashSet<String>,
}

impl Warnings {
    fn push(&mut self, w: String) {
        if self.seen.insert(w.clone()) {
            self.list.push(w);
        }
    }
}

/// A pod that counts: not host-network, not finished, with addresses.
struct PodInfo {
    namespace: String,
    name: String,
    labels: Labels,
    ips: Vec<IpAddr>,
    ports: Vec<NamedPort>,
    /// Being deleted (`metadata.deletionTimestamp`).
    terminating: bool,
}

impl PodInfo {
    fn new(pod: &Pod, warnings: &mut Warnings) -> Option<Self> {
        let namespace = pod.metadata.namespace.clone()?;
        let name = pod.metadata.name.clone()?;
        if pod.spec.as_ref().and_then(|s| s.host_network) == Some(true) {
            return None;
        }
        let status = pod.status.as_ref()?;
        if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
            return None;
        }
        let texts: Vec<&str> = match &status.pod_ips {
            Some(ips) if !ips.is_empty() => ips.iter().map(|p| p.ip.as_str()).collect(),
            _ => status.pod_ip.iter().map(String::as_str).collect(),
        };
        let mut ips = Vec::new();
        for t in texts {
            match t.parse::<IpAddr>() {
                Ok(ip) => {
                    let ip = ip.to_canonical();
                    if !ips.contains(&ip) {
                        ips.push(ip);
                    }
                }
                Err(_) => warnings.push(format!(
                    "pod {namespace}/{name}: unparsable IP {t:?} ignored"
                )),
            }
        }
        if ips.is_empty() {
            return None;
        }
        Some(Self {
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            ports: ports::container_ports(pod),
            terminating: pod.metadata.deletion_timestamp.is_some(),
            namespace,
            name,
            ips,
        })
    }

    fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Labels of every namespace, from its object or, for namespaces of pods
/// without one, just its name label.
fn namespace_labels(namespaces: &[Namespace], pods: &[PodInfo]) -> HashMap<String, Labels> {
    let mut map: HashMap<String, Labels> = HashMap::new();
    for ns in namespaces {
        let Some(name) = &ns.metadata.name else {
            continue;
        };
        let mut labels = ns.metadata.labels.clone().unwrap_or_default();
        labels.insert(NAMESPACE_NAME.to_owned(), name.clone());
        map.insert(name.clone(), labels);
    }
    for p in pods {
        map.entry(p.namespace.clone())
            .or_insert_with(|| Labels::from([(NAMESPACE_NAME.to_owned(), p.namespace.clone())]));
    }
    map
}

/// The pods owning the addresses of `local` (index in `pods` -> its local
/// addresses). Two pods claiming one address: the one not being deleted,
/// else the first by name (warned).
fn local_owners(
    pods: &[PodInfo],
    local: &BTreeSet<IpAddr>,
    warnings: &mut Warnings,
) -> BTreeMap<usize, Vec<IpAddr>> {
    let local: BTreeSet<IpAddr> = local.iter().map(IpAddr::to_canonical).collect();
    let mut owner: BTreeMap<IpAddr, usize> = BTreeMap::new();
    for (i, p) in pods.iter().enumerate() {
        for ip in p.ips.iter().filter(|ip| local.contains(ip)) {
            match owner.get(ip) {
                None => {
                    owner.insert(*ip, i);
                }
                Some(&cur) if pods[cur].terminating && !p.terminating => {
                    owner.insert(*ip, i);
                }
                Some(&cur) if pods[cur].terminating == p.terminating => warnings.push(format!(
                    "address {ip} belongs to pods {} and {}: compiled for {}",
                    pods[cur].id(),
                    p.id(),
                    pods[cur].id()
                )),
                Some(_) => {}
            }
        }
    }
    let mut by_pod: BTreeMap<usize, Vec<IpAddr>> = BTreeMap::new();
    for (ip, i) in owner {
        by_pod.entry(i).or_default().push(ip);
    }
    by_pod
}

/// A policy selecting some local pod, its rules parsed.
struct CPolicy {
    /// `namespace/name`.
    key: String,
    /// Local pods (indices in the pods) it selects.
    selected: BTreeSet<usize>,
    /// By [`policy_dir`]: the rules, if the policy is of that type.
    dirs: [Option<Vec<CRule>>; 2],
}

impl CPolicy {
    fn rules(&self) -> impl Iterator<Item = &CRule> {
        self.dirs.iter().flatten().flatten()
    }

    fn dir_rules(&self, dir: u8) -> impl Iterator<Item = &CRule> {
        self.dirs[usize::from(dir)].iter().flatten()
    }
}

struct CRule {
    dir: u8,
    index: usize,
    /// Set once ids are assigned.
    id: u16,
    peers: Vec<CPeer>,
    ports: Vec<PortSpec>,
    /// Some port is named.
    named: bool,
    peer_text: Vec<String>,
}

enum CPeer {
    /// `cidr` minus `except` (every except inside `cidr`, same family).
    Block {
        cidr: IpNetwork,
        except: Vec<IpNetwork>,
    },
    /// A pod (index in the pods): each of its addresses.
    Pod(usize),
}

/// What the rules are compiled against.
struct Ctx<'a> {
    pods: &'a [PodInfo],
    ns_labels: &'a HashMap<String, Labels>,
}

impl Ctx<'_> {
    /// `pol` parsed, if it selects some local pod.
    fn policy(
        &self,
        pol: &NetworkPolicy,
        local_pods: &BTreeMap<usize, Vec<IpAddr>>,
        warnings: &mut Warnings,
    ) -> Option<CPolicy> {
        let (Some(ns), Some(name)) = (&pol.metadata.namespace, &pol.metadata.name) else {
            warnings.push("a NetworkPolicy without namespace or name is ignored".to_owned());
            return None;
        };
        let key = format!("{ns}/{name}");
        let empty_spec = NetworkPolicySpec::default();
        let spec = pol.spec.as_ref().unwrap_or(&empty_spec);
        let everything = LabelSelector::default();
        let pod_selector = spec.pod_selector.as_ref().unwrap_or(&everything);
        for problem in selector_problems(spec) {
            warnings.push(format!("policy {key}: {problem}"));
        }
        let (ingress, egress) = match spec.policy_types.as_deref() {
            Some(types) if !types.is_empty() => {
                for t in types.iter().filter(|t| *t != "Ingress" && *t != "Egress") {
                    warnings.push(format!("policy {key}: unknown policy type {t:?} ignored"));
                }
                (
                    types.iter().any(|t| t == "Ingress"),
                    types.iter().any(|t| t == "Egress"),
                )
            }
            _ => (true, spec.egress.is_some()),
        };
        let selected: BTreeSet<usize> = local_pods
            .keys()
            .copied()
            .filter(|&i| {
                let p = &self.pods[i];
                p.namespace == *ns && selector::matches(pod_selector, &p.labels)
            })
            .collect();
        if selected.is_empty() {
            return None;
        }
        let ingress = ingress.then(|| {
            spec.ingress
                .iter()
                .flatten()
                .enumerate()
                .map(|(i, r)| {
                    self.rule(
                        &key,
                        ns,
                        policy_dir::INGRESS,
                        i,
                        r.from.as_deref(),
                        r.ports.as_deref(),
                        warnings,
                    )
                })
                .collect()
        });
        let egress = egress.then(|| {
            spec.egress
                .iter()
                .flatten()
                .enumerate()
                .map(|(i, r)| {
                    self.rule(
                        &key,
                        ns,
                        policy_dir::EGRESS,
                        i,
                        r.to.as_deref(),
                        r.ports.as_deref(),
                        warnings,
                    )
                })
                .collect()
        });
        Some(CPolicy {
            key,
            selected,
            dirs: [ingress, egress],
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn rule(
        &self,
        key: &str,
        ns: &str,
        dir: u8,
        index: usize,
        peers: Option<&[NetworkPolicyPeer]>,
        port_list: Option<&[NetworkPolicyPort]>,
        warnings: &mut Warnings,
    ) -> CRule {
        let what = format!("policy {key} {} rule {index}", dir_name(dir));
        let mut problems = Vec::new();
        let specs = ports::parse(port_list, &mut problems);
        let mut cpeers = Vec::new();
        let mut peer_text = Vec::new();
        match peers.filter(|p| !p.is_empty()) {
            None => {
                cpeers.push(CPeer::Block {
                    cidr: IpNetwork::V4(ALL_V4),
                    except: Vec::new(),
                });
                cpeers.push(CPeer::Block {
                    cidr: IpNetwork::V6(ALL_V6),
                    except: Vec::new(),
                });
                peer_text.push("any".to_owned());
            }
            Some(peers) => {
                for peer in peers {
                    match (&peer.ip_block, &peer.pod_selector, &peer.namespace_selector) {
                        (Some(block), None, None) => {
                            let Some(cidr) = parse_cidr(&block.cidr, &mut problems) else {
                                peer_text
                                    .push(format!("ipBlock {} (invalid, ignored)", block.cidr));
                                continue;
                            };
                            let mut except = Vec::new();
                            for e in block.except.iter().flatten() {
                                let Some(net) = parse_cidr(e, &mut problems) else {
                                    continue;
                                };
                                if within(net, cidr) {
                                    except.push(net);
                                } else {
                                    problems.push(format!(
                                        "except {net} is not inside ipBlock {cidr}: ignored"
                                    ));
                                }
                            }
                            let mut text = format!("ipBlock {cidr}");
                            if !except.is_empty() {
                                let list: Vec<String> =
                                    except.iter().map(ToString::to_string).collect();
                                let _ = write!(text, " except {}", list.join(", "));
                            }
                            peer_text.push(text);
                            cpeers.push(CPeer::Block { cidr, except });
                        }
                        (None, None, None) | (Some(_), _, _) => {
                            problems.push(
                                "a peer needs exactly one of ipBlock or pod/namespace selectors: peer ignored"
                                    .to_owned(),
                            );
                            peer_text.push("invalid (ignored)".to_owned());
                        }
                        (None, pod_sel, ns_sel) => {
                            for (j, p) in self.pods.iter().enumerate() {
                                let ns_ok = match ns_sel {
                                    None => p.namespace == ns,
                                    Some(s) => self
                                        .ns_labels
                                        .get(&p.namespace)
                                        .is_some_and(|l| selector::matches(s, l)),
                                };
                                if ns_ok
                                    && pod_sel
                                        .as_ref()
                                        .is_none_or(|s| selector::matches(s, &p.labels))
                                {
                                    cpeers.push(CPeer::Pod(j));
                                }
                            }
                            let ns_text = ns_sel.as_ref().map_or_else(
                                || ns.to_owned(),
                                |s| format!("[{}]", selector::describe(s)),
                            );
                            let labels = pod_sel
                                .as_ref()
                                .map_or_else(|| "any".to_owned(), selector::describe);
                            peer_text.push(format!("pods ns={ns_text} labels={labels}"));
                        }
                    }
                }
            }
        }
        let named: Vec<String> = specs
            .iter()
            .filter(|s| matches!(s, PortSpec::Named { .. }))
            .map(PortSpec::describe)
            .collect();
        if dir == policy_dir::EGRESS
            && !named.is_empty()
            && cpeers.iter().any(|p| matches!(p, CPeer::Block { .. }))
        {
            problems.push(format!(
                "named port(s) {} resolve against peer pods only: the rule's ipBlock (or any-address) peers get nothing for them",
                named.join(", ")
            ));
        }
        for p in problems {
            warnings.push(format!("{what}: {p}"));
        }
        CRule {
            dir,
            index,
            id: 0,
            peers: cpeers,
            named: !named.is_empty(),
            ports: specs,
            peer_text,
        }
    }
}

/// Problems of every label selector of `spec`.
fn selector_problems(spec: &NetworkPolicySpec) -> Vec<String> {
    let peers = spec
        .ingress
        .iter()
        .flatten()
        .flat_map(|r| r.from.iter().flatten())
        .chain(
            spec.egress
                .iter()
                .flatten()
                .flat_map(|r| r.to.iter().flatten()),
        );
    spec.pod_selector
        .iter()
        .chain(peers.flat_map(|p| p.pod_selector.iter().chain(p.namespace_selector.iter())))
        .flat_map(selector::problems)
        .collect()
}

/// A CIDR as a prefix: host bits cleared (warned), an IPv4-mapped IPv6
/// prefix as the IPv4 one (the datapath sees IPv4 as mapped addresses).
fn parse_cidr(text: &str, problems: &mut Vec<String>) -> Option<IpNetwork> {
    let Ok(raw) = text.trim().parse::<IpNetwork>() else {
        problems.push(format!("unparsable CIDR {text:?}: ignored"));
        return None;
    };
    let mut net = IpNetwork::new(raw.network(), raw.prefix()).unwrap_or(raw);
    if net.ip() != raw.ip() {
        problems.push(format!("CIDR {text:?} has host bits set: {net} used"));
    }
    if let IpNetwork::V6(n) = net {
        if let (true, Some(v4)) = (n.prefix() >= 96, n.ip().to_ipv4_mapped()) {
            net = IpNetwork::new(IpAddr::V4(v4), n.prefix() - 96).unwrap_or(net);
        }
    }
    Some(net)
}

/// Whether prefix `a` lies inside prefix `b` (same family only).
fn within(a: IpNetwork, b: IpNetwork) -> bool {
    match (a, b) {
        (IpNetwork::V4(_), IpNetwork::V4(_)) | (IpNetwork::V6(_), IpNetwork::V6(_)) => {
            b.prefix() <= a.prefix() && b.contains(a.network())
        }
        _ => false,
    }
}

/// Whether the IPv6 prefix `p` covers the IPv4-mapped space (`::ffff:0:0/96`).
fn covers_v4_space(p: IpNetwork) -> bool {
    match p {
        IpNetwork::V6(n) => n.prefix() <= 96 && n.contains(Ipv4Addr::UNSPECIFIED.to_ipv6_mapped()),
        IpNetwork::V4(_) => false,
    }
}

fn dir_name(dir: u8) -> &'static str {
    if dir == policy_dir::INGRESS {
        "ingress"
    } else {
        "egress"
    }
}

/// `a, b, c, d, e (and 3 more)`.
fn name_list(names: &[String]) -> String {
    let mut s = names
        .iter()
        .take(NAMED_MAX)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > NAMED_MAX {
        let _ = write!(s, " (and {} more)", names.len() - NAMED_MAX);
    }
    s
}

/// A local pod and what it got.
struct Placed {
    pod: usize,
    addrs: Vec<IpAddr>,
    flags: u32,
    /// Index in the contents (`None`: not isolated).
    content: Option<usize>,
    policies: Vec<String>,
}

/// What a content depends on: the flags, the policies per direction and,
/// where ingress rules have named ports, the pod's container ports.
#[derive(PartialEq, Eq, Hash)]
struct CacheKey {
    flags: u32,
    by_dir: [Vec<usize>; 2],
    ports: Option<Vec<NamedPort>>,
}

/// An entry over [`MAX_PORT_RANGES`] (`count` ranges after merging).
struct Overflow {
    dir: u8,
    peer: IpNetwork,
    count: usize,
}

/// The content of the set of a pod (`local`) selected by the policies
/// `by_dir` (indices in `cpols`, per direction).
fn build(
    flags: u32,
    by_dir: &[Vec<usize>; 2],
    cpols: &[CPolicy],
    pods: &[PodInfo],
    local: &PodInfo,
    misses: &mut BTreeMap<(String, u8, usize, String), BTreeSet<String>>,
) -> (Content, Vec<Overflow>) {
    let mut entries = BTreeMap::new();
    let mut overflows = Vec::new();
    for (dir, flag) in [
        (policy_dir::INGRESS, pod_policy::INGRESS),
        (policy_dir::EGRESS, pod_policy::EGRESS),
    ] {
        if flags & flag == 0 {
            continue;
        }
        // Every (rule, peer) with a sequence number (rule order) and the
        // ranges it allows.
        let mut seq = 0usize;
        let mut blocks: Vec<(usize, IpNetwork, &[IpNetwork], Vec<Range>)> = Vec::new();
        let mut hosts: BTreeMap<IpNetwork, Vec<(usize, Vec<Range>)>> = BTreeMap::new();
        for &k in &by_dir[usize::from(dir)] {
            for rule in cpols[k].dir_rules(dir) {
                let named_against = (dir == policy_dir::INGRESS).then_some(local.ports.as_slice());
                let (base, _) = resolve(&rule.ports, rule.id, named_against);
                for peer in &rule.peers {
                    seq += 1;
                    match peer {
                        CPeer::Block { cidr, except } => {
                            blocks.push((seq, *cidr, except, base.clone()));
                        }
                        CPeer::Pod(j) => {
                            let peer_pod = &pods[*j];
                            let ranges = if dir == policy_dir::EGRESS && rule.named {
                                let (ranges, missed) =
                                    resolve(&rule.ports, rule.id, Some(&peer_pod.ports));
                                for m in missed {
                                    misses
                                        .entry((cpols[k].key.clone(), dir, rule.index, m))
                                        .or_default()
                                        .insert(peer_pod.id());
                                }
                                ranges
                            } else {
                                base.clone()
                            };
                            for ip in &peer_pod.ips {
                                hosts
                                    .entry(IpNetwork::from(*ip))
                                    .or_default()
                                    .push((seq, ranges.clone()));
                            }
                        }
                    }
                }
            }
        }
        let mut prefixes: BTreeSet<IpNetwork> = hosts.keys().copied().collect();
        for (_, cidr, except, _) in &blocks {
            prefixes.insert(*cidr);
            prefixes.extend(except.iter().copied());
        }
        if prefixes.iter().any(|p| covers_v4_space(*p)) {
            prefixes.insert(IpNetwork::V4(ALL_V4));
        }
        for peer in prefixes {
            let mut parts: Vec<(usize, &[Range])> = hosts
                .get(&peer)
                .into_iter()
                .flatten()
                .map(|(s, r)| (*s, r.as_slice()))
                .collect();
            parts.extend(
                blocks
                    .iter()
                    .filter(|(_, cidr, except, _)| {
                        within(peer, *cidr) && !except.iter().any(|e| within(peer, *e))
                    })
                    .map(|(s, _, _, r)| (*s, r.as_slice())),
            );
            parts.sort_by_key(|(s, _)| *s);
            let (ranges, over) = normalize(parts.iter().flat_map(|(_, r)| r.iter().copied()));
            if let Some(count) = over {
                overflows.push(Overflow { dir, peer, count });
            }
            entries.insert((dir, peer), ranges);
        }
    }
    (Content { flags, entries }, overflows)
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::policy::ports::{TCP, UDP};

    const ANY: (u8, u16, u16) = (0, 0, u16::MAX);
    const IN: u8 = policy_dir::INGRESS;
    const OUT: u8 = policy_dir::EGRESS;

    fn pod_json(ns: &str, name: &str, labels: &Value, ips: &[&str]) -> Value {
        let list: Vec<Value> = ips.iter().map(|ip| json!({ "ip": ip })).collect();
        json!({
            "metadata": {"namespace": ns, "name": name, "labels": labels},
            "spec": {"containers": [{"name": "main"}]},
            "status": {"phase": "Running", "podIP": ips.first(), "podIPs": list},
        })
    }

    fn pod(ns: &str, name: &str, labels: &Value, ips: &[&str]) -> Pod {
        serde_json::from_value(pod_json(ns, name, labels, ips)).unwrap()
    }

    /// A pod whose containers are `containers`.
    fn pod_with(ns: &str, name: &str, labels: &Value, ips: &[&str], containers: Value) -> Pod {
        let mut v = pod_json(ns, name, labels, ips);
        v["spec"]["containers"] = containers;
        serde_json::from_value(v).unwrap()
    }

    fn namespace(name: &str, labels: &Value) -> Namespace {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
    }

    fn policy(ns: &str, name: &str, spec: &Value) -> NetworkPolicy {
        serde_json::from_value(json!({"metadata": {"namespace": ns, "name": name}, "spec": spec}))
            .unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn addrs(ips: &[&str]) -> BTreeSet<IpAddr> {
        ips.iter().map(|s| ip(s)).collect()
    }

    fn set_of(c: &Compiled, addr: &str) -> u32 {
        c.pods[&ip(addr)].set
    }

    /// The value at `prefix` of `set`'s `dir` as (proto, first, last) each.
    fn entry(c: &Compiled, set: u32, dir: u8, prefix: &str) -> Option<Vec<(u8, u16, u16)>> {
        entry_ranges(c, set, dir, prefix)
            .map(|v| v.iter().map(|r| (r.proto, r.first, r.last)).collect())
    }

    fn entry_ranges(c: &Compiled, set: u32, dir: u8, prefix: &str) -> Option<Vec<PortRange>> {
        let key = PolicyKeyOrd {
            set,
            dir,
            peer: prefix.parse().unwrap(),
        };
        c.rules
            .get(&key)
            .map(|v| v.ranges[..v.count as usize].to_vec())
    }

    /// Every prefix of `set`'s `dir`.
    fn prefixes(c: &Compiled, set: u32, dir: u8) -> BTreeSet<String> {
        c.rules
            .keys()
            .filter(|k| k.set == set && k.dir == dir)
            .map(|k| k.peer.to_string())
            .collect()
    }

    /// The prefixes of `set`'s `dir` whose value allows something.
    fn allowed(c: &Compiled, set: u32, dir: u8) -> BTreeSet<String> {
        c.rules
            .iter()
            .filter(|(k, v)| k.set == set && k.dir == dir && v.count > 0)
            .map(|(k, _)| k.peer.to_string())
            .collect()
    }

    fn strings(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn default_deny_ingress() {
        let mut host = pod_json("prod", "host", &json!({}), &["10.0.0.9"]);
        host["spec"]["hostNetwork"] = json!(true);
        let mut done = pod_json("prod", "done", &json!({}), &["10.0.0.8"]);
        done["status"]["phase"] = json!("Succeeded");
        let pods = [
            pod("prod", "a", &json!({"app": "a"}), &["10.0.0.1"]),
            pod("prod", "b", &json!({}), &["10.0.0.2"]),
            pod("dev", "c", &json!({}), &["10.0.1.1"]),
            serde_json::from_value(host).unwrap(),
            serde_json::from_value(done).unwrap(),
        ];
        let policies = [policy("prod", "deny", &json!({"podSelector": {}}))];
        let local = addrs(&[
            "10.0.0.1", "10.0.0.2", "10.0.1.1", "10.0.0.9", "10.0.0.8", "10.0.0.7",
        ]);
        let c = Compiler::new(100).compile(&policies, &pods, &[], &local);

        let isolated = PolicyPod {
            flags: pod_policy::INGRESS,
            set: 100,
        };
        let expected = BTreeMap::from([
            (ip("10.0.0.1"), isolated),
            (ip("10.0.0.2"), isolated),
            (ip("10.0.1.1"), PolicyPod { flags: 0, set: 0 }),
        ]);
        assert_eq!(
            c.pods, expected,
            "host-network, finished and unknown pods are left out"
        );
        assert!(c.rules.is_empty(), "default deny: no entry at all");
        assert!(c.report.rules.is_empty());
        assert_eq!(c.report.pods.len(), 3);
        assert_eq!(c.report.pods[0].name, "c");
        assert_eq!(c.report.pods[0].set, 0);
        assert!(c.report.pods[1].ingress_isolated && !c.report.pods[1].egress_isolated);
        assert_eq!(c.report.pods[1].policies, ["prod/deny"]);
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    }

    #[test]
    fn allow_all_ingress() {
        let pods = [pod("prod", "a", &json!({"app": "a"}), &["10.0.0.1"])];
        let policies = [policy(
            "prod",
            "allow",
            &json!({"podSelector": {"matchLabels": {"app": "a"}}, "ingress": [{}]}),
        )];
        let c = Compiler::new(1).compile(&policies, &pods, &[], &addrs(&["10.0.0.1"]));
        assert_eq!(
            c.pods[&ip("10.0.0.1")],
            PolicyPod {
                flags: pod_policy::INGRESS,
                set: 1
            }
        );
        assert_eq!(prefixes(&c, 1, IN), strings(&["0.0.0.0/0", "::/0"]));
        assert_eq!(c.rules.len(), 2);
        assert_eq!(entry(&c, 1, IN, "0.0.0.0/0"), Some(vec![ANY]));
        assert_eq!(entry(&c, 1, IN, "::/0"), Some(vec![ANY]));
        assert_eq!(entry_ranges(&c, 1, IN, "::/0").unwrap()[0].rule, 1);
        let keys: Vec<PolicyKey> = c.rules.keys().map(PolicyKeyOrd::policy_key).collect();
        assert_eq!(keys[0].prefixlen, 64 + 96);
        assert_eq!(keys[0].peer, IpKey::v4([0; 4]));
        assert_eq!(keys[0].set, 1);
        assert_eq!(keys[0].dir, IN);
        assert_eq!(keys[1].prefixlen, 64);
        assert_eq!(keys[1].peer, IpKey::v6([0; 16]));
        assert_eq!(
            c.report.rules,
            [RuleReport {
                id: 1,
                policy: "prod/allow".into(),
                direction: "ingress".into(),
                index: 0,
                peers: vec!["any".into()],
                ports: vec!["any".into()],
            }]
        );
    }

    /// The /32s allowed into prod/target (TCP 80) with `from` = `peers`.
    fn ingress_peers(peers: &Value) -> BTreeSet<String> {
        let namespaces = [
            namespace("prod", &json!({"team": "a"})),
            namespace("dev", &json!({"team": "b"})),
        ];
        let pods = [
            pod("prod", "target", &json!({"app": "target"}), &["10.0.0.10"]),
            pod("prod", "web", &json!({"app": "web"}), &["10.0.0.1"]),
            pod("prod", "db", &json!({"app": "db"}), &["10.0.0.2"]),
            pod("dev", "web", &json!({"app": "web"}), &["10.0.1.1"]),
            pod("dev", "db", &json!({"app": "db"}), &["10.0.1.2"]),
            // No Namespace object.
            pod("other", "web", &json!({"app": "web"}), &["10.0.2.1"]),
        ];
        let policies = [policy(
            "prod",
            "p",
            &json!({
                "podSelector": {"matchLabels": {"app": "target"}},
                "ingress": [{"from": peers, "ports": [{"port": 80}]}],
            }),
        )];
        let c = Compiler::new(1).compile(&policies, &pods, &namespaces, &addrs(&["10.0.0.10"]));
        let set = set_of(&c, "10.0.0.10");
        for p in allowed(&c, set, IN) {
            assert_eq!(entry(&c, set, IN, &p), Some(vec![(TCP, 80, 80)]));
        }
        assert_eq!(allowed(&c, set, IN), prefixes(&c, set, IN));
        allowed(&c, set, IN)
    }

    #[test]
    fn peer_selectors() {
        let web = json!({"matchLabels": {"app": "web"}});
        let team_b = json!({"matchLabels": {"team": "b"}});
        assert_eq!(
            ingress_peers(&json!([{"podSelector": web}])),
            strings(&["10.0.0.1/32"])
        );
        assert_eq!(
            ingress_peers(&json!([{"namespaceSelector": team_b}])),
            strings(&["10.0.1.1/32", "10.0.1.2/32"])
        );
        // Both in one peer: AND.
        assert_eq!(
            ingress_peers(&json!([{"namespaceSelector": team_b, "podSelector": web}])),
            strings(&["10.0.1.1/32"])
        );
        // Two peers: OR.
        assert_eq!(
            ingress_peers(&json!([{"namespaceSelector": team_b}, {"podSelector": web}])),
            strings(&["10.0.0.1/32", "10.0.1.1/32", "10.0.1.2/32"])
        );
        // Empty namespaceSelector: every namespace, with or without object.
        assert_eq!(
            ingress_peers(&json!([{"namespaceSelector": {}, "podSelector": web}])),
            strings(&["10.0.0.1/32", "10.0.1.1/32", "10.0.2.1/32"])
        );
        // The name label, also of a namespace without object.
        assert_eq!(
            ingress_peers(
                &json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "other"}}}])
            ),
            strings(&["10.0.2.1/32"])
        );
        assert_eq!(
            ingress_peers(
                &json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "dev"}}}])
            ),
            strings(&["10.0.1.1/32", "10.0.1.2/32"])
        );
        // Empty podSelector: the policy's namespace, the pod itself included.
        assert_eq!(
            ingress_peers(&json!([{"podSelector": {}}])),
            strings(&["10.0.0.1/32", "10.0.0.10/32", "10.0.0.2/32"])
        );
    }

    #[test]
    fn match_expressions() {
        let pods = [
            pod("prod", "a", &json!({"env": "prod"}), &["10.0.0.1"]),
            pod("prod", "b", &json!({"env": "dev"}), &["10.0.0.2"]),
            pod("prod", "c", &json!({}), &["10.0.0.3"]),
        ];
        let expr = |key: &str, op: &str, values: &[&str]| json!({"matchExpressions": [{"key": key, "operator": op, "values": values}]});
        let policies = [
            policy(
                "prod",
                "not-prod",
                &json!({
                    "podSelector": expr("env", "NotIn", &["prod"]),
                    "ingress": [{"from": [{"podSelector": expr("env", "Exists", &[])}]}],
                }),
            ),
            policy(
                "prod",
                "no-env",
                &json!({"podSelector": expr("env", "DoesNotExist", &[]), "policyTypes": ["Egress"]}),
            ),
            policy(
                "prod",
                "in",
                &json!({"podSelector": expr("env", "In", &["prod", "qa"]), "policyTypes": ["Egress"]}),
            ),
            policy(
                "prod",
                "bogus",
                &json!({"podSelector": expr("env", "Bogus", &["prod"])}),
            ),
        ];
        let c = Compiler::new(1).compile(
            &policies,
            &pods,
            &[],
            &addrs(&["10.0.0.1", "10.0.0.2", "10.0.0.3"]),
        );
        assert_eq!(c.pods[&ip("10.0.0.1")].flags, pod_policy::EGRESS);
        assert_eq!(c.pods[&ip("10.0.0.2")].flags, pod_policy::INGRESS);
        assert_eq!(
            c.pods[&ip("10.0.0.3")].flags,
            pod_policy::INGRESS | pod_policy::EGRESS
        );
        let b = set_of(&c, "10.0.0.2");
        assert_eq!(allowed(&c, b, IN), strings(&["10.0.0.1/32", "10.0.0.2/32"]));
        assert_eq!(c.report.pods[2].policies, ["prod/no-env", "prod/not-prod"]);
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert!(c.warnings[0].contains("prod/bogus") && c.warnings[0].contains("\"Bogus\""));
        assert_eq!(
            c.report.rules[0].peers,
            ["pods ns=prod labels=env"],
            "Exists is written as the bare key"
        );
    }

    #[test]
    fn ip_block_except_and_pod_inside_it() {
        let pods = [
            pod(
                "prod",
                "target",
                &json!({"app": "target"}),
                &["192.168.0.1"],
            ),
            pod("prod", "web", &json!({"app": "web"}), &["10.1.0.5"]),
            pod("prod", "web2", &json!({"app": "web"}), &["10.2.0.7"]),
        ];
        let policies = [policy(
            "prod",
            "p",
            &json!({
                "podSelector": {"matchLabels": {"app": "target"}},
                "ingress": [
                    {"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}], "ports": [{"port": 443}]},
                    {"from": [{"podSelector": {"matchLabels": {"app": "web"}}}], "ports": [{"port": 80}]},
                ],
            }),
        )];
        let c = Compiler::new(1).compile(&policies, &pods, &[], &addrs(&["192.168.0.1"]));
        let s = set_of(&c, "192.168.0.1");
        assert_eq!(
            prefixes(&c, s, IN),
            strings(&["10.0.0.0/8", "10.1.0.0/16", "10.1.0.5/32", "10.2.0.7/32"])
        );
        assert_eq!(entry(&c, s, IN, "10.0.0.0/8"), Some(vec![(TCP, 443, 443)]));
        assert_eq!(
            entry(&c, s, IN, "10.1.0.0/16"),
            Some(vec![]),
            "the except allows nothing"
        );
        assert_eq!(
            entry(&c, s, IN, "10.1.0.5/32"),
            Some(vec![(TCP, 80, 80)]),
            "a pod inside the except: its own entry, without the block's port"
        );
        assert_eq!(
            entry_ranges(&c, s, IN, "10.2.0.7/32").unwrap(),
            [
                PortRange {
                    proto: TCP,
                    _pad: 0,
                    rule: 2,
                    first: 80,
                    last: 80
                },
                PortRange {
                    proto: TCP,
                    _pad: 0,
                    rule: 1,
                    first: 443,
                    last: 443
                },
            ]
        );
        let key = |p: &str| {
            PolicyKeyOrd {
                set: s,
                dir: IN,
                peer: p.parse().unwrap(),
            }
            .policy_key()
        };
        assert_eq!(key("10.0.0.0/8").prefixlen, 64 + 96 + 8);
        assert_eq!(key("10.1.0.0/16").prefixlen, 64 + 96 + 16);
        assert_eq!(key("10.1.0.0/16").peer, IpKey::v4([10, 1, 0, 0]));
        assert_eq!(key("10.1.0.5/32").prefixlen, 64 + 128);
        assert_eq!(
            c.report.rules[0].peers,
            ["ipBlock 10.0.0.0/8 except 10.1.0.0/16"]
        );
        assert_eq!(c.report.rules[0].ports, ["TCP/443"]);
        assert_eq!(c.report.rules[1].peers, ["pods ns=prod labels=app=web"]);
    }

    #[test]
    fn end_port() {
        let pods = [
            pod("prod", "a", &json!({"app": "a"}), &["10.0.0.1"]),
            pod("prod", "b", &json!({"app": "b"}), &["10.0.0.2"]),
        ];
        let policies = [
            policy(
                "prod",
                "range",
                &json!({
                    "podSelector": {"matchLabels": {"app": "a"}},
                    "ingress": [{"ports": [{"port": 8000, "endPort": 8080}, {"protocol": "UDP", "port": 53}]}],
                }),
            ),
            policy(
                "prod",
                "reversed",
                &json!({
                    "podSelector": {"matchLabels": {"app": "b"}},
                    "ingress": [{"ports": [{"port": 9000, "endPort": 8000}]}],
                }),
            ),
        ];
        let c = Compiler::new(1).compile(&policies, &pods, &[], &addrs(&["10.0.0.1", "10.0.0.2"]));
        let a = set_of(&c, "10.0.0.1");
        assert_eq!(
            entry(&c, a, IN, "0.0.0.0/0"),
            Some(vec![(TCP, 8000, 8080), (UDP, 53, 53)])
        );
        assert_eq!(c.report.rules[0].ports, ["TCP/8000-8080", "UDP/53"]);
        let b = set_of(&c, "10.0.0.2");
        assert_ne!(a, b);
        assert_eq!(
            entry(&c, b, IN, "0.0.0.0/0"),
            Some(vec![]),
            "the bad entry is ignored: nothing allowed"
        );
        assert_eq!(entry(&c, b, IN, "::/0"), Some(vec![]));
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert!(c.warnings[0]
            .starts_with("policy prod/reversed ingress rule 0: endPort 8000 below port 9000"));
    }

    #[test]
    fn named_ports_per_selected_pod() {
        let http = |port: u16| json!({"name": "http", "containerPort": port});
        let pods = [
            pod_with(
                "prod",
                "a",
                &json!({}),
                &["10.0.0.1"],
                json!([{"name": "c1", "ports": [http(8080)]}, {"name": "c2", "ports": [http(9090)]}]),
            ),
            pod_with(
                "prod",
                "b",
                &json!({}),
                &["10.0.0.2"],
                json!([{"name": "c1", "ports": [http(7070), {"name": "http", "containerPort": 5000, "protocol": "UDP"}]}]),
            ),
            pod_with(
                "prod",
                "c",
                &json!({}),
                &["10.0.0.3"],
                json!([{"name": "c1", "ports": [http(9090), http(8080)]}]),
            ),
            pod("prod", "d", &json!({}), &["10.0.0.4"]),
        ];
        let policies = [policy(
            "prod",
            "web",
            &json!({"podSelector": {}, "ingress": [{"ports": [{"port": "http"}]}]}),
        )];
        let local = addrs(&["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]);
        let c = Compiler::new(1).compile(&policies, &pods, &[], &local);
        let (a, b, cc, d) = (
            set_of(&c, "10.0.0.1"),
            set_of(&c, "10.0.0.2"),
            set_of(&c, "10.0.0.3"),
            set_of(&c, "10.0.0.4"),
        );
        assert_eq!(a, cc, "equal content, one set");
        assert_eq!(BTreeSet::from([a, b, d]).len(), 3);
        assert_eq!(
            entry(&c, a, IN, "0.0.0.0/0"),
            Some(vec![(TCP, 8080, 8080), (TCP, 9090, 9090)])
        );
        assert_eq!(entry(&c, a, IN, "::/0"), entry(&c, a, IN, "0.0.0.0/0"));
        assert_eq!(entry(&c, b, IN, "0.0.0.0/0"), Some(vec![(TCP, 7070, 7070)]));
        assert_eq!(entry(&c, d, IN, "0.0.0.0/0"), Some(vec![]));
        assert_eq!(c.report.rules[0].ports, ["TCP/http (named)"]);
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert!(
            c.warnings[0].contains("policy prod/web ingress rule 0: named port TCP/http (named)")
        );
        assert!(c.warnings[0].contains("selected pod(s) prod/d:"));
    }

    #[test]
    fn named_ports_per_egress_peer() {
        let pg =
            |port: u16| json!([{"name": "db", "ports": [{"name": "pg", "containerPort": port}]}]);
        let pods = [
            pod("prod", "client", &json!({"app": "client"}), &["10.0.0.1"]),
            pod_with(
                "prod",
                "db1",
                &json!({"app": "db"}),
                &["10.0.0.11"],
                pg(5432),
            ),
            pod_with(
                "prod",
                "db2",
                &json!({"app": "db"}),
                &["10.0.0.12", "fd00::12"],
                pg(5433),
            ),
            pod("prod", "db3", &json!({"app": "db"}), &["10.0.0.13"]),
        ];
        let policies = [policy(
            "prod",
            "to-db",
            &json!({
                "podSelector": {"matchLabels": {"app": "client"}},
                "policyTypes": ["Egress"],
                "egress": [{
                    "to": [{"podSelector": {"matchLabels": {"app": "db"}}}, {"ipBlock": {"cidr": "192.168.0.0/16"}}],
                    "ports": [{"port": "pg"}],
                }],
            }),
        )];
        let c = Compiler::new(1).compile(&policies, &pods, &[], &addrs(&["10.0.0.1"]));
        assert_eq!(
            c.pods[&ip("10.0.0.1")],
            PolicyPod {
                flags: pod_policy::EGRESS,
                set: 1
            }
        );
        assert_eq!(
            prefixes(&c, 1, OUT),
            strings(&[
                "10.0.0.11/32",
                "10.0.0.12/32",
                "10.0.0.13/32",
                "192.168.0.0/16",
                "fd00::12/128"
            ])
        );
        assert!(prefixes(&c, 1, IN).is_empty());
        assert_eq!(
            entry(&c, 1, OUT, "10.0.0.11/32"),
            Some(vec![(TCP, 5432, 5432)])
        );
        assert_eq!(
            entry(&c, 1, OUT, "10.0.0.12/32"),
            Some(vec![(TCP, 5433, 5433)])
        );
        assert_eq!(
            entry(&c, 1, OUT, "fd00::12/128"),
            Some(vec![(TCP, 5433, 5433)])
        );
        assert_eq!(entry(&c, 1, OUT, "10.0.0.13/32"), Some(vec![]));
        assert_eq!(entry(&c, 1, OUT, "192.168.0.0/16"), Some(vec![]));
        assert_eq!(c.warnings.len(), 2, "{:?}", c.warnings);
        assert!(c.warnings[0].contains(
            "prod/to-db egress rule 0: named port(s) TCP/pg (named) resolve against peer pods only"
        ));
        assert!(c.warnings[1].contains("peer pod(s) prod/db3:"));
    }

    #[test]
    fn policy_types_default() {
        let pods = [
            pod("prod", "a", &json!({"app": "a"}), &["10.0.0.1"]),
            pod("prod", "b", &json!({"app": "b"}), &["10.0.0.2"]),
            pod("prod", "c", &json!({"app": "c"}), &["10.0.0.3"]),
        ];
        let policies = [
            // egress present: Ingress and Egress.
            policy(
                "prod",
                "a",
                &json!({
                    "podSelector": {"matchLabels": {"app": "a"}},
                    "ingress": [{}],
                    "egress": [{"ports": [{"protocol": "UDP", "port": 53}]}],
                }),
            ),
            // Egress only: the ingress rules do not apply.
            policy(
                "prod",
                "b",
                &json!({"podSelector": {"matchLabels": {"app": "b"}}, "policyTypes": ["Egress"], "ingress": [{}]}),
            ),
            // An empty egress list is present.
            policy(
                "prod",
                "c",
                &json!({"podSelector": {"matchLabels": {"app": "c"}}, "egress": []}),
            ),
        ];
        let c = Compiler::new(1).compile(
            &policies,
            &pods,
            &[],
            &addrs(&["10.0.0.1", "10.0.0.2", "10.0.0.3"]),
        );
        let both = pod_policy::INGRESS | pod_policy::EGRESS;
        assert_eq!(c.pods[&ip("10.0.0.1")].flags, both);
        assert_eq!(c.pods[&ip("10.0.0.2")].flags, pod_policy::EGRESS);
        assert_eq!(c.pods[&ip("10.0.0.3")].flags, both);
        let a = set_of(&c, "10.0.0.1");
        assert_eq!(entry(&c, a, IN, "0.0.0.0/0"), Some(vec![ANY]));
        assert_eq!(entry(&c, a, OUT, "0.0.0.0/0"), Some(vec![(UDP, 53, 53)]));
        assert_eq!(entry(&c, a, OUT, "::/0"), Some(vec![(UDP, 53, 53)]));
        assert!(prefixes(&c, set_of(&c, "10.0.0.2"), IN).is_empty());
        assert!(prefixes(&c, set_of(&c, "10.0.0.2"), OUT).is_empty());
        assert!(prefixes(&c, set_of(&c, "10.0.0.3"), OUT).is_empty());
        assert_ne!(
            set_of(&c, "10.0.0.2"),
            set_of(&c, "10.0.0.3"),
            "other flags, other set"
        );
        // Only the rules of applied directions have ids.
        let rules: Vec<(&str, &str)> = c
            .report
            .rules
            .iter()
            .map(|r| (r.policy.as_str(), r.direction.as_str()))
            .collect();
        assert_eq!(rules, [("prod/a", "ingress"), ("prod/a", "egress")]);
    }

    #[test]
    fn union_of_policies() {
        let pods = [
            pod("prod", "target", &json!({"app": "target"}), &["10.0.0.10"]),
            pod("prod", "web", &json!({"app": "web"}), &["10.0.0.1"]),
        ];
        let web = json!([{"podSelector": {"matchLabels": {"app": "web"}}}]);
        let target = json!({"matchLabels": {"app": "target"}});
        let policies = [
            policy(
                "prod",
                "p2",
                &json!({
                    "podSelector": target,
                    "ingress": [
                        {"from": web, "ports": [{"port": 443}]},
                        {"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"protocol": "UDP", "port": 53}]},
                    ],
                }),
            ),
            policy(
                "prod",
                "p1",
                &json!({"podSelector": target, "ingress": [{"from": web, "ports": [{"port": 80}]}]}),
            ),
        ];
        let c = Compiler::new(1).compile(&policies, &pods, &[], &addrs(&["10.0.0.10"]));
        let s = set_of(&c, "10.0.0.10");
        let ids: Vec<(String, usize, u16)> = c
            .report
            .rules
            .iter()
            .map(|r| (r.policy.clone(), r.index, r.id))
            .collect();
        assert_eq!(
            ids,
            [
                ("prod/p1".into(), 0, 1),
                ("prod/p2".into(), 0, 2),
                ("prod/p2".into(), 1, 3)
            ]
        );
        assert_eq!(
            entry_ranges(&c, s, IN, "10.0.0.1/32").unwrap(),
            [
                PortRange {
                    proto: TCP,
                    _pad: 0,
                    rule: 1,
                    first: 80,
                    last: 80
                },
                PortRange {
                    proto: TCP,
                    _pad: 0,
                    rule: 2,
                    first: 443,
                    last: 443
                },
                PortRange {
                    proto: UDP,
                    _pad: 0,
                    rule: 3,
                    first: 53,
                    last: 53
                },
            ]
        );
        assert_eq!(entry(&c, s, IN, "10.0.0.0/8"), Some(vec![(UDP, 53, 53)]));
        assert_eq!(c.report.pods.len(), 1);
        assert_eq!(c.report.pods[0].policies, ["prod/p1", "prod/p2"]);
    }

    fn one_port_policy(port: u16) -> NetworkPolicy {
        policy(
            "prod",
            "p",
            &json!({"podSelector": {"matchLabels": {"app": "a"}}, "ingress": [{"ports": [{"port": port}]}]}),
        )
    }

    #[test]
    fn set_ids_stable_and_never_reused() {
        let pods = vec![
            pod("prod", "a", &json!({"app": "a"}), &["10.0.0.1"]),
            pod("prod", "b", &json!({"app": "b"}), &["10.0.0.2"]),
        ];
        let deny_b = policy(
            "prod",
            "deny-b",
            &json!({"podSelector": {"matchLabels": {"app": "b"}}}),
        );
        let local = addrs(&["10.0.0.1", "10.0.0.2"]);
        let mut compiler = Compiler::new(10);
        let first = compiler.compile(&[one_port_policy(80), deny_b.clone()], &pods, &[], &local);
        // Pods are placed in name order: a, then b.
        let (a, b) = (set_of(&first, "10.0.0.1"), set_of(&first, "10.0.0.2"));
        assert_eq!((a, b), (10, 11));

        // Same input, other order: same ids, same rules.
        let reversed: Vec<Pod> = pods.iter().rev().cloned().collect();
        let again = compiler.compile(
            &[deny_b.clone(), one_port_policy(80)],
            &reversed,
            &[],
            &local,
        );
        assert_eq!(again.pods, first.pods);
        assert_eq!(again.rules, first.rules);

        // a's content changes: a new id; b keeps its own.
        let changed = compiler.compile(&[one_port_policy(81), deny_b.clone()], &pods, &[], &local);
        assert_eq!(set_of(&changed, "10.0.0.1"), 12);
        assert_eq!(set_of(&changed, "10.0.0.2"), b);
        assert_eq!(
            entry(&changed, 12, IN, "0.0.0.0/0"),
            Some(vec![(TCP, 81, 81)])
        );
        assert!(
            changed.rules.keys().all(|k| k.set != a),
            "the old set's entries are gone"
        );

        // Back to the first content: still a new id.
        let back = compiler.compile(&[one_port_policy(80), deny_b], &pods, &[], &local);
        assert_eq!(set_of(&back, "10.0.0.1"), 13);
        assert_eq!(entry(&back, 13, IN, "0.0.0.0/0"), Some(vec![(TCP, 80, 80)]));
    }

    #[test]
    fn rule_ids_stable() {
        let pods = [pod("prod", "a", &json!({"app": "a"}), &["10.0.0.1"])];
        let local = addrs(&["10.0.0.1"]);
        let sel = json!({"matchLabels": {"app": "a"}});
        let two = policy(
            "prod",
            "p1",
            &json!({"podSelector": sel, "ingress": [{}, {"ports": [{"port": 1}]}]}),
        );
        let one = policy(
            "prod",
            "p2",
            &json!({"podSelector": sel, "ingress": [{"ports": [{"port": 2}]}]}),
        );
        let new = policy("prod", "p0", &json!({"podSelector": sel, "egress": [{}]}));
        let ids = |c: &Compiled| -> Vec<(String, String, usize, u16)> {
            c.report
                .rules
                .iter()
                .map(|r| (r.policy.clone(), r.direction.clone(), r.index, r.id))
                .collect()
        };
        let row = |p: &str, d: &str, i: usize, id: u16| (p.to_owned(), d.to_owned(), i, id);
        let mut compiler = Compiler::new(1);
        let c = compiler.compile(&[one.clone(), two.clone()], &pods, &[], &local);
        assert_eq!(
            ids(&c),
            [
                row("prod/p1", "ingress", 0, 1),
                row("prod/p1", "ingress", 1, 2),
                row("prod/p2", "ingress", 0, 3)
            ]
        );
        let c = compiler.compile(std::slice::from_ref(&one), &pods, &[], &local);
        assert_eq!(ids(&c), [row("prod/p2", "ingress", 0, 3)]);
        // Come back: new ids (1 and 2 are not reused before 65535).
        let c = compiler.compile(&[one, two, new], &pods, &[], &local);
        assert_eq!(
            ids(&c),
            [
                row("prod/p0", "egress", 0, 4),
                row("prod/p1", "ingress", 0, 5),
                row("prod/p1", "ingress", 1, 6),
                row("prod/p2", "ingress", 0, 3),
            ]
        );
    }

    #[test]
    fn rule_ids_after_exhaustion() {
        let mut compiler = Compiler::new(1);
        let mut warnings = Warnings::default();
        let r = |i: usize| ("prod/p".to_owned(), IN, i);
        compiler.assign_rule_ids(&BTreeSet::from([r(0), r(1)]), &mut warnings);
        assert_eq!(compiler.rule_ids[&r(0)], 1);
        compiler.next_rule = u32::from(u16::MAX);
        compiler.assign_rule_ids(&BTreeSet::from([r(1), r(2), r(3), r(4)]), &mut warnings);
        assert_eq!(compiler.rule_ids[&r(1)], 2, "kept");
        assert_eq!(compiler.rule_ids[&r(2)], u16::MAX, "the last never used");
        assert_eq!(compiler.rule_ids[&r(3)], 1, "then the lowest free one");
        assert_eq!(compiler.rule_ids[&r(4)], 3);
        assert!(!compiler.rule_ids.contains_key(&r(0)));
        assert!(warnings.list.is_empty());
    }

    #[test]
    fn ipv6_and_masked_prefixes() {
        let pods = [
            pod(
                "prod",
                "target",
                &json!({"app": "target"}),
                &["10.0.0.10", "fd00::10"],
            ),
            pod(
                "prod",
                "web",
                &json!({"app": "web"}),
                &["10.0.0.1", "fd00::1"],
            ),
        ];
        let policies = [policy(
            "prod",
            "p",
            &json!({
                "podSelector": {"matchLabels": {"app": "target"}},
                "ingress": [
                    {"from": [{"podSelector": {"matchLabels": {"app": "web"}}}], "ports": [{"port": 80}]},
                    {"from": [{"ipBlock": {"cidr": "2001:db8::/32"}}, {"ipBlock": {"cidr": "10.1.2.3/8"}}]},
                ],
            }),
        )];
        let c = Compiler::new(1).compile(&policies, &pods, &[], &addrs(&["10.0.0.10", "fd00::10"]));
        assert_eq!(
            c.pods[&ip("10.0.0.10")],
            c.pods[&ip("fd00::10")],
            "one pod, one entry"
        );
        let s = set_of(&c, "fd00::10");
        assert_eq!(
            prefixes(&c, s, IN),
            strings(&["10.0.0.0/8", "10.0.0.1/32", "2001:db8::/32", "fd00::1/128"])
        );
        assert_eq!(entry(&c, s, IN, "fd00::1/128"), Some(vec![(TCP, 80, 80)]));
        assert_eq!(entry(&c, s, IN, "2001:db8::/32"), Some(vec![ANY]));
        // Inside the block without ports: only the any-range stays.
        assert_eq!(
            entry_ranges(&c, s, IN, "10.0.0.1/32").unwrap()[..],
            [PortRange {
                proto: 0,
                _pad: 0,
                rule: 2,
                first: 0,
                last: u16::MAX
            }]
        );
        let key = |p: &str| {
            PolicyKeyOrd {
                set: s,
                dir: IN,
                peer: p.parse().unwrap(),
            }
            .policy_key()
        };
        let db8 = key("2001:db8::/32");
        assert_eq!(db8.prefixlen, 64 + 32);
        assert_eq!(
            db8.peer,
            IpKey::v6("2001:db8::".parse::<Ipv6Addr>().unwrap().octets())
        );
        assert_eq!(key("fd00::1/128").prefixlen, 64 + 128);
        let ten = key("10.0.0.0/8");
        assert_eq!(ten.prefixlen, 64 + 96 + 8);
        assert_eq!(ten.peer, IpKey::v4([10, 0, 0, 0]), "host bits cleared");
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert!(c.warnings[0].contains("\"10.1.2.3/8\" has host bits set: 10.0.0.0/8 used"));
        assert_eq!(
            c.report.rules[1].peers,
            ["ipBlock 2001:db8::/32", "ipBlock 10.0.0.0/8"]
        );
    }

    #[test]
    fn ipv6_block_does_not_cover_ipv4() {
        let pods = [pod("prod", "a", &json!({}), &["10.0.0.1"])];
        let policies = [policy(
            "prod",
            "v6-only",
            &json!({"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "::/0", "except": ["fd00::/8"]}}]}]}),
        )];
        let c = Compiler::new(1).compile(&policies, &pods, &[], &addrs(&["10.0.0.1"]));
        assert_eq!(
            prefixes(&c, 1, IN),
            strings(&["0.0.0.0/0", "::/0", "fd00::/8"])
        );
        assert_eq!(entry(&c, 1, IN, "::/0"), Some(vec![ANY]));
        assert_eq!(entry(&c, 1, IN, "fd00::/8"), Some(vec![]));
        assert_eq!(
            entry(&c, 1, IN, "0.0.0.0/0"),
            Some(vec![]),
            "IPv4 peers do not fall to ::/0"
        );
    }

    #[test]
    fn over_sixteen_ranges() {
        let pods = [
            pod("prod", "a", &json!({"app": "a"}), &["10.0.0.1"]),
            pod("prod", "b", &json!({"app": "b"}), &["10.0.0.2"]),
        ];
        // 20 adjacent TCP ports in one rule, 2 overlapping UDP ranges in another.
        let adjacent: Vec<Value> = (1000..1020).map(|p| json!({"port": p})).collect();
        // 20 UDP ports apart and one TCP port: 21 ranges.
        let apart: Vec<Value> = (0..20)
            .map(|i| json!({"protocol": "UDP", "port": 100 + 10 * i}))
            .chain([json!({"port": 22})])
            .collect();
        let policies = [
            policy(
                "prod",
                "a",
                &json!({
                    "podSelector": {"matchLabels": {"app": "a"}},
                    "ingress": [
                        {"ports": adjacent},
                        {"ports": [{"protocol": "UDP", "port": 10, "endPort": 20}, {"protocol": "UDP", "port": 15, "endPort": 30}]},
                    ],
                }),
            ),
            policy(
                "prod",
                "b",
                &json!({"podSelector": {"matchLabels": {"app": "b"}}, "ingress": [{"ports": apart}]}),
            ),
        ];
        let c = Compiler::new(1).compile(&policies, &pods, &[], &addrs(&["10.0.0.1", "10.0.0.2"]));
        let a = set_of(&c, "10.0.0.1");
        assert_eq!(
            entry_ranges(&c, a, IN, "0.0.0.0/0").unwrap(),
            [
                PortRange {
                    proto: TCP,
                    _pad: 0,
                    rule: 1,
                    first: 1000,
                    last: 1019
                },
                PortRange {
                    proto: UDP,
                    _pad: 0,
                    rule: 2,
                    first: 10,
                    last: 30
                },
            ]
        );
        let b = set_of(&c, "10.0.0.2");
        let ranges = entry(&c, b, IN, "0.0.0.0/0").unwrap();
        assert_eq!(ranges.len(), MAX_PORT_RANGES);
        assert_eq!(ranges[0], (TCP, 22, 22));
        assert_eq!(
            ranges[15],
            (UDP, 240, 240),
            "the first 16, the rest left out"
        );
        // One warning per set and prefix (both families).
        assert_eq!(c.warnings.len(), 2, "{:?}", c.warnings);
        assert_eq!(
            c.warnings[0],
            format!(
                "policy set {b} (pod(s) prod/b): ingress peer 0.0.0.0/0: 21 port ranges after merging, over 16: only the first 16 are allowed"
            )
        );
    }

    #[test]
    fn report_json() {
        let pods = [
            pod("prod", "web", &json!({"app": "web"}), &["10.0.0.1"]),
            pod("prod", "client", &json!({"app": "client"}), &["10.0.0.2"]),
        ];
        let policies = [policy(
            "prod",
            "web",
            &json!({
                "podSelector": {"matchLabels": {"app": "web"}},
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}], "ports": [{"port": 80}]}],
            }),
        )];
        let c = Compiler::new(1).compile(&policies, &pods, &[], &addrs(&["10.0.0.1"]));
        assert_eq!(
            serde_json::to_value(&c.report).unwrap(),
            json!({
                "pods": [{
                    "namespace": "prod", "name": "web", "ips": ["10.0.0.1"],
                    "ingressIsolated": true, "egressIsolated": false, "set": 1,
                    "policies": ["prod/web"],
                }],
                "rules": [{
                    "id": 1, "policy": "prod/web", "direction": "ingress", "index": 0,
                    "peers": ["pods ns=prod labels=app=client"], "ports": ["TCP/80"],
                }],
                "sets": [{
                    "set": 1, "direction": "ingress", "prefix": "10.0.0.2/32",
                    "ranges": [{"proto": "TCP", "first": 80, "last": 80, "rule": 1}],
                }],
            })
        );
    }
}
