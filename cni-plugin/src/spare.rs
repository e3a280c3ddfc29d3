//! Spare files: the inodes of the state files a DEL retires, kept for the
//! next ADD instead of freed.
//!
//! Each pod has two files of its own: its address reservation (one per
//! address, host-local's format) and its attachment record. Creating a file
//! allocates an inode and removing one frees it, and on ext4 without a
//! journal every inode allocation scans past each inode freed in the last 60
//! s or more (`find_inode_bit` skipping `recently_deleted` ones,
//! fs/ext4/ialloc.c): on a node whose pods come and go, each ADD paid for the
//! DELs before it. So a DEL moves the file it retires into a spares
//! directory (one `rename(2)`, and the file is emptied), and an ADD takes a
//! spare back under a private name (one `rename`, which only one process can
//! win: the loser sees `ENOENT` and tries the next) before it writes the new
//! content. A node then allocates inodes only while it holds more pods than
//! it ever held. The spares are empty files, as many as the node's peak pods
//! less its current ones; nothing reads them.
use std::{
    fs::{self, OpenOptions},
    io::{self, ErrorKind},
    os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
    time::{SystemTime, UNIX_EPOCH},
};

/// Spares tried before creating a file: others may be taking the same ones.
const TAKE_TRIES: usize = 8;

/// A directory of spare files on the same file system as the files it holds.
#[derive(Debug, Clone)]
pub struct Spares {
    dir: PathBuf,
}

impl Spares {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Moves `path` into the spares and empties it. `Ok(false)`: there was
    /// no `path`. Atomic for readers of `path`: it is there, with its
    /// content, or gone.
    pub fn retire(&self, path: &Path) -> io::Result<bool> {
        let spare = self.dir.join(unique_name());
        match fs::rename(path, &spare) {
            Ok(()) => {}
            // ENOENT is either `path` or the spares directory missing.
            Err(e) if e.kind() == ErrorKind::NotFound => {
                if fs::symlink_metadata(path).is_err() {
                    return Ok(false);
                }
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&self.dir)?;
                match fs::rename(path, &spare) {
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
        // A spare that keeps its old bytes would still name a pod; emptying
        // frees its data block, not its inode. A failure here leaves content
        // no one reads and the next taker replaces.
        let _ = OpenOptions::new().write(true).truncate(true).open(&spare);
        Ok(true)
    }

    /// Makes `path` a file (0600) holding exactly `content`, from a spare
    /// when there is one. `path` must be a name private to the caller (a
    /// temporary it then links or renames into place): a spare is renamed
    /// onto it, replacing what was there.
    pub fn create(&self, path: &Path, content: &[u8]) -> io::Result<()> {
        if let Ok(entries) = fs::read_dir(&self.dir) {
            for entry in entries.take(TAKE_TRIES).filter_map(Result::ok) {
                match fs::rename(entry.path(), path) {
                    Ok(()) => return fill(path, content),
                    // Another ADD took it first: try the next.
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
        }
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)?;
        file.write_all_at(content, 0)
    }
}

/// Writes `content` over a taken spare and cuts it to that length.
fn fill(path: &Path, content: &[u8]) -> io::Result<()> {
    let file = OpenOptions::new().write(true).open(path)?;
    file.write_all_at(content, 0)?;
    file.set_len(content.len() as u64)
}

/// A name no other spare has: this process, the time, and a counter.
fn unique_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "s{}-{nanos}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{collections::BTreeSet, os::unix::fs::MetadataExt, sync::Arc};

    #[test]
    fn a_retired_file_is_emptied_and_its_inode_comes_back() {
        let tmp = tempfile::tempdir().unwrap();
        let spares = Spares::new(tmp.path().join("spare"));
        let a = tmp.path().join("a");
        spares.create(&a, b"first owner").unwrap();
        assert_eq!(fs::read(&a).unwrap(), b"first owner");
        assert_eq!(fs::metadata(&a).unwrap().mode() & 0o777, 0o600);
        let ino = fs::metadata(&a).unwrap().ino();

        assert!(spares.retire(&a).unwrap(), "the spares directory is made");
        assert!(!a.exists());
        let kept: Vec<_> = fs::read_dir(spares.dir()).unwrap().collect();
        assert_eq!(kept.len(), 1);
        let kept = kept[0].as_ref().unwrap().path();
        assert_eq!(fs::metadata(&kept).unwrap().len(), 0, "emptied");
        assert!(!spares.retire(&a).unwrap(), "gone already");

        let b = tmp.path().join("b");
        spares.create(&b, b"x").unwrap();
        assert_eq!(fs::metadata(&b).unwrap().ino(), ino, "the same inode");
        assert_eq!(fs::read(&b).unwrap(), b"x", "nothing of the old content");
        assert_eq!(fs::read_dir(spares.dir()).unwrap().count(), 0);
    }

    #[test]
    fn without_spares_a_file_is_created() {
        let tmp = tempfile::tempdir().unwrap();
        let spares = Spares::new(tmp.path().join("missing"));
        let a = tmp.path().join("a");
        spares.create(&a, b"hello").unwrap();
        assert_eq!(fs::read(&a).unwrap(), b"hello");
        assert!(!spares.dir().exists(), "creating needs no spares directory");
    }

    /// Two takers never get the same spare: each file ends with its own
    /// content and its own inode, whether it came from a spare or not.
    #[test]
    fn concurrent_takers_get_distinct_files() {
        let tmp = tempfile::tempdir().unwrap();
        let spares = Arc::new(Spares::new(tmp.path().join("spare")));
        for i in 0..8 {
            let p = tmp.path().join(format!("old{i}"));
            fs::write(&p, b"old").unwrap();
            assert!(spares.retire(&p).unwrap());
        }
        let dir = Arc::new(tmp.path().to_path_buf());
        let threads: Vec<_> = (0..16)
            .map(|i| {
                let (spares, dir) = (Arc::clone(&spares), Arc::clone(&dir));
                std::thread::spawn(move || {
                    let p = dir.join(format!("new{i}"));
                    spares.create(&p, format!("owner {i}").as_bytes()).unwrap();
                    p
                })
            })
            .collect();
        let mut inodes = BTreeSet::new();
        for (i, t) in threads.into_iter().enumerate() {
            let p = t.join().unwrap();
            assert_eq!(fs::read_to_string(&p).unwrap(), format!("owner {i}"));
            assert!(inodes.insert(fs::metadata(&p).unwrap().ino()));
        }
        assert_eq!(fs::read_dir(spares.dir()).unwrap().count(), 0, "all taken");
    }
}
