//! Where reservations are kept: the [`Store`] trait, [`DiskStore`] (host-local's on-disk
//! format, so both plugins can share a data dir) and [`MemStore`] (for tests).
//!
//! On disk, per network: `<dataDir>/<network>/<ip>` holding `<containerid>\r\n<ifname>`,
//! `last_reserved_ip.<range set index>` holding the address, and `lock`, flocked for the
//! whole of an operation. A reservation is written in `.sluice-tmp/` first and
//! linked into place, so the sweep for what a crash left there reads a directory
//! that is empty, not one entry per pod; `last_reserved_ip.*`, a hint, is
//! rewritten in place. A released reservation's file moves to `.sluice-spare/`,
//! emptied, and the next reservation's file is one of those
//! ([`crate::spare`]): a node reuses inodes instead of allocating them.
use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io;
use std::net::IpAddr;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::cni::AttachmentId;
use crate::error::Error;
use crate::lock::FileLock;
use crate::overwrite::overwrite;
use crate::spare::Spares;

/// One reserved address and who holds it, as read from the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub ip: IpAddr,
    pub container_id: String,
    /// `None` for files host-local wrote before it recorded the interface.
    pub ifname: Option<String>,
}

impl Reservation {
    /// Held by exactly this attachment.
    pub fn is_exactly(&self, id: &AttachmentId) -> bool {
        self.container_id == id.container_id && self.ifname.as_deref() == Some(&id.ifname)
    }

    /// An old-format reservation (container id only) of this attachment's container.
    pub fn is_legacy_of(&self, id: &AttachmentId) -> bool {
        self.ifname.is_none() && self.container_id == id.container_id
    }

    /// Held by this attachment, counting old-format files as host-local does.
    pub fn belongs_to(&self, id: &AttachmentId) -> bool {
        self.is_exactly(id) || self.is_legacy_of(id)
    }

    /// The holder as an attachment (empty ifname for an old-format file).
    pub fn attachment(&self) -> AttachmentId {
        AttachmentId {
            container_id: self.container_id.clone(),
            ifname: self.ifname.clone().unwrap_or_default(),
        }
    }
}

impl fmt::Display for Reservation {
    /// Describes the holder: `container "abc" interface "eth0"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.ifname {
            Some(i) => write!(f, "container {:?} interface {i:?}", self.container_id),
            None => write!(f, "container {:?}", self.container_id),
        }
    }
}

/// Keeps a store locked until dropped.
#[derive(Debug)]
#[must_use = "the lock is released when this is dropped"]
pub struct StoreLock {
    _lock: Option<FileLock>,
}

/// The reservations of one network. Callers hold [`Store::lock`] across every
/// read-decide-write sequence.
pub trait Store {
    /// Takes the network's exclusive lock.
    fn lock(&self) -> Result<StoreLock, Error>;

    /// Records `ip` for `id` unless it is already reserved (then `Ok(false)`; an
    /// existing reservation is never overwritten), and remembers it as the last
    /// address reserved in range set `range_set`.
    fn reserve(&mut self, id: &AttachmentId, ip: IpAddr, range_set: usize) -> Result<bool, Error>;

    /// Removes the reservation of `ip`; `Ok(false)` when there was none.
    fn release(&mut self, ip: IpAddr) -> Result<bool, Error>;

    /// The address last reserved in range set `range_set`, if known.
    fn last_reserved(&self, range_set: usize) -> Result<Option<IpAddr>, Error>;

    /// Every reservation, ordered by address.
    fn reservations(&self) -> Result<Vec<Reservation>, Error>;

    /// Whether `ip` is reserved, without reading who holds it.
    fn is_reserved(&self, ip: IpAddr) -> Result<bool, Error> {
        Ok(self.owner_of(ip)?.is_some())
    }

    /// Every reserved address, without reading who holds it (the disk store
    /// lists file names only: cheap however many pods the node has).
    fn reserved_ips(&self) -> Result<Vec<IpAddr>, Error> {
        Ok(self.reservations()?.into_iter().map(|r| r.ip).collect())
    }

    /// Releases the addresses `ips` that `id` holds (others are left alone);
    /// returns those released. O(addresses), for a caller that knows them (DEL
    /// with the attachment record).
    fn release_held(&mut self, id: &AttachmentId, ips: &[IpAddr]) -> Result<Vec<IpAddr>, Error> {
        let mut released = Vec::new();
        for ip in ips {
            if self.owner_of(*ip)?.is_some_and(|r| r.belongs_to(id)) && self.release(*ip)? {
                released.push(*ip);
            }
        }
        Ok(released)
    }

    /// Who holds `ip`, if anyone.
    fn owner_of(&self, ip: IpAddr) -> Result<Option<Reservation>, Error> {
        Ok(self.reservations()?.into_iter().find(|r| r.ip == ip))
    }

    /// The addresses held by `id` (old-format files of its container included).
    fn get_by_id(&self, id: &AttachmentId) -> Result<Vec<IpAddr>, Error> {
        Ok(self
            .reservations()?
            .into_iter()
            .filter(|r| r.belongs_to(id))
            .map(|r| r.ip)
            .collect())
    }

    /// Releases what `id` holds and returns it. Like host-local, old-format files of
    /// the container are released only when no file names the interface; it keeps
    /// going past errors and returns the first.
    fn release_by_id(&mut self, id: &AttachmentId) -> Result<Vec<IpAddr>, Error> {
        let all = self.reservations()?;
        let exact: Vec<IpAddr> = all
            .iter()
            .filter(|r| r.is_exactly(id))
            .map(|r| r.ip)
            .collect();
        let chosen = if exact.is_empty() {
            all.iter()
                .filter(|r| r.is_legacy_of(id))
                .map(|r| r.ip)
                .collect()
        } else {
            exact
        };
        let mut released = Vec::new();
        let mut first_err = None;
        for ip in chosen {
            match self.release(ip) {
                Ok(true) => released.push(ip),
                Ok(false) => {}
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(released),
        }
    }
}

/// Refuses network names that would not be a single directory under `dataDir`.
pub fn check_network_name(network: &str) -> Result<(), Error> {
    if network.is_empty() || network == "." || network == ".." || network.contains(['/', '\0']) {
        return Err(Error::config(
            "name",
            format!("{network:?}"),
            "cannot name the IPAM state directory (empty, \".\", \"..\", or contains '/' or NUL)",
        ));
    }
    Ok(())
}

const LOCK_FILE: &str = "lock";
const LAST_RESERVED_PREFIX: &str = "last_reserved_ip.";
/// The directory of temporary files (a dot, so it never parses as an address).
const TEMP_DIR: &str = ".sluice-tmp";
/// Released reservations' files, for the next reservation ([`Spares`]).
const SPARE_DIR: &str = ".sluice-spare";
/// Between container id and interface (host-local's `LineBreak`).
const LINE_BREAK: &str = "\r\n";

/// host-local's disk store, with atomic writes and a bounded lock wait.
#[derive(Debug)]
pub struct DiskStore {
    dir: PathBuf,
    spares: Spares,
    lock_timeout: Duration,
}

impl DiskStore {
    /// How long [`Store::lock`] waits before giving up with `TryAgain`.
    pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(30);

    /// The store of `network` under `data_dir`, creating its directory (0700).
    pub fn open(data_dir: &Path, network: &str) -> Result<Self, Error> {
        check_network_name(network)?;
        let dir = data_dir.join(network);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir.join(TEMP_DIR))
            .map_err(|e| Error::io(format!("creating IPAM directory {}", dir.display()), e))?;
        Ok(Self {
            spares: Spares::new(dir.join(SPARE_DIR)),
            dir,
            lock_timeout: Self::DEFAULT_LOCK_TIMEOUT,
        })
    }

    pub fn with_lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout;
        self
    }

    /// `<dataDir>/<network>`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn ip_path(&self, ip: IpAddr) -> PathBuf {
        self.dir.join(ip.to_string())
    }

    fn last_path(&self, range_set: usize) -> PathBuf {
        self.dir.join(format!("{LAST_RESERVED_PREFIX}{range_set}"))
    }

    /// Writes `content` to a temporary file (0600) in `TEMP_DIR`, a spare
    /// when there is one, for `reserve` to link into place. Only called with
    /// the lock held, after `lock` removed what a dead writer left there, so
    /// the name is this call's own. No fsync: the temp file + link is what
    /// keeps a killed process from leaving a partial reservation; fsync would
    /// only add power-loss durability (~0.3 ms per
    /// call on the ADD path), and after a power loss every pod is gone and GC
    /// releases what no attachment owns. host-local does not fsync either.
    fn write_temp(&self, content: &[u8]) -> Result<PathBuf, Error> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = self
            .dir
            .join(TEMP_DIR)
            .join(format!("{}.{n}", std::process::id()));
        self.spares
            .create(&path, content)
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
        Ok(path)
    }

    /// Rewrites `last_reserved_ip.<range_set>` in place ([`overwrite`]: no
    /// inode freed per ADD; a killed ADD leaves the old address or the new).
    /// A shorter address is padded with spaces, which this store trims and
    /// host-local reads as no hint (it then starts from the range's start; a
    /// hint only spreads allocations). After a power loss a torn file parses
    /// as no hint here too.
    fn write_last_reserved(&self, range_set: usize, ip: IpAddr) -> Result<(), Error> {
        let target = self.last_path(range_set);
        overwrite(&target, ip.to_string().as_bytes(), true)
            .map(drop)
            .map_err(|e| Error::io(format!("writing {}", target.display()), e))
    }

    /// Temporary files left by a crash; only called with the lock held, when no
    /// writer can be mid-way. Reads `TEMP_DIR` only, which is empty but for them.
    fn remove_stale_temps(&self) {
        let Ok(entries) = fs::read_dir(self.dir.join(TEMP_DIR)) else {
            return;
        };
        for entry in entries.flatten() {
            let _ = fs::remove_file(entry.path());
        }
    }

    /// The reservation in the file for `ip`; `None` when absent or unreadable
    /// (host-local skips those too).
    fn read_reservation(&self, ip: IpAddr) -> Option<Reservation> {
        let bytes = fs::read(self.ip_path(ip)).ok()?;
        Some(parse_reservation(ip, &bytes))
    }
}

/// File content -> holder: `id\r\nifname`, or just `id` in host-local's old format.
fn parse_reservation(ip: IpAddr, bytes: &[u8]) -> Reservation {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    let (container_id, ifname) = match text.split_once(LINE_BREAK) {
        Some((id, ifname)) => (id, Some(ifname.to_string())),
        None => (text, None),
    };
    Reservation {
        ip,
        container_id: container_id.to_string(),
        ifname,
    }
}

impl Store for DiskStore {
    /// Polls a non-blocking flock on `<dir>/lock` until `lock_timeout`, then gives up
    /// with `TryAgain` naming the lock file.
    fn lock(&self) -> Result<StoreLock, Error> {
        let lock = FileLock::exclusive_within(&self.dir.join(LOCK_FILE), self.lock_timeout)?;
        self.remove_stale_temps();
        Ok(StoreLock { _lock: Some(lock) })
    }

    /// Writes a temporary file and hard-links it to `<ip>`: the link fails
    /// if the address is taken, and a crash never leaves a partial reservation.
    fn reserve(&mut self, id: &AttachmentId, ip: IpAddr, range_set: usize) -> Result<bool, Error> {
        // host-local trims the container id and writes no trailing newline.
        let content = format!("{}{LINE_BREAK}{}", id.container_id.trim(), id.ifname);
        let tmp = self.write_temp(content.as_bytes())?;
        let target = self.ip_path(ip);
        let linked = fs::hard_link(&tmp, &target);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(false),
            Err(e) => return Err(Error::io(format!("reserving {}", target.display()), e)),
        }
        if let Err(e) = self.write_last_reserved(range_set, ip) {
            let _ = fs::remove_file(&target);
            return Err(e);
        }
        Ok(true)
    }

    /// The file goes to the spares (one rename), not away: the next
    /// reservation takes its inode back instead of allocating one.
    fn release(&mut self, ip: IpAddr) -> Result<bool, Error> {
        let path = self.ip_path(ip);
        self.spares
            .retire(&path)
            .map_err(|e| Error::io(format!("releasing {}", path.display()), e))
    }

    /// A missing or unparsable file means "none" (host-local then starts from the
    /// beginning of the range set).
    fn last_reserved(&self, range_set: usize) -> Result<Option<IpAddr>, Error> {
        let path = self.last_path(range_set);
        match fs::read_to_string(&path) {
            Ok(s) => Ok(s.trim().parse().ok()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("reading {}", path.display()), e)),
        }
    }

    fn reservations(&self) -> Result<Vec<Reservation>, Error> {
        let entries = fs::read_dir(&self.dir)
            .map_err(|e| Error::io(format!("listing {}", self.dir.display()), e))?;
        let mut out = Vec::new();
        for entry in entries {
            let entry =
                entry.map_err(|e| Error::io(format!("listing {}", self.dir.display()), e))?;
            let Some(ip) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            if let Some(r) = self.read_reservation(ip) {
                out.push(r);
            }
        }
        out.sort_by_key(|r| r.ip);
        Ok(out)
    }

    fn owner_of(&self, ip: IpAddr) -> Result<Option<Reservation>, Error> {
        Ok(self.read_reservation(ip))
    }

    /// One `lstat`, whatever the number of reservations.
    fn is_reserved(&self, ip: IpAddr) -> Result<bool, Error> {
        let path = self.ip_path(ip);
        match fs::symlink_metadata(&path) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(Error::io(format!("reading {}", path.display()), e)),
        }
    }

    fn reserved_ips(&self) -> Result<Vec<IpAddr>, Error> {
        let entries = fs::read_dir(&self.dir)
            .map_err(|e| Error::io(format!("listing {}", self.dir.display()), e))?;
        let mut out = Vec::new();
        for entry in entries {
            let entry =
                entry.map_err(|e| Error::io(format!("listing {}", self.dir.display()), e))?;
            if let Some(ip) = entry.file_name().to_str().and_then(|n| n.parse().ok()) {
                out.push(ip);
            }
        }
        out.sort();
        Ok(out)
    }
}

/// An in-memory store with the same semantics, for tests of the allocation logic.
#[derive(Debug, Default)]
pub struct MemStore {
    reserved: BTreeMap<IpAddr, Reservation>,
    last: BTreeMap<usize, IpAddr>,
}

impl MemStore {
    /// Adds an old-format reservation (container id only), as host-local once wrote.
    pub fn insert_legacy(&mut self, ip: IpAddr, container_id: &str) {
        let r = Reservation {
            ip,
            container_id: container_id.to_string(),
            ifname: None,
        };
        self.reserved.insert(ip, r);
    }

    /// Sets the remembered last reserved address of a range set.
    pub fn set_last_reserved(&mut self, range_set: usize, ip: IpAddr) {
        self.last.insert(range_set, ip);
    }
}

impl Store for MemStore {
    fn lock(&self) -> Result<StoreLock, Error> {
        Ok(StoreLock { _lock: None })
    }

    fn reserve(&mut self, id: &AttachmentId, ip: IpAddr, range_set: usize) -> Result<bool, Error> {
        if self.reserved.contains_key(&ip) {
            return Ok(false);
        }
        let r = Reservation {
            ip,
            container_id: id.container_id.trim().to_string(),
            ifname: Some(id.ifname.clone()),
        };
        self.reserved.insert(ip, r);
        self.last.insert(range_set, ip);
        Ok(true)
    }

    fn release(&mut self, ip: IpAddr) -> Result<bool, Error> {
        Ok(self.reserved.remove(&ip).is_some())
    }

    fn last_reserved(&self, range_set: usize) -> Result<Option<IpAddr>, Error> {
        Ok(self.last.get(&range_set).copied())
    }

    fn reservations(&self) -> Result<Vec<Reservation>, Error> {
        Ok(self.reserved.values().cloned().collect())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeSet;
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::ipam::range::tests::ip;

    pub(crate) fn att(container_id: &str, ifname: &str) -> AttachmentId {
        AttachmentId {
            container_id: container_id.into(),
            ifname: ifname.into(),
        }
    }

    /// The store's files; its temporary-file directory must be empty and its
    /// spares empty files, and both are left out.
    pub(crate) fn names(dir: &Path) -> BTreeSet<String> {
        let mut names: BTreeSet<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        if names.remove(TEMP_DIR) {
            assert_eq!(fs::read_dir(dir.join(TEMP_DIR)).unwrap().count(), 0);
        }
        if names.remove(SPARE_DIR) {
            for e in fs::read_dir(dir.join(SPARE_DIR)).unwrap() {
                assert_eq!(e.unwrap().metadata().unwrap().len(), 0, "spares are empty");
            }
        }
        names
    }

    /// The same behaviour from both stores.
    fn exercise(store: &mut dyn Store) {
        let a = att("ctr-a", "eth0");
        let a1 = att("ctr-a", "eth1");
        let b = att("ctr-b", "eth0");
        let _lock = store.lock().unwrap();
        assert!(store.reserve(&a, ip("10.0.0.2"), 0).unwrap());
        assert!(store.reserve(&a, ip("fd00::2"), 1).unwrap());
        assert!(store.reserve(&a1, ip("10.0.0.3"), 0).unwrap());
        assert!(!store.reserve(&b, ip("10.0.0.2"), 0).unwrap(), "taken");
        assert!(store.reserve(&b, ip("10.0.0.4"), 0).unwrap());
        assert_eq!(store.last_reserved(0).unwrap(), Some(ip("10.0.0.4")));
        assert_eq!(store.last_reserved(1).unwrap(), Some(ip("fd00::2")));
        assert_eq!(store.last_reserved(2).unwrap(), None);

        let owner = store.owner_of(ip("10.0.0.2")).unwrap().unwrap();
        assert!(owner.is_exactly(&a), "{owner}");
        assert_eq!(store.owner_of(ip("10.0.0.9")).unwrap(), None);
        assert_eq!(
            store.get_by_id(&a).unwrap(),
            [ip("10.0.0.2"), ip("fd00::2")]
        );
        assert_eq!(store.reservations().unwrap().len(), 4);

        assert_eq!(
            store.release_by_id(&a).unwrap(),
            [ip("10.0.0.2"), ip("fd00::2")]
        );
        assert!(store.get_by_id(&a).unwrap().is_empty());
        assert_eq!(store.get_by_id(&a1).unwrap(), [ip("10.0.0.3")]);
        assert!(store.release_by_id(&a).unwrap().is_empty(), "idempotent");
        assert!(store.release(ip("10.0.0.4")).unwrap());
        assert!(!store.release(ip("10.0.0.4")).unwrap());
        // The last reserved address survives releases, so allocation moves on.
        assert_eq!(store.last_reserved(0).unwrap(), Some(ip("10.0.0.4")));
    }

    #[test]
    fn mem_store_semantics() {
        exercise(&mut MemStore::default());
    }

    #[test]
    fn disk_store_semantics() {
        let tmp = tempfile::tempdir().unwrap();
        exercise(&mut DiskStore::open(tmp.path(), "net").unwrap());
    }

    #[test]
    fn disk_format_matches_host_local() {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = DiskStore::open(tmp.path(), "mynet").unwrap();
        let dir = tmp.path().join("mynet");
        assert_eq!(s.dir(), dir);
        let _lock = s.lock().unwrap();
        assert!(s
            .reserve(&att(" ctr1\n", "eth0"), ip("10.1.2.3"), 0)
            .unwrap());
        assert!(s
            .reserve(&att("ctr1", "eth0"), ip("2001:db8::5"), 1)
            .unwrap());
        assert_eq!(fs::read(dir.join("10.1.2.3")).unwrap(), b"ctr1\r\neth0");
        assert_eq!(fs::read(dir.join("2001:db8::5")).unwrap(), b"ctr1\r\neth0");
        assert_eq!(
            fs::read(dir.join("last_reserved_ip.0")).unwrap(),
            b"10.1.2.3"
        );
        assert_eq!(
            fs::read(dir.join("last_reserved_ip.1")).unwrap(),
            b"2001:db8::5"
        );
        // Nothing else: no temporary files are left behind.
        assert_eq!(
            names(&dir),
            BTreeSet::from(
                [
                    "10.1.2.3",
                    "2001:db8::5",
                    "last_reserved_ip.0",
                    "last_reserved_ip.1",
                    "lock"
                ]
                .map(String::from)
            )
        );
    }

    /// A reservation creates one file and frees none: `last_reserved_ip` is
    /// rewritten in the same inode (see `write_last_reserved`), padded.
    #[test]
    fn last_reserved_is_rewritten_in_place() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let mut s = DiskStore::open(tmp.path(), "net").unwrap();
        let last = tmp.path().join("net/last_reserved_ip.0");
        let _lock = s.lock().unwrap();
        assert!(s.reserve(&att("a", "eth0"), ip("10.0.0.200"), 0).unwrap());
        let ino = fs::metadata(&last).unwrap().ino();
        assert!(s.reserve(&att("b", "eth0"), ip("10.0.0.3"), 0).unwrap());
        assert_eq!(fs::metadata(&last).unwrap().ino(), ino);
        assert_eq!(fs::read(&last).unwrap(), b"10.0.0.3  ", "padded, not a mix");
        assert_eq!(s.last_reserved(0).unwrap(), Some(ip("10.0.0.3")));
    }

    /// A release keeps the file's inode (emptied, in the spares) and the next
    /// reservation takes it back: a node whose pods come and go allocates no
    /// inodes (see `crate::spare`).
    #[test]
    fn a_released_reservation_file_is_reused() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let mut s = DiskStore::open(tmp.path(), "net").unwrap();
        let dir = tmp.path().join("net");
        let _lock = s.lock().unwrap();
        assert!(s.reserve(&att("a", "eth0"), ip("10.0.0.2"), 0).unwrap());
        let ino = fs::metadata(dir.join("10.0.0.2")).unwrap().ino();
        assert!(s.release(ip("10.0.0.2")).unwrap());
        assert!(!s.release(ip("10.0.0.2")).unwrap(), "already released");
        assert_eq!(s.owner_of(ip("10.0.0.2")).unwrap(), None);
        assert!(s.reservations().unwrap().is_empty());
        assert!(s.reserve(&att("bb", "eth1"), ip("10.0.0.3"), 0).unwrap());
        assert_eq!(fs::metadata(dir.join("10.0.0.3")).unwrap().ino(), ino);
        assert_eq!(fs::read(dir.join("10.0.0.3")).unwrap(), b"bb\r\neth1");
        assert_eq!(fs::read_dir(dir.join(SPARE_DIR)).unwrap().count(), 0);
        assert_eq!(
            names(&dir),
            BTreeSet::from(["10.0.0.3", "last_reserved_ip.0", "lock"].map(String::from))
        );
    }

    #[test]
    fn reads_files_written_by_host_local() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("net");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("10.0.0.5"), "new-ctr\r\neth1").unwrap();
        fs::write(dir.join("10.0.0.6"), "old-ctr\n").unwrap();
        fs::write(dir.join("last_reserved_ip.0"), "10.0.0.6").unwrap();
        fs::write(dir.join("last_reserved_ip.1"), "garbage").unwrap();
        fs::write(dir.join("lock"), "").unwrap();
        let mut s = DiskStore::open(tmp.path(), "net").unwrap();
        assert_eq!(
            s.reservations().unwrap(),
            [
                Reservation {
                    ip: ip("10.0.0.5"),
                    container_id: "new-ctr".into(),
                    ifname: Some("eth1".into()),
                },
                Reservation {
                    ip: ip("10.0.0.6"),
                    container_id: "old-ctr".into(),
                    ifname: None,
                },
            ]
        );
        assert_eq!(s.last_reserved(0).unwrap(), Some(ip("10.0.0.6")));
        assert_eq!(s.last_reserved(1).unwrap(), None);
        // An old-format file belongs to any interface of its container.
        assert_eq!(
            s.get_by_id(&att("old-ctr", "eth0")).unwrap(),
            [ip("10.0.0.6")]
        );
        assert_eq!(
            s.release_by_id(&att("old-ctr", "eth0")).unwrap(),
            [ip("10.0.0.6")]
        );
        assert!(!dir.join("10.0.0.6").exists());
        assert!(s.release_by_id(&att("new-ctr", "eth0")).unwrap().is_empty());
        assert!(dir.join("10.0.0.5").exists());
    }

    #[test]
    fn legacy_files_released_only_when_no_exact_match() {
        let mut s = MemStore::default();
        s.insert_legacy(ip("10.0.0.9"), "c");
        assert!(s.reserve(&att("c", "eth0"), ip("10.0.0.2"), 0).unwrap());
        assert_eq!(
            s.release_by_id(&att("c", "eth0")).unwrap(),
            [ip("10.0.0.2")]
        );
        assert_eq!(
            s.release_by_id(&att("c", "eth0")).unwrap(),
            [ip("10.0.0.9")]
        );
    }

    #[test]
    fn root_only_permissions() {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = DiskStore::open(&tmp.path().join("a/b"), "net").unwrap();
        let _lock = s.lock().unwrap();
        assert!(s.reserve(&att("c", "eth0"), ip("10.0.0.2"), 0).unwrap());
        let mode = |p: PathBuf| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        for d in ["a", "a/b", "a/b/net"] {
            assert_eq!(mode(tmp.path().join(d)) & 0o077, 0, "{d} must be 0700");
        }
        for f in ["10.0.0.2", "last_reserved_ip.0", "lock"] {
            assert_eq!(mode(s.dir().join(f)) & 0o077, 0, "{f} must be 0600");
        }
    }

    #[test]
    fn existing_reservation_is_never_overwritten() {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = DiskStore::open(tmp.path(), "net").unwrap();
        let _lock = s.lock().unwrap();
        assert!(s.reserve(&att("first", "eth0"), ip("10.0.0.2"), 0).unwrap());
        assert!(!s
            .reserve(&att("second", "eth0"), ip("10.0.0.2"), 3)
            .unwrap());
        assert_eq!(
            fs::read(s.dir().join("10.0.0.2")).unwrap(),
            b"first\r\neth0"
        );
        assert_eq!(
            s.last_reserved(3).unwrap(),
            None,
            "a failed reserve records nothing"
        );
        assert_eq!(names(&s.dir().join(TEMP_DIR)).len(), 0);
    }

    #[test]
    fn stale_temporary_files_are_removed_under_the_lock() {
        let tmp = tempfile::tempdir().unwrap();
        let s = DiskStore::open(tmp.path(), "net").unwrap();
        let stale = s.dir().join(TEMP_DIR).join("1.0");
        fs::write(&stale, "half").unwrap();
        let _lock = s.lock().unwrap();
        assert!(!stale.exists());
        assert!(s.reservations().unwrap().is_empty());
    }

    #[test]
    fn lock_wait_is_bounded_and_names_the_lock() {
        let tmp = tempfile::tempdir().unwrap();
        let holder = DiskStore::open(tmp.path(), "net").unwrap();
        let waiter = DiskStore::open(tmp.path(), "net")
            .unwrap()
            .with_lock_timeout(Duration::from_millis(20));
        let held = holder.lock().unwrap();
        let e = waiter.lock().unwrap_err();
        assert_eq!(e.code(), 11, "{e}");
        let lock_path = tmp.path().join("net/lock");
        assert!(
            e.to_string().contains(&lock_path.display().to_string()),
            "{e}"
        );
        drop(held);
        let _again = waiter.lock().unwrap();
    }

    #[test]
    fn network_names_that_escape_the_data_dir_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        for bad in ["", ".", "..", "a/b", "../x", "/abs", "nul\0"] {
            let e = DiskStore::open(tmp.path(), bad).unwrap_err();
            assert_eq!(e.code(), 7, "{bad:?}: {e}");
            assert!(e.to_string().contains("name="), "{e}");
        }
        assert!(DiskStore::open(tmp.path(), "..ok").is_ok());
    }
}
