//! Every attachment of the datapath's programs, and its replacement by an
//! upgrade: the pod programs on host veths (`cls_bpf` filters through netlink,
//! or pinned tcx links), the uplink's tc programs and XDP program, the NAT
//! sweeper's perf event and the hostPort socket hooks (pinned links).
//!
//! Link pins under `links/`: `<host veth>-<program>` (pods, tcx),
//! `uplink<ifindex>-<program>`, `cgroup-<program>`, `nat_sweep`. bpffs refuses
//! names with a dot (EPERM from `bpf_lookup`, kernel/bpf/inode.c), so none has
//! one.
use std::{
    fs,
    os::fd::{AsFd, AsRawFd},
    path::{Path, PathBuf},
};

use aya::programs::{
    links::{FdLink, LinkType, PinnedLink},
    perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    tc::{qdisc_add_clsact, NlOptions, SchedClassifierLink, TcAttachOptions, TcError, TcHandle},
    xdp::XdpLink,
    CgroupAttachMode, CgroupSockAddr, Link, PerfEvent, SchedClassifier, TcAttachType, Xdp, XdpMode,
};
use aya_obj::programs::{CgroupSockAddrAttachType, XdpAttachType};
use sluice_common::{
    config_flags, prog_names,
    programs::{self, ProgKind, SockHook},
};
use sluice_maps::PinRoot;

use super::{bpffs::unpin, pod_block, sys::NetkitHook};
use crate::{
    cni::config::{PodAttach, XdpMode as XdpConfig},
    error::Error,
};

/// Prefix of the uplink's link pins (`uplink<ifindex>-<program>`); pod links
/// start with the host veth name (`sl...`), so the two never mix.
pub(super) const UPLINK_LINK_PREFIX: &str = "uplink";
/// Prefix of the socket hooks' link pins (`cgroup-<program>`).
pub(super) const HOOK_LINK_PREFIX: &str = "cgroup-";
/// Pin of the NAT sweeper's perf-event link.
pub(super) const SWEEP_LINK: &str = "nat_sweep";
/// How often the sweeper runs (CPU clock of CPU 0, which ticks while idle too).
const SWEEP_PERIOD_NS: u64 = 1_000_000_000;

/// Priority and handle of Sluice's `cls_bpf` filters on a pod's host veth: fixed,
/// so an upgrade can replace them in place and DEL can find them.
const FILTER_PRIORITY: u16 = 1;
const FILTER_HANDLE: TcHandle = TcHandle::new(0, 1);

fn dp_err(op: impl Into<String>, e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Error {
    Error::datapath(op, e)
}

/// The tc hook of a pod or uplink program.
pub(super) fn tc_hook(kind: ProgKind) -> TcAttachType {
    match kind {
        ProgKind::PodEgress | ProgKind::PodDevice | ProgKind::UplinkEgress => TcAttachType::Egress,
        _ => TcAttachType::Ingress,
    }
}

fn sock_attach_type(h: SockHook) -> CgroupSockAddrAttachType {
    match h {
        SockHook::Connect4 => CgroupSockAddrAttachType::Connect4,
        SockHook::SendMsg4 => CgroupSockAddrAttachType::UDPSendMsg4,
        SockHook::RecvMsg4 => CgroupSockAddrAttachType::UDPRecvMsg4,
        SockHook::GetPeerName4 => CgroupSockAddrAttachType::GetPeerName4,
        SockHook::Connect6 => CgroupSockAddrAttachType::Connect6,
        SockHook::SendMsg6 => CgroupSockAddrAttachType::UDPSendMsg6,
        SockHook::RecvMsg6 => CgroupSockAddrAttachType::UDPRecvMsg6,
        SockHook::GetPeerName6 => CgroupSockAddrAttachType::GetPeerName6,
    }
}

fn pod_link_path(root: &PinRoot, host_ifname: &str, prog: &str) -> PathBuf {
    root.links_dir().join(format!("{host_ifname}-{prog}"))
}

fn uplink_link_path(root: &PinRoot, ifindex: u32, prog: &str) -> PathBuf {
    root.links_dir()
        .join(format!("{UPLINK_LINK_PREFIX}{ifindex}-{prog}"))
}

fn hook_link_path(root: &PinRoot, prog: &str) -> PathBuf {
    root.links_dir().join(format!("{HOOK_LINK_PREFIX}{prog}"))
}

fn open_tc(root: &PinRoot, name: &str) -> Result<SchedClassifier, Error> {
    SchedClassifier::from_pin(root.progs_dir().join(name))
        .map_err(|e| dp_err(format!("open pinned program {name}"), e))
}

fn pin_link(
    link: impl TryInto<FdLink, Error = impl std::error::Error + Send + Sync + 'static>,
    path: &Path,
) -> Result<(), Error> {
    let fd: FdLink = link
        .try_into()
        .map_err(|e| dp_err(format!("link for {} is not a bpf_link", path.display()), e))?;
    fd.pin(path)
        .map(drop)
        .map_err(|e| dp_err(format!("pin {}", path.display()), e))
}

/// Detaches the link pinned at `path` now and removes the pin. Removing a pin
/// alone drops the link's reference only after an RCU grace period (bpffs frees
/// its inodes with `call_rcu`), so a new attachment made right after would find the
/// old one still there (tcx: EEXIST, XDP: EBUSY).
pub(super) fn detach_pinned(path: &Path) -> Result<(), Error> {
    if !path.exists() {
        return Ok(());
    }
    if let Err(e) = super::sys::link_detach(path) {
        eprintln!(
            "sluice: BPF_LINK_DETACH of {} failed ({e}); the pin's removal releases it",
            path.display()
        );
    }
    Ok(unpin(path)?)
}

// --- pods ---------------------------------------------------------------------

/// Attaches the pod programs to `host_ifname` (link `host_ifindex`, in this
/// thread's namespace, the node's) so that the attachment outlives this process:
/// - `Tc`: a clsact qdisc joined to the node's shared pod blocks, whose
///   `cls_bpf` filters run the pinned programs ([`super::pod_block`]). The
///   qdisc and blocks own them; no grace period is waited for.
/// - `Tcx`: tcx links, pinned. Each first tcx attachment of a device and direction
///   waits for an RCU grace period (`tcx_entry_sync`), ~10 ms here.
pub(super) fn attach_pod(
    root: &PinRoot,
    host_ifname: &str,
    host_ifindex: u32,
    mode: PodAttach,
) -> Result<(), Error> {
    if mode == PodAttach::Tc {
        return attach_pod_block(root, host_ifname, host_ifindex);
    }
    for p in programs::POD {
        let mut prog = open_tc(root, p.name)?;
        attach_tcx_pinned(
            &mut prog,
            p.name,
            host_ifname,
            tc_hook(p.kind),
            &pod_link_path(root, host_ifname, p.name),
        )?;
    }
    Ok(())
}

/// The `Tc` case of [`attach_pod`]. A veth that has a clsact qdisc already (a
/// pod of a lost datapath being re-attached; its qdisc may hold filters of its
/// own, as Sluice attached them before the shared blocks, or other blocks)
/// gets a new one: its traffic takes the kernel's routes for the moment
/// between.
fn attach_pod_block(root: &PinRoot, host_ifname: &str, host_ifindex: u32) -> Result<(), Error> {
    let blocks = pod_block::Blocks::of(root);
    let mut tc = pod_block::Tc::open().map_err(|e| dp_err("open a netlink socket", e))?;
    let qdisc_err = |e| {
        dp_err(
            format!("add a clsact qdisc on the pod blocks to {host_ifname}"),
            e,
        )
    };
    if !tc.add_clsact(host_ifindex, blocks).map_err(qdisc_err)? {
        tc.del_clsact(host_ifindex)
            .map_err(|e| dp_err(format!("delete the clsact qdisc of {host_ifname}"), e))?;
        if !tc.add_clsact(host_ifindex, blocks).map_err(qdisc_err)? {
            return Err(dp_err(
                format!("add a clsact qdisc on the pod blocks to {host_ifname}"),
                "it has an ingress qdisc that is not Sluice's (a chained plugin's? \
                 the reference bandwidth plugin needs podAttach: tcx)",
            ));
        }
    }
    // Set on every ADD, not only the first of a block: the filters of a block a
    // lost datapath left behind run that datapath's programs.
    for p in programs::POD {
        let prog = open_tc(root, p.name)?;
        let fd = prog
            .fd()
            .map_err(|e| dp_err(format!("program {}", p.name), e))?;
        let block = blocks.of_hook(tc_hook(p.kind) == TcAttachType::Ingress);
        tc.set_filter(block, fd.as_fd().as_raw_fd(), p.name, true)
            .map_err(|e| dp_err(format!("attach {} to tc block {block:#x}", p.name), e))?;
    }
    Ok(())
}

/// `prog` on `ifname`'s `hook` as a tcx link pinned at `lp` (a pin left there
/// by a crashed ADD of the same attachment is detached first).
fn attach_tcx_pinned(
    prog: &mut SchedClassifier,
    name: &str,
    ifname: &str,
    hook: TcAttachType,
    lp: &Path,
) -> Result<(), Error> {
    detach_pinned(lp)?;
    let id = prog
        .attach_with_options(
            ifname,
            hook,
            TcAttachOptions::TcxOrder(aya::programs::LinkOrder::default()),
        )
        .map_err(|e| dp_err(format!("attach {name} to {ifname}"), e))?;
    let link = prog
        .take_link(id)
        .map_err(|e| dp_err(format!("take link of {name} on {ifname}"), e))?;
    pin_link(link, lp)
}

/// The programs of a netkit pod on its host device `host_ifname` (`ifindex`):
/// `from_netkit_pod` on the peer hook, `to_netkit_pod` on the primary's, as pinned
/// netkit links `<host device>-<program>` (a pin left by a crashed ADD of the
/// same attachment is detached first).
pub(super) fn attach_pod_netkit(
    root: &PinRoot,
    host_ifname: &str,
    ifindex: u32,
) -> Result<(), Error> {
    for p in programs::POD_NETKIT {
        let prog = open_tc(root, p.name)?;
        let hook = if p.kind == ProgKind::PodNetkit {
            NetkitHook::Peer
        } else {
            NetkitHook::Primary
        };
        let lp = pod_link_path(root, host_ifname, p.name);
        detach_pinned(&lp)?;
        let prog_fd = prog
            .fd()
            .map_err(|e| dp_err(format!("program {}", p.name), e))?;
        let link = super::sys::netkit_link_create(prog_fd.as_fd().as_raw_fd(), ifindex, hook)
            .map_err(|e| dp_err(format!("attach {} to netkit {host_ifname}", p.name), e))?;
        super::sys::obj_pin(&link, &lp)?;
    }
    Ok(())
}

/// Whether the netkit pod programs are attached to `host_ifname`: each pinned
/// link is there and runs the pinned program of its name.
pub(super) fn check_pod_netkit(root: &PinRoot, host_ifname: &str) -> Result<(), Error> {
    for p in programs::POD_NETKIT {
        let have = pinned_link_program(&pod_link_path(root, host_ifname, p.name))?;
        let want = sluice_maps::programs::id(root, p.name)?;
        if have != want {
            return Err(Error::check(format!(
                "{} on netkit {host_ifname} runs program id {have}, not the pinned one ({want})",
                p.name
            )));
        }
    }
    Ok(())
}

/// The program id of the link pinned at `lp` (CHECK: a missing or unreadable
/// pin is a failed check).
fn pinned_link_program(lp: &Path) -> Result<u32, Error> {
    let pinned = PinnedLink::from_pin(lp)
        .map_err(|e| Error::check(format!("pinned link {} is missing: {e}", lp.display())))?;
    FdLink::from(pinned)
        .info()
        .map(|i| i.program_id())
        .map_err(|e| Error::check(format!("link {} unreadable: {e}", lp.display())))
}

fn add_clsact(ifname: &str) -> Result<(), Error> {
    match qdisc_add_clsact(ifname) {
        Ok(()) => Ok(()),
        Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
        Err(e) => Err(dp_err(format!("add a clsact qdisc to {ifname}"), e)),
    }
}

/// A `cls_bpf` filter of `prog` on `ifname`'s `hook` at Sluice's priority and
/// handle; one already there (the programs of a datapath whose pins were lost)
/// is pointed at `prog` in place (aya creates filters with `NLM_F_EXCL`). The
/// filter stays when this process exits.
fn attach_filter(
    prog: &mut SchedClassifier,
    name: &str,
    ifname: &str,
    hook: TcAttachType,
) -> Result<(), Error> {
    let opts = TcAttachOptions::Netlink(NlOptions {
        priority: FILTER_PRIORITY,
        handle: FILTER_HANDLE,
        classid: None,
    });
    let id = match prog.attach_with_options(ifname, hook, opts) {
        Ok(id) => id,
        Err(aya::programs::ProgramError::TcError(TcError::NetlinkError(e)))
            if e.raw_os_error() == Some(libc::EEXIST) =>
        {
            let existing =
                SchedClassifierLink::attached(ifname, hook, FILTER_PRIORITY, FILTER_HANDLE, None)
                    .map_err(|e| dp_err(format!("find {name} on {ifname}"), e))?;
            prog.attach_to_link(existing)
                .map_err(|e| dp_err(format!("replace {name} on {ifname}"), e))?
        }
        Err(e) => return Err(dp_err(format!("attach {name} to {ifname}"), e)),
    };
    let link = prog
        .take_link(id)
        .map_err(|e| dp_err(format!("take link of {name} on {ifname}"), e))?;
    // Dropping a netlink link would delete the filter; it must stay.
    std::mem::forget(link);
    Ok(())
}

/// Attaches `pod_edt` to the tc egress of the pod's own interface `pod_ifname`
/// inside its namespace `ns` (aya resolves the name and talks netlink in the
/// calling thread's namespace): a pinned tcx link `<host veth>-pod_edt`, or a
/// `cls_bpf` filter on a clsact qdisc, which goes with the device.
pub(super) fn attach_pod_device(
    root: &PinRoot,
    ns: &crate::netns::Netns,
    host_ifname: &str,
    pod_ifname: &str,
    mode: PodAttach,
) -> Result<(), Error> {
    let name = programs::POD_DEVICE.name;
    let mut prog = open_tc(root, name)?;
    let hook = tc_hook(programs::POD_DEVICE.kind);
    let lp = pod_link_path(root, host_ifname, name);
    ns.run(|| match mode {
        PodAttach::Tc => {
            add_clsact(pod_ifname)?;
            attach_filter(&mut prog, name, pod_ifname, hook)
        }
        PodAttach::Tcx => attach_tcx_pinned(&mut prog, name, pod_ifname, hook, &lp),
    })?
}

/// Whether `pod_edt` is attached to the egress of the pod's `pod_ifname` (in
/// `ns`) through its pinned tcx link (the `cls_bpf` case is checked through the
/// pod's netlink, as the host veth's filters are).
pub(super) fn check_pod_device_tcx(
    root: &PinRoot,
    ns: &crate::netns::Netns,
    host_ifname: &str,
    pod_ifname: &str,
) -> Result<(), Error> {
    let name = programs::POD_DEVICE.name;
    let lp = pod_link_path(root, host_ifname, name);
    let pinned = PinnedLink::from_pin(&lp)
        .map_err(|e| Error::check(format!("pinned link {} is missing: {e}", lp.display())))?;
    let want = FdLink::from(pinned)
        .info()
        .map_err(|e| Error::check(format!("link {} unreadable: {e}", lp.display())))?
        .program_id();
    let hook = tc_hook(programs::POD_DEVICE.kind);
    let attached: Vec<u32> = ns.run(|| {
        SchedClassifier::query_tcx(pod_ifname, hook)
            .map(|(_, progs)| progs.iter().map(aya::programs::ProgramInfo::id).collect())
            .map_err(|e| Error::check(format!("cannot query tcx programs of {pod_ifname}: {e}")))
    })??;
    if attached.contains(&want) {
        Ok(())
    } else {
        Err(Error::check(format!(
            "{name} (program id {want}) is not attached to the egress of the pod's {pod_ifname} (found {attached:?})"
        )))
    }
}

/// Removes the pod programs from `host_ifname`, whichever way they were attached.
/// Missing pins, filters or interface are fine (DEL deletes the veth anyway).
pub(super) fn detach_pod(root: &PinRoot, host_ifname: &str) -> Result<(), Error> {
    let mut errors = crate::error::Errors::new();
    // The pod device's program goes with the pod's eth0; only its pin stays.
    errors.note(unpin(&pod_link_path(
        root,
        host_ifname,
        programs::POD_DEVICE.name,
    )));
    // netkit links go with the device; only their pins stay.
    for p in programs::POD_NETKIT {
        errors.note(unpin(&pod_link_path(root, host_ifname, p.name)));
    }
    let mut tcx = false;
    for p in programs::POD {
        let lp = pod_link_path(root, host_ifname, p.name);
        tcx |= lp.exists();
        errors.note(unpin(&lp));
    }
    // `Tc`: the clsact qdisc goes, and with it the veth's hold on the shared
    // blocks (or, attached before them, its own filters). Not in tcx mode: a
    // qdisc there is a chained plugin's.
    if !tcx {
        if let Some(ifindex) = ifindex_of(host_ifname) {
            let gone = pod_block::Tc::open().and_then(|mut tc| tc.del_clsact(ifindex));
            errors.note(
                gone.map(drop)
                    .map_err(|e| dp_err(format!("delete the clsact qdisc of {host_ifname}"), e)),
            );
        }
    }
    errors.finish()
}

/// Kernel ids of the pinned pod programs: (name, ingress?, id).
pub(super) fn pod_program_ids(root: &PinRoot) -> Result<Vec<(&'static str, bool, u32)>, Error> {
    programs::POD
        .iter()
        .map(|p| {
            let id = sluice_maps::programs::id(root, p.name)?;
            Ok((p.name, p.kind == ProgKind::PodIngress, id))
        })
        .collect()
}

/// Whether the pod programs are attached to `host_ifname` through pinned tcx links
/// whose programs are attached to it (tcx query).
pub(super) fn check_pod_tcx(root: &PinRoot, host_ifname: &str) -> Result<(), Error> {
    for p in programs::POD {
        let program_id = pinned_link_program(&pod_link_path(root, host_ifname, p.name))?;
        let (_, progs) = SchedClassifier::query_tcx(host_ifname, tc_hook(p.kind)).map_err(|e| {
            Error::check(format!("cannot query tcx programs of {host_ifname}: {e}"))
        })?;
        if !progs.iter().any(|q| q.id() == program_id) {
            return Err(Error::check(format!(
                "{} (program id {program_id}) is not attached to {host_ifname}",
                p.name
            )));
        }
    }
    Ok(())
}

// --- the uplink -----------------------------------------------------------------

/// How the uplink's XDP program ended up attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpAttached {
    Native,
    Generic,
    Off,
}

/// Whether the uplink's tc programs are attached to interface `ifindex` as
/// pinned tcx links (their pins exist).
pub(super) fn uplink_attached(root: &PinRoot, ifindex: u32) -> bool {
    programs::UPLINK_TC
        .iter()
        .all(|p| uplink_link_path(root, ifindex, p.name).exists())
}

/// Kernel ids of the pinned uplink tc programs: (name, ingress?, id).
pub(super) fn uplink_program_ids(root: &PinRoot) -> Result<Vec<(&'static str, bool, u32)>, Error> {
    programs::UPLINK_TC
        .iter()
        .map(|p| {
            let id = sluice_maps::programs::id(root, p.name)?;
            Ok((p.name, p.kind == ProgKind::UplinkIngress, id))
        })
        .collect()
}

/// How the uplink ended up attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct UplinkAttached {
    pub xdp: XdpAttached,
    /// The tc programs are `cls_bpf` filters (no tcx), not pinned tcx links.
    pub filters: bool,
}

/// Attaches `uplink_in` (tc ingress), `uplink_out` (tc egress) and, unless `xdp`
/// is off, `uplink_xdp` to the uplink. The tc programs go in as pinned tcx links,
/// or as `cls_bpf` filters on a clsact qdisc on a kernel without tcx (before 6.6).
/// Native XDP falls back to generic when the driver refuses it; an XDP failure
/// leaves tc alone to do the job.
pub(super) fn attach_uplink(
    root: &PinRoot,
    ifname: &str,
    ifindex: u32,
    xdp: XdpConfig,
) -> Result<UplinkAttached, Error> {
    let filters = !super::features::get().tcx;
    if filters {
        add_clsact(ifname)?;
    }
    for p in programs::UPLINK_TC {
        let mut tc = open_tc(root, p.name)?;
        let hook = tc_hook(p.kind);
        if filters {
            attach_filter(&mut tc, p.name, ifname, hook)?;
            continue;
        }
        let lp = uplink_link_path(root, ifindex, p.name);
        // Already attached to this interface (the pin name carries the ifindex):
        // keep it; upgrades replace its program in place.
        if lp.exists() {
            continue;
        }
        let id = tc
            .attach_with_options(
                ifname,
                hook,
                TcAttachOptions::TcxOrder(aya::programs::LinkOrder::default()),
            )
            .map_err(|e| dp_err(format!("attach {} to {ifname}", p.name), e))?;
        pin_link(
            tc.take_link(id)
                .map_err(|e| dp_err(format!("take {} link", p.name), e))?,
            &lp,
        )?;
    }
    Ok(UplinkAttached {
        xdp: attach_uplink_xdp(root, ifname, ifindex, xdp)?,
        filters,
    })
}

/// Removes the uplink's `cls_bpf` filters (kernels without tcx); none is fine.
pub(super) fn detach_uplink_filters(ifname: &str) {
    for p in programs::UPLINK_TC {
        if let Ok(link) = SchedClassifierLink::attached(
            ifname,
            tc_hook(p.kind),
            FILTER_PRIORITY,
            FILTER_HANDLE,
            None,
        ) {
            let _ = Link::detach(link);
        }
    }
}

/// The index of interface `ifname` in this namespace, if it exists.
fn ifindex_of(ifname: &str) -> Option<u32> {
    let c = std::ffi::CString::new(ifname).ok()?;
    // SAFETY: a valid NUL-terminated name.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i)
}

/// The name of interface `ifindex` in this namespace.
pub(super) fn ifname_of(ifindex: u32) -> Option<String> {
    let mut buf = [0u8; libc::IF_NAMESIZE];
    // SAFETY: a buffer of IF_NAMESIZE bytes, as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr().cast()) };
    if p.is_null() {
        return None;
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8(buf[..end].to_vec()).ok()
}

/// The XDP half of [`attach_uplink`].
fn attach_uplink_xdp(
    root: &PinRoot,
    ifname: &str,
    ifindex: u32,
    xdp: XdpConfig,
) -> Result<XdpAttached, Error> {
    // Any XDP link of an earlier mode goes first (also when XDP is now off).
    let lp = uplink_link_path(root, ifindex, prog_names::UPLINK_XDP);
    detach_pinned(&lp)?;
    let mode = match xdp {
        XdpConfig::Native | XdpConfig::Auto => XdpMode::Driver,
        XdpConfig::Generic => XdpMode::Skb,
        XdpConfig::Off => return Ok(XdpAttached::Off),
    };
    let mut prog = Xdp::from_pin(
        root.progs_dir().join(prog_names::UPLINK_XDP),
        XdpAttachType::Interface,
    )
    .map_err(|e| dp_err("open pinned program uplink_xdp", e))?;
    let mut tries = vec![mode];
    if mode == XdpMode::Driver {
        tries.push(XdpMode::Skb);
    }
    for m in tries {
        match prog.attach(ifname, m) {
            Ok(id) => {
                let link = prog
                    .take_link(id)
                    .map_err(|e| dp_err("take uplink_xdp link", e))?;
                pin_link(link, &lp)?;
                return Ok(if m == XdpMode::Skb {
                    XdpAttached::Generic
                } else {
                    XdpAttached::Native
                });
            }
            Err(e) => eprintln!("sluice: XDP ({m:?} mode) on {ifname} failed: {e}"),
        }
    }
    eprintln!("sluice: no XDP on {ifname}; the tc program handles uplink traffic alone");
    Ok(XdpAttached::Off)
}

// --- the NAT sweeper --------------------------------------------------------------

/// Whether the sweeper's link is pinned.
pub(super) fn sweeper_attached(root: &PinRoot) -> bool {
    root.links_dir().join(SWEEP_LINK).exists()
}

/// Fires `prog` once a second on CPU 0 through a perf event whose link is pinned:
/// the sweep runs with no process of ours alive.
pub(super) fn attach_sweeper(root: &PinRoot, prog: &mut PerfEvent) -> Result<(), Error> {
    let lp = root.links_dir().join(SWEEP_LINK);
    unpin(&lp)?;
    let id = prog
        .attach(
            PerfEventConfig::Software(SoftwareEvent::CpuClock),
            PerfEventScope::AllProcessesOneCpu { cpu: 0 },
            SamplePolicy::Period(SWEEP_PERIOD_NS),
            false,
        )
        .map_err(|e| dp_err("attach the NAT sweeper to a CPU clock perf event", e))?;
    let link = prog
        .take_link(id)
        .map_err(|e| dp_err("take the NAT sweeper link", e))?;
    pin_link(link, &lp)
}

/// Attaches the pinned sweeper program (after an upgrade from a datapath
/// without one, or when its link was removed).
pub(super) fn ensure_sweeper(root: &PinRoot) -> Result<(), Error> {
    let mut prog = PerfEvent::from_pin(root.progs_dir().join(prog_names::NAT_SWEEP))
        .map_err(|e| dp_err("open pinned program nat_sweep", e))?;
    attach_sweeper(root, &mut prog)
}

// --- the hostPort socket hooks ---------------------------------------------------------

/// Whether the socket hooks are attached (their link pins exist).
pub(super) fn hooks_attached(root: &PinRoot) -> bool {
    programs::SOCK_HOOKS
        .iter()
        .all(|p| hook_link_path(root, p.name).exists())
}

/// Attaches the socket hooks to the cgroup v2 directory `cgroup` (opened) and
/// pins their links, so they outlive the plugin. Attached ones stay.
pub(super) fn attach_hooks(root: &PinRoot, cgroup: &fs::File, shown: &Path) -> Result<(), Error> {
    for p in programs::SOCK_HOOKS {
        let ProgKind::SockAddr(hook) = p.kind else {
            continue;
        };
        let lp = hook_link_path(root, p.name);
        if lp.exists() {
            continue;
        }
        let mut prog =
            CgroupSockAddr::from_pin(root.progs_dir().join(p.name), sock_attach_type(hook))
                .map_err(|e| dp_err(format!("open pinned program {}", p.name), e))?;
        let id = prog
            .attach(cgroup.as_fd(), CgroupAttachMode::Single)
            .map_err(|e| {
                dp_err(
                    format!("attach {} to cgroup {}", p.name, shown.display()),
                    e,
                )
            })?;
        let link = prog
            .take_link(id)
            .map_err(|e| dp_err(format!("take {} link", p.name), e))?;
        pin_link(link, &lp)?;
    }
    Ok(())
}

/// The node namespace's cookie on a kernel without `SO_NETNS_COOKIE` (before
/// 5.14): `hp_learn4` is attached for a moment to this process's own cgroup
/// (v2), a UDP socket connects to `LEARN_ADDR` (no packet is sent), and the
/// program records the socket's netns cookie under the socket's cookie
/// (`SO_COOKIE`, 4.12). The program touches no other connect.
pub(super) fn learn_netns_cookie(root: &PinRoot) -> Result<u64, Error> {
    let op = "learn the node namespace's cookie (no SO_NETNS_COOKIE before Linux 5.14)";
    let own = own_cgroup2().ok_or_else(|| dp_err(op, "this process is in no cgroup v2"))?;
    let dir =
        fs::File::open(&own).map_err(|e| dp_err(format!("{op}: open {}", own.display()), e))?;
    let mut prog = CgroupSockAddr::from_pin(
        root.progs_dir().join(prog_names::HP_LEARN4),
        CgroupSockAddrAttachType::Connect4,
    )
    .map_err(|e| dp_err(op, e))?;
    let id = prog
        // A bpf_link: other programs on the cgroup stay (links are multi-attach).
        .attach(dir.as_fd(), CgroupAttachMode::Single)
        .map_err(|e| dp_err(format!("{op}: attach to {}", own.display()), e))?;
    let learned = (|| -> std::io::Result<u64> {
        let (ip, port) = programs::LEARN_ADDR;
        let s = std::net::UdpSocket::bind("127.0.0.1:0")?;
        s.connect((std::net::Ipv4Addr::from(ip), port))?;
        socket_cookie(&s)
    })();
    // Detached whatever happened (dropping the program would detach it too).
    let _ = prog.detach(id);
    let sock = learned.map_err(|e| dp_err(op, e))?;
    sluice_maps::hostport::take_learned_cookie(root, sock)?
        .ok_or_else(|| dp_err(op, "hp_learn4 recorded nothing"))
}

/// `SO_COOKIE` of a socket.
fn socket_cookie(s: &std::net::UdpSocket) -> std::io::Result<u64> {
    const SO_COOKIE: libc::c_int = 57;
    sluice_common::user::sockopt_u64(s, SO_COOKIE)
}

/// This process's cgroup v2 directory (`0::<path>` of /proc/self/cgroup under
/// the v2 mount).
fn own_cgroup2() -> Option<PathBuf> {
    let mount = sluice_common::user::cgroup2_mount()?;
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(mount.join(rel.trim_start_matches('/')))
}

// --- upgrades: pointing attachments at new programs ------------------------------------

/// Pinned links of program `prog` (`links/*-<prog>`).
pub(super) fn link_pins_of(root: &PinRoot, prog: &str) -> Result<Vec<PathBuf>, Error> {
    let suffix = format!("-{prog}");
    Ok(root
        .pins(sluice_common::pin_dirs::LINKS)?
        .into_iter()
        .filter(|n| n.ends_with(&suffix))
        .map(|n| root.links_dir().join(n))
        .collect())
}

/// Points the pinned tcx or netkit link at `prog` without detaching it
/// (`bpf_link_update`). A link whose interface is gone cannot be updated; its
/// pin is dropped.
pub(super) fn replace_tc_link(prog: &mut SchedClassifier, link_path: &Path) -> Result<(), Error> {
    let pinned = PinnedLink::from_pin(link_path)
        .map_err(|e| dp_err(format!("open pinned link {}", link_path.display()), e))?;
    let fd = FdLink::from(pinned);
    let kind = fd.info().ok().and_then(|i| i.link_type().ok());
    if kind == Some(LinkType::Netkit) {
        // aya 0.14 has no netkit link type of its own: the raw update.
        let prog_fd = prog
            .fd()
            .map_err(|e| dp_err(format!("program for {}", link_path.display()), e))?;
        return match super::sys::link_update(link_path, prog_fd.as_fd().as_raw_fd()) {
            Ok(()) => Ok(()),
            Err(e) => drop_dead_link(link_path, &e),
        };
    }
    let link: SchedClassifierLink = fd
        .try_into()
        .map_err(|e| dp_err(format!("use pinned link {}", link_path.display()), e))?;
    match prog.attach_to_link(link) {
        // The pin keeps the link alive; taking it out of `prog` keeps the program's
        // drop from touching it.
        Ok(id) => prog
            .take_link(id)
            .map(drop)
            .map_err(|e| dp_err(format!("keep link {}", link_path.display()), e)),
        Err(e) => drop_dead_link(link_path, &e),
    }
}

/// The same for an XDP link.
pub(super) fn replace_xdp_link(prog: &mut Xdp, link_path: &Path) -> Result<(), Error> {
    let pinned = PinnedLink::from_pin(link_path)
        .map_err(|e| dp_err(format!("open pinned link {}", link_path.display()), e))?;
    let link: XdpLink = FdLink::from(pinned)
        .try_into()
        .map_err(|e| dp_err(format!("use pinned link {}", link_path.display()), e))?;
    match prog.attach_to_link(link) {
        Ok(id) => prog
            .take_link(id)
            .map(drop)
            .map_err(|e| dp_err(format!("keep link {}", link_path.display()), e)),
        Err(e) => drop_dead_link(link_path, &e),
    }
}

/// The same for a cgroup link, through `BPF_LINK_UPDATE` (aya has no update for
/// cgroup links).
pub(super) fn replace_cgroup_link(prog: &CgroupSockAddr, link_path: &Path) -> Result<(), Error> {
    use std::os::fd::AsRawFd;
    let fd = prog
        .fd()
        .map_err(|e| dp_err("fd of a socket hook", e))?
        .as_fd()
        .as_raw_fd();
    match super::sys::link_update(link_path, fd) {
        Ok(()) => Ok(()),
        Err(e) => drop_dead_link(link_path, &e),
    }
}

/// Points Sluice's `cls_bpf` filter on `host_ifname` at `prog` in place (netlink
/// replace of the same priority and handle: no packet sees no filter). A veth
/// without a filter of its own (tcx mode, on the shared blocks, or gone) is
/// skipped.
pub(super) fn replace_filter(prog: &mut SchedClassifier, host_ifname: &str, hook: TcAttachType) {
    let Ok(link) =
        SchedClassifierLink::attached(host_ifname, hook, FILTER_PRIORITY, FILTER_HANDLE, None)
    else {
        return;
    };
    if let Ok(id) = prog.attach_to_link(link) {
        if let Ok(l) = prog.take_link(id) {
            std::mem::forget(l);
        }
    }
}

/// Points the pod filter of the shared block of `hook` at `prog` in place
/// (every `Tc` pod of the node at once). No block (no `Tc` pod now) is fine.
pub(super) fn replace_block_filter(
    root: &PinRoot,
    prog: &SchedClassifier,
    name: &str,
    hook: TcAttachType,
) -> Result<(), Error> {
    let block = pod_block::Blocks::of(root).of_hook(hook == TcAttachType::Ingress);
    let fd = prog
        .fd()
        .map_err(|e| dp_err(format!("program {name}"), e))?;
    pod_block::Tc::open()
        .and_then(|mut tc| tc.set_filter(block, fd.as_fd().as_raw_fd(), name, false))
        .map(drop)
        .map_err(|e| dp_err(format!("replace {name} on tc block {block:#x}"), e))
}

/// A link that cannot be updated (ENOLINK: its interface went away) is dropped.
fn drop_dead_link(link_path: &Path, e: &dyn std::fmt::Display) -> Result<(), Error> {
    eprintln!(
        "sluice: dropping pinned link {} that cannot be updated: {e}",
        link_path.display()
    );
    Ok(unpin(link_path)?)
}

// --- everything ---------------------------------------------------------------------

/// Takes every program of the datapath off the kernel's hooks: the pods' tc
/// programs (`pod_ifnames`) and every pinned link (uplink tc and XDP, hostPort
/// socket hooks, NAT sweeper). Maps and programs stay pinned. Returns what was
/// detached.
pub(super) fn detach_all(root: &PinRoot, pod_ifnames: &[String]) -> Result<Vec<String>, Error> {
    let mut gone = Vec::new();
    let present: Vec<&String> = pod_ifnames
        .iter()
        // (Not /sys/class/net: sysfs shows the namespace of whoever mounted it.)
        .filter(|n| ifindex_of(n).is_some())
        .collect();
    // Host veths live in the node's namespace: from anywhere else nothing
    // would be found, and nothing must be claimed.
    if present.is_empty() && !pod_ifnames.is_empty() {
        return Err(dp_err(
            "detach the pod programs",
            format!(
                "none of the pod interfaces ({}) is in this network namespace; run it in the node's",
                pod_ifnames.join(", ")
            ),
        ));
    }
    for ifname in pod_ifnames {
        if present.contains(&ifname) {
            detach_pod(root, ifname)?;
            gone.push(format!("pod interface {ifname}"));
        } else {
            gone.push(format!("pod interface {ifname}: not found (skipped)"));
        }
    }
    for name in root.pins(sluice_common::pin_dirs::LINKS)? {
        detach_pinned(&root.links_dir().join(&name))?;
        gone.push(format!("link {name}"));
    }
    // The uplink's filters (kernels without tcx), and the record of them, so
    // that the next ADD attaches the uplink again.
    if let Ok(mut cfg) = sluice_maps::node::config(root) {
        if cfg.flags & config_flags::UPLINK_TC_FILTERS != 0 {
            if let Some(ifname) = ifname_of(cfg.uplink_ifindex) {
                detach_uplink_filters(&ifname);
                gone.push(format!("uplink {ifname} tc filters"));
            }
            cfg.flags &= !config_flags::UPLINK_TC_FILTERS;
            cfg.uplink_ifindex = 0;
            sluice_maps::node::write_config(root, cfg)?;
        }
    }
    Ok(gone)
}
