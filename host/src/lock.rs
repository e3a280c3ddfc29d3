//! Advisory file locks (`flock`) with a bounded wait. A plugin that cannot get a
//! lock in time answers "try again later" (CNI code 11) instead of hanging the runtime.
use std::{
    fs::{File, OpenOptions},
    os::unix::fs::OpenOptionsExt,
    path::Path,
    time::{Duration, Instant},
};

use nix::fcntl::{Flock, FlockArg};

use crate::Error;

/// How long an invocation waits for a lock before giving up.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// A held lock; released on drop (also when the process dies).
#[derive(Debug)]
pub struct FileLock {
    _lock: Flock<File>,
}

impl FileLock {
    /// Takes an exclusive lock on the file `path` (created 0600 if missing).
    pub fn exclusive(path: &Path) -> Result<Self, Error> {
        Self::exclusive_within(path, LOCK_TIMEOUT)
    }

    /// Takes an exclusive lock on the file `path`, waiting at most `timeout`.
    pub fn exclusive_within(path: &Path, timeout: Duration) -> Result<Self, Error> {
        Self::take(
            open_file(path)?,
            path,
            FlockArg::LockExclusiveNonblock,
            timeout,
        )
    }

    /// Takes a shared lock on the directory `dir` (flock works on any inode, so a
    /// bpffs directory can be its own lock: no lock file needed).
    pub fn dir_shared(dir: &Path) -> Result<Self, Error> {
        Self::take(
            open_dir(dir)?,
            dir,
            FlockArg::LockSharedNonblock,
            LOCK_TIMEOUT,
        )
    }

    /// Takes an exclusive lock on the directory `dir`.
    pub fn dir_exclusive(dir: &Path) -> Result<Self, Error> {
        Self::take(
            open_dir(dir)?,
            dir,
            FlockArg::LockExclusiveNonblock,
            LOCK_TIMEOUT,
        )
    }

    fn take(file: File, path: &Path, arg: FlockArg, timeout: Duration) -> Result<Self, Error> {
        let start = Instant::now();
        let mut file = file;
        let mut sleep = Duration::from_millis(1);
        loop {
            match Flock::lock(file, arg) {
                Ok(lock) => return Ok(Self { _lock: lock }),
                Err((f, nix::errno::Errno::EWOULDBLOCK | nix::errno::Errno::EINTR)) => {
                    if start.elapsed() >= timeout {
                        return Err(Error::LockBusy {
                            path: path.display().to_string(),
                            waited_secs: timeout.as_secs(),
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

fn open_file(path: &Path) -> Result<File, Error> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::io(format!("opening lock file {}", path.display()), e))
}

fn open_dir(dir: &Path) -> Result<File, Error> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(dir)
        .map_err(|e| Error::io(format!("opening {} to lock it", dir.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exclusive_excludes_and_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("lock");
        let held = FileLock::exclusive(&p).unwrap();
        let e = FileLock::exclusive_within(&p, Duration::from_millis(20))
            .err()
            .unwrap();
        assert!(matches!(e, Error::LockBusy { .. }), "{e:?}");
        assert!(e.to_string().contains("lock"));
        drop(held);
        assert!(FileLock::exclusive(&p).is_ok());
    }

    #[test]
    fn shared_dir_locks_coexist_and_exclude_exclusive() {
        let dir = tempfile::tempdir().unwrap();
        let _a = FileLock::dir_shared(dir.path()).unwrap();
        let _b = FileLock::dir_shared(dir.path()).unwrap();
        let excl = FileLock::take(
            open_dir(dir.path()).unwrap(),
            dir.path(),
            FlockArg::LockExclusiveNonblock,
            Duration::from_millis(10),
        );
        assert!(excl.is_err_and(|e| matches!(e, Error::LockBusy { .. })));
    }
}
