//! The bpffs under the pin root: mounted if needed, directories created root-only.
use std::{
    fs::{self, DirBuilder},
    os::unix::fs::DirBuilderExt,
    path::Path,
};

use nix::{
    mount::{mount, MsFlags},
    sys::statfs::{statfs, BPF_FS_MAGIC},
};

use crate::Error;

/// Where bpffs is conventionally mounted.
pub const BPFFS_MOUNT: &str = "/sys/fs/bpf";

/// True when `path` (or its closest existing ancestor) is on a bpffs.
pub fn is_bpffs(path: &Path) -> bool {
    let mut p = path;
    loop {
        if p.exists() {
            return statfs(p).is_ok_and(|s| s.filesystem_type() == BPF_FS_MAGIC);
        }
        match p.parent() {
            Some(parent) => p = parent,
            None => return false,
        }
    }
}

/// Mounts a bpffs at `at` (nosuid, nodev, noexec, as systemd mounts it).
pub fn mount_at(at: &Path) -> nix::Result<()> {
    mount(
        Some("bpf"),
        at,
        Some("bpf"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
}

/// Makes sure `pin_root` lives on a bpffs. When it is below `/sys/fs/bpf` and that
/// is not mounted (e.g. a fresh boot without systemd's mount), mounts it.
pub fn ensure_bpffs(pin_root: &Path) -> Result<(), Error> {
    if is_bpffs(pin_root) {
        return Ok(());
    }
    let base = Path::new(BPFFS_MOUNT);
    if pin_root.starts_with(base) && base.is_dir() {
        mount_at(base)
            .map_err(|e| Error::io(format!("mounting bpffs at {BPFFS_MOUNT}"), e.into()))?;
        if is_bpffs(pin_root) {
            return Ok(());
        }
    }
    Err(Error::NotBpffs {
        path: pin_root.display().to_string(),
    })
}

/// `mkdir -p` with mode 0700 for every directory it creates.
pub fn create_dirs(dir: &Path) -> Result<(), Error> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))
}

/// Removes a pinned object; a missing one is fine.
pub fn unpin(path: &Path) -> Result<(), Error> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("removing pin {}", path.display()), e)),
    }
}
