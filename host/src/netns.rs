//! Network namespaces: open one by path and run a closure inside it on this thread.
//!
//! The plugin runs in the node's namespace (spec section 2). It enters a pod's
//! namespace only briefly, to open a netlink socket there: a socket stays bound to
//! the namespace it was created in, so everything else runs from the node.
use std::{
    fs::File,
    os::{fd::AsFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
};

use nix::sched::{setns, CloneFlags};

use crate::Error;

/// An open network namespace.
#[derive(Debug)]
pub struct Netns {
    file: File,
    path: PathBuf,
}

impl Netns {
    /// Opens the namespace at `path` (e.g. `/run/netns/x` or `/proc/<pid>/ns/net`).
    /// (The plugin's error names `CNI_NETNS`, where its paths come from.)
    pub fn open(path: &Path) -> Result<Self, Error> {
        let file = File::open(path)
            .map_err(|e| Error::netns(path, format!("cannot open the network namespace: {e}")))?;
        let ns = Self {
            file,
            path: path.to_path_buf(),
        };
        // A regular file would be accepted by open() but fail setns(); say so early.
        if !ns.is_netns() {
            return Err(Error::netns(path, "is not a network namespace"));
        }
        Ok(ns)
    }

    /// The namespace this thread is in now.
    pub fn current() -> Result<Self, Error> {
        let path = PathBuf::from("/proc/thread-self/ns/net");
        let file =
            File::open(&path).map_err(|e| Error::io("opening /proc/thread-self/ns/net", e))?;
        Ok(Self { file, path })
    }

    fn is_netns(&self) -> bool {
        // nsfs files report their type through the NS_GET_NSTYPE ioctl; checking
        // the filesystem magic is simpler and sufficient: NSFS_MAGIC = 0x6e736673.
        nix::sys::statfs::fstatfs(self.file.as_fd())
            .is_ok_and(|s| s.filesystem_type().0 == 0x6e73_6673)
    }

    /// Inode number: identifies the namespace (same inode = same namespace).
    pub fn inode(&self) -> u64 {
        self.file.metadata().map_or(0, |m| m.ino())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Runs `f` with this thread inside the namespace, then returns to the namespace
    /// the thread was in, whether `f` succeeded or not.
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> Result<T, Error> {
        let home = Self::current()?;
        setns(self.file.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|e| {
            Error::io(
                format!("entering network namespace {}", self.path.display()),
                e.into(),
            )
        })?;
        let out = f();
        // Failing to return would leave the rest of the plugin in the pod's
        // namespace; there is no safe way to continue.
        if let Err(e) = setns(home.file.as_fd(), CloneFlags::CLONE_NEWNET) {
            eprintln!("sluice: cannot return to the node network namespace: {e}");
            std::process::abort();
        }
        Ok(out)
    }
}
