//! The one error type of the map layer. Each variant names what was being done
//! and keeps the cause.
use std::{io, path::PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Nothing is pinned where a map should be.
    #[error("no datapath pinned at {root} ({path} is missing): no pod attached yet, or wrong network/pin root")]
    NotPinned { root: PathBuf, path: PathBuf },

    /// The pin root is root-only and the caller cannot see into it.
    #[error("reading {path} needs root (CAP_BPF and CAP_SYS_ADMIN, and access to the root-only pin root)")]
    NeedsRoot {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// A map operation failed.
    #[error("{op} ({map})")]
    Map {
        op: String,
        map: &'static str,
        #[source]
        source: aya::maps::MapError,
    },

    /// A program operation failed.
    #[error("{op}")]
    Program {
        op: String,
        #[source]
        source: aya::programs::ProgramError,
    },

    /// A system call or file operation failed.
    #[error("{op}")]
    Io {
        op: String,
        #[source]
        source: io::Error,
    },

    /// A pinned map has another shape than this layout's.
    #[error("the pinned map {path} has {found}, map layout v{layout} needs {wanted}; the pin root holds another map layout (remove it or migrate)")]
    Shape {
        path: PathBuf,
        found: String,
        wanted: String,
        layout: u32,
    },

    /// A hostPort (port, protocol, host address) is mapped already.
    #[error("hostPort {port} is mapped already (to {target}, by {owner})")]
    PortConflict {
        port: String,
        target: String,
        owner: String,
    },

    /// A map has no room for another entry.
    #[error("the map {map} is full ({max} entries): the entry was not written; raise the limit or remove entries")]
    Full { map: &'static str, max: u32 },

    /// CHECK: the maps do not hold what the attachment should have.
    #[error("{0}")]
    Check(String),
}

impl Error {
    pub(crate) fn map(
        op: impl Into<String>,
        map: &'static str,
        source: aya::maps::MapError,
    ) -> Self {
        Self::Map {
            op: op.into(),
            map,
            source,
        }
    }

    pub(crate) fn io(op: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            op: op.into(),
            source,
        }
    }
}

/// Whether a map error says the key was not there.
pub(crate) fn is_not_found(e: &aya::maps::MapError) -> bool {
    match e {
        aya::maps::MapError::KeyNotFound => true,
        aya::maps::MapError::SyscallError(s) => s.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
}

/// Whether a map error says the key exists (`BPF_NOEXIST`).
pub(crate) fn is_exists(e: &aya::maps::MapError) -> bool {
    matches!(e, aya::maps::MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(libc::EEXIST))
}
