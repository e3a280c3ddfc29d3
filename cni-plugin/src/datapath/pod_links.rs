//! A pod's programs on its devices: `from_pod`/`to_pod` on the host veth
//! (`cls_bpf` filters on the node's shared blocks, or pinned tcx links), the
//! netkit programs on a netkit pair, `pod_edt` on the pod's own interface;
//! attached, checked and detached. The pin and attach mechanics are
//! [`super::links`].
use std::os::fd::{AsFd, AsRawFd};

use aya::programs::{
    links::{FdLink, PinnedLink},
    SchedClassifier, TcAttachType,
};
use sluice_common::programs::{self, ProgKind};
use sluice_maps::PinRoot;

use super::{
    bpffs::unpin,
    links::{
        add_clsact, attach_filter, attach_tcx_pinned, detach_pinned, dp_err, ifindex_of, open_tc,
        pinned_link_program, pod_link_path, tc_hook,
    },
    pod_block,
    sys::NetkitHook,
};
use crate::{cni::config::PodAttach, error::Error};

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
