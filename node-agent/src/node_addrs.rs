//! The node's addresses for hostPorts, kept current from this process
//! (`sluice-node node-addrs`, and part of `route-sync`). hostPorts answer on
//! every address of the node (what the reference portmap matches with
//! `--dst-type LOCAL`); the datapath knows them from `sl_node_addrs` and
//! `sl_node_addrs6`. Without the agent, each ADD with hostPorts reads them
//! from the kernel's `local` routing table, which the kernel keeps in one trie
//! with `main` (one route per pod) until a policy rule splits them: that read
//! grew with the pods, and an address added between two ADDs went unanswered
//! until the next.
//!
//! Here the agent follows the kernel's address notifications and writes the
//! maps when an address that counts comes or goes (and every `RESYNC`, in
//! case a notification was lost), and holds a lease in `sl_agent` while it
//! does. While the lease lasts, ADDs leave the maps alone; a stopped agent
//! gives the lease back and a killed one's runs out within
//! `NODE_ADDRS_LEASE_NS`, and ADDs read the addresses themselves again.
use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use sluice_common::{
    agent_slot::{NODE_ADDRS_LEASE_NS, NODE_ADDRS_UNTIL_NS},
    maps,
    user::monotonic_ns,
};
use sluice_host::netlink::{AddrChange, AddrEvents, Netlink, NodeAddrs};
use sluice_maps::{
    agent,
    hostport::{self, V4, V6},
    PinRoot,
};

use crate::{
    error::{Error, Result},
    log,
    shutdown::Shutdown,
};

/// How often the lease is renewed: well within `NODE_ADDRS_LEASE_NS`.
pub(crate) const RENEW: Duration = Duration::from_secs(1);
/// How often the maps are rewritten from the kernel without a notification.
const RESYNC: Duration = Duration::from_secs(10);

/// The keeper of one datapath's node addresses.
pub(crate) struct Keeper {
    root: PinRoot,
    nl: Netlink,
    events: Option<AddrEvents>,
    /// The `sl_agent` pin the maps were last written for (a datapath loaded
    /// again has new, empty maps), and when.
    written: Option<(u64, Instant)>,
    /// What was last written, to log changes only.
    current: Option<NodeAddrs>,
    holds_lease: bool,
    said: Option<String>,
}

impl Keeper {
    /// Subscribes to the address notifications first, so no change between
    /// the first read and the subscription is missed. Inside a tokio runtime.
    pub(crate) fn new(pin_root: &Path) -> Result<Self> {
        let events = AddrEvents::subscribe()?;
        Ok(Self {
            root: PinRoot::new(pin_root),
            nl: Netlink::open()?,
            events: Some(events),
            written: None,
            current: None,
            holds_lease: false,
            said: None,
        })
    }
}

/// The next address change of `keeper` (never without one).
pub(crate) async fn next_change(keeper: Option<&mut Keeper>) -> AddrChange {
    match keeper {
        Some(k) => k.change().await,
        None => std::future::pending().await,
    }
}

impl Keeper {
    /// The next address change (never, once the subscription has ended).
    pub(crate) async fn change(&mut self) -> AddrChange {
        if let Some(ev) = self.events.as_mut() {
            if let Some(c) = ev.next().await {
                return c;
            }
            log("node addresses: the kernel's notifications stopped; rereading them every 10 s");
            self.events = None;
        }
        std::future::pending().await
    }

    /// One pass: on a tick (`change` `None`) or after a notification. The
    /// maps are rewritten after a change of an address that counts, for a new
    /// datapath, and every `RESYNC`; the lease is renewed after a good write.
    /// Problems are logged, not returned: ADDs read the addresses themselves
    /// while the lease is not held.
    pub(crate) async fn pass(&mut self, change: Option<AddrChange>) {
        if change.is_some_and(|c| !NodeAddrs::counts(c.addr)) {
            // A host veth's link-local address, or loopback's.
            return;
        }
        if !agent::supported(&self.root) {
            self.say(format!(
                "node addresses: no lease map under {} (no datapath loaded yet, or one an older \
                 sluice loaded): ADDs read them themselves",
                self.root.path().display()
            ));
            self.holds_lease = false;
            self.written = None;
            return;
        }
        match self.write_and_renew(change.is_some()).await {
            Ok(()) => {
                if !self.holds_lease || self.said.is_some() {
                    log(&format!(
                        "node addresses: kept for {} from this agent (ADDs with hostPorts no longer \
                         read them)",
                        self.root.path().display()
                    ));
                    self.said = None;
                }
                self.holds_lease = true;
            }
            Err(e) => {
                self.say(format!(
                    "node addresses: {e}; ADDs read them themselves until a pass succeeds"
                ));
                self.holds_lease = true;
                self.release();
            }
        }
    }

    async fn write_and_renew(&mut self, changed: bool) -> Result<()> {
        let path = self.root.map_path(&maps::AGENT);
        let pin = std::fs::metadata(&path)
            .map_err(|e| Error::io(path.display().to_string(), e))?
            .ino();
        let due = changed
            || self
                .written
                .is_none_or(|(ino, at)| ino != pin || at.elapsed() >= RESYNC);
        if due {
            let addrs = self.nl.local_addrs(true).await?;
            hostport::set_node_addrs::<V4>(&self.root, &addrs.v4)?;
            if let Some(v6) = addrs
                .v6
                .as_ref()
                .filter(|_| self.root.has(&maps::NODE_ADDRS6))
            {
                let v6: Vec<sluice_common::Addr6> =
                    v6.iter().copied().map(sluice_common::Addr6).collect();
                hostport::set_node_addrs::<V6>(&self.root, &v6)?;
            }
            if self.current.as_ref() != Some(&addrs) {
                log(&format!("node addresses for hostPorts: {}", show(&addrs)));
                self.current = Some(addrs);
            }
            self.written = Some((pin, Instant::now()));
        }
        // The maps first, then the lease: an ADD that sees the lease finds
        // them current.
        agent::set_lease(
            &self.root,
            NODE_ADDRS_UNTIL_NS,
            monotonic_ns() + NODE_ADDRS_LEASE_NS,
        )?;
        Ok(())
    }

    /// Gives the addresses back to the ADDs at once.
    pub(crate) fn release(&mut self) {
        if self.holds_lease {
            if let Err(e) = agent::set_lease(&self.root, NODE_ADDRS_UNTIL_NS, 0) {
                log(&format!("node addresses: giving the lease back: {e}"));
            }
            self.holds_lease = false;
        }
    }

    fn say(&mut self, msg: String) {
        if self.said.as_ref() != Some(&msg) {
            log(&msg);
            self.said = Some(msg);
        }
    }
}

/// ADDs read the node's addresses themselves again once the keeper is gone:
/// at shutdown, on an error's early return, on a panic.
impl Drop for Keeper {
    fn drop(&mut self) {
        self.release();
    }
}

/// `192.0.2.1, 2001:db8::1` (or `none`).
fn show(a: &NodeAddrs) -> String {
    let mut out: Vec<String> =
        a.v4.iter()
            .map(|o| std::net::Ipv4Addr::from(*o).to_string())
            .collect();
    out.extend(
        a.v6.iter()
            .flatten()
            .map(|o| std::net::Ipv6Addr::from(*o).to_string()),
    );
    if out.is_empty() {
        "none".into()
    } else {
        out.join(", ")
    }
}

/// `sluice-node node-addrs`: keeps them until `shutdown`; the lease goes
/// back when the keeper is dropped.
pub(crate) async fn run(pin_root: PathBuf, mut shutdown: Shutdown) -> Result<()> {
    let mut tick = tokio::time::interval(RENEW);
    let mut keeper = Keeper::new(&pin_root)?;
    loop {
        let change = tokio::select! {
            _ = tick.tick() => None,
            c = keeper.change() => Some(c),
            () = &mut shutdown => break,
        };
        keeper.pass(change).await;
    }
    Ok(())
}
