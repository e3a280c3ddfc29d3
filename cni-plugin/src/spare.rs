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
    ffi::OsString,
    fs::{self, OpenOptions},
    io::{self, ErrorKind},
    os::{
        fd::AsRawFd,
        unix::{
            ffi::OsStringExt,
            fs::{DirBuilderExt, FileExt, OpenOptionsExt},
        },
    },
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
        if let Ok(names) = some_names(&self.dir) {
            for name in names.into_iter().take(TAKE_TRIES) {
                match fs::rename(self.dir.join(name), path) {
                    Ok(()) => break,
                    // Another ADD took it first: try the next.
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
        }
        // One open for both: a taken spare is opened (and cut, in case its
        // emptying failed), and without one the file is created.
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)?;
        file.write_all_at(content, 0)
    }
}

/// Bytes of the one `getdents64(2)` read [`some_names`] makes: a few dozen
/// names.
const DIRENT_BUF: usize = 1024;

/// The first few names in `dir` (not `.` or `..`), from one small
/// `getdents64(2)`. `fs::read_dir` would do, but glibc's `readdir` fills a
/// 32 KiB buffer on its first call: in a spares directory of 1,000 files an
/// ADD read most of them to take one, and an ADD soon after a node emptied
/// paid more for its spare than a new file costs.
fn some_names(dir: &Path) -> io::Result<Vec<OsString>> {
    let d = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)?;
    let mut buf = [0u8; DIRENT_BUF];
    // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`, which
    // lives across the call; `d` is an open directory.
    let n = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            d.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
    Ok(parse_dirents(buf.get(..n).unwrap_or_default()))
}

/// The names in `linux_dirent64` records (include/uapi/linux/dirent.h:
/// `d_ino` u64, `d_off` s64, `d_reclen` u16, `d_type` u8, then the name,
/// NUL-terminated), `.` and `..` left out; stops at a record that does not fit.
fn parse_dirents(mut b: &[u8]) -> Vec<OsString> {
    const NAME: usize = 19;
    let mut out = Vec::new();
    while let Some(len) = b.get(16..18) {
        let reclen = usize::from(u16::from_ne_bytes([len[0], len[1]]));
        let Some(rec) = b.get(..reclen).filter(|_| reclen > NAME) else {
            break;
        };
        let raw = &rec[NAME..];
        let name = &raw[..raw.iter().position(|&c| c == 0).unwrap_or(raw.len())];
        if name != b"." && name != b".." && !name.is_empty() {
            out.push(OsString::from_vec(name.to_vec()));
        }
        b = &b[reclen..];
    }
    out
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

    /// One small read gives the first names; a directory of many files
    /// gives a few dozen of them, all real, and never `.` or `..`.
    #[test]
    fn some_names_reads_a_few_real_names() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(some_names(tmp.path()).unwrap().is_empty());
        let all: BTreeSet<OsString> = (0..300)
            .map(|i| {
                let name = format!("s1-{i}-{i}");
                fs::write(tmp.path().join(&name), b"").unwrap();
                OsString::from(name)
            })
            .collect();
        let got = some_names(tmp.path()).unwrap();
        assert!(
            (TAKE_TRIES..300).contains(&got.len()),
            "{} names",
            got.len()
        );
        assert!(got.iter().all(|n| all.contains(n)), "{got:?}");
        assert!(some_names(&tmp.path().join("missing")).is_err());
    }

    #[test]
    fn dirent_records_that_do_not_fit_are_not_read() {
        let rec = |name: &[u8]| {
            let reclen = (19 + name.len() + 1).next_multiple_of(8);
            let mut r = vec![0u8; reclen];
            r[16..18].copy_from_slice(&u16::try_from(reclen).unwrap().to_ne_bytes());
            r[19..19 + name.len()].copy_from_slice(name);
            r
        };
        let mut b = [rec(b"."), rec(b".."), rec(b"abc"), rec(b"d")].concat();
        assert_eq!(parse_dirents(&b), [OsString::from("abc"), "d".into()]);
        b.truncate(b.len() - 3);
        assert_eq!(parse_dirents(&b), [OsString::from("abc")], "cut short");
        assert!(parse_dirents(&[0u8; 17]).is_empty());
        let mut zero = rec(b"x");
        zero[16..18].copy_from_slice(&0u16.to_ne_bytes());
        assert!(
            parse_dirents(&zero).is_empty(),
            "a zero length stops the walk"
        );
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
