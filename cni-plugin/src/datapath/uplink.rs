//! The node's uplink: `uplink_in`/`uplink_out` on its tc hooks (pinned tcx
//! links, or `cls_bpf` filters before tcx) and `uplink_xdp`, with how XDP is
//! chosen for it.
use aya::programs::{
    tc::{SchedClassifierLink, TcAttachOptions},
    Link, Xdp, XdpMode,
};
use aya_obj::programs::XdpAttachType;
use sluice_common::{
    config_flags, prog_names,
    programs::{self, ProgKind},
    NodeConfig,
};
use sluice_maps::PinRoot;

use super::links::{
    add_clsact, attach_filter, detach_pinned, dp_err, open_tc, pin_link, tc_hook, uplink_link_path,
    FILTER_HANDLE, FILTER_PRIORITY,
};
use super::{features, NodeSettings, Uplink};
use crate::{cni::config::XdpMode as XdpConfig, error::Error, netlink::Netlink};

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

/// `xdp` made concrete for `uplink`. On a veth, no XDP pays: native turns skbs
/// into XDP frames, losing the `CHECKSUM_PARTIAL` state a veth peer leaves (the pod
/// drops the segment as a bad checksum); generic has to linearize (copy) every
/// GRO'd skb before running, only to pass most of them on (measured:
/// external->pod TCP at 0.75x of tc alone). The tc program's
/// `bpf_redirect_peer` does the job.
/// Before Linux 5.13 native XDP could not deliver into a pod (see
/// `features::Features::veth_xdp`): tc does it, with no XDP.
pub(super) fn resolve_xdp(xdp: XdpConfig, uplink: &Uplink) -> XdpConfig {
    match xdp {
        XdpConfig::Auto if uplink.is_veth => XdpConfig::Off,
        XdpConfig::Auto | XdpConfig::Native if !features::veth_xdp() => XdpConfig::Off,
        XdpConfig::Auto => XdpConfig::Native,
        other => other,
    }
}

const WANT_MASK: u32 = config_flags::XDP_WANT_NATIVE | config_flags::XDP_WANT_GENERIC;

fn want_flags(xdp: XdpConfig) -> u32 {
    match xdp {
        XdpConfig::Native | XdpConfig::Auto => config_flags::XDP_WANT_NATIVE,
        XdpConfig::Generic => config_flags::XDP_WANT_GENERIC,
        XdpConfig::Off => 0,
    }
}

/// The uplink's programs are attached as the settings ask: to that interface,
/// with that XDP mode (so a changed `xdp` takes effect at the next ADD). Pinned
/// tcx links are found by their pins; `cls_bpf` filters (kernels without tcx)
/// are looked for on the interface, so filters someone removed are attached
/// again.
pub(super) async fn current(
    root: &PinRoot,
    host_nl: &Netlink,
    s: &NodeSettings,
) -> Result<bool, Error> {
    let Some(u) = &s.uplink else {
        return Ok(true);
    };
    let Ok(c) = sluice_maps::node::config(root) else {
        return Ok(false);
    };
    if c.uplink_ifindex != u.ifindex
        || c.flags & WANT_MASK != want_flags(resolve_xdp(s.xdp, u))
        || (c.flags & config_flags::UPLINK_VETH != 0) != u.is_veth
    {
        return Ok(false);
    }
    if c.flags & config_flags::UPLINK_TC_FILTERS == 0 {
        return Ok(uplink_attached(root, u.ifindex));
    }
    for (name, ingress, id) in uplink_program_ids(root)? {
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

/// The node's part (under the datapath's exclusive lock): the uplink's
/// programs attached as `s` asks unless they are, and how they ended up in
/// the node's config (the programs read the uplink's index, MAC and the
/// pods' MTU from it).
pub(super) async fn prepare(
    root: &PinRoot,
    host_nl: &Netlink,
    s: &NodeSettings,
) -> Result<(), Error> {
    let Some(u) = &s.uplink else {
        return Ok(());
    };
    if current(root, host_nl, s).await? {
        return Ok(());
    }
    let xdp = resolve_xdp(s.xdp, u);
    let attached = attach_uplink(root, &u.ifname, u.ifindex, xdp)?;
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
    if u.is_veth {
        flags |= config_flags::UPLINK_VETH;
    }
    sluice_maps::node::write_config(
        root,
        NodeConfig {
            uplink_ifindex: u.ifindex,
            flags,
            uplink_mac: u.mac,
            pod_mtu: u16::try_from(s.pod_mtu).unwrap_or(u16::MAX),
        },
    )?;
    Ok(())
}
