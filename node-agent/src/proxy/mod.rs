//! `sluice-node proxy`: Sluice translates the cluster's Services itself,
//! instead of kube-proxy. The agent watches Services and EndpointSlices
//! (kube-rs reflector stores: relists, `410 Gone` and bookmarks as kube-rs
//! handles them), computes each Service port's frontends and backends
//! ([`desired`]), keeps the datapath's Service maps in step ([`apply`]) and
//! attaches the Service socket hooks to a cgroup (every socket of its
//! processes, pods' too, in any network namespace): a connect to a Service
//! goes to a backend before any packet exists.
//!
//! Nothing is written before both watches have listed everything once (a
//! restart does not disturb the maps until it knows the whole cluster); the
//! maps and hooks stay when the agent stops (connections keep working, the
//! next agent takes over). `--stop` removes the hooks: back to kube-proxy.
mod apply;
mod desired;
mod health;
mod state;
mod udp_sockets;

use std::{os::unix::fs::MetadataExt, path::PathBuf, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use kube::{
    runtime::{
        reflector::{self, Store},
        watcher, WatchStreamExt,
    },
    Api, Client,
};
use sluice_common::{lb_flags, maps, svc_scope, IpKey, LbConfig};
use sluice_maps::{lb, PinRoot};

use crate::{
    error::Result,
    log,
    services::{drain, slim, take_event, Ev},
    shutdown::Shutdown,
};

/// How often the datapath's pins are looked at: a datapath loaded after the
/// agent started gets the Services this soon.
const PIN_POLL: Duration = Duration::from_secs(2);

pub(crate) struct Options {
    pub(crate) pin_root: PathBuf,
    /// This node's name (`internalTrafficPolicy: Local`).
    pub(crate) node_name: String,
    /// The cgroup v2 directory the socket hooks attach to.
    pub(crate) cgroup: PathBuf,
    /// The plugin's state directory: the pods' network namespaces (see
    /// [`udp_sockets`]).
    pub(crate) cni_state_dir: PathBuf,
    /// Everything is compared again this often even without a change.
    pub(crate) resync: Duration,
    /// The node's IPv4 address flows from outside to an external or load
    /// balancer IP leave with towards a backend on another node (a NodePort
    /// flow leaves with the node address it came to).
    pub(crate) node_ip: Option<std::net::Ipv4Addr>,
    /// Where the agent keeps its state file (see [`state`]), if anywhere.
    pub(crate) state_file: Option<PathBuf>,
}

/// The two watches' progress.
#[derive(Default)]
struct Watches {
    services: bool,
    slices: bool,
    dirty: bool,
}

impl Watches {
    fn service(&mut self, ev: Ev<Service>) -> Result<()> {
        take_event(
            "proxy",
            "Services",
            (&mut self.services, &mut self.dirty),
            ev,
        )
    }

    fn slice(&mut self, ev: Ev<EndpointSlice>) -> Result<()> {
        take_event(
            "proxy",
            "EndpointSlices",
            (&mut self.slices, &mut self.dirty),
            ev,
        )
    }
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
    let (slices, slice_writer): (Store<EndpointSlice>, _) = reflector::store();
    let slice_stream = reflector::reflector(
        slice_writer,
        watcher(
            Api::<EndpointSlice>::all(client),
            watcher::Config::default(),
        )
        .modify(slim),
    )
    .default_backoff();
    futures::pin_mut!(svc_stream, slice_stream);
    let root = PinRoot::new(&opts.pin_root);
    let mut resync = tokio::time::interval(opts.resync);
    let mut pins = tokio::time::interval(PIN_POLL);
    let mut w = Watches::default();
    let mut health = health::HealthServers::default();
    let mut state = State {
        // The node's namespace, as the hooks compare it (see `lb/sock.rs`'s
        // `no_endpoint` in the eBPF crate).
        node_netns: sluice_common::user::netns_cookie().ok().filter(|c| *c != 0),
        ..State::default()
    };
    log(&format!(
        "proxy: watching Services and EndpointSlices; datapath {}, socket hooks on cgroup {}{}",
        opts.pin_root.display(),
        opts.cgroup.display(),
        if cgroup_root(&opts.cgroup) {
            ""
        } else {
            " (not the root: pods outside it are translated per packet)"
        }
    ));
    if state.node_netns.is_none() {
        log("proxy: the kernel does not tell this network namespace's cookie (SO_NETNS_COOKIE, Linux 5.14): connects to a Service without endpoints are refused at the socket (EPERM) instead of answered with port unreachable");
    }
    loop {
        tokio::select! {
            ev = svc_stream.next() => w.service(ev)?,
            ev = slice_stream.next() => w.slice(ev)?,
            _ = resync.tick() => w.dirty = true,
            _ = pins.tick() => {}
            () = &mut shutdown => return Ok(()),
        }
        drain(&mut svc_stream, |ev| w.service(ev))?;
        drain(&mut slice_stream, |ev| w.slice(ev))?;
        if !(w.services && w.slices) {
            continue;
        }
        let new_maps = state.follow(&root);
        if !(w.dirty || new_maps) {
            continue;
        }
        let (s, e) = (services.state(), slices.state());
        let (want, notes) = desired::desired(
            s.iter().map(|o| &**o),
            e.iter().map(|o| &**o),
            &opts.node_name,
        );
        state.notes(&notes);
        let checks = desired::health_checks(
            s.iter().map(|o| &**o),
            e.iter().map(|o| &**o),
            &opts.node_name,
        );
        for line in health.update(&checks) {
            log(&line);
        }
        if state.apply(&root, &want, opts) {
            w.dirty = false;
        }
    }
}

/// What the agent did last, to log changes only.
#[derive(Default)]
struct State {
    applied: apply::Applied,
    /// Inode of `sl_lb_svc`'s pin when last written.
    maps_ino: Option<u64>,
    notes: std::collections::BTreeSet<String>,
    said: Option<String>,
    /// This (the node's) network namespace's cookie, where the kernel tells it.
    node_netns: Option<u64>,
    /// The state file's text as last written.
    file_text: Option<String>,
}

impl State {
    fn say(&mut self, msg: String) {
        if self.said.as_ref() != Some(&msg) {
            log(&msg);
            self.said = Some(msg);
        }
    }

    fn notes(&mut self, notes: &[String]) {
        let now: std::collections::BTreeSet<String> = notes.iter().cloned().collect();
        for n in now.difference(&self.notes) {
            log(n);
        }
        self.notes = now;
    }

    /// Whether the Service maps are new ones (first load, or a datapath
    /// loaded again): then everything is written again.
    fn follow(&mut self, root: &PinRoot) -> bool {
        let ino = std::fs::metadata(root.map_path(&maps::LB_SVC))
            .ok()
            .map(|m| m.ino());
        if ino != self.maps_ino {
            self.applied.reset();
            self.maps_ino = ino;
            return ino.is_some();
        }
        false
    }

    /// Writes `want` and attaches the hooks; `false` when the datapath is
    /// not there yet (tried again at the next poll).
    fn apply(&mut self, root: &PinRoot, want: &desired::Ports, opts: &Options) -> bool {
        let maps = match lb::LbMaps::open(root) {
            Ok(Some(m)) => Some(m),
            Ok(None) => None,
            Err(e) => {
                self.say(format!("proxy: opening the Service maps: {e}"));
                return false;
            }
        };
        let Some(mut maps) = maps else {
            self.say(format!(
                "proxy: no datapath with Service maps at {} yet (no pod attached, or an older sluice loaded it); waiting",
                root.path().display()
            ));
            return false;
        };
        // A flag is set before the frontends that need it are written and
        // cleared only after the pass: a frontend in the maps always finds
        // its flag.
        let per_packet = if cgroup_root(&opts.cgroup) {
            0
        } else {
            lb_flags::PER_PACKET
        };
        let mut cfg = LbConfig {
            node_netns: self.node_netns.unwrap_or(0),
            flags: lb_flags_of(want) | per_packet,
            snat4: opts.node_ip.map_or([0; 4], |ip| ip.octets()),
        };
        let held = lb::config(root).ok().flatten().map_or(0, |c| c.flags);
        let before = LbConfig {
            flags: cfg.flags | held,
            ..cfg
        };
        if let Err(e) = lb::write_config(root, &before) {
            self.say(format!("proxy: writing the Service config: {e}"));
            return false;
        }
        let pass = match self.applied.sync(&mut maps, want) {
            Ok(p) => p,
            Err(e) => {
                self.say(format!("proxy: writing the Service maps: {e}"));
                return false;
            }
        };
        if !pass.failed.is_empty() {
            // What could not be written may still be there as it was.
            cfg.flags |= held;
        }
        if let Err(e) = lb::write_config(root, &cfg) {
            self.say(format!("proxy: writing the Service config: {e}"));
            return false;
        }
        for (name, why) in &pass.failed {
            log(&format!("proxy: Service port {name} NOT written: {why}"));
        }
        close_udp(&pass.gone_udp, want, opts);
        if let Some(path) = &opts.state_file {
            state::write(
                path,
                &state::render(want, &self.applied),
                &mut self.file_text,
            );
        }
        if pass.written + pass.removed > 0 {
            log(&format!(
                "proxy: {} Service ports written, {} removed; {} in the maps",
                pass.written,
                pass.removed,
                self.applied.len()
            ));
        }
        if !lb::hooks_attached(root) {
            match lb::attach_hooks(root, &opts.cgroup) {
                Ok(()) => log(&format!(
                    "proxy: Service socket hooks attached to {}",
                    opts.cgroup.display()
                )),
                Err(e) => {
                    self.say(format!("proxy: attaching the Service socket hooks: {e}"));
                    return false;
                }
            }
        }
        self.said = None;
        pass.failed.is_empty()
    }
}

/// Closes the connected UDP sockets of backends no UDP Service port has
/// any more (`gone`: what this pass took away; one still in another port
/// stays, its sockets cannot be told apart).
fn close_udp(gone: &[sluice_common::Backend], want: &desired::Ports, opts: &Options) {
    let still: std::collections::BTreeSet<_> = want
        .values()
        .filter(|p| apply::udp(p))
        .flat_map(|p| &p.backends)
        .map(|b| (b.addr.addr, b.port))
        .collect();
    let mut targets: Vec<std::net::SocketAddr> = gone
        .iter()
        .filter(|b| !still.contains(&(b.addr.addr, b.port)))
        .map(|b| lb::addr_port(&b.addr, b.port).into())
        .collect();
    targets.sort_unstable();
    targets.dedup();
    if targets.is_empty() {
        return;
    }
    let namespaces = udp_sockets::pod_namespaces(&opts.cni_state_dir);
    let closed = udp_sockets::close(&targets, &namespaces);
    let list: Vec<String> = targets.iter().map(ToString::to_string).collect();
    log(&format!(
        "proxy: UDP backends gone: {}; {} connected sockets to them closed (the node and {} pod namespaces)",
        list.join(", "),
        closed.sockets,
        namespaces.len()
    ));
    for e in closed.errors {
        log(&format!("proxy: closing UDP sockets: {e}"));
    }
}

/// The datapath's shortcuts: whether any frontend is a NodePort (on the
/// unspecified address), whether any Service port has no endpoint (only
/// then does `from_pod` look a pod's packets up among the frontends), and
/// whether any frontend is for the uplink (only then do `uplink_in` and
/// `from_pod` look packets up in `sl_lb_ct`).
fn lb_flags_of(want: &desired::Ports) -> u32 {
    let any4 = IpKey::v4([0; 4]);
    let any6 = IpKey::v6([0; 16]);
    let inside = |p: &&desired::Port| p.frontends.iter().any(|k| k.scope == svc_scope::NODE);
    let node_ports = want
        .values()
        .flat_map(|p| &p.frontends)
        .any(|k| k.scope == svc_scope::NODE && (k.addr == any4 || k.addr == any6));
    let empty = want.values().filter(inside).any(|p| p.backends.is_empty());
    let external = want
        .values()
        .flat_map(|p| &p.frontends)
        .any(|k| k.scope == svc_scope::EXTERNAL);
    (if node_ports { lb_flags::NODE_PORTS } else { 0 })
        | (if empty { lb_flags::EMPTY_SERVICES } else { 0 })
        | (if external { lb_flags::EXTERNAL } else { 0 })
}

/// Whether `dir` is the root of its cgroup v2 hierarchy (every process of
/// the node below it): only a cgroup below the root has `cgroup.type`.
/// Below the root, pods outside it get their ClusterIP flows translated per
/// packet (`lb_flags::PER_PACKET`).
fn cgroup_root(dir: &std::path::Path) -> bool {
    dir.join("cgroup.procs").exists() && !dir.join("cgroup.type").exists()
}

/// `proxy --stop`: the socket hooks go (Services are kube-proxy's again);
/// the maps stay until the datapath goes.
pub(crate) fn stop(pin_root: &std::path::Path) -> Result<()> {
    let root = PinRoot::new(pin_root);
    lb::detach_hooks(&root)?;
    // The datapath's own translations (from outside, and the answers to a
    // Service without endpoints) go with the hooks: its flags cleared, it
    // looks nothing up in the Service maps.
    if let Ok(Some(cfg)) = lb::config(&root) {
        lb::write_config(&root, &LbConfig { flags: 0, ..cfg })?;
    }
    log("proxy: Service socket hooks removed; Services are left to kube-proxy");
    Ok(())
}
