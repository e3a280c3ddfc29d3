//! The error type of the node's kernel interfaces. Each variant keeps what
//! failed and why (the kernel's errno as an `io::Error` source where there is
//! one); the plugin maps them to CNI codes, the agent logs them.
use std::io;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A netlink request failed; `source` carries the kernel's errno when it
    /// sent one.
    #[error("netlink {op} failed: {source}")]
    Netlink {
        op: String,
        #[source]
        source: io::Error,
    },

    #[error("I/O error while {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },

    /// A path that is not a usable network namespace.
    #[error("network namespace {path}: {reason}")]
    Netns { path: String, reason: String },

    /// A pin root that is not on a bpffs mount (and could not be mounted).
    #[error("{path} is not on a bpffs mount")]
    NotBpffs { path: String },

    /// A lock another process held for longer than the wait allowed.
    #[error("lock {path} still held by another invocation after {waited_secs}s")]
    LockBusy { path: String, waited_secs: u64 },
}

impl Error {
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }

    /// `Netlink` for `op`, with a message where no errno came back.
    pub fn netlink(op: impl Into<String>, detail: impl std::fmt::Display) -> Self {
        Self::Netlink {
            op: op.into(),
            source: io::Error::other(detail.to_string()),
        }
    }

    pub(crate) fn netns(path: &std::path::Path, reason: impl Into<String>) -> Self {
        Self::Netns {
            path: path.display().to_string(),
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netlink_errors_keep_the_errno() {
        let e = Error::Netlink {
            op: "add route 10.0.0.0/24".into(),
            source: io::Error::from_raw_os_error(libc::EEXIST),
        };
        let source = std::error::Error::source(&e)
            .and_then(|s| s.downcast_ref::<io::Error>())
            .expect("an io::Error source");
        assert_eq!(source.raw_os_error(), Some(libc::EEXIST));
        assert!(e
            .to_string()
            .starts_with("netlink add route 10.0.0.0/24 failed: "));
    }
}
