//! The eBPF datapath of one network, behind a narrow interface: load once per node,
//! attach to each pod's host veth, keep the endpoint maps in step with the pods.
//! All aya calls are in [`bpf`].
pub mod bandwidth;
mod bpf;
pub mod bpffs;
pub mod hostport;

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
};

use sluice_common::{
    config_flags, endpoint_flags, pin_dirs, to_cbuf, DatapathMeta, Endpoint, EndpointInfo, IpKey,
    MasqConfig, NodeConfig, PortKey, PortTarget, CONTAINER_ID_LEN, IFNAME_LEN, LAYOUT_VERSION,
};

pub use bpf::{now_unix, object_hash, XdpAttached};

use crate::{
    cni::{
        config::{PodAttach, XdpMode},
        runtime_config::Bandwidth,
        AttachmentId,
    },
    error::Error,
    lock::FileLock,
};

/// The node's uplink, where `uplink_in` and `uplink_xdp` attach.
#[derive(Clone, Debug)]
pub struct Uplink {
    pub ifname: String,
    pub ifindex: u32,
    pub mac: [u8; 6],
    /// A veth (nested setups, test beds): see [`XdpMode::Auto`].
    pub is_veth: bool,
}

/// What the node-wide part of the datapath is set up with.
#[derive(Clone, Debug)]
pub struct NodeSettings {
    pub uplink: Option<Uplink>,
    pub xdp: XdpMode,
    /// MTU of the pods' veths.
    pub pod_mtu: u32,
    /// Entries of each NAT map when they are created.
    pub nat_flows: u32,
    /// The cgroup to attach the hostPort socket hooks to, when this ADD maps
    /// ports (they are attached once, by the first ADD that needs them).
    pub host_port_cgroup: Option<PathBuf>,
}

/// Masquerade as the programs see it: the config entry and the prefixes never
/// masqueraded.
#[derive(Clone, Debug)]
pub struct MasqSpec {
    pub config: MasqConfig,
    pub non_masq: Vec<(u32, [u8; 4])>,
}

/// A pod's endpoint as the datapath sees it.
pub struct EndpointSpec<'a> {
    pub id: &'a AttachmentId,
    pub host_ifname: &'a str,
    pub host_ifindex: u32,
    pub host_mac: [u8; 6],
    pub pod_mac: [u8; 6],
    pub ips: &'a [IpAddr],
    pub netns_ino: u64,
    /// The pod end takes XDP frames (see `endpoint_flags::XDP_READY`).
    pub xdp_ready: bool,
    pub attach: PodAttach,
}

/// The datapath pinned at one pin root. The pin root directory is also the lock
/// that serialises loads (exclusive) against attaches (shared).
pub struct Datapath {
    pin_root: PathBuf,
}

/// Held while attaching: an upgrade (exclusive) cannot swap programs meanwhile.
pub struct LoadedGuard {
    _lock: FileLock,
    fresh: bool,
}

impl LoadedGuard {
    /// Whether this invocation loaded the datapath where nothing was pinned: a
    /// new node, or one whose pins were lost (reboot, deleted by hand), whose
    /// pods ADD then re-attaches. Decided under the load lock, so of two ADDs
    /// racing to load, only the one that loads sees it.
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
/// into XDP frames, losing the CHECKSUM_PARTIAL state a veth peer leaves (the pod
/// drops the segment as a bad checksum); generic has to linearize (copy) every
/// GRO'd skb before running, only to pass most of them on (measured:
/// external->pod TCP at 0.75x of tc alone). The tc program's
/// bpf_redirect_peer does the job.
fn resolve_xdp(xdp: XdpMode, uplink: &Uplink) -> XdpMode {
    match xdp {
        XdpMode::Auto if uplink.is_veth => XdpMode::Off,
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

pub fn ip_key(ip: IpAddr) -> IpKey {
    match ip {
        IpAddr::V4(v4) => IpKey::v4(v4.octets()),
        IpAddr::V6(v6) => IpKey::v6(v6.octets()),
    }
}

impl Datapath {
    /// The datapath pinned at `pin_root`.
    pub fn new(pin_root: &Path) -> Self {
        Self {
            pin_root: pin_root.to_path_buf(),
        }
    }

    fn dir(&self, sub: &str) -> PathBuf {
        self.pin_root.join(sub)
    }

    /// The pinned datapath's identity, if one is loaded.
    pub fn meta(&self) -> Result<Option<DatapathMeta>, Error> {
        bpf::read_meta(&self.dir(pin_dirs::MAPS))
    }

    fn is_current(&self) -> Result<bool, Error> {
        Ok(match self.meta()? {
            Some(m) => {
                if m.layout_version != LAYOUT_VERSION {
                    return Err(Error::datapath(
                        "reuse the pinned datapath",
                        format!(
                            "{} holds map layout v{}, this sluice uses v{LAYOUT_VERSION}",
                            self.pin_root.display(),
                            m.layout_version
                        ),
                    ));
                }
                m.object_hash == object_hash() && bpf::programs_pinned(&self.dir(pin_dirs::PROGS))
            }
            None => false,
        })
    }

    /// The node-wide attachments are in place: the NAT sweeper and the uplink's
    /// programs as the settings ask.
    fn uplink_ok(&self, s: &NodeSettings) -> bool {
        let links = self.dir(pin_dirs::LINKS);
        bpf::sweeper_attached(&links)
            && self.uplink_current(s)
            && (s.host_port_cgroup.is_none() || hostport::hooks_attached(&links))
    }

    /// The uplink's programs are attached as the settings ask: to that interface,
    /// with that XDP mode (so a changed `xdp` takes effect at the next ADD).
    fn uplink_current(&self, s: &NodeSettings) -> bool {
        s.uplink.as_ref().is_none_or(|u| {
            bpf::uplink_attached(&self.dir(pin_dirs::LINKS), u.ifindex)
                && bpf::read_config(&self.dir(pin_dirs::MAPS)).is_ok_and(|c| {
                    c.uplink_ifindex == u.ifindex
                        && c.flags & WANT_MASK == want_flags(resolve_xdp(s.xdp, u))
                })
        })
    }

    /// Writes the masquerade settings (disabled when `spec` is `None`). Cheap when
    /// nothing changed: every ADD calls it, so a config change takes effect at the
    /// next ADD.
    pub fn apply_masq(&self, _guard: &LoadedGuard, spec: Option<&MasqSpec>) -> Result<(), Error> {
        let maps = self.dir(pin_dirs::MAPS);
        match spec {
            Some(s) => {
                // Prefixes first: the cluster range must never be masqueraded.
                bpf::set_non_masq(&maps, &s.non_masq)?;
                bpf::write_masq(&maps, s.config)
            }
            None => bpf::write_masq(&maps, MasqConfig::default()),
        }
    }

    /// Attaches the hostPort socket hooks to `cgroup` unless they are attached.
    pub fn ensure_host_port_hooks(&self, _guard: &LoadedGuard, cgroup: &Path) -> Result<(), Error> {
        hostport::attach_hooks(
            &self.dir(pin_dirs::PROGS),
            &self.dir(pin_dirs::LINKS),
            cgroup,
        )
    }

    /// Switches the programs' aya-log debug lines on or off (config `debug`).
    pub fn set_debug(&self, _guard: &LoadedGuard, on: bool) -> Result<(), Error> {
        bpf::write_monitor_slot(
            &self.dir(pin_dirs::MAPS),
            sluice_common::monitor_slot::DEBUG,
            u64::from(on),
        )
    }

    /// Makes sure this binary's programs are loaded and pinned, and attached to the
    /// uplink. The first ADD on a node loads them (verifier work once); later ADDs
    /// only open the pins. When the pinned programs come from another object, they
    /// are replaced on every attached interface, keeping map contents.
    pub fn ensure_loaded(&self, settings: &NodeSettings) -> Result<LoadedGuard, Error> {
        bpffs::ensure_bpffs(&self.pin_root)?;
        bpffs::create_dirs(&self.pin_root)?;
        {
            let shared = FileLock::dir_shared(&self.pin_root)?;
            if self.is_current()? && self.uplink_ok(settings) {
                return Ok(LoadedGuard {
                    _lock: shared,
                    fresh: false,
                });
            }
        }
        let exclusive = FileLock::dir_exclusive(&self.pin_root)?;
        let fresh = self.load_locked(settings)?;
        drop(exclusive);
        Ok(LoadedGuard {
            _lock: FileLock::dir_shared(&self.pin_root)?,
            fresh,
        })
    }

    /// Reloads the programs from this binary's object even when the pinned ones
    /// look current (`sluicectl datapath reload`), moving every link to them.
    pub fn reload(&self) -> Result<(), Error> {
        bpffs::ensure_bpffs(&self.pin_root)?;
        bpffs::create_dirs(&self.pin_root)?;
        let _exclusive = FileLock::dir_exclusive(&self.pin_root)?;
        for d in [pin_dirs::MAPS, pin_dirs::PROGS, pin_dirs::LINKS] {
            bpffs::create_dirs(&self.dir(d))?;
        }
        bpf::check_pinned_maps(&self.dir(pin_dirs::MAPS))?;
        bpf::load_and_pin(
            &self.dir(pin_dirs::MAPS),
            &self.dir(pin_dirs::PROGS),
            &self.dir(pin_dirs::LINKS),
            &self.pod_ifnames(),
            crate::cni::config::NAT_MAX_FLOWS_DEFAULT,
        )
    }

    /// Detaches every program (pods, uplink, socket hooks, sweeper) under the
    /// exclusive lock; traffic falls back to the kernel's routes (the pods'
    /// routes and neighbours do not depend on the programs). The next ADD attaches
    /// the uplink again. Returns what was detached.
    pub fn detach_all(&self) -> Result<Vec<String>, Error> {
        let _exclusive = FileLock::dir_exclusive(&self.pin_root)?;
        bpf::detach_all(&self.dir(pin_dirs::LINKS), &self.pod_ifnames())
    }

    /// Under the exclusive lock: load if needed, attach the uplink if needed.
    /// Returns whether it loaded where no datapath was pinned.
    fn load_locked(&self, s: &NodeSettings) -> Result<bool, Error> {
        let mut fresh = false;
        // Another invocation may have loaded while this one waited.
        if !self.is_current()? {
            fresh = self.meta()?.is_none();
            for d in [pin_dirs::MAPS, pin_dirs::PROGS, pin_dirs::LINKS] {
                bpffs::create_dirs(&self.dir(d))?;
            }
            bpf::check_pinned_maps(&self.dir(pin_dirs::MAPS))?;
            bpf::load_and_pin(
                &self.dir(pin_dirs::MAPS),
                &self.dir(pin_dirs::PROGS),
                &self.dir(pin_dirs::LINKS),
                &self.pod_ifnames(),
                s.nat_flows,
            )?;
        }
        if !bpf::sweeper_attached(&self.dir(pin_dirs::LINKS)) {
            bpf::ensure_sweeper(&self.dir(pin_dirs::PROGS), &self.dir(pin_dirs::LINKS))?;
        }
        if let Some(cg) = &s.host_port_cgroup {
            hostport::attach_hooks(&self.dir(pin_dirs::PROGS), &self.dir(pin_dirs::LINKS), cg)?;
        }
        if let Some(u) = &s.uplink {
            if !self.uplink_current(s) {
                let xdp = resolve_xdp(s.xdp, u);
                let attached = bpf::attach_uplink(
                    &self.dir(pin_dirs::PROGS),
                    &self.dir(pin_dirs::LINKS),
                    &u.ifname,
                    u.ifindex,
                    xdp,
                )?;
                eprintln!("sluice: uplink {} attached (XDP: {attached:?})", u.ifname);
                let flags = want_flags(xdp)
                    | match attached {
                        XdpAttached::Native => config_flags::XDP_NATIVE,
                        XdpAttached::Generic => config_flags::XDP_GENERIC,
                        XdpAttached::Off => 0,
                    };
                bpf::write_config(
                    &self.dir(pin_dirs::MAPS),
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

    /// The per-reason counters summed over CPUs (index = `sluice_common::reason`).
    pub fn counters(&self) -> Result<Vec<u64>, Error> {
        bpf::counters(&self.dir(pin_dirs::MAPS))
    }

    /// Attaches the programs to the pod's host veth and publishes the endpoint.
    pub fn add_endpoint(&self, _guard: &LoadedGuard, ep: &EndpointSpec<'_>) -> Result<(), Error> {
        let mut maps = bpf::Maps::open(&self.dir(pin_dirs::MAPS))?;
        let info = EndpointInfo {
            container_id: to_cbuf(ep.id.container_id.as_bytes()),
            ifname: to_cbuf(ep.id.ifname.as_bytes()),
            host_ifname: to_cbuf(ep.host_ifname.as_bytes()),
            netns_ino: ep.netns_ino,
            created_unix: now_unix(),
        };
        // Counters first, so the programs count from the first packet.
        maps.insert_interface(ep.host_ifindex, &info)?;
        bpf::attach(
            &self.dir(pin_dirs::PROGS),
            &self.dir(pin_dirs::LINKS),
            ep.host_ifname,
            ep.attach,
        )?;
        for ip in ep.ips {
            let mut flags = if ip.is_ipv6() {
                endpoint_flags::IPV6
            } else {
                0
            };
            if ep.xdp_ready {
                flags |= endpoint_flags::XDP_READY;
            }
            maps.insert_endpoint(
                ip_key(*ip),
                Endpoint {
                    ifindex: ep.host_ifindex,
                    flags,
                    pod_mac: ep.pod_mac,
                    host_mac: ep.host_mac,
                },
            )?;
        }
        Ok(())
    }

    /// Removes what [`Self::add_endpoint`] made. Best effort: it goes on past errors
    /// and returns the first. Nothing pinned yet means nothing to remove.
    pub fn remove_endpoint(
        &self,
        host_ifname: &str,
        host_ifindex: Option<u32>,
        id: &AttachmentId,
    ) -> Result<(), Error> {
        let mut first_err: Option<Error> = None;
        let links = self.dir(pin_dirs::LINKS);
        if let Err(e) = bpf::detach(&links, host_ifname) {
            first_err.get_or_insert(e);
        }
        let maps_dir = self.dir(pin_dirs::MAPS);
        if !self.holds_endpoints()? {
            return first_err.map_or(Ok(()), Err);
        }
        let mut maps = bpf::Maps::open(&maps_dir)?;
        // The interface may be known by its recorded index or, after a crash before
        // the record was complete, only by the owner entry.
        let mut ifindexes: Vec<u32> = host_ifindex.into_iter().collect();
        for (idx, info) in maps.interfaces() {
            let owner = info_owned_by(&info, id);
            if owner && !ifindexes.contains(&idx) {
                ifindexes.push(idx);
            }
        }
        let mut v4 = Vec::new();
        for (key, ep) in maps.endpoints() {
            if ifindexes.contains(&ep.ifindex) {
                v4.extend(key.as_v4());
                if let Err(e) = maps.remove_endpoint(&key) {
                    first_err.get_or_insert(e);
                }
            }
        }
        // The pod's masqueraded flows and hostPort mappings go with it.
        if let Err(e) = bpf::flush_nat(&maps_dir, &v4) {
            first_err.get_or_insert(e);
        }
        if let Err(e) = hostport::remove_of_pods(&maps_dir, &ifindexes) {
            first_err.get_or_insert(e);
        }
        if let Err(e) = hostport::flush_flows(&maps_dir, &v4) {
            first_err.get_or_insert(e);
        }
        for idx in ifindexes {
            if let Err(e) = bandwidth::remove(&maps_dir, idx) {
                first_err.get_or_insert(e);
            }
            if let Err(e) = maps.remove_interface(idx) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Publishes a pod's hostPort mappings (all or none; a conflict names the
    /// owner), after refreshing the node addresses wildcard mappings match.
    pub fn add_ports(
        &self,
        _guard: &LoadedGuard,
        node_addrs: &[[u8; 4]],
        entries: &[(PortKey, PortTarget)],
    ) -> Result<(), Error> {
        if entries.is_empty() {
            return Ok(());
        }
        let maps = self.dir(pin_dirs::MAPS);
        hostport::set_node_addrs(&maps, node_addrs)?;
        hostport::add(&maps, entries)
    }

    /// Sets (or, with `None`, removes) the bandwidth limits of the pod on host
    /// veth `ifindex`.
    pub fn set_bandwidth(
        &self,
        _guard: &LoadedGuard,
        ifindex: u32,
        bw: Option<&Bandwidth>,
    ) -> Result<(), Error> {
        let maps = self.dir(pin_dirs::MAPS);
        match bw {
            Some(b) => bandwidth::write(&maps, ifindex, b),
            None => bandwidth::remove(&maps, ifindex),
        }
    }

    /// CHECK: the pod's bandwidth limits are the configured ones.
    pub fn check_bandwidth(&self, ifindex: u32, bw: Option<&Bandwidth>) -> Result<(), Error> {
        bandwidth::check(&self.dir(pin_dirs::MAPS), ifindex, bw)
    }

    /// CHECK: the pod's hostPort mappings are in place.
    pub fn check_ports(&self, entries: &[(PortKey, PortTarget)]) -> Result<(), Error> {
        hostport::check(&self.dir(pin_dirs::MAPS), entries)
    }

    /// GC: mappings whose pod is not one of `live` (host veth ifindexes) go.
    pub fn remove_orphan_ports(&self, live: &[u32]) -> Result<usize, Error> {
        hostport::remove_orphans(&self.dir(pin_dirs::MAPS), live)
    }

    /// CHECK: programs attached to the host veth, endpoint entries in place.
    pub fn check_endpoint(&self, ep: &EndpointSpec<'_>) -> Result<(), Error> {
        if ep.attach == PodAttach::Tcx {
            bpf::check_tcx_attached(&self.dir(pin_dirs::LINKS), ep.host_ifname)?;
        }
        let maps = bpf::Maps::open(&self.dir(pin_dirs::MAPS))?;
        if !maps.has_counters(ep.host_ifindex) {
            return Err(Error::check(format!(
                "no counters for {} (ifindex {})",
                ep.host_ifname, ep.host_ifindex
            )));
        }
        for ip in ep.ips {
            match maps.endpoint(&ip_key(*ip)) {
                Some(e) if e.ifindex == ep.host_ifindex && e.pod_mac == ep.pod_mac => {}
                Some(e) => {
                    return Err(Error::check(format!(
                        "endpoint {ip} points at ifindex {} instead of {} ({})",
                        e.ifindex, ep.host_ifindex, ep.host_ifname
                    )))
                }
                None => {
                    return Err(Error::check(format!(
                        "endpoint {ip} missing from sl_endpoints"
                    )))
                }
            }
        }
        Ok(())
    }

    /// Kernel ids of the pinned pod programs: (name, ingress?, id). CHECK compares
    /// them with the cls_bpf filters on a host veth.
    pub fn pod_program_ids(&self) -> Result<Vec<(&'static str, bool, u32)>, Error> {
        bpf::pod_program_ids(&self.dir(pin_dirs::PROGS))
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
            && self
                .dir(pin_dirs::MAPS)
                .join(sluice_common::map_names::ENDPOINTS)
                .exists())
    }

    /// Owners of the endpoint entries: (host ifindex, container id, ifname, host ifname).
    pub fn endpoint_owners(&self) -> Result<Vec<(u32, AttachmentId, String)>, Error> {
        let maps_dir = self.dir(pin_dirs::MAPS);
        if !self.holds_endpoints()? {
            return Ok(Vec::new());
        }
        let maps = bpf::Maps::open(&maps_dir)?;
        Ok(maps
            .interfaces()
            .into_iter()
            .map(|(idx, info)| {
                let s =
                    |b: &[u8]| String::from_utf8_lossy(sluice_common::from_cbuf(b)).into_owned();
                (
                    idx,
                    AttachmentId {
                        container_id: s(&info.container_id),
                        ifname: s(&info.ifname),
                    },
                    s(&info.host_ifname),
                )
            })
            .collect())
    }

    /// Whether the embedded object can be loaded at all (STATUS).
    pub fn has_object(&self) -> bool {
        bpf::has_object()
    }

    pub fn pin_root(&self) -> &Path {
        &self.pin_root
    }
}

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
