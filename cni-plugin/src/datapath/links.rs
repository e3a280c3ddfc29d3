//! Every attachment of the datapath's programs, and its replacement by an
//! upgrade: the pod programs on host veths (`cls_bpf` filters through netlink,
//! or pinned tcx links), the uplink's tc programs and XDP program, the NAT
//! sweeper's perf event and the hostPort socket hooks (pinned links).
//!
//! Link pins under `links/`: `<host veth>-<program>` (pods, tcx),
//! `uplink<ifindex>-<program>`, `cgroup-<program>` (made by
//! `sluice_maps::sock_hooks`), `nat_sweep`. bpffs refuses names with a dot
//! (EPERM from `bpf_lookup`, kernel/bpf/inode.c), so none has one.
use std::{
    os::fd::{AsFd, AsRawFd},
    path::{Path, PathBuf},
};

use aya::programs::{
    links::{FdLink, LinkType, PinnedLink},
    tc::{qdisc_add_clsact, NlOptions, SchedClassifierLink, TcAttachOptions, TcError, TcHandle},
    xdp::XdpLink,
    CgroupSockAddr, SchedClassifier, TcAttachType, Xdp,
};
use sluice_common::{config_flags, programs::ProgKind};
use sluice_maps::PinRoot;

use super::{bpffs::unpin, pod_block};
use crate::error::Error;

/// Prefix of the uplink's link pins (`uplink<ifindex>-<program>`); pod links
/// start with the host veth name (`sl...`), so the two never mix.
pub(super) const UPLINK_LINK_PREFIX: &str = "uplink";
/// Pin of the NAT sweeper's perf-event link.
pub(super) const SWEEP_LINK: &str = "nat_sweep";

/// Priority and handle of Sluice's `cls_bpf` filters on a pod's host veth: fixed,
/// so an upgrade can replace them in place and DEL can find them.
pub(super) const FILTER_PRIORITY: u16 = 1;
pub(super) const FILTER_HANDLE: TcHandle = TcHandle::new(0, 1);

pub(super) fn dp_err(
    op: impl Into<String>,
    e: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> Error {
    Error::datapath(op, e)
}

/// The tc hook of a pod or uplink program.
pub(super) fn tc_hook(kind: ProgKind) -> TcAttachType {
    match kind {
        ProgKind::PodEgress | ProgKind::PodDevice | ProgKind::UplinkEgress => TcAttachType::Egress,
        _ => TcAttachType::Ingress,
    }
}

pub(super) fn pod_link_path(root: &PinRoot, host_ifname: &str, prog: &str) -> PathBuf {
    root.links_dir().join(format!("{host_ifname}-{prog}"))
}

pub(super) fn uplink_link_path(root: &PinRoot, ifindex: u32, prog: &str) -> PathBuf {
    root.links_dir()
        .join(format!("{UPLINK_LINK_PREFIX}{ifindex}-{prog}"))
}

pub(super) fn open_tc(root: &PinRoot, name: &str) -> Result<SchedClassifier, Error> {
    SchedClassifier::from_pin(root.progs_dir().join(name))
        .map_err(|e| dp_err(format!("open pinned program {name}"), e))
}

pub(super) fn pin_link(
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

/// `prog` on `ifname`'s `hook` as a tcx link pinned at `lp` (a pin left there
/// by a crashed ADD of the same attachment is detached first).
pub(super) fn attach_tcx_pinned(
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

/// The program id of the link pinned at `lp` (CHECK: a missing or unreadable
/// pin is a failed check).
pub(super) fn pinned_link_program(lp: &Path) -> Result<u32, Error> {
    let pinned = PinnedLink::from_pin(lp)
        .map_err(|e| Error::check(format!("pinned link {} is missing: {e}", lp.display())))?;
    FdLink::from(pinned)
        .info()
        .map(|i| i.program_id())
        .map_err(|e| Error::check(format!("link {} unreadable: {e}", lp.display())))
}

pub(super) fn add_clsact(ifname: &str) -> Result<(), Error> {
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
pub(super) fn attach_filter(
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

/// The index of interface `ifname` in this namespace, if it exists.
pub(super) fn ifindex_of(ifname: &str) -> Option<u32> {
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
            super::pod_links::detach_pod(root, ifname)?;
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
                super::uplink::detach_uplink_filters(&ifname);
                gone.push(format!("uplink {ifname} tc filters"));
            }
            cfg.flags &= !config_flags::UPLINK_TC_FILTERS;
            cfg.uplink_ifindex = 0;
            sluice_maps::node::write_config(root, cfg)?;
        }
    }
    Ok(gone)
}
