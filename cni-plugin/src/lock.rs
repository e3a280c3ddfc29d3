//! Advisory file locks (`flock`) with a bounded wait. A plugin that cannot get a
//! lock in time returns "try again later" (code 11) instead of hanging the runtime.
use std::{
    fs::{File, OpenOptions},
    os::unix::fs::OpenOptionsExt,
    path::Path,
    time::{Duration, Instant},
};

use nix::fcntl::{Flock, FlockArg};

use crate::error::Error;

/// How long an invocation waits for a lock before giving up.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// A held lock; released on drop (also when the process dies).
#[derive(Debug)]
pub struct FileLock {
    _lock: Flock<File>,
}

impl FileLock {
    /// Takes an exclusive lock on `path` (created 0600 if missing).
    pub fn exclusive(path: &Path) -> Result<Self, Error> {
        Self::take(path, FlockArg::LockExclusiveNonblock, LOCK_TIMEOUT)
    }

    /// Takes a shared lock on `path`.
    pub fn shared(path: &Path) -> Result<Self, Error> {
        Self::take(path, FlockArg::LockSharedNonblock, LOCK_TIMEOUT)
    }

    /// Takes an exclusive lock, waiting at most `timeout`.
    pub fn exclusive_within(path: &Path, timeout: Duration) -> Result<Self, Error> {
        Self::take(path, FlockArg::LockExclusiveNonblock, timeout)
    }

    fn take(path: &Path, arg: FlockArg, timeout: Duration) -> Result<Self, Error> {
        let start = Instant::now();
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|e| Error::io(format!("opening lock file {}", path.display()), e))?;
        let mut sleep = Duration::from_millis(1);
        loop {
            match Flock::lock(file, arg) {
                Ok(lock) => return Ok(Self { _lock: lock }),
                Err((f, nix::errno::Errno::EWOULDBLOCK | nix::errno::Errno::EINTR)) => {
                    if start.elapsed() >= timeout {
                        return Err(Error::TryAgain {
                            reason: format!(
                                "lock {} still held by another invocation after {}s",
                                path.display(),
                                timeout.as_secs()
                            ),
                        });
                    }
                    file = f;
                    std::thread::sleep(sleep.min(timeout.saturating_sub(start.elapsed())));
                    sleep = (sleep * 2).min(Duration::from_millis(50));
                }
                Err((_, e)) => {
                    return Err(Error::io(format!("locking {}", path.display()), e.into()))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exclusive_excludes_and_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("lock");
        let held = FileLock::exclusive(&p).unwrap();
        let e = FileLock::take(
            &p,
            FlockArg::LockExclusiveNonblock,
            Duration::from_millis(20),
        )
        .err()
        .unwrap();
        assert_eq!(e.code(), 11);
        assert!(e.to_string().contains("lock"));
        drop(held);
        assert!(FileLock::exclusive(&p).is_ok());
    }

    #[test]
    fn shared_locks_coexist() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("lock");
        let _a = FileLock::shared(&p).unwrap();
        let _b = FileLock::shared(&p).unwrap();
        assert!(FileLock::take(
            &p,
            FlockArg::LockExclusiveNonblock,
            Duration::from_millis(10)
        )
        .is_err());
    }
}
