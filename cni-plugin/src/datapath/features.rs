//! What the running kernel offers the datapath, probed once per invocation (by
//! trying the mechanism, as libbpf and bpftool do, not by reading the version:
//! distribution kernels backport). Where a feature is missing the datapath
//! falls back or, where nothing can stand in for it, says so:
//!
//! | feature | since | without it |
//! | --- | --- | --- |
//! | tcx links | 6.6 | cls_bpf filters on a clsact qdisc, for the uplink and for `podAttach: tcx` pods |
//! | `bpf_ktime_get_coarse_ns` | 5.11 | `bpf_ktime_get_ns` (the same clock, a little dearer) |
//! | `bpf_check_mtu` | 5.12 | a packet whose next hop is not resolved yet goes to the kernel, which resolves it and checks the MTU |
//! | `bpf_for_each_map_elem` and pinnable perf-event links | 5.13, 5.15 | no NAT sweeper: flows expire when a packet or a new flow meets them, and the flow maps are LRU maps (a full table drops its least recently used flows instead of refusing new ones) |
//!
//! `SLUICE_DISABLE_FEATURES` (a comma-separated list of `tcx`, `ktime_coarse`,
//! `check_mtu`, `sweeper`) makes a newer kernel take the fallbacks, so they are
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
pub struct Features {
    /// tcx links (Linux 6.6).
    pub tcx: bool,
    /// `bpf_ktime_get_coarse_ns` (5.11).
    pub ktime_coarse: bool,
    /// `bpf_check_mtu` (5.12).
    pub check_mtu: bool,
    /// The NAT sweeper can run with no process of ours alive: its program
    /// walks the flow table with `bpf_for_each_map_elem` (5.13) and its perf
    /// event is kept by a pinned bpf_link (5.15).
    pub sweeper: bool,
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
        if !self.sweeper {
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
        out
    }
}

/// The features of the running kernel.
pub fn get() -> Features {
    static FEATURES: OnceLock<Features> = OnceLock::new();
    *FEATURES.get_or_init(|| {
        let disabled = std::env::var("SLUICE_DISABLE_FEATURES").unwrap_or_default();
        let off = |name: &str| disabled.split(',').any(|d| d.trim() == name);
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
        }
    })
}

/// A tcx query on `lo` (every namespace has one): the kernel answers it from
/// 6.6 on, and refuses the unknown attach type (EINVAL) before.
fn probe_tcx() -> bool {
    SchedClassifier::query_tcx("lo", TcAttachType::Ingress).is_ok()
}

/// How pods are attached on this kernel: `podAttach: tcx` needs tcx, and
/// falls back to cls_bpf filters (`tc`) without it.
pub fn pod_attach(wanted: PodAttach) -> PodAttach {
    if wanted == PodAttach::Tcx && !get().tcx {
        eprintln!("sluice: this kernel has no tcx (Linux 6.6+); podAttach tcx falls back to tc");
        return PodAttach::Tc;
    }
    wanted
}
