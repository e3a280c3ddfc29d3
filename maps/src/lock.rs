//! The lock on a pin root's maps directory (an `flock` on the directory,
//! taken by `sluice_host::lock::FileLock::dir_exclusive`, the lock the plugin
//! holds while an ADD claims a counter slot). Whoever writes counts from a
//! walk of the tables holds it from the walk to the write
//! ([`crate::nat_pressure::recount`], [`crate::sweep::sweep`]): two walks
//! and writes interleaved would put back the count of a pod a DEL had just
//! removed, an entry no later DEL takes away.
use std::io;

use sluice_host::lock::FileLock;

use crate::{Error, PinRoot, Result};

/// Held until dropped (closing the file releases the `flock`).
pub struct MapsLock {
    _lock: FileLock,
}

impl PinRoot {
    /// Takes the maps directory's lock, waiting up to 30 s
    /// (`sluice_host::lock::LOCK_TIMEOUT`).
    pub fn lock_maps(&self) -> Result<MapsLock> {
        FileLock::dir_exclusive(&self.maps_dir())
            .map(|lock| MapsLock { _lock: lock })
            .map_err(lock_error)
    }
}

/// A lock error of `sluice_host` in this crate's terms (a wait that ran out
/// keeps the errno the last attempt saw).
fn lock_error(e: sluice_host::Error) -> Error {
    match e {
        sluice_host::Error::Io { context, source } => Error::io(context, source),
        sluice_host::Error::LockBusy { path, waited_secs } => Error::io(
            format!("lock {path} (waited {waited_secs}s)"),
            io::Error::from_raw_os_error(libc::EWOULDBLOCK),
        ),
        e => Error::io("lock the maps directory", io::Error::other(e)),
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{
            atomic::{AtomicBool, Ordering},
            Arc,
        },
        time::Duration,
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

    #[test]
    fn a_lock_held_too_long_is_an_io_error_naming_the_directory() {
        let e = lock_error(sluice_host::Error::LockBusy {
            path: "/p/maps".into(),
            waited_secs: 30,
        });
        assert!(
            matches!(&e, Error::Io { op, source } if op.contains("/p/maps")
                && source.raw_os_error() == Some(libc::EWOULDBLOCK)),
            "{e:?}"
        );
    }
}
