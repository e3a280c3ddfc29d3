//! Rewriting a small file in place: the same inode, one `pwrite(2)`.
//!
//! Atomic replacement (a temp file renamed over the old one) frees an inode
//! per write, and on ext4 without a journal every file created afterwards
//! scans past each inode freed in the last minute or more
//! (`recently_deleted` in fs/ext4/ialloc.c): a node adding pods fast would
//! pay, in each ADD, for the ADDs before it. In place, a process killed at
//! any point leaves the old content or the new one, never a mix: the new
//! bytes go out in one `pwrite` at offset 0, padded with spaces to the old
//! length so that nothing of the old content is left after them, and the
//! file is never truncated. Readers ignore trailing whitespace (a JSON
//! parser does; the IPAM store trims). That holds for content within one
//! page (4 KiB: an address, a record without hundreds of port mappings):
//! the kernel copies a longer write page by page and stops between pages
//! for a fatal signal (`generic_perform_write`). A power loss can tear any
//! write (there is no fsync, as there is none anywhere in the state files).
//! Each caller says what a torn file means.
use std::{
    fs::OpenOptions,
    io::{self, ErrorKind},
    os::unix::fs::{FileExt, OpenOptionsExt},
    path::Path,
};

/// Writes `content` over the start of `path`, padded as above; with
/// `create`, a missing file is created (0600). `Ok(false)`: the file did not
/// exist and `create` was not asked for.
pub fn overwrite(path: &Path, content: &[u8], create: bool) -> io::Result<bool> {
    let file = match OpenOptions::new()
        .write(true)
        .create(create)
        .mode(0o600)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound && !create => return Ok(false),
        Err(e) => return Err(e),
    };
    let old_len = usize::try_from(file.metadata()?.len()).unwrap_or(usize::MAX);
    let mut buf = content.to_vec();
    if buf.len() < old_len {
        buf.resize(old_len, b' ');
    }
    file.write_all_at(&buf, 0)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn longer_then_shorter_keeps_the_inode_and_no_old_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        assert!(!overwrite(&p, b"x", false).unwrap(), "missing, not created");
        assert!(!p.exists());
        assert!(overwrite(&p, b"10.0.0.200", true).unwrap());
        let ino = std::fs::metadata(&p).unwrap().ino();
        assert!(overwrite(&p, b"10.0.0.3", false).unwrap());
        assert_eq!(std::fs::metadata(&p).unwrap().ino(), ino);
        assert_eq!(std::fs::read(&p).unwrap(), b"10.0.0.3  ");
        assert!(overwrite(&p, b"10.0.0.123456", true).unwrap());
        assert_eq!(std::fs::read(&p).unwrap(), b"10.0.0.123456");
    }
}
