//! The NAT sweep from process context (`sluice-node sweep`, and part of
//! `route-sync`): once a second, the agent renews its lease in `sl_agent` and
//! removes idle flows and stale fragment entries itself
//! (`sluice_maps::sweep`). While the lease lasts the in-kernel sweeper, a
//! perf-event program in hard interrupt context, skips its runs; when the
//! agent stops, it gives the lease back, and a killed agent's lease runs out
//! within `SWEEP_LEASE_NS`.
use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use sluice_common::{agent_slot::SWEEP_LEASE_NS, user::monotonic_ns};
use sluice_maps::{
    sweep::{self, Swept},
    PinRoot,
};

use crate::{error::Result, log, shutdown::Shutdown};

/// How often a pass runs: as often as the in-kernel sweeper, well within the
/// lease.
pub(crate) const INTERVAL: Duration = Duration::from_secs(1);
/// How often the agent logs what its passes removed (when they removed anything).
const REPORT_EVERY: Duration = Duration::from_mins(1);

/// The sweeper of one datapath, between passes.
pub(crate) struct Sweeper {
    root: PinRoot,
    /// The last problem logged (each is logged once until it changes).
    said: Option<String>,
    holds_lease: bool,
    since_report: Report,
}

/// What the passes since the last report did.
#[derive(Default)]
struct Report {
    started: Option<Instant>,
    passes: u32,
    swept: Swept,
    total: Duration,
    longest: Duration,
}

impl Sweeper {
    pub(crate) fn new(pin_root: &Path) -> Self {
        Self {
            root: PinRoot::new(pin_root),
            said: None,
            holds_lease: false,
            since_report: Report::default(),
        }
    }

    /// One pass. Problems are logged, not returned: the in-kernel sweeper
    /// covers a pass that did not happen (the lease is given back).
    pub(crate) fn pass(&mut self) {
        if !sweep::supported(&self.root) {
            self.say(format!(
                "NAT sweep: no sweep lease map under {} (no datapath loaded yet, or one an older \
                 sluice loaded): its in-kernel sweeper sweeps",
                self.root.path().display()
            ));
            self.holds_lease = false;
            return;
        }
        let started = Instant::now();
        let now = monotonic_ns();
        let done = sweep::set_lease(&self.root, now + SWEEP_LEASE_NS)
            .and_then(|()| sweep::sweep(&self.root, now));
        match done {
            Ok(swept) => {
                if !self.holds_lease || self.said.is_some() {
                    log(&format!(
                        "NAT sweep: sweeping {} from this agent (the in-kernel sweeper stands back)",
                        self.root.path().display()
                    ));
                    self.said = None;
                }
                self.holds_lease = true;
                self.since_report.add(swept, started.elapsed());
            }
            Err(e) => {
                self.say(format!(
                    "NAT sweep: {e}; the in-kernel sweeper sweeps until a pass succeeds"
                ));
                // The lease may have been taken before the sweep failed: a
                // failing agent must not keep the in-kernel sweeper away.
                self.holds_lease = true;
                self.release();
            }
        }
        if let Some(line) = self.since_report.due() {
            log(&line);
        }
    }

    /// Gives the tables back to the in-kernel sweeper at once.
    pub(crate) fn release(&mut self) {
        if self.holds_lease {
            if let Err(e) = sweep::set_lease(&self.root, 0) {
                log(&format!("NAT sweep: giving the lease back: {e}"));
            }
            self.holds_lease = false;
        }
    }

    fn say(&mut self, msg: String) {
        if self.said.as_ref() != Some(&msg) {
            log(&msg);
            self.said = Some(msg);
        }
    }
}

/// The lease goes back with its holder: at shutdown, on an error's early
/// return, on a panic.
impl Drop for Sweeper {
    fn drop(&mut self) {
        self.release();
    }
}

impl Report {
    fn add(&mut self, s: Swept, took: Duration) {
        self.started.get_or_insert_with(Instant::now);
        self.passes += 1;
        self.swept.flows += s.flows;
        self.swept.flows6 += s.flows6;
        self.swept.frags += s.frags;
        self.total += took;
        self.longest = self.longest.max(took);
    }

    /// The line to log when `REPORT_EVERY` has passed and something was removed.
    fn due(&mut self) -> Option<String> {
        if self.started?.elapsed() < REPORT_EVERY {
            return None;
        }
        let r = std::mem::take(self);
        let s = r.swept;
        (s.flows + s.flows6 + s.frags > 0).then(|| {
            format!(
                "NAT sweep: {} idle flows removed (IPv4 {}, IPv6 {}), {} stale fragment entries, \
                 in {} passes; a pass took {} µs on average, {} µs at most",
                s.flows + s.flows6,
                s.flows,
                s.flows6,
                s.frags,
                r.passes,
                r.total.as_micros() / u128::from(r.passes.max(1)),
                r.longest.as_micros()
            )
        })
    }
}

/// `sluice-node sweep`: passes until `shutdown`; the lease goes back when the
/// sweeper is dropped.
pub(crate) async fn run(pin_root: PathBuf, mut shutdown: Shutdown) -> Result<()> {
    let mut tick = tokio::time::interval(INTERVAL);
    let mut sweeper = Sweeper::new(&pin_root);
    loop {
        tokio::select! {
            _ = tick.tick() => sweeper.pass(),
            () = &mut shutdown => break,
        }
    }
    Ok(())
}
