//! The eBPF datapath of one network, behind a few pod-level verbs:
//!
//! - [`Datapath::prepare`]: the node-wide part, once per ADD: load the programs
//!   (once per node, or when this binary carries another object: an upgrade),
//!   attach the uplink, the NAT sweeper and the hostPort socket hooks, write the
//!   masquerade, Service range, debug and node-address settings;
//! - [`Datapath::attach`]: one pod (its [`Attachment`]: endpoint, hostPorts,
//!   bandwidth), all of it or an error;
//! - [`Datapath::detach`]: everything of one pod, best effort;
//! - [`Datapath::check`]: CHECK of one pod;
//! - [`Datapath::collect`]: GC of what no valid attachment owns;
//!
//! Each per-pod feature is one module with the same verbs (`prepare` for the
//! node, `attach`, `detach`, `check`), listed once in [`FEATURES`]; the verbs
//! here are loops over that list. The node-wide verb is in [`prepare`](mod@prepare),
//! the uplink's part in [`uplink`]. The maps are read and written through
//! `sluice_maps`; loading is [`loader`] (and [`verify`]), the generic attach and
//! pin mechanics [`links`], a pod's programs on its devices [`pod_links`], the
//! few raw bpf(2) commands [`sys`].
mod attachment;
pub mod bandwidth;
pub use sluice_host::bpffs;
mod endpoint;
pub mod features;
pub mod hostport;
mod links;
mod loader;
pub mod masquerade;
mod pod_block;
mod pod_links;
mod prepare;
pub mod services;
mod sweeper;
mod sys;
mod uplink;
mod verify;

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
};

use sluice_common::DatapathMeta;
use sluice_maps::PinRoot;

pub use attachment::{Attachment, PodDevice};
pub use endpoint::{info_owned_by, owned_by};
pub use loader::object_hash;
pub use masquerade::MasqSpec;
pub use uplink::XdpAttached;

use crate::{
    cni::{config::XdpMode, AttachmentId},
    error::{Error, Errors},
    lock::FileLock,
    netlink::Netlink,
};

/// Where the runtime passes port mappings (CNI conventions): names the list in
/// errors.
pub const PORT_MAPPINGS: &str = "runtimeConfig.portMappings";

impl From<sluice_maps::Error> for Error {
    fn from(e: sluice_maps::Error) -> Self {
        match e {
            sluice_maps::Error::PortConflict {
                port,
                target,
                owner,
            } => Self::PortConflict {
                port,
                target,
                owner,
            },
            sluice_maps::Error::Check(what) => Self::check(what),
            e => Self::datapath("map operation", e),
        }
    }
}

/// The node's uplink, where `uplink_in` and `uplink_xdp` attach.
#[derive(Clone, Debug)]
pub struct Uplink {
    pub ifname: String,
    pub ifindex: u32,
    pub mac: [u8; 6],
    /// A veth (nested setups, test beds): see [`XdpMode::Auto`].
    pub is_veth: bool,
}

/// The node-wide settings an ADD brings.
#[derive(Clone, Debug)]
pub struct NodeSettings {
    pub uplink: Option<Uplink>,
    pub xdp: XdpMode,
    /// MTU of the pods' veths.
    pub pod_mtu: u32,
    /// Entries of each NAT map when they are created.
    pub nat_flows: u32,
    /// The cgroup to attach the hostPort socket hooks to, when this ADD maps
    /// ports (attached once, by the first ADD that needs them).
    pub host_port_cgroup: Option<PathBuf>,
    /// The node's addresses, when this ADD maps ports (what wildcard mappings
    /// match; refreshed then).
    pub node_addrs: Option<crate::netlink::NodeAddrs>,
    /// `None`: masquerade off.
    pub masq: Option<MasqSpec>,
    /// The config's Service ranges (`serviceCIDRs`, see [`services`]).
    pub services: Vec<ipnetwork::IpNetwork>,
    /// Config `debug`.
    pub debug: bool,
}

/// The datapath pinned at one pin root. The pin root directory is also the lock
/// that serialises loads (exclusive) against attaches (shared).
pub struct Datapath {
    root: PinRoot,
}

/// What [`Datapath::prepare`] gives: held while attaching, so an upgrade
/// (exclusive) cannot swap programs meanwhile.
pub struct Prepared {
    _lock: FileLock,
    fresh: bool,
}

impl Prepared {
    /// Whether this invocation loaded the datapath where nothing was pinned: a
    /// new node, or one whose pins were lost (reboot, deleted by hand), whose
    /// pods ADD then re-attaches (`crate::pod::repair`). Decided under the load
    /// lock, so of two ADDs racing to load, only the one that loads sees it.
    pub fn fresh(&self) -> bool {
        self.fresh
    }
}

pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Whether this binary carries an eBPF object (STATUS).
pub fn has_object() -> bool {
    loader::has_object()
}

impl Datapath {
    /// The datapath pinned at `pin_root`.
    pub fn new(pin_root: &Path) -> Self {
        Self {
            root: PinRoot::new(pin_root),
        }
    }

    pub fn pin_root(&self) -> &Path {
        self.root.path()
    }

    /// The pinned datapath's identity, if one is loaded.
    pub fn meta(&self) -> Result<Option<DatapathMeta>, Error> {
        Ok(sluice_maps::node::meta(&self.root)?)
    }

    /// The node's part of hostPorts outside an ADD's `prepare` (a repair):
    /// the node's addresses, and the socket hooks when `cgroup` asks for them.
    pub fn prepare_host_ports(
        &self,
        addrs: &crate::netlink::NodeAddrs,
        cgroup: Option<&Path>,
    ) -> Result<(), Error> {
        hostport::prepare_addrs(&self.root, addrs)?;
        if let Some(cg) = cgroup {
            if !hostport::hooks_attached(&self.root) {
                hostport::attach_hooks(&self.root, &hostport::open_cgroup(cg)?, cg)?;
            }
        }
        Ok(())
    }

    // --- one pod --------------------------------------------------------------------

    /// Attaches one pod, feature by feature in [`FEATURES`] order, all of it
    /// or an error (an ADD's rollback then removes the rest with
    /// [`Self::detach`]). The hostPort entries are checked before anything is
    /// written: a bad mapping fails the ADD with nothing to undo.
    pub fn attach(&self, _prepared: &Prepared, pod: &Attachment<'_>) -> Result<(), Error> {
        hostport::pod_ports(pod)?;
        for f in FEATURES {
            f.attach(&self.root, pod)?;
        }
        Ok(())
    }

    /// Removes everything of one pod: its programs first, then each feature's
    /// part in reverse [`FEATURES`] order, its owner and counters last (see
    /// [`endpoint::gone`] for how the pod is found with or without its record,
    /// `pod`, what its complete record says it was given). Best effort: goes
    /// on past errors and returns them all. Nothing pinned: nothing to remove.
    pub fn detach(
        &self,
        host_ifname: &str,
        host_ifindex: Option<u32>,
        id: &AttachmentId,
        pod: Option<&Attachment<'_>>,
    ) -> Result<(), Error> {
        let mut errors = Errors::new();
        errors.note(pod_links::detach_pod(&self.root, host_ifname));
        if !endpoint::held(&self.root)? {
            return errors.finish();
        }
        let gone = endpoint::gone(&self.root, host_ifindex, id, pod)?;
        for f in FEATURES.iter().rev() {
            f.detach(&self.root, &gone, &mut errors);
        }
        endpoint::forget(&self.root, &gone, &mut errors);
        errors.finish()
    }

    /// CHECK of one pod: each feature's part, in [`FEATURES`] order.
    pub async fn check(&self, host_nl: &Netlink, pod: &Attachment<'_>) -> Result<(), Error> {
        for f in CHECK_ORDER {
            f.check(&self.root, host_nl, pod).await?;
        }
        Ok(())
    }

    /// GC: removes the datapath state of every endpoint no attachment in `valid`
    /// owns (a crash before its record was written, a record removed by hand),
    /// and hostPort mappings whose pod is gone (operator ones too). Returns the
    /// host veths of the removed endpoints, for the caller to delete. Goes on
    /// past errors and returns them all.
    pub fn collect(&self, valid: &[AttachmentId]) -> Result<Vec<String>, Error> {
        let mut errors = Errors::new();
        let mut orphans = Vec::new();
        for (ifindex, id, host_ifname) in &endpoint::owners(&self.root)? {
            if !valid.iter().any(|v| owned_by(id, v)) {
                errors.note(self.detach(host_ifname, Some(*ifindex), id, None));
                orphans.push(host_ifname.clone());
            }
        }
        if endpoint::held(&self.root)? {
            let live: Vec<u32> = endpoint::owners(&self.root)?
                .iter()
                .map(|(i, _, _)| *i)
                .collect();
            hostport::collect(&self.root, &live, &mut errors);
        }
        errors.finish().map(|()| orphans)
    }

    /// Owners of the endpoint entries: (host ifindex, attachment, host ifname).
    pub fn endpoint_owners(&self) -> Result<Vec<(u32, AttachmentId, String)>, Error> {
        endpoint::owners(&self.root)
    }
}

/// What of a pod is going (see [`endpoint::gone`]): its host devices and the
/// addresses that still point at them (also per family, as the maps key
/// them), and what its record says it was given when it has one.
pub(super) struct Gone<'a> {
    pub ifindexes: Vec<u32>,
    pub ips: Vec<IpAddr>,
    pub v4: Vec<[u8; 4]>,
    pub v6: Vec<[u8; 16]>,
    pub pod: Option<&'a Attachment<'a>>,
}

/// The per-pod features, each one module with the same verbs. Adding one is a
/// module plus a variant here and a line in each verb's `match`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Feature {
    Bandwidth,
    Endpoint,
    HostPort,
    Masquerade,
    Services,
}

/// The order ADD attaches in (DEL detaches in reverse): the limits before the
/// endpoint whose `LIMITED` mark makes the programs look them up, the
/// hostPorts once the pod they lead to is reachable.
const FEATURES: [Feature; 5] = [
    Feature::Bandwidth,
    Feature::Endpoint,
    Feature::HostPort,
    Feature::Masquerade,
    Feature::Services,
];

/// CHECK's order: the programs and addresses first, as they always were.
const CHECK_ORDER: [Feature; 5] = [
    Feature::Endpoint,
    Feature::HostPort,
    Feature::Bandwidth,
    Feature::Masquerade,
    Feature::Services,
];

impl Feature {
    /// The node-wide settings of the feature (every ADD writes them).
    fn prepare(self, root: &PinRoot, settings: &NodeSettings) -> Result<(), Error> {
        match self {
            Self::Bandwidth | Self::Endpoint => Ok(()),
            Self::HostPort => hostport::prepare(root, settings),
            Self::Masquerade => masquerade::prepare(root, settings),
            Self::Services => services::prepare(root, settings),
        }
    }

    fn attach(self, root: &PinRoot, pod: &Attachment<'_>) -> Result<(), Error> {
        match self {
            Self::Bandwidth => bandwidth::attach(root, pod),
            Self::Endpoint => endpoint::attach(root, pod),
            Self::HostPort => hostport::attach(root, pod),
            // Node-wide only: nothing per pod.
            Self::Masquerade | Self::Services => Ok(()),
        }
    }

    fn detach(self, root: &PinRoot, gone: &Gone<'_>, errors: &mut Errors) {
        match self {
            Self::Bandwidth => bandwidth::detach(root, gone, errors),
            Self::Endpoint => endpoint::detach(root, gone, errors),
            Self::HostPort => hostport::detach(root, gone, errors),
            Self::Masquerade => masquerade::detach(root, gone, errors),
            Self::Services => {}
        }
    }

    async fn check(
        self,
        root: &PinRoot,
        host_nl: &Netlink,
        pod: &Attachment<'_>,
    ) -> Result<(), Error> {
        match self {
            Self::Bandwidth => bandwidth::check(root, pod).await,
            Self::Endpoint => endpoint::check(root, host_nl, pod).await,
            Self::HostPort => hostport::check(root, pod),
            Self::Masquerade | Self::Services => Ok(()),
        }
    }
}
