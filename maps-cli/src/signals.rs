//! Ctrl-C (SIGINT) and SIGTERM end `monitor` and `counters --watch` cleanly: the
//! handler only sets a flag that their loops check at least every 200 ms.
use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Installs the handler for SIGINT and SIGTERM.
pub(crate) fn install() {
    let handler: extern "C" fn(libc::c_int) = on_signal;
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler is async-signal-safe (one atomic store).
        unsafe { libc::signal(sig, handler as libc::sighandler_t) };
    }
}

pub(crate) fn stop_requested() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// Sleeps up to `d`, returning early (true) when a stop was requested.
pub(crate) fn sleep(d: std::time::Duration) -> bool {
    let end = std::time::Instant::now() + d;
    while !stop_requested() {
        let now = std::time::Instant::now();
        if now >= end {
            return false;
        }
        std::thread::sleep((end - now).min(std::time::Duration::from_millis(100)));
    }
    true
}
