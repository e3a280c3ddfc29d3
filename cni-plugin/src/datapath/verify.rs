//! Verifying the object's programs, several at once.
//!
//! A load spends nearly all its time in the kernel's verifier, which runs in
//! the thread that calls `BPF_PROG_LOAD`; for a privileged loader `bpf_check`
//! takes no global lock (`bpf_verifier_lock` serialises unprivileged loads
//! only), so programs loaded from separate threads verify in parallel. The
//! largest go first: `uplink_out` alone is over half of a load, so with two
//! threads the rest verify beside it.
use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
    thread,
    time::Instant,
};

use aya::{programs::Program, Ebpf};
use sluice_common::programs::{ProgKind, ProgSpec};

use crate::error::Error;

/// At most this many programs verify at once (one CPU each).
const MAX_THREADS: usize = 4;

/// Loads (verifies) every program of `specs`, up to [`MAX_THREADS`] at once
/// and no more than the CPUs the process may use. The first failure stops
/// the programs not yet started and is returned.
pub(super) fn verify_all(ebpf: &mut Ebpf, specs: &[&'static ProgSpec]) -> Result<(), Error> {
    let mut progs: HashMap<&str, &mut Program> = ebpf.programs_mut().collect();
    let mut work = Vec::with_capacity(specs.len());
    for spec in specs {
        let prog = progs.remove(spec.name).ok_or_else(|| {
            Error::datapath(
                "load",
                format!("program {} missing from the object", spec.name),
            )
        })?;
        work.push((*spec, prog));
    }
    // Popped from the end: the costliest last here, so it starts first.
    work.sort_by_key(|(spec, _)| cost_rank(spec.kind));
    let threads = thread::available_parallelism()
        .map_or(1, std::num::NonZero::get)
        .clamp(1, MAX_THREADS)
        .min(work.len().max(1));
    let queue = Mutex::new(work);
    let worker = || -> Result<(), Error> {
        loop {
            let next = queue.lock().unwrap_or_else(PoisonError::into_inner).pop();
            let Some((spec, prog)) = next else {
                return Ok(());
            };
            let started = Instant::now();
            if let Err(e) = load(spec, prog) {
                queue.lock().unwrap_or_else(PoisonError::into_inner).clear();
                return Err(e);
            }
            // Each program's own verifier time (they overlap).
            crate::timing::record(&format!("verify {}", spec.name), started.elapsed());
        }
    };
    thread::scope(|scope| {
        let handles: Vec<_> = (0..threads).map(|_| scope.spawn(worker)).collect();
        let mut first_error = None;
        for h in handles {
            let result = h
                .join()
                .unwrap_or_else(|_| Err(Error::datapath("verify", "a verifier thread panicked")));
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    })
}

/// Loads one program: the kernel verifies it (and JITs it). Whatever its
/// kind, as the object's section made it (the pin loop in `loader.rs` checks
/// each against its `ProgSpec` kind).
fn load(spec: &ProgSpec, prog: &mut Program) -> Result<(), Error> {
    let name = spec.name;
    let verified = |e| Error::datapath(format!("verify and load {name}"), e);
    match prog {
        Program::CgroupSockAddr(p) => p.load().map_err(verified),
        Program::PerfEvent(p) => p.load().map_err(verified),
        Program::Xdp(p) => p.load().map_err(verified),
        Program::SchedClassifier(p) => p.load().map_err(verified),
        other => Err(Error::datapath(
            format!("verify and load {name}"),
            format!("a {:?} program, not one Sluice loads", other.prog_type()),
        )),
    }
}

/// Larger is costlier to verify (measured per program with `SLUICE_TIMING`:
/// `uplink_out` about 60% of a load, then the other uplink programs, then
/// the pods' ingress programs).
fn cost_rank(kind: ProgKind) -> u8 {
    match kind {
        ProgKind::UplinkEgress => 9,
        ProgKind::UplinkIngress => 8,
        ProgKind::UplinkXdp => 7,
        ProgKind::PodIngress => 6,
        ProgKind::PodNetkit => 5,
        ProgKind::PodEgress | ProgKind::PodNetkitPrimary => 4,
        ProgKind::PodDevice => 3,
        ProgKind::PerfEvent => 2,
        ProgKind::SockAddr(_) => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_common::programs::ALL;

    /// The queue is popped from its end: sorted by rank, the costliest
    /// program (`uplink_out`) is the first to start, the socket hooks last.
    #[test]
    fn uplink_out_starts_first() {
        let mut kinds: Vec<ProgKind> = ALL.iter().map(|p| p.kind).collect();
        kinds.sort_by_key(|k| cost_rank(*k));
        assert_eq!(kinds.last(), Some(&ProgKind::UplinkEgress));
        assert!(matches!(kinds.first(), Some(ProgKind::SockAddr(_))));
    }
}
