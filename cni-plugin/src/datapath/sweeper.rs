//! The NAT sweeper: `nat_sweep` fired once a second by a perf event whose
//! link is pinned, so idle flows expire with no process of ours alive.

use aya::programs::{
    perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    PerfEvent,
};
use sluice_common::prog_names;
use sluice_maps::PinRoot;

use super::{
    bpffs::unpin,
    links::{dp_err, pin_link, SWEEP_LINK},
};
use crate::error::Error;

/// How often the sweeper runs (CPU clock of CPU 0, which ticks while idle too).
const SWEEP_PERIOD_NS: u64 = 1_000_000_000;

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
