//! Where an invocation's time goes, for performance work: with
//! `SLUICE_TIMING=1` in its environment the plugin prints each step's
//! duration to stderr (`sluice: timing <step> <µs>`). Off, a step costs one
//! branch on a cached flag.
use std::{sync::OnceLock, time::Instant};

fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SLUICE_TIMING").is_some_and(|v| v == "1"))
}

/// Times the steps of one command.
pub struct Steps {
    last: Option<Instant>,
}

impl Steps {
    pub fn start() -> Self {
        Self {
            last: enabled().then(Instant::now),
        }
    }

    /// Ends step `name` (started by the previous call, or by [`Self::start`]).
    pub fn done(&mut self, name: &str) {
        if let Some(last) = self.last {
            let now = Instant::now();
            eprintln!(
                "sluice: timing {name} {}",
                now.duration_since(last).as_micros()
            );
            self.last = Some(now);
        }
    }
}
