//! What the running kernel offers the datapath, probed once per invocation
//! (by trying the mechanism, not by reading the version: distribution kernels
//! backport). Where a feature is missing the datapath falls back:
//!
//! | feature | since | without it |
//! | --- | --- | --- |
//! | tcx (`BPF_TCX_INGRESS/EGRESS` links) | 6.6 | cls_bpf filters on a clsact qdisc, for the uplink and for `podAttach: tcx` pods |
//!
//! `SLUICE_DISABLE_FEATURES=tcx` (a comma-separated list) makes a newer kernel
//! take the fallbacks, so they are tested on every kernel, not only old ones.
use std::sync::OnceLock;

use aya::programs::{SchedClassifier, TcAttachType};

use crate::cni::config::PodAttach;

/// What the kernel has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// tcx links (Linux 6.6).
    pub tcx: bool,
}

/// The features of the running kernel.
pub fn get() -> Features {
    static FEATURES: OnceLock<Features> = OnceLock::new();
    *FEATURES.get_or_init(|| {
        let disabled = std::env::var("SLUICE_DISABLE_FEATURES").unwrap_or_default();
        let off = |name: &str| disabled.split(',').any(|d| d.trim() == name);
        Features {
            tcx: !off("tcx") && probe_tcx(),
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
