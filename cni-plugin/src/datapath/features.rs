//! What the running kernel offers the datapath, probed once per invocation (by
//! trying the mechanism, as libbpf and bpftool do, not by reading the version:
//! distribution kernels backport). Where a feature is missing the datapath
//! falls back or, where nothing can stand in for it, says so:
//!
//! | feature | since | without it |
//! | --- | --- | --- |
//! | tcx links | 6.6 | `cls_bpf` filters on a clsact qdisc, for the uplink and for `podAttach: tcx` pods |
//! | `bpf_ktime_get_coarse_ns` | 5.11 | `bpf_ktime_get_ns` (the same clock, a little dearer) |
//! | `bpf_check_mtu` | 5.12 | a packet whose next hop is not resolved yet goes to the kernel, which resolves it and checks the MTU |
//! | a veth taking XDP frames when its NAPI runs (GRO on) | 5.13 | no native XDP (`xdp: native` and `auto` act as `off`): before 5.13 a veth accepts redirected XDP frames only with an XDP program on its peer, so native XDP could not deliver into pods; tc does |
//! | `bpf_for_each_map_elem` and pinnable perf-event links | 5.13, 5.15 | no NAT sweeper: flows expire when a packet or a new flow meets them, and the flow maps are LRU maps (a full table drops its least recently used flows instead of refusing new ones); no IPv6 masquerade (IPv6 stays routed): with lazy expiry its code took 5.10's verifier over a minute |
//!
//! `SLUICE_DISABLE_FEATURES` (a comma-separated list of `tcx`, `ktime_coarse`,
//! `check_mtu`, `sweeper`, `veth_xdp`) makes a newer kernel take the fallbacks, so they are
//! tested on every kernel, not only on old ones.
use std::sync::OnceLock;

use aya::{
    programs::{ProgramType, SchedClassifier, TcAttachType},
    sys::{is_helper_supported, BpfHelper},
};
use sluice_common::kernel_features;

use crate::cni::config::PodAttach;

/// What the kernel has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[expect(clippy::struct_excessive_bools, reason = "one flag per kernel feature")]
pub struct Features {
    /// tcx links (Linux 6.6).
    pub tcx: bool,
    /// `bpf_ktime_get_coarse_ns` (5.11).
    pub ktime_coarse: bool,
    /// `bpf_check_mtu` (5.12).
    pub check_mtu: bool,
    /// The NAT sweeper can run with no process of ours alive: its program
    /// walks the flow table with `bpf_for_each_map_elem` (5.13) and its perf
    /// event is kept by a pinned `bpf_link` (5.15).
    pub sweeper: bool,
    /// A veth takes redirected XDP frames once GRO turns its NAPI on (5.13,
    /// "veth: allow enabling NAPI even without XDP"); before, only with an XDP
    /// program on its peer. Not probeable without building veths, so read
    /// from the kernel version.
    pub veth_xdp: bool,
}

impl Features {
    /// The bits of `SLUICE_KERNEL_FEATURES` the programs read.
    pub fn program_bits(&self) -> u32 {
        let mut bits = 0;
        if self.check_mtu {
            bits |= kernel_features::CHECK_MTU;
        }
        if self.ktime_coarse {
            bits |= kernel_features::KTIME_COARSE;
        }
        if self.sweeper {
            bits |= kernel_features::MASQ6;
        } else {
            bits |= kernel_features::LAZY_EXPIRY;
        }
        bits
    }

    /// What is missing, for STATUS and logs: (feature, kernel it needs).
    pub fn missing(&self) -> Vec<(&'static str, &'static str)> {
        let mut out = Vec::new();
        if !self.tcx {
            out.push(("tcx", "6.6"));
        }
        if !self.ktime_coarse {
            out.push(("bpf_ktime_get_coarse_ns", "5.11"));
        }
        if !self.check_mtu {
            out.push(("bpf_check_mtu", "5.12"));
        }
        if !self.sweeper {
            out.push((
                "the NAT sweeper (bpf_for_each_map_elem, perf-event links)",
                "5.15",
            ));
        }
        if !self.veth_xdp {
            out.push((
                "XDP delivery into a veth without a program on its peer",
                "5.13",
            ));
        }
        out
    }
}

/// Whether this run takes `feature`'s fallback on any kernel
/// (`SLUICE_DISABLE_FEATURES`).
fn off(feature: &str) -> bool {
    std::env::var("SLUICE_DISABLE_FEATURES")
        .unwrap_or_default()
        .split(',')
        .any(|d| d.trim() == feature)
}

/// The features of the running kernel (probes that load programs: asked when
/// the datapath is loaded or attached, not on every ADD).
pub fn get() -> Features {
    static FEATURES: OnceLock<Features> = OnceLock::new();
    *FEATURES.get_or_init(|| {
        let helper =
            |h: BpfHelper| is_helper_supported(ProgramType::SchedClassifier, h).unwrap_or(false);
        Features {
            tcx: !off("tcx") && probe_tcx(),
            ktime_coarse: !off("ktime_coarse") && helper(BpfHelper::BPF_FUNC_ktime_get_coarse_ns),
            check_mtu: !off("check_mtu") && helper(BpfHelper::BPF_FUNC_check_mtu),
            sweeper: !off("sweeper")
                && is_helper_supported(
                    ProgramType::PerfEvent,
                    BpfHelper::BPF_FUNC_for_each_map_elem,
                )
                .unwrap_or(false)
                && aya::features().bpf_perf_link(),
            veth_xdp: veth_xdp(),
        }
    })
}

/// [`Features::veth_xdp`] alone: a version check, no probe, so that every ADD
/// with an uplink can ask it (the XDP mode it wants) without [`get`]'s probes.
pub fn veth_xdp() -> bool {
    static VETH_XDP: OnceLock<bool> = OnceLock::new();
    *VETH_XDP.get_or_init(|| !off("veth_xdp") && kernel_at_least((5, 13)))
}

/// netkit devices and their BPF hooks (Linux 6.7): whether `from_netkit_pod`
/// is loaded at all. Whether the device type is there (`CONFIG_NETKIT`) only
/// creating one tells (see `interface::create`).
pub fn netkit() -> bool {
    static NETKIT: OnceLock<bool> = OnceLock::new();
    *NETKIT.get_or_init(|| !off("netkit") && kernel_at_least((6, 7)))
}

/// Whether the running kernel's release (`uname -r`) is `want` or newer.
fn kernel_at_least(want: (u32, u32)) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    release_at_least(&release, want)
}

fn release_at_least(release: &str, want: (u32, u32)) -> bool {
    let mut it = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    match (it.next(), it.next()) {
        (Some(major), Some(minor)) => (major, minor) >= want,
        // Unreadable: assume a current kernel (the probes decide the rest).
        _ => true,
    }
}

/// A tcx query on `lo` (every namespace has one): the kernel answers it from
/// 6.6 on, and refuses the unknown attach type (EINVAL) before.
fn probe_tcx() -> bool {
    SchedClassifier::query_tcx("lo", TcAttachType::Ingress).is_ok()
}

/// How pods are attached on this kernel: `podAttach: tcx` needs tcx, and
/// falls back to `cls_bpf` filters (`tc`) without it.
pub fn pod_attach(wanted: PodAttach) -> PodAttach {
    if wanted == PodAttach::Tcx && !get().tcx {
        eprintln!("sluice: this kernel has no tcx (Linux 6.6+); podAttach tcx falls back to tc");
        return PodAttach::Tc;
    }
    wanted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_releases_compare_by_major_and_minor() {
        assert!(release_at_least("6.18.44-fc-v657\n", (5, 13)));
        assert!(release_at_least("5.13.0", (5, 13)));
        assert!(!release_at_least("5.10.0-32-amd64", (5, 13)));
        assert!(!release_at_least("4.19.0-27-amd64", (5, 13)));
        assert!(release_at_least("", (5, 13)));
    }
}
