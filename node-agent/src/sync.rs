//! `sluice-node route-sync`: watches the cluster's Nodes and keeps this node's
//! routes to the other nodes' pods, and the datapath's view of their pod
//! ranges, in step. Per-pod work stays in the plugin; this process only
//! follows Nodes (kindnet's model).
//!
//! Nothing is removed when it stops: pods keep their routes across a restart or
//! an upgrade of the agent, and the next start reconciles.
use std::{collections::BTreeMap, os::unix::fs::MetadataExt, path::PathBuf, time::Duration};

use futures::StreamExt;
use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::Node;
use kube::{
    runtime::{
        reflector::{self, Store},
        watcher, WatchStreamExt,
    },
    Api, Client, ResourceExt,
};
use sluice_common::maps;
use sluice_host::netlink::Netlink;
use sluice_maps::PinRoot;

use crate::{
    cluster::{node_info, NodeInfo},
    error::{Error, Result},
    log, node_addrs,
    routes::{self, Route},
    shutdown::Shutdown,
};

/// How often the datapath's pins are looked at: a datapath loaded (or
/// re-created) after the agent started gets the remote ranges this soon.
const PIN_POLL: Duration = Duration::from_secs(2);

pub(crate) struct Options {
    pub(crate) node_name: String,
    pub(crate) pin_root: PathBuf,
    /// Everything is reconciled this often even without a change (a route
    /// someone deleted by hand comes back).
    pub(crate) resync: Duration,
    /// Sweep idle NAT flows from here (see `sweep`).
    pub(crate) nat_sweep: bool,
    /// Keep the node's addresses for hostPorts from here (see `node_addrs`).
    pub(crate) node_addrs: bool,
}

/// The Nodes as the agent uses them, read from the watch's reflector store
/// after each event (the store follows relists, `410 Gone` and bookmarks as
/// kube-rs does).
#[derive(Default)]
struct Nodes {
    known: BTreeMap<String, NodeInfo>,
    /// A complete list has arrived at least once (before that, an empty set
    /// would delete every route).
    ready: bool,
    /// The Nodes ignored for a bad field, and why, as last logged.
    ignored: BTreeMap<String, String>,
}

impl Nodes {
    /// Follows the watch event `ev` (`store` as the reflector left it after
    /// it); `true` when the set the routes are made from changed. One Node's
    /// change reads that Node; a complete list (the first, and each relist
    /// after `410 Gone`) reads the store again.
    fn take(&mut self, ev: &watcher::Event<Node>, store: &Store<Node>) -> bool {
        match ev {
            watcher::Event::InitDone => {
                self.ready = true;
                self.known.clear();
                let said = std::mem::take(&mut self.ignored);
                for n in store.state() {
                    let name = name_of(&n);
                    self.read(&n, said.get(&name));
                }
                // Always a change: the first list, or a relist that may have
                // missed deletions.
                true
            }
            // A relist in progress: the store swaps its contents at InitDone.
            watcher::Event::Init | watcher::Event::InitApply(_) => false,
            _ if !self.ready => false,
            watcher::Event::Apply(n) => {
                let name = name_of(n);
                let before = self.known.get(&name).cloned();
                let said = self.ignored.get(&name).cloned();
                self.read(n, said.as_ref());
                self.known.get(&name) != before.as_ref()
            }
            watcher::Event::Delete(n) => {
                let name = name_of(n);
                self.ignored.remove(&name);
                self.known.remove(&name).is_some()
            }
        }
    }

    /// Reads one Node into `known` (or `ignored`, for a bad field: said once,
    /// not at every event; `said` is what was said of it before).
    fn read(&mut self, n: &Node, said: Option<&String>) {
        let name = name_of(n);
        match node_info(n) {
            Ok(i) => {
                self.ignored.remove(&name);
                self.known.insert(name, i);
            }
            Err(e) => {
                let why = e.to_string();
                if said != Some(&why) {
                    log(&format!("ignoring a Node: {why}"));
                }
                self.known.remove(&name);
                self.ignored.insert(name, why);
            }
        }
    }
}

fn name_of(n: &Node) -> String {
    n.metadata.name.clone().unwrap_or_default()
}

/// Drops what the agent never reads from a Node (the store holds every Node
/// of the cluster): managed fields, annotations, the images list.
fn slim(n: &mut Node) {
    n.managed_fields_mut().clear();
    n.annotations_mut().clear();
    if let Some(s) = n.status.as_mut() {
        s.images = None;
    }
}

pub(crate) async fn run(client: Client, opts: &Options, mut shutdown: Shutdown) -> Result<()> {
    let api: Api<Node> = Api::all(client);
    let (store, writer): (Store<Node>, _) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher(api, watcher::Config::default()).modify(slim),
    )
    .default_backoff();
    futures::pin_mut!(stream);
    let nl = Netlink::open()?;
    let root = PinRoot::new(&opts.pin_root);
    let mut resync = tokio::time::interval(opts.resync);
    let mut pins = tokio::time::interval(PIN_POLL);
    let mut nodes = Nodes::default();
    let mut state = Applied::default();
    let mut sweeper = opts
        .nat_sweep
        .then(|| crate::sweep::Sweeper::new(&opts.pin_root));
    let mut sweep_tick = tokio::time::interval(crate::sweep::INTERVAL);
    let mut addrs = if opts.node_addrs {
        match node_addrs::Keeper::new(&opts.pin_root) {
            Ok(k) => Some(k),
            Err(e) => {
                log(&format!(
                    "node addresses: {e}; ADDs with hostPorts read them themselves"
                ));
                None
            }
        }
    } else {
        None
    };
    let mut addrs_tick = tokio::time::interval(node_addrs::RENEW);
    log(&format!(
        "route-sync for node {:?}: watching Nodes; datapath {}",
        opts.node_name,
        opts.pin_root.display()
    ));
    let end = loop {
        let mut full = false;
        let mut addrs_pass = None;
        tokio::select! {
            ev = stream.next() => match ev {
                Some(Ok(ev)) => full = nodes.take(&ev, &store),
                // The watcher retries with backoff; say why it had to.
                Some(Err(e)) => log(&format!("watching Nodes: {e}")),
                None => break Err(Error::invalid("Node watch", "", "ended")),
            },
            _ = resync.tick() => full = true,
            _ = pins.tick() => {}
            _ = sweep_tick.tick(), if sweeper.is_some() => {
                if let Some(s) = sweeper.as_mut() {
                    s.pass();
                }
                continue;
            }
            _ = addrs_tick.tick(), if addrs.is_some() => addrs_pass = Some(None),
            c = node_addrs::next_change(addrs.as_mut()), if addrs.is_some() => addrs_pass = Some(Some(c)),
            () = &mut shutdown => break Ok(()),
        }
        if let (Some(change), Some(k)) = (addrs_pass, addrs.as_mut()) {
            k.pass(change).await;
            continue;
        }
        if !nodes.ready {
            continue;
        }
        let all: Vec<NodeInfo> = nodes.known.values().cloned().collect();
        let (want, notes) = routes::desired(&all, &opts.node_name);
        if full {
            if let Err(e) = state.routes(&nl, &want, &notes).await {
                log(&format!("routes: {e}"));
            }
        }
        if let Err(e) = state.datapath(&root, &want, full) {
            log(&format!("datapath: {e}"));
        }
    };
    // The in-kernel sweeper takes the tables back now, not when the lease
    // ends, and ADDs read the node's addresses again: the sweeper and the
    // keeper give their leases back as they are dropped here (and on any
    // early return above).
    drop(sweeper);
    drop(addrs);
    end
}

/// What the agent last did, to log changes only.
#[derive(Default)]
struct Applied {
    notes: Vec<String>,
    /// Inode of the non-masquerade map's pin and the ranges written into it.
    datapath: Option<(u64, Vec<IpNetwork>)>,
}

impl Applied {
    async fn routes(&mut self, nl: &Netlink, want: &[Route], notes: &[String]) -> Result<()> {
        if notes != self.notes {
            for n in notes {
                log(n);
            }
            self.notes = notes.to_vec();
        }
        let done = routes::apply(nl, want).await?;
        for r in &done.removed {
            log(&format!("route removed: {} via {}", r.dst, r.via));
        }
        for r in &done.added {
            log(&format!(
                "route added: {} via {} (node {})",
                r.dst, r.via, r.node
            ));
        }
        for f in &done.failed {
            log(&format!(
                "route not changed, tried again at the next pass: {f}"
            ));
        }
        Ok(())
    }

    /// Writes the remote ranges when they changed, when the map is a new one
    /// (first load, or a datapath removed and loaded again), or on a full pass.
    fn datapath(&mut self, root: &PinRoot, want: &[Route], full: bool) -> Result<()> {
        let Ok(meta) = std::fs::metadata(root.map_path(&maps::NON_MASQ)) else {
            self.datapath = None;
            return Ok(());
        };
        let ranges: Vec<IpNetwork> = want.iter().map(|r| r.dst).collect();
        let now = (meta.ino(), ranges);
        if !full && self.datapath.as_ref() == Some(&now) {
            return Ok(());
        }
        if routes::apply_datapath(root, &now.1)? && self.datapath.as_ref() != Some(&now) {
            log(&format!(
                "datapath: {} remote pod range(s) never masqueraded",
                now.1.len()
            ));
        }
        self.datapath = Some(now);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, cidr: &str) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"podCIDRs": [cidr]},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.9"}]},
        }))
        .unwrap()
    }

    /// The store as the reflector keeps it, and what the agent reads of it.
    struct Fixture {
        store: Store<Node>,
        writer: reflector::store::Writer<Node>,
        nodes: Nodes,
    }

    impl Fixture {
        fn new() -> Self {
            let (store, writer) = reflector::store();
            Self {
                store,
                writer,
                nodes: Nodes::default(),
            }
        }

        #[expect(
            clippy::needless_pass_by_value,
            reason = "the tests write each event in place"
        )]
        fn take(&mut self, ev: watcher::Event<Node>) -> bool {
            self.writer.apply_watcher_event(&ev);
            self.nodes.take(&ev, &self.store)
        }
    }

    #[test]
    fn nothing_counts_until_a_full_list_arrived() {
        let mut f = Fixture::new();
        assert!(!f.take(watcher::Event::Init));
        assert!(!f.take(watcher::Event::InitApply(node("a", "10.1.0.0/24"))));
        assert!(!f.nodes.ready && f.nodes.known.is_empty());
        assert!(f.take(watcher::Event::InitDone));
        assert!(f.nodes.ready && f.nodes.known.contains_key("a"));
        // The same object again is no change; a new range is.
        assert!(!f.take(watcher::Event::Apply(node("a", "10.1.0.0/24"))));
        assert!(f.take(watcher::Event::Apply(node("a", "10.2.0.0/24"))));
        assert!(f.take(watcher::Event::Delete(node("a", "10.2.0.0/24"))));
        assert!(!f.take(watcher::Event::Delete(node("a", "10.2.0.0/24"))));
        // A relist replaces the set only when complete: a node gone meanwhile goes.
        f.take(watcher::Event::Apply(node("b", "10.3.0.0/24")));
        f.take(watcher::Event::Init);
        f.take(watcher::Event::InitApply(node("c", "10.4.0.0/24")));
        assert!(f.nodes.known.contains_key("b"));
        f.take(watcher::Event::InitDone);
        assert_eq!(f.nodes.known.keys().collect::<Vec<_>>(), ["c"]);
    }

    #[test]
    fn a_bad_node_is_left_out_and_the_rest_count() {
        let mut f = Fixture::new();
        f.take(watcher::Event::Init);
        f.take(watcher::Event::InitApply(node("a", "10.1.0.0/24")));
        f.take(watcher::Event::InitApply(node("bad", "not-a-cidr")));
        assert!(f.take(watcher::Event::InitDone));
        assert_eq!(f.nodes.known.keys().collect::<Vec<_>>(), ["a"]);
        assert!(
            f.nodes.ignored["bad"].contains("not-a-cidr"),
            "{:?}",
            f.nodes.ignored
        );
    }

    #[test]
    fn one_node_changing_is_read_alone_and_a_bad_one_leaves_the_set() {
        let mut f = Fixture::new();
        f.take(watcher::Event::Init);
        f.take(watcher::Event::InitApply(node("a", "10.1.0.0/24")));
        f.take(watcher::Event::InitApply(node("b", "10.2.0.0/24")));
        assert!(f.take(watcher::Event::InitDone));
        // "a" turns bad: it leaves the set; "b" stays as it was.
        assert!(f.take(watcher::Event::Apply(node("a", "not-a-cidr"))));
        assert_eq!(f.nodes.known.keys().collect::<Vec<_>>(), ["b"]);
        assert!(f.nodes.ignored.contains_key("a"));
        // Still bad: no change. Fixed: back in the set, no longer ignored.
        assert!(!f.take(watcher::Event::Apply(node("a", "not-a-cidr"))));
        assert!(f.take(watcher::Event::Apply(node("a", "10.1.0.0/24"))));
        assert!(f.nodes.known.contains_key("a") && f.nodes.ignored.is_empty());
    }
}
