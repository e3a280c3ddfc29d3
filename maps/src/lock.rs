//! The lock on a pin root's maps directory (an `flock` on the directory, the
//! same lock `sluice_host::lock::FileLock::dir_exclusive` takes on it: the
//! plugin holds it while an ADD claims a counter slot). Whoever writes counts
//! from a walk of the tables holds it from the walk to the write
//! ([`crate::nat_pressure::recount`], [`crate::sweep::sweep`]): two walks
//! and writes interleaved would put back the count of a pod a DEL had just
//! removed, an entry no later DEL takes away.
use std::{
    fs::File,
    os::fd::AsRawFd,
    time::{Duration, Instant},
};

use crate::{Error, PinRoot, Result};

/// How long a holder may keep the lock before a waiter gives up (a walk of
/// the largest tables takes milliseconds; a holder that died released it).
const WAIT: Duration = Duration::from_secs(30);

/// Held until dropped (closing the file releases the `flock`).
pub struct MapsLock {
    _dir: File,
}

impl PinRoot {
    /// Takes the maps directory's lock, waiting up to 30 s.
    pub fn lock_maps(&self) -> Result<MapsLock> {
        let path = self.maps_dir();
        let dir = File::open(&path)
            .map_err(|e| Error::io(format!("open {} to lock it", path.display()), e))?;
        let start = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            // SAFETY: flock(2) on a descriptor this function owns.
            if unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(MapsLock { _dir: dir });
            }
            let e = std::io::Error::last_os_error();
            let busy = matches!(e.raw_os_error(), Some(libc::EWOULDBLOCK | libc::EINTR));
            if !busy || start.elapsed() >= WAIT {
                return Err(Error::io(
                    format!("lock {} (waited {:?})", path.display(), start.elapsed()),
                    e,
                ));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    };

    use super::*;

    #[test]
    fn a_second_holder_waits_for_the_first() {
        let root = std::env::temp_dir().join(format!("sluice-maps-lock-{}", std::process::id()));
        let pin = PinRoot::new(&root);
        std::fs::create_dir_all(pin.maps_dir()).unwrap();
        let first = pin.lock_maps().unwrap();
        let released = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (pin, released) = (pin.clone(), Arc::clone(&released));
            std::thread::spawn(move || {
                let _second = pin.lock_maps().unwrap();
                released.load(Ordering::SeqCst)
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        released.store(true, Ordering::SeqCst);
        drop(first);
        let saw_release = waiter.join().unwrap();
        std::fs::remove_dir_all(&root).unwrap();
        assert!(
            saw_release,
            "the second lock was taken while the first was held"
        );
    }

    #[test]
    fn a_missing_directory_is_an_error_naming_it() {
        let pin = PinRoot::new(std::path::Path::new("/nonexistent/sluice-pin-root"));
        let e = pin.lock_maps().err().unwrap().to_string();
        assert!(e.contains("/nonexistent/sluice-pin-root/maps"), "{e}");
    }
}
