//! Files replaced in one step: written under a temporary name in the target's
//! directory, flushed, then renamed over the target. A runtime executing the
//! plugin while it is replaced runs the old file or the new one, never half of
//! one, and never gets "text file busy" (which writing into a binary that is
//! being executed gives: `ETXTBSY`, open(2)).
use std::{
    fs::{self, File, OpenOptions},
    io::Write,
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use crate::error::{Error, Result};

/// What [`replace`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Written,
    /// The target already held exactly these bytes with this mode.
    Unchanged,
}

/// Makes `target` hold `bytes` with permissions `mode`, atomically.
pub(crate) fn replace(target: &Path, bytes: &[u8], mode: u32) -> Result<Outcome> {
    if let (Ok(old), Ok(meta)) = (fs::read(target), fs::metadata(target)) {
        if old == bytes && meta.permissions().mode() & 0o7777 == mode {
            return Ok(Outcome::Unchanged);
        }
    }
    let dir = target
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = temp_name(target)?;
    let written = write_new(&tmp, bytes, mode).and_then(|()| {
        fs::rename(&tmp, target).map_err(|e| {
            Error::io(
                format!("renaming {} to {}", tmp.display(), target.display()),
                e,
            )
        })
    });
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    // The rename itself is durable once the directory is.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(Outcome::Written)
}

/// `<dir>/.<name>.sluice-tmp-<pid>`: hidden (a runtime reading the CNI
/// directories skips it: no `.conflist` suffix, no executable of a known name).
fn temp_name(target: &Path) -> Result<PathBuf> {
    let name = target
        .file_name()
        .ok_or_else(|| Error::invalid("target file", target.display(), "has no file name"))?;
    let mut tmp = std::ffi::OsString::from(".");
    tmp.push(name);
    tmp.push(format!(".sluice-tmp-{}", std::process::id()));
    Ok(target.with_file_name(tmp))
}

fn write_new(tmp: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let what = || format!("writing {}", tmp.display());
    // A leftover of a killed earlier run with our pid is replaced.
    let _ = fs::remove_file(tmp);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(tmp)
        .map_err(|e| Error::io(what(), e))?;
    f.write_all(bytes).map_err(|e| Error::io(what(), e))?;
    // The umask may have narrowed the mode given to open.
    f.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(|e| Error::io(what(), e))?;
    f.sync_all().map_err(|e| Error::io(what(), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_and_reports_unchanged() {
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("sluice");
        assert_eq!(replace(&t, b"one", 0o755).unwrap(), Outcome::Written);
        assert_eq!(replace(&t, b"one", 0o755).unwrap(), Outcome::Unchanged);
        assert_eq!(replace(&t, b"one", 0o644).unwrap(), Outcome::Written);
        assert_eq!(
            fs::metadata(&t).unwrap().permissions().mode() & 0o7777,
            0o644
        );
        assert_eq!(replace(&t, b"two", 0o644).unwrap(), Outcome::Written);
        assert_eq!(fs::read(&t).unwrap(), b"two");
        // Nothing but the target is left behind.
        let names: Vec<_> = fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("sluice")]);
    }

    #[test]
    fn a_running_executable_is_replaced_not_overwritten() {
        // The old file stays intact for whoever has it open (or executes it):
        // the new one is another inode.
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("plugin");
        replace(&t, b"old", 0o755).unwrap();
        let held = File::open(&t).unwrap();
        replace(&t, b"new", 0o755).unwrap();
        let mut old = String::new();
        std::io::Read::read_to_string(&mut &held, &mut old).unwrap();
        assert_eq!(old, "old");
        assert_eq!(fs::read(&t).unwrap(), b"new");
    }

    #[test]
    fn a_missing_directory_is_an_error_naming_it() {
        let e = replace(Path::new("/nonexistent-sluice-dir/x"), b"x", 0o644).unwrap_err();
        assert!(e.to_string().contains("/nonexistent-sluice-dir"), "{e}");
    }
}
