//! The eBPF datapath of one network, behind a few pod-level verbs:
//!
//! - [`Datapath::prepare`]: the node-wide part, once per ADD: load the programs
//!   (once per node, or when this binary carries another object: an upgrade),
//!   attach the uplink, the NAT sweeper and the hostPort socket hooks, write the
//!   masquerade, Service range, debug and node-address settings;
//! - [`Datapath::attach`]: one pod (its [`PodSpec`]: endpoint, hostPorts,
//!   bandwidth), all of it or an error;
//! - [`Datapath::detach`]: everything of one pod, best effort;
//! - [`Datapath::check`]: CHECK of one pod;
//! - [`Datapath::collect`]: GC of what no valid attachment owns;
//! - [`Datapath::repair`]: re-attaching recorded pods to a datapath loaded anew.
//!
//! The maps are read and written through `sluice_maps`; loading is [`loader`],
//! every attachment [`links`], the few raw bpf(2) commands [`sys`].
pub mod bandwidth;
pub use sluice_host::bpffs;
pub mod features;
pub mod hostport;
mod links;
mod loader;
pub mod masquerade;
mod pod_block;
mod repair;
pub mod services;
mod sys;
mod verify;

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
};

use sluice_common::{
    config_flags, endpoint_flags, maps, monitor_slot, pin_dirs, to_cbuf, DatapathMeta, Endpoint,
    EndpointInfo, Masq6Config, MasqConfig, NodeConfig, CONTAINER_ID_LEN, IFNAME_LEN,
    LAYOUT_VERSION,
};
use sluice_maps::{
    endpoint::Endpoints,
    hostport::{V4, V6},
    nat::non_masq_owner,
    PinRoot,
};

pub use links::XdpAttached;
pub use loader::object_hash;
pub use masquerade::MasqSpec;

use crate::{
    cni::{
        config::{PodAttach, XdpMode},
        runtime_config::{Bandwidth, PortMapping},
        AttachmentId,
    },
    error::{Error, Errors},
    lock::FileLock,
    netlink::Netlink,
    netns::Netns,
};

/// What a pod's complete record says it was given, for [`Datapath::detach`]
/// to remove by key.
pub struct Known<'a> {
    pub host_ifindex: u32,
    pub ips: &'a [IpAddr],
    pub port_mappings: &'a [PortMapping],
}

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

/// One pod as the datapath sees it.
pub struct PodSpec<'a> {
    pub id: &'a AttachmentId,
    pub host_ifname: &'a str,
    pub host_ifindex: u32,
    pub host_mac: [u8; 6],
    pub pod_mac: [u8; 6],
    pub ips: &'a [IpAddr],
    /// Inode of the pod's network namespace (0 unknown).
    pub netns_ino: u64,
    /// The pod end takes XDP frames (see `endpoint_flags::XDP_READY`).
    pub xdp_ready: bool,
    pub attach: PodAttach,
    /// The pair is netkit (its programs attach to netkit's hooks; `attach`
    /// is for a veth's).
    pub netkit: bool,
    pub port_mappings: &'a [PortMapping],
    pub bandwidth: Option<&'a Bandwidth>,
    /// The pod's own interface, where EDT shapes an egress limit; `None`: the
    /// policer only (e.g. a repair, which does not enter pods).
    pub device: Option<PodDevice<'a>>,
}

/// A pod's own interface (its `eth0`), inside its namespace.
pub struct PodDevice<'a> {
    pub ns: &'a Netns,
    /// A netlink socket in the pod's namespace.
    pub nl: &'a Netlink,
    pub ifname: &'a str,
    pub ifindex: u32,
    /// `fq` is its root qdisc (ADD made it so; false where the kernel has no
    /// `sch_fq`).
    pub fq: bool,
}

impl PodSpec<'_> {
    /// EDT for this pod: an egress limit and `fq` on its interface.
    fn edt_device(&self) -> Option<&PodDevice<'_>> {
        let egress = self.bandwidth.is_some_and(|b| b.egress_rate.is_some());
        self.device.as_ref().filter(|d| egress && d.fq)
    }

    fn ports(&self) -> Result<hostport::PodPorts, Error> {
        hostport::entries(
            self.port_mappings,
            PORT_MAPPINGS,
            self.ips,
            self.host_ifindex,
        )
    }
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
    /// pods ADD then re-attaches ([`Datapath::repair`]). Decided under the load
    /// lock, so of two ADDs racing to load, only the one that loads sees it.
    pub fn fresh(&self) -> bool {
        self.fresh
    }
}

/// Whether the owner recorded in `sl_ep_info` is `id`. The map keeps the container
/// id cut at `CONTAINER_ID_LEN` bytes, so `id` is cut the same way first.
pub fn info_owned_by(info: &EndpointInfo, id: &AttachmentId) -> bool {
    let cid: [u8; CONTAINER_ID_LEN] = to_cbuf(id.container_id.as_bytes());
    let ifname: [u8; IFNAME_LEN] = to_cbuf(id.ifname.as_bytes());
    info.container_id == cid && info.ifname == ifname
}

/// The same test for an owner read back as an [`AttachmentId`] by
/// [`Datapath::endpoint_owners`].
pub fn owned_by(recorded: &AttachmentId, id: &AttachmentId) -> bool {
    let info = EndpointInfo {
        container_id: to_cbuf(recorded.container_id.as_bytes()),
        ifname: to_cbuf(recorded.ifname.as_bytes()),
        ..EndpointInfo::default()
    };
    info_owned_by(&info, id)
}

/// `xdp` made concrete for `uplink`. On a veth, no XDP pays: native turns skbs
/// into XDP frames, losing the `CHECKSUM_PARTIAL` state a veth peer leaves (the pod
/// drops the segment as a bad checksum); generic has to linearize (copy) every
/// GRO'd skb before running, only to pass most of them on (measured:
/// external->pod TCP at 0.75x of tc alone). The tc program's
/// `bpf_redirect_peer` does the job.
/// Before Linux 5.13 native XDP could not deliver into a pod (see
/// `features::Features::veth_xdp`): tc does it, with no XDP.
fn resolve_xdp(xdp: XdpMode, uplink: &Uplink) -> XdpMode {
    match xdp {
        XdpMode::Auto if uplink.is_veth => XdpMode::Off,
        XdpMode::Auto | XdpMode::Native if !features::veth_xdp() => XdpMode::Off,
        XdpMode::Auto => XdpMode::Native,
        other => other,
    }
}

const WANT_MASK: u32 = config_flags::XDP_WANT_NATIVE | config_flags::XDP_WANT_GENERIC;

fn want_flags(xdp: XdpMode) -> u32 {
    match xdp {
        XdpMode::Native | XdpMode::Auto => config_flags::XDP_WANT_NATIVE,
        XdpMode::Generic => config_flags::XDP_WANT_GENERIC,
        XdpMode::Off => 0,
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

    // --- the node -------------------------------------------------------------------

    /// Makes the node-wide part as `settings` ask: this binary's programs loaded
    /// and pinned (the first ADD on a node pays the verifier; later ADDs open the
    /// pins; pinned programs of another object are replaced on every attached
    /// interface, keeping map contents), the uplink, sweeper and socket hooks
    /// attached, and the masquerade, debug and node-address settings written
    /// (cheap when unchanged: every ADD writes them, so a config change takes
    /// effect at the next ADD).
    pub async fn prepare(
        &self,
        host_nl: &Netlink,
        settings: &NodeSettings,
    ) -> Result<Prepared, Error> {
        bpffs::ensure_bpffs(self.root.path())?;
        bpffs::create_dirs(self.root.path())?;
        let prepared = 'load: {
            {
                let shared = FileLock::dir_shared(self.root.path())?;
                if self.is_current()? && self.node_attached(host_nl, settings).await? {
                    break 'load Prepared {
                        _lock: shared,
                        fresh: false,
                    };
                }
            }
            let exclusive = FileLock::dir_exclusive(self.root.path())?;
            let fresh = self.load_locked(host_nl, settings).await?;
            drop(exclusive);
            Prepared {
                _lock: FileLock::dir_shared(self.root.path())?,
                fresh,
            }
        };
        // Prefixes first: the cluster range must never be masqueraded.
        if let Some(m) = &settings.masq {
            sluice_maps::nat::set_non_masq(&self.root, non_masq_owner::CONFIG, &m.non_masq)?;
            sluice_maps::nat::set_non_masq6(&self.root, non_masq_owner::CONFIG, &m.non_masq6)?;
            sluice_maps::nat::write_config(&self.root, m.config)?;
            sluice_maps::nat::write_config6(&self.root, m.config6)?;
            sluice_maps::nat_pressure::write_limits(&self.root, m.udp_unreplied_secs, m.pod_share)?;
        } else {
            sluice_maps::nat::write_config(&self.root, MasqConfig::default())?;
            sluice_maps::nat::write_config6(&self.root, Masq6Config::default())?;
        }
        services::write(&self.root, &settings.services)?;
        sluice_maps::node::set_monitor_slot(
            &self.root,
            monitor_slot::DEBUG,
            u64::from(settings.debug),
        )?;
        if let Some(addrs) = &settings.node_addrs {
            sluice_maps::hostport::set_node_addrs::<V4>(&self.root, &addrs.v4)?;
            if let Some(v6) = &addrs.v6 {
                let v6: Vec<sluice_common::Addr6> =
                    v6.iter().copied().map(sluice_common::Addr6).collect();
                sluice_maps::hostport::set_node_addrs::<V6>(&self.root, &v6)?;
            }
        }
        Ok(prepared)
    }

    fn is_current(&self) -> Result<bool, Error> {
        Ok(match self.meta()? {
            Some(m) => {
                if m.layout_version != LAYOUT_VERSION {
                    return Err(Error::datapath(
                        "reuse the pinned datapath",
                        format!(
                            "{} holds map layout v{}, this sluice uses v{LAYOUT_VERSION}",
                            self.root.path().display(),
                            m.layout_version
                        ),
                    ));
                }
                m.object_hash == object_hash() && loader::programs_pinned(&self.root)
            }
            None => false,
        })
    }

    /// The node-wide attachments are in place: the NAT sweeper, the socket hooks
    /// if asked for, and the uplink's programs as the settings ask.
    async fn node_attached(&self, host_nl: &Netlink, s: &NodeSettings) -> Result<bool, Error> {
        Ok(
            (links::sweeper_attached(&self.root) || !features::get().sweeper)
                && (s.host_port_cgroup.is_none() || links::hooks_attached(&self.root))
                && self.uplink_current(host_nl, s).await?,
        )
    }

    /// The uplink's programs are attached as the settings ask: to that interface,
    /// with that XDP mode (so a changed `xdp` takes effect at the next ADD). Pinned
    /// tcx links are found by their pins; `cls_bpf` filters (kernels without tcx)
    /// are looked for on the interface, so filters someone removed are attached
    /// again.
    async fn uplink_current(&self, host_nl: &Netlink, s: &NodeSettings) -> Result<bool, Error> {
        let Some(u) = &s.uplink else {
            return Ok(true);
        };
        let Ok(c) = sluice_maps::node::config(&self.root) else {
            return Ok(false);
        };
        if c.uplink_ifindex != u.ifindex || c.flags & WANT_MASK != want_flags(resolve_xdp(s.xdp, u))
        {
            return Ok(false);
        }
        if c.flags & config_flags::UPLINK_TC_FILTERS == 0 {
            return Ok(links::uplink_attached(&self.root, u.ifindex));
        }
        for (name, ingress, id) in links::uplink_program_ids(&self.root)? {
            let filters = host_nl.bpf_filters(u.ifindex, ingress).await?;
            if !filters.iter().any(|f| f.prog_id == id) {
                eprintln!(
                    "sluice: {name} is not attached to {}; attaching it",
                    u.ifname
                );
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn create_pin_dirs(&self) -> Result<(), Error> {
        for d in [pin_dirs::MAPS, pin_dirs::PROGS, pin_dirs::LINKS] {
            bpffs::create_dirs(&self.root.path().join(d))?;
        }
        Ok(())
    }

    /// Under the exclusive lock: load if needed, attach what is missing.
    /// Returns whether it loaded where no datapath was pinned.
    async fn load_locked(&self, host_nl: &Netlink, s: &NodeSettings) -> Result<bool, Error> {
        let mut fresh = false;
        // Another invocation may have loaded while this one waited.
        if !self.is_current()? {
            fresh = self.meta()?.is_none();
            self.create_pin_dirs()?;
            loader::load_and_pin(&self.root, &self.pod_ifnames(), s.nat_flows)?;
        }
        if features::get().sweeper && !links::sweeper_attached(&self.root) {
            links::ensure_sweeper(&self.root)?;
        }
        if let Some(cg) = &s.host_port_cgroup {
            if !links::hooks_attached(&self.root) {
                links::attach_hooks(&self.root, &hostport::open_cgroup(cg)?, cg)?;
            }
        }
        if let Some(u) = &s.uplink {
            if !self.uplink_current(host_nl, s).await? {
                let xdp = resolve_xdp(s.xdp, u);
                let attached = links::attach_uplink(&self.root, &u.ifname, u.ifindex, xdp)?;
                eprintln!(
                    "sluice: uplink {} attached (tc {}, XDP {:?})",
                    u.ifname,
                    if attached.filters { "filters" } else { "tcx" },
                    attached.xdp
                );
                let mut flags = want_flags(xdp)
                    | match attached.xdp {
                        XdpAttached::Native => config_flags::XDP_NATIVE,
                        XdpAttached::Generic => config_flags::XDP_GENERIC,
                        XdpAttached::Off => 0,
                    };
                if attached.filters {
                    flags |= config_flags::UPLINK_TC_FILTERS;
                }
                sluice_maps::node::write_config(
                    &self.root,
                    NodeConfig {
                        uplink_ifindex: u.ifindex,
                        flags,
                        uplink_mac: u.mac,
                        pod_mtu: u16::try_from(s.pod_mtu).unwrap_or(u16::MAX),
                    },
                )?;
            }
        }
        Ok(fresh)
    }

    /// Reloads the programs from this binary's object even when the pinned ones
    /// look current (`sluicectl datapath reload`), moving every link to them.
    pub fn reload(&self) -> Result<(), Error> {
        bpffs::ensure_bpffs(self.root.path())?;
        bpffs::create_dirs(self.root.path())?;
        let _exclusive = FileLock::dir_exclusive(self.root.path())?;
        self.create_pin_dirs()?;
        loader::load_and_pin(
            &self.root,
            &self.pod_ifnames(),
            crate::cni::config::NAT_MAX_FLOWS_DEFAULT,
        )
    }

    /// The exclusive lock an ADD's shared one waits for; `None` when nothing
    /// was ever pinned here (no ADD has got that far, so none holds a lock).
    pub fn lock_exclusive(&self) -> Result<Option<FileLock>, Error> {
        if !self.root.path().is_dir() {
            return Ok(None);
        }
        Ok(Some(FileLock::dir_exclusive(self.root.path())?))
    }

    /// Detaches every program (pods, uplink, socket hooks, sweeper) under the
    /// exclusive lock; traffic falls back to the kernel's routes (the pods'
    /// routes and neighbours do not depend on the programs). The next ADD attaches
    /// the uplink again. Returns what was detached.
    pub fn detach_all(&self) -> Result<Vec<String>, Error> {
        let _exclusive = FileLock::dir_exclusive(self.root.path())?;
        links::detach_all(&self.root, &self.pod_ifnames())
    }

    /// The per-reason counters summed over CPUs (index = `sluice_common::reason`).
    pub fn counters(&self) -> Result<Vec<u64>, Error> {
        Ok(sluice_maps::counters::read(&self.root)?)
    }

    // --- one pod --------------------------------------------------------------------

    /// Attaches one pod: its counters and owner first (so the programs count
    /// from the first packet), the programs on its host veth, its addresses,
    /// its bandwidth limits, and last its hostPort mappings (all or none; a
    /// conflict names the owner and fails the ADD, whose rollback removes the
    /// rest with [`Self::detach`]).
    pub fn attach(&self, _prepared: &Prepared, pod: &PodSpec<'_>) -> Result<(), Error> {
        let mut steps = crate::timing::Steps::start();
        let ports = pod.ports()?;
        let mut eps = Endpoints::open(&self.root)?;
        let info = EndpointInfo {
            container_id: to_cbuf(pod.id.container_id.as_bytes()),
            ifname: to_cbuf(pod.id.ifname.as_bytes()),
            host_ifname: to_cbuf(pod.host_ifname.as_bytes()),
            netns_ino: pod.netns_ino,
            created_unix: now_unix(),
        };
        eps.insert_interface(pod.host_ifindex, &info)?;
        let slot = {
            // One claim at a time (ADDs hold the pin root shared): the maps
            // directory is the lock.
            let _claim = FileLock::dir_exclusive(&self.root.maps_dir())?;
            eps.claim_slot(pod.host_ifindex)?
        };
        steps.done("attach: counters and owner");
        if pod.netkit {
            links::attach_pod_netkit(&self.root, pod.host_ifname, pod.host_ifindex)?;
        } else {
            links::attach_pod(
                &self.root,
                pod.host_ifname,
                pod.host_ifindex,
                features::pod_attach(pod.attach),
            )?;
        }
        steps.done("attach: programs");
        // The limits before the endpoints that tell the programs to look
        // them up (endpoint_flags::LIMITED): limited from the first packet.
        match pod.bandwidth {
            Some(b) => sluice_maps::bandwidth::set(
                &self.root,
                pod.host_ifindex,
                bandwidth::state(b, sluice_common::user::monotonic_ns()),
            )?,
            None => sluice_maps::bandwidth::remove(&self.root, pod.host_ifindex)?,
        }
        for ip in pod.ips {
            let mut flags = if ip.is_ipv6() {
                endpoint_flags::IPV6
            } else {
                0
            };
            if pod.xdp_ready {
                flags |= endpoint_flags::XDP_READY;
            }
            if pod.bandwidth.is_some() {
                flags |= endpoint_flags::LIMITED;
            }
            if let Some(slot) = slot {
                flags = endpoint_flags::with_slot(flags, slot);
            }
            eps.insert(
                *ip,
                Endpoint {
                    ifindex: pod.host_ifindex,
                    flags,
                    pod_mac: pod.pod_mac,
                    host_mac: pod.host_mac,
                },
            )?;
        }
        steps.done("attach: limits and endpoints");
        match pod.edt_device() {
            Some(d) => {
                links::attach_pod_device(
                    &self.root,
                    d.ns,
                    pod.host_ifname,
                    d.ifname,
                    features::pod_attach(pod.attach),
                )?;
                sluice_maps::bandwidth::enable_edt(&self.root, pod.host_ifindex, d.ifindex)?;
            }
            None => sluice_maps::bandwidth::disable_edt(&self.root, pod.host_ifindex)?,
        }
        if !ports.is_empty() {
            let cookie = match sluice_maps::hostport::node_netns_cookie(&self.root)? {
                Some(c) => c,
                None => links::learn_netns_cookie(&self.root)?,
            };
            sluice_maps::hostport::add_pod(&self.root, &ports.v4, &ports.v6, cookie)?;
        }
        Ok(())
    }

    /// Removes everything of one pod: its programs, addresses, counters, owner,
    /// masqueraded flows, hostPort mappings (operator ones too) and flows, and
    /// bandwidth limits. With `known` (what the pod's complete record says it
    /// was given: its host veth's index, addresses and mappings), its entries
    /// are removed by key, so a DEL costs the same on a node with 20 pods or
    /// 1,000. Without (a crash before the record had the index, GC of an
    /// endpoint without a record), the interface is known by `host_ifindex` or
    /// only by the owner entry, and the endpoint and mapping tables are walked.
    /// Best effort: goes on past errors and returns them all. Nothing pinned:
    /// nothing to remove.
    pub fn detach(
        &self,
        host_ifname: &str,
        host_ifindex: Option<u32>,
        id: &AttachmentId,
        known: Option<&Known<'_>>,
    ) -> Result<(), Error> {
        let mut errors = Errors::new();
        errors.note(links::detach_pod(&self.root, host_ifname));
        if !self.holds_endpoints()? {
            return errors.finish();
        }
        let mut eps = Endpoints::open(&self.root)?;
        let (ifindexes, ips): (Vec<u32>, Vec<IpAddr>) = if let Some(k) = known {
            // The record's addresses that still go to its interface.
            (
                vec![k.host_ifindex],
                k.ips
                    .iter()
                    .copied()
                    .filter(|ip| eps.get(*ip).is_some_and(|e| e.ifindex == k.host_ifindex))
                    .collect(),
            )
        } else {
            let mut ifindexes: Vec<u32> = host_ifindex.into_iter().collect();
            for (idx, info) in eps.interfaces() {
                if info_owned_by(&info, id) && !ifindexes.contains(&idx) {
                    ifindexes.push(idx);
                }
            }
            let ips = eps
                .list()
                .into_iter()
                .filter(|(_, ep)| ifindexes.contains(&ep.ifindex))
                .map(|(ip, _)| ip)
                .collect();
            (ifindexes, ips)
        };
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for ip in ips {
            match ip {
                IpAddr::V4(a) => v4.push(a.octets()),
                IpAddr::V6(a) => v6.push(a.octets()),
            }
            errors.note(eps.remove(ip).map_err(Error::from));
        }
        errors.note(sluice_maps::nat::forget_pods(&self.root, &v4, &v6).map_err(Error::from));
        errors.note(self.remove_mappings(&ifindexes, known));
        errors.note(sluice_maps::hostport::forget_pods::<V4>(&self.root, &v4).map_err(Error::from));
        let v6: Vec<sluice_common::Addr6> = v6.iter().map(|a| sluice_common::Addr6(*a)).collect();
        errors.note(sluice_maps::hostport::forget_pods::<V6>(&self.root, &v6).map_err(Error::from));
        for idx in ifindexes {
            errors.note(sluice_maps::bandwidth::remove(&self.root, idx).map_err(Error::from));
            errors.note(sluice_maps::bandwidth::disable_edt(&self.root, idx).map_err(Error::from));
            for e in eps.remove_interface(idx) {
                errors.push(e.into());
            }
        }
        errors.finish()
    }

    /// The hostPort mappings of the pods on `ifindexes`: by key from what
    /// `known` says the pod was given, unless operator mappings may exist
    /// (they are in no record); then, without `known`, or with a record whose
    /// mappings no longer make keys, by a walk of every mapping.
    fn remove_mappings(&self, ifindexes: &[u32], known: Option<&Known<'_>>) -> Result<(), Error> {
        let by_key = known
            .filter(|_| !sluice_maps::hostport::operator_mappings_marked(&self.root))
            .and_then(|k| {
                hostport::entries(k.port_mappings, PORT_MAPPINGS, k.ips, k.host_ifindex).ok()
            });
        if let Some(ports) = by_key {
            sluice_maps::hostport::remove_mappings::<V4>(&self.root, &ports.v4)?;
            sluice_maps::hostport::remove_mappings::<V6>(&self.root, &ports.v6)?;
            return Ok(());
        }
        sluice_maps::hostport::remove_of_pods::<V4>(&self.root, ifindexes)?;
        sluice_maps::hostport::remove_of_pods::<V6>(&self.root, ifindexes)?;
        Ok(())
    }

    /// CHECK of one pod: its programs on its host veth (`cls_bpf` filters of the
    /// pinned programs, or tcx links), its counters and addresses, hostPort
    /// mappings and bandwidth limits.
    pub async fn check(&self, host_nl: &Netlink, pod: &PodSpec<'_>) -> Result<(), Error> {
        match features::pod_attach(pod.attach) {
            _ if pod.netkit => links::check_pod_netkit(&self.root, pod.host_ifname)?,
            PodAttach::Tc => self.check_filters(host_nl, pod).await?,
            PodAttach::Tcx => links::check_pod_tcx(&self.root, pod.host_ifname)?,
        }
        let eps = Endpoints::open(&self.root)?;
        if !eps.has_counters(pod.host_ifindex) {
            return Err(Error::check(format!(
                "no counters for {} (ifindex {})",
                pod.host_ifname, pod.host_ifindex
            )));
        }
        for ip in pod.ips {
            match eps.get(*ip) {
                Some(e) if e.ifindex == pod.host_ifindex && e.pod_mac == pod.pod_mac => {}
                Some(e) => {
                    return Err(Error::check(format!(
                        "endpoint {ip} points at ifindex {} instead of {} ({})",
                        e.ifindex, pod.host_ifindex, pod.host_ifname
                    )))
                }
                None => {
                    return Err(Error::check(format!(
                        "endpoint {ip} missing from {}",
                        maps::ENDPOINTS.name
                    )))
                }
            }
        }
        let ports = pod.ports()?;
        sluice_maps::hostport::check::<V4>(&self.root, &ports.v4)?;
        sluice_maps::hostport::check::<V6>(&self.root, &ports.v6)?;
        let want = pod.bandwidth.map(|b| bandwidth::state(b, 0));
        sluice_maps::bandwidth::check(&self.root, pod.host_ifindex, want.as_ref())?;
        self.check_edt(pod).await
    }

    /// A pod in EDT mode has `fq` as its interface's root qdisc and `pod_edt`
    /// on its egress; one in policer mode needs nothing there.
    async fn check_edt(&self, pod: &PodSpec<'_>) -> Result<(), Error> {
        use sluice_maps::bandwidth::{egress_mode, EgressMode};
        if egress_mode(&self.root, pod.host_ifindex) == EgressMode::Policer {
            return Ok(());
        }
        let Some(d) = &pod.device else {
            return Ok(());
        };
        let root = d.nl.root_qdisc(d.ifindex).await?;
        if root.as_deref() != Some(crate::netlink::FQ) {
            return Err(Error::check(format!(
                "{} of the pod has root qdisc {} instead of fq (its egress is EDT)",
                d.ifname,
                root.as_deref().unwrap_or("none")
            )));
        }
        match features::pod_attach(pod.attach) {
            PodAttach::Tcx => {
                links::check_pod_device_tcx(&self.root, d.ns, pod.host_ifname, d.ifname)
            }
            PodAttach::Tc => {
                let id = sluice_maps::programs::id(&self.root, sluice_common::prog_names::POD_EDT)?;
                let filters = d.nl.bpf_filters(d.ifindex, false).await?;
                if filters.iter().any(|f| f.prog_id == id) {
                    Ok(())
                } else {
                    Err(Error::check(format!(
                        "pod_edt (program id {id}) is not attached to the egress of the pod's {} (filters: {filters:?})",
                        d.ifname
                    )))
                }
            }
        }
    }

    /// The pinned pod programs are the `cls_bpf` filters of the host veth's hooks.
    async fn check_filters(&self, host_nl: &Netlink, pod: &PodSpec<'_>) -> Result<(), Error> {
        for (name, ingress, id) in links::pod_program_ids(&self.root)? {
            let filters = host_nl.bpf_filters(pod.host_ifindex, ingress).await?;
            if !filters.iter().any(|f| f.prog_id == id) {
                return Err(Error::check(format!(
                    "{name} (program id {id}) is not attached to {} of {} (filters: {filters:?})",
                    if ingress { "ingress" } else { "egress" },
                    pod.host_ifname,
                )));
            }
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
        let owners = self.endpoint_owners()?;
        for (ifindex, id, host_ifname) in &owners {
            if !valid.iter().any(|v| owned_by(id, v)) {
                errors.note(self.detach(host_ifname, Some(*ifindex), id, None));
                orphans.push(host_ifname.clone());
            }
        }
        let live: Vec<u32> = self.endpoint_owners()?.iter().map(|(i, _, _)| *i).collect();
        if self.holds_endpoints()? {
            errors.note(
                sluice_maps::hostport::remove_orphans::<V4>(&self.root, &live).map_err(Error::from),
            );
            errors.note(
                sluice_maps::hostport::remove_orphans::<V6>(&self.root, &live).map_err(Error::from),
            );
        }
        errors.finish().map(|()| orphans)
    }

    /// Host veths of every endpoint (an upgrade replaces their filters).
    fn pod_ifnames(&self) -> Vec<String> {
        self.endpoint_owners()
            .map(|o| o.into_iter().map(|(_, _, ifname)| ifname).collect())
            .unwrap_or_default()
    }

    /// Whether the pinned maps can hold pods of ours: a load of this layout
    /// finished there. Not when nothing is pinned, when a first ADD was killed
    /// while it pinned the maps one by one (no pod was published yet), or when
    /// another layout's datapath is pinned (never ours to read or change).
    fn holds_endpoints(&self) -> Result<bool, Error> {
        Ok(self
            .meta()?
            .is_some_and(|m| m.layout_version == LAYOUT_VERSION)
            && self.root.has(&maps::ENDPOINTS))
    }

    /// Owners of the endpoint entries: (host ifindex, attachment, host ifname).
    pub fn endpoint_owners(&self) -> Result<Vec<(u32, AttachmentId, String)>, Error> {
        if !self.holds_endpoints()? {
            return Ok(Vec::new());
        }
        let eps = Endpoints::open(&self.root)?;
        let text = sluice_maps::endpoint::text;
        Ok(eps
            .interfaces()
            .into_iter()
            .map(|(idx, info)| {
                (
                    idx,
                    AttachmentId {
                        container_id: text(&info.container_id),
                        ifname: text(&info.ifname),
                    },
                    text(&info.host_ifname),
                )
            })
            .collect())
    }
}

pub use repair::repair;

#[cfg(test)]
mod tests {
    use super::*;

    fn id(c: &str, i: &str) -> AttachmentId {
        AttachmentId {
            container_id: c.into(),
            ifname: i.into(),
        }
    }

    #[test]
    fn owners_compare_with_the_cut_container_id() {
        let long = "a".repeat(99);
        let full = id(&long, "eth0");
        let recorded = id(&long[..CONTAINER_ID_LEN], "eth0");
        assert!(owned_by(&recorded, &full));
        assert!(!owned_by(&recorded, &id(&long, "eth1")));
        assert!(!owned_by(&id("abc", "eth0"), &id("abcd", "eth0")));
        assert!(owned_by(&id("abc", "eth0"), &id("abc", "eth0")));
    }
}
