//! `sluice-node services`, and a duty of `route-sync`: the addresses
//! kube-proxy translates, kept in the datapath's Service tries (`sl_svc`,
//! `sl_svc6`) as the agent's own entries ([`service_owner::AGENT`]). The
//! datapath hands a pod's traffic to those addresses to the node's stack,
//! where kube-proxy's rules (iptables, nftables or IPVS) translate it.
//!
//! What kube-proxy translates for pods, and so what goes in:
//! - every ServiceCIDR's `spec.cidrs` (networking.k8s.io/v1, Kubernetes 1.33+);
//! - where the cluster has no ServiceCIDR API (a 404; or a 403, RBAC without
//!   it), each Service's `spec.clusterIPs`, one address each, so ClusterIPs
//!   work without configured ranges (also any ClusterIP no ServiceCIDR holds);
//! - every Service's `spec.externalIPs`;
//! - every Service's `status.loadBalancer.ingress[].ip` whose `ipMode` is
//!   unset or `VIP` (a `Proxy` load balancer receives the traffic itself).
//!
//! Only Services kube-proxy proxies count, as its `ServiceChangeTracker` sees
//! them: not headless (`clusterIP: None`), not `ExternalName`, not labelled
//! for another proxy (`service.kubernetes.io/service-proxy-name`, or
//! `service.kubernetes.io/headless`: kube-proxy's informers select both out),
//! and an external or load balancer address only in a family the Service has
//! a ClusterIP of (kube-proxy's rules are per family).
//!
//! The config's `serviceCIDRs` (owner CONFIG, written by ADD) stay whatever
//! the agent writes. Nothing is written before both watches have listed
//! everything once (a restart does not disturb the tries until it knows the
//! whole cluster), and nothing is removed when the agent stops: kube-proxy
//! keeps its rules while it is down, too.
use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr},
    os::unix::fs::MetadataExt,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use futures::{FutureExt, Stream, StreamExt};
use ipnetwork::IpNetwork;
use k8s_openapi::api::{core::v1::Service, networking::v1::ServiceCIDR};
use kube::{
    runtime::{
        reflector::{self, Store},
        utils::Backoff,
        watcher, WatchStreamExt,
    },
    Api, Client, ResourceExt,
};
use sluice_common::maps;
use sluice_host::lock::FileLock;
use sluice_maps::{
    services::{service_owner, set_prefixes},
    PinRoot,
};

use crate::{
    error::{Error, Result},
    log,
    shutdown::Shutdown,
};

/// How often the datapath's pins are looked at (as route-sync does): a
/// datapath loaded after the agent started gets the prefixes this soon.
const PIN_POLL: Duration = Duration::from_secs(2);
/// Labels kube-proxy's Service informers select out (the Service is another
/// proxy's, or a headless Service's).
const NOT_KUBE_PROXY: [&str; 2] = [
    "service.kubernetes.io/service-proxy-name",
    "service.kubernetes.io/headless",
];
/// Events taken at most before the desired state is computed again (a burst
/// of changes makes one computation, not one per Service).
const COALESCE: usize = 512;
/// Retries of a failing ServiceCIDR watch while the API is there: client-go's
/// reflector's (0.8 s doubling to 30 s).
const RETRY_MIN: Duration = Duration::from_millis(800);
const RETRY_MAX: Duration = Duration::from_secs(30);

pub(crate) struct Options {
    pub(crate) pin_root: PathBuf,
    /// Everything is written again this often even without a change; a
    /// cluster without the ServiceCIDR API is asked for it again this often.
    pub(crate) resync: Duration,
}

/// What the tries should hold for the agent.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Desired {
    /// The ServiceCIDR ranges, then single addresses, each sorted.
    pub(crate) nets: Vec<IpNetwork>,
    pub(crate) counts: Counts,
    /// A line for each value that cannot be used.
    pub(crate) notes: Vec<String>,
}

/// Where the prefixes of [`Desired`] come from (an address in two places
/// counts in both).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) ranges: usize,
    pub(crate) cluster_ips: usize,
    pub(crate) external_ips: usize,
    pub(crate) lb_ips: usize,
}

/// The prefix of an address alone (/32, /128).
fn host(ip: IpAddr) -> IpNetwork {
    IpNetwork::from(ip)
}

/// `n` with its host bits cleared.
fn network(n: IpNetwork) -> IpNetwork {
    IpNetwork::new(n.network(), n.prefix()).unwrap_or(n)
}

/// An address as kube-proxy reads it (Go's `ParseIPSloppy`): IPv4 octets with
/// leading zeros are decimal, an IPv4-mapped IPv6 address is IPv4.
pub(crate) fn parse_ip(s: &str) -> Option<IpAddr> {
    let ip = if let Ok(ip) = s.parse::<IpAddr>() {
        ip
    } else {
        let parts: Vec<&str> = s.split('.').collect();
        let ok = parts.len() == 4
            && parts
                .iter()
                .all(|p| (1..=3).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()));
        if !ok {
            return None;
        }
        let mut o = [0u8; 4];
        for (i, p) in parts.iter().enumerate() {
            o[i] = p.parse().ok()?;
        }
        IpAddr::V4(Ipv4Addr::from(o))
    };
    Some(match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 @ IpAddr::V4(_) => v4,
    })
}

/// The ranges of ServiceCIDR objects (by name), host bits cleared, and a
/// note for each value that is no CIDR.
pub(crate) fn ranges<'a>(
    cidrs: impl IntoIterator<Item = &'a ServiceCIDR>,
    notes: &mut Vec<String>,
) -> Vec<IpNetwork> {
    let mut objs: Vec<&ServiceCIDR> = cidrs.into_iter().collect();
    objs.sort_by_key(|c| c.name_any());
    let mut out = Vec::new();
    for c in objs {
        for v in c.spec.iter().flat_map(|s| s.cidrs.iter().flatten()) {
            match v.trim().parse::<IpNetwork>() {
                Ok(n) => {
                    let n = network(n);
                    if !out.contains(&n) {
                        out.push(n);
                    }
                }
                Err(e) => notes.push(format!(
                    "services: ServiceCIDR {:?} spec.cidrs: {v:?} is not a CIDR ({e}); left out",
                    c.name_any()
                )),
            }
        }
    }
    out
}

/// Whether kube-proxy proxies `svc` at all, and its ClusterIPs if so.
fn cluster_ips(svc: &Service, name: &str, notes: &mut Vec<String>) -> Option<Vec<IpAddr>> {
    if NOT_KUBE_PROXY.iter().any(|l| svc.labels().contains_key(*l)) {
        return None;
    }
    let spec = svc.spec.as_ref()?;
    if spec.type_.as_deref() == Some("ExternalName") {
        return None;
    }
    let listed: Vec<&String> = match &spec.cluster_ips {
        Some(l) if !l.is_empty() => l.iter().collect(),
        _ => spec.cluster_ip.iter().collect(),
    };
    // Headless (kube-proxy's IsServiceIPSet looks at the primary one).
    let primary = spec
        .cluster_ip
        .as_deref()
        .or(listed.first().map(|s| s.as_str()));
    if matches!(primary, None | Some("" | "None")) {
        return None;
    }
    let mut ips = Vec::new();
    for v in listed {
        match parse_ip(v) {
            Some(ip) => ips.push(ip),
            None => notes.push(format!(
                "services: Service {name} spec.clusterIPs: {v:?} is not an IP address; left out"
            )),
        }
    }
    Some(ips)
}

/// The addresses `svc` adds: (ClusterIPs, externalIPs, load balancer IPs).
pub(crate) fn addresses(
    svc: &Service,
    notes: &mut Vec<String>,
) -> Option<(Vec<IpAddr>, Vec<IpAddr>, Vec<IpAddr>)> {
    let name = format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any());
    let cips = cluster_ips(svc, &name, notes)?;
    // kube-proxy's rules are per family: an external address of a family the
    // Service has no ClusterIP of is not translated.
    let family_ok = |ip: &IpAddr, field: &str, notes: &mut Vec<String>| {
        let ok = cips.iter().any(|c| c.is_ipv6() == ip.is_ipv6());
        if !ok {
            notes.push(format!(
                "services: Service {name} {field}: {ip} has no ClusterIP of its family, so kube-proxy does not translate it; left out"
            ));
        }
        ok
    };
    let mut ext = Vec::new();
    let spec = svc.spec.as_ref()?;
    for v in spec.external_ips.iter().flatten() {
        match parse_ip(v) {
            Some(ip) if family_ok(&ip, "spec.externalIPs", notes) => ext.push(ip),
            Some(_) => {}
            None => notes.push(format!(
                "services: Service {name} spec.externalIPs: {v:?} is not an IP address; left out"
            )),
        }
    }
    let mut lb = Vec::new();
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref());
    for ing in ingress.into_iter().flatten() {
        let Some(v) = ing.ip.as_deref().filter(|v| !v.is_empty()) else {
            continue; // a hostname only
        };
        // `Proxy`: the load balancer delivers to the nodes itself.
        if ing.ip_mode.as_deref().is_some_and(|m| m != "VIP") {
            continue;
        }
        match parse_ip(v) {
            Some(ip) if family_ok(&ip, "status.loadBalancer.ingress", notes) => lb.push(ip),
            Some(_) => {}
            None => notes.push(format!(
                "services: Service {name} status.loadBalancer.ingress: {v:?} is not an IP address; left out"
            )),
        }
    }
    Some((cips, ext, lb))
}

/// What the tries should hold: `cidrs`, the ServiceCIDR objects (`None`: the
/// cluster has no ServiceCIDR API), and the addresses of `services`.
pub(crate) fn desired<'a>(
    cidrs: Option<impl IntoIterator<Item = &'a ServiceCIDR>>,
    services: impl IntoIterator<Item = &'a Service>,
) -> Desired {
    let mut notes = Vec::new();
    let ranges = cidrs.map(|c| ranges(c, &mut notes)).unwrap_or_default();
    let covered = |ip: &IpAddr| ranges.iter().any(|r| r.contains(*ip));
    let (mut cluster, mut external, mut lb) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    for svc in services {
        let Some((c, e, l)) = addresses(svc, &mut notes) else {
            continue;
        };
        cluster.extend(c.into_iter().filter(|ip| !covered(ip)).map(host));
        external.extend(e.into_iter().filter(|ip| !covered(ip)).map(host));
        lb.extend(l.into_iter().filter(|ip| !covered(ip)).map(host));
    }
    let counts = Counts {
        ranges: ranges.len(),
        cluster_ips: cluster.len(),
        external_ips: external.len(),
        lb_ips: lb.len(),
    };
    let mut singles: BTreeSet<IpNetwork> = cluster;
    singles.extend(external);
    singles.extend(lb);
    let mut nets = ranges;
    nets.sort();
    nets.extend(singles);
    Desired {
        nets,
        counts,
        notes,
    }
}

/// The ranges of the cluster's ServiceCIDR objects, read once (`install`);
/// `None` where the cluster has no ServiceCIDR API (404) or this account may
/// not list it (403).
pub(crate) async fn list_ranges(client: &Client) -> Result<Option<Vec<IpNetwork>>> {
    let api: Api<ServiceCIDR> = Api::all(client.clone());
    match api.list(&kube::api::ListParams::default()).await {
        Ok(list) => {
            let mut notes = Vec::new();
            let r = ranges(&list.items, &mut notes);
            for n in notes {
                log(&n);
            }
            Ok(Some(r))
        }
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 403 => {
            log(&format!(
                "ServiceCIDRs: {} ({}): none read",
                if s.code == 404 {
                    "the cluster has no ServiceCIDR API (Kubernetes before 1.33)"
                } else {
                    "listing them is forbidden"
                },
                s.code
            ));
            Ok(None)
        }
        Err(e) => Err(Error::kube("listing ServiceCIDRs", e)),
    }
}

/// Whether the ServiceCIDR API is there, as the watch found out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CidrApi {
    /// Not listed yet.
    Unknown,
    Present,
    /// 404 or 403: ClusterIPs go in one by one.
    Absent,
}

/// The ServiceCIDR watch's retries: client-go's while the API is there; once
/// the API turned out absent, every resync period (a cluster upgraded to
/// 1.33 gets its ranges used that soon, without a 404 every few seconds from
/// every node meanwhile).
struct CidrBackoff {
    absent: Arc<AtomicBool>,
    slow: Duration,
    next: Duration,
}

impl Iterator for CidrBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if self.absent.load(Ordering::Relaxed) {
            return Some(self.slow);
        }
        let d = self.next;
        self.next = (d * 2).min(RETRY_MAX);
        Some(d)
    }
}

impl Backoff for CidrBackoff {
    fn reset(&mut self) {
        self.next = RETRY_MIN;
    }
}

/// The HTTP status of an API error a watch met.
fn api_code(e: &watcher::Error) -> Option<u16> {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s))
        | watcher::Error::WatchError(s) => Some(s.code),
        _ => None,
    }
}

/// Drops what the agent never reads from a watched object (memory: the
/// stores hold every Service of the cluster).
pub(crate) fn slim<K: ResourceExt>(o: &mut K) {
    o.managed_fields_mut().clear();
    o.annotations_mut().clear();
}

/// The two watches' progress.
struct Watches {
    services_ready: bool,
    cidr: CidrApi,
    /// Shared with [`CidrBackoff`].
    cidr_absent: Arc<AtomicBool>,
    resync: Duration,
    /// A change since the desired state was last computed.
    dirty: bool,
}

pub(crate) type Ev<K> = Option<std::result::Result<watcher::Event<K>, watcher::Error>>;

/// One event of a reflector's watch of `what`, for a duty (`who`, its log
/// prefix) that recomputes everything on a change: `ready` once the first
/// list is complete, `dirty` on every change. The watch ending is an error.
pub(crate) fn take_event<K>(
    who: &str,
    what: &str,
    (ready, dirty): (&mut bool, &mut bool),
    ev: Ev<K>,
) -> Result<()> {
    match ev {
        Some(Ok(watcher::Event::InitDone)) => {
            *ready = true;
            *dirty = true;
        }
        Some(Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_))) => *dirty = true,
        // The store swaps in a relist at its end (InitDone).
        Some(Ok(watcher::Event::Init | watcher::Event::InitApply(_))) => {}
        // The watcher retries with backoff (a 410 Gone with a relist).
        Some(Err(e)) => crate::log(&format!("{who}: watching {what}: {e}")),
        None => return Err(Error::invalid(format!("{what} watch"), "", "ended")),
    }
    Ok(())
}

impl Watches {
    fn ready(&self) -> bool {
        self.services_ready && self.cidr != CidrApi::Unknown
    }

    fn service(&mut self, ev: Ev<Service>) -> Result<()> {
        match ev {
            Some(Ok(watcher::Event::InitDone)) => {
                self.services_ready = true;
                self.dirty = true;
            }
            Some(Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_))) => self.dirty = true,
            // The store swaps in a relist at its end (InitDone).
            Some(Ok(watcher::Event::Init | watcher::Event::InitApply(_))) => {}
            // The watcher retries with backoff (a 410 Gone with a relist);
            // say why it had to.
            Some(Err(e)) => log(&format!("services: watching Services: {e}")),
            None => return Err(Error::invalid("Service watch", "", "ended")),
        }
        Ok(())
    }

    fn cidr(&mut self, ev: Ev<ServiceCIDR>) -> Result<()> {
        match ev {
            Some(Ok(watcher::Event::InitDone)) => {
                if self.cidr != CidrApi::Present {
                    log("services: ServiceCIDR API found: the ServiceCIDR objects' ranges go in");
                }
                self.cidr = CidrApi::Present;
                self.cidr_absent.store(false, Ordering::Relaxed);
                self.dirty = true;
            }
            Some(Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_))) => self.dirty = true,
            Some(Ok(watcher::Event::Init | watcher::Event::InitApply(_))) => {}
            Some(Err(e)) => match api_code(&e) {
                Some(code @ (404 | 403)) => {
                    if self.cidr != CidrApi::Absent {
                        log(&format!(
                            "services: {}: each Service's ClusterIPs go in one by one (the API is looked for again every {} s)",
                            if code == 404 {
                                "no ServiceCIDR API (404: Kubernetes before 1.33)".to_string()
                            } else {
                                format!("listing ServiceCIDRs is forbidden (403: does the ClusterRole grant list and watch on servicecidrs.networking.k8s.io?): {e}")
                            },
                            self.resync.as_secs()
                        ));
                        self.cidr = CidrApi::Absent;
                        self.dirty = true;
                    }
                    self.cidr_absent.store(true, Ordering::Relaxed);
                }
                _ => log(&format!("services: watching ServiceCIDRs: {e}")),
            },
            None => return Err(Error::invalid("ServiceCIDR watch", "", "ended")),
        }
        Ok(())
    }
}

/// Takes the events `stream` has ready now (at most [`COALESCE`]).
pub(crate) fn drain<S: Stream + Unpin>(
    stream: &mut S,
    mut take: impl FnMut(Option<S::Item>) -> Result<()>,
) -> Result<()> {
    for _ in 0..COALESCE {
        match stream.next().now_or_never() {
            Some(ev) => {
                let end = ev.is_none();
                take(ev)?;
                if end {
                    break;
                }
            }
            None => break,
        }
    }
    Ok(())
}

pub(crate) async fn run(client: Client, opts: &Options, mut shutdown: Shutdown) -> Result<()> {
    let (services, svc_writer): (Store<Service>, _) = reflector::store();
    let svc_stream = reflector::reflector(
        svc_writer,
        watcher(
            Api::<Service>::all(client.clone()),
            watcher::Config::default(),
        )
        .modify(slim),
    )
    .default_backoff();
    let cidr_absent = Arc::new(AtomicBool::new(false));
    let (cidrs, cidr_writer): (Store<ServiceCIDR>, _) = reflector::store();
    let cidr_stream = reflector::reflector(
        cidr_writer,
        watcher(Api::<ServiceCIDR>::all(client), watcher::Config::default()).modify(slim),
    )
    .backoff(CidrBackoff {
        absent: Arc::clone(&cidr_absent),
        slow: opts.resync,
        next: RETRY_MIN,
    });
    futures::pin_mut!(svc_stream, cidr_stream);
    let root = PinRoot::new(&opts.pin_root);
    let mut resync = tokio::time::interval(opts.resync);
    let mut pins = tokio::time::interval(PIN_POLL);
    let mut w = Watches {
        services_ready: false,
        cidr: CidrApi::Unknown,
        cidr_absent,
        resync: opts.resync,
        dirty: false,
    };
    let mut want = Desired::default();
    let mut applied = Applied::default();
    log(&format!(
        "services: watching Services and ServiceCIDRs; datapath {}",
        opts.pin_root.display()
    ));
    loop {
        let mut full = false;
        tokio::select! {
            ev = svc_stream.next() => w.service(ev)?,
            ev = cidr_stream.next() => w.cidr(ev)?,
            _ = resync.tick() => full = true,
            _ = pins.tick() => {}
            () = &mut shutdown => return Ok(()),
        }
        drain(&mut svc_stream, |ev| w.service(ev))?;
        drain(&mut cidr_stream, |ev| w.cidr(ev))?;
        if !w.ready() {
            continue;
        }
        if w.dirty {
            let present = w.cidr == CidrApi::Present;
            let (c, s) = (cidrs.state(), services.state());
            want = desired(
                present.then(|| c.iter().map(|o| &**o)),
                s.iter().map(|o| &**o),
            );
            applied.notes(&want.notes);
            w.dirty = false;
        }
        applied.datapath(&root, &want, full);
    }
}

/// What the agent last did, to log changes only.
#[derive(Default)]
struct Applied {
    /// The notes about bad values logged (each once while it lasts).
    notes: BTreeSet<String>,
    /// Inode of `sl_svc`'s pin and the prefixes written into the tries.
    written: Option<(u64, Vec<IpNetwork>)>,
    /// The prefixes last logged (what changed is logged with the next).
    logged: Option<Vec<IpNetwork>>,
    /// The last problem logged about the datapath (once until it changes).
    said: Option<String>,
}

impl Applied {
    fn notes(&mut self, notes: &[String]) {
        let now: BTreeSet<String> = notes.iter().cloned().collect();
        for n in now.difference(&self.notes) {
            log(n);
        }
        self.notes = now;
    }

    fn say(&mut self, msg: String) {
        if self.said.as_ref() != Some(&msg) {
            log(&msg);
            self.said = Some(msg);
        }
    }

    /// Writes `want` when it changed, when the tries are new ones (first
    /// load, or a datapath removed and loaded again), or on a full pass.
    fn datapath(&mut self, root: &PinRoot, want: &Desired, full: bool) {
        let Ok(meta) = std::fs::metadata(root.map_path(&maps::SVC)) else {
            self.written = None;
            if root.has(&maps::ENDPOINTS) {
                self.say(format!(
                    "services: the datapath at {} has no Service tries (an older sluice loaded it); they are written once an ADD of this version upgrades it",
                    root.path().display()
                ));
            }
            return;
        };
        let ino = meta.ino();
        let same = self
            .written
            .as_ref()
            .is_some_and(|(i, n)| *i == ino && *n == want.nets);
        if same && !full {
            return;
        }
        // ADD writes the config's bits under the shared lock; this is a read,
        // modify, write of the same tries, so it excludes them.
        let done = FileLock::dir_exclusive(root.path())
            .map_err(Error::from)
            .and_then(|_lock| {
                set_prefixes(root, service_owner::AGENT, &want.nets).map_err(Error::from)
            });
        match done {
            Ok(()) => {
                if !same {
                    let c = want.counts;
                    let change = match &self.logged {
                        Some(prev) if *prev != want.nets => {
                            let (old, new): (BTreeSet<_>, BTreeSet<_>) =
                                (prev.iter().collect(), want.nets.iter().collect());
                            format!(
                                " ({} added, {} removed)",
                                new.difference(&old).count(),
                                old.difference(&new).count()
                            )
                        }
                        _ => String::new(),
                    };
                    log(&format!(
                        "services: {} Service prefix(es) for kube-proxy in the datapath{change}: {} ServiceCIDR range(s), {} ClusterIP(s), {} externalIP(s), {} load balancer IP(s)",
                        want.nets.len(),
                        c.ranges,
                        c.cluster_ips,
                        c.external_ips,
                        c.lb_ips
                    ));
                    self.logged = Some(want.nets.clone());
                }
                self.written = Some((ino, want.nets.clone()));
                self.said = None;
            }
            Err(e) => {
                self.written = None;
                self.say(format!(
                    "services: writing the Service prefixes: {e}; tried again in {} s",
                    PIN_POLL.as_secs()
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    fn cidr(name: &str, cidrs: &[&str]) -> ServiceCIDR {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"cidrs": cidrs}}))
            .unwrap()
    }

    fn nets(d: &Desired) -> Vec<String> {
        d.nets.iter().map(ToString::to_string).collect()
    }

    fn web() -> Service {
        svc(json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {
                "type": "LoadBalancer",
                "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "fd00:96::10"],
                "externalIPs": ["203.0.113.7", "2001:db8::7"],
                "ports": [{"port": 80}],
            },
            "status": {"loadBalancer": {"ingress": [
                {"ip": "198.51.100.1"},
                {"ip": "198.51.100.2", "ipMode": "VIP"},
                {"ip": "198.51.100.3", "ipMode": "Proxy"},
                {"hostname": "lb.example"},
            ]}},
        }))
    }

    #[test]
    fn ranges_external_and_vip_load_balancer_addresses() {
        let cidrs = [cidr("kubernetes", &["10.96.0.0/12", "fd00:96::/108"])];
        let services = [web()];
        let d = desired(Some(&cidrs), &services);
        assert_eq!(
            nets(&d),
            [
                "10.96.0.0/12",
                "fd00:96::/108",
                "198.51.100.1/32",
                "198.51.100.2/32",
                "203.0.113.7/32",
                "2001:db8::7/128",
            ]
        );
        assert_eq!(
            d.counts,
            Counts {
                ranges: 2,
                cluster_ips: 0,
                external_ips: 2,
                lb_ips: 2
            }
        );
        assert!(d.notes.is_empty(), "{:?}", d.notes);
    }

    #[test]
    fn without_the_servicecidr_api_each_cluster_ip() {
        let services = [web()];
        let d = desired(None::<&[ServiceCIDR]>, &services);
        assert!(nets(&d).contains(&"10.96.0.10/32".to_string()), "{d:?}");
        assert!(nets(&d).contains(&"fd00:96::10/128".to_string()), "{d:?}");
        assert_eq!(d.counts.cluster_ips, 2);
        // With the API, a ClusterIP outside every range still goes in.
        let cidrs = [cidr("kubernetes", &["10.96.0.0/12"])];
        let d = desired(Some(&cidrs), &services);
        assert!(!nets(&d).contains(&"10.96.0.10/32".to_string()), "{d:?}");
        assert!(nets(&d).contains(&"fd00:96::10/128".to_string()), "{d:?}");
    }

    #[test]
    fn services_kube_proxy_does_not_proxy_add_nothing() {
        let services = [
            svc(json!({"metadata": {"name": "headless", "namespace": "a"},
                "spec": {"clusterIP": "None", "externalIPs": ["203.0.113.1"]}})),
            svc(json!({"metadata": {"name": "dns", "namespace": "a"},
                "spec": {"type": "ExternalName", "externalName": "example.com", "externalIPs": ["203.0.113.2"]}})),
            svc(json!({"metadata": {"name": "other", "namespace": "a",
                    "labels": {"service.kubernetes.io/service-proxy-name": "other-proxy"}},
                "spec": {"clusterIP": "10.96.0.3", "externalIPs": ["203.0.113.3"]}})),
            // One family only: the IPv6 external address is not translated.
            svc(json!({"metadata": {"name": "v4", "namespace": "a"},
                "spec": {"clusterIP": "10.96.0.4", "externalIPs": ["2001:db8::4", "203.0.113.4"]}})),
        ];
        let d = desired(None::<&[ServiceCIDR]>, &services);
        assert_eq!(nets(&d), ["10.96.0.4/32", "203.0.113.4/32"]);
        assert_eq!(d.notes.len(), 1, "{:?}", d.notes);
        assert!(d.notes[0].contains("2001:db8::4"), "{:?}", d.notes);
    }

    #[test]
    fn bad_values_are_noted_by_object_and_field() {
        let cidrs = [
            cidr("bad", &["10.96.0.0/33"]),
            cidr("ok", &["10.97.0.1/16"]),
        ];
        let services = [svc(json!({"metadata": {"name": "s", "namespace": "n"},
            "spec": {"clusterIP": "10.97.0.5", "externalIPs": ["203.0.113.300", "010.001.002.003"]},
            "status": {"loadBalancer": {"ingress": [{"ip": "not-an-ip"}]}}}))];
        let d = desired(Some(&cidrs), &services);
        // Host bits cleared; a sloppy address read as kube-proxy reads it.
        assert_eq!(nets(&d), ["10.97.0.0/16", "10.1.2.3/32"]);
        let all = d.notes.join("\n");
        for what in [
            "ServiceCIDR \"bad\" spec.cidrs: \"10.96.0.0/33\"",
            "Service n/s spec.externalIPs: \"203.0.113.300\"",
            "Service n/s status.loadBalancer.ingress: \"not-an-ip\"",
        ] {
            assert!(all.contains(what), "{what}: {all}");
        }
    }

    #[test]
    fn the_servicecidr_backoff_slows_down_once_the_api_is_absent() {
        let absent = Arc::new(AtomicBool::new(false));
        let mut b = CidrBackoff {
            absent: Arc::clone(&absent),
            slow: Duration::from_mins(1),
            next: RETRY_MIN,
        };
        assert_eq!(b.next(), Some(RETRY_MIN));
        assert_eq!(b.next(), Some(RETRY_MIN * 2));
        absent.store(true, Ordering::Relaxed);
        assert_eq!(b.next(), Some(Duration::from_mins(1)));
        absent.store(false, Ordering::Relaxed);
        b.reset();
        assert_eq!(b.next(), Some(RETRY_MIN));
    }
}
