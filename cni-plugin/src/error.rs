//! The plugin's one error type, and its mapping to CNI error codes (spec section 5,
//! "Error"; codes 50 and 51 from spec 1.1.0 STATUS).
use std::io;

/// Everything that can go wrong in the plugin. Each variant names the value that
/// was wrong so that the message alone tells an operator what to fix.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Code 1.
    #[error("incompatible CNI version {version:?}: {reason}")]
    IncompatibleVersion { version: String, reason: String },

    /// Code 2: the spec requires the key and the value in the message.
    #[error("unsupported field {key}={value}: {reason}")]
    UnsupportedField {
        key: String,
        value: String,
        reason: String,
    },

    /// Code 3.
    #[error("unknown container {container_id:?}: {reason}")]
    UnknownContainer {
        container_id: String,
        reason: String,
    },

    /// Code 4: names the variable(s).
    #[error("invalid environment variable {name}={value:?}: {reason}")]
    InvalidEnv {
        name: String,
        value: String,
        reason: String,
    },

    /// Code 5.
    #[error("I/O error while {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },

    /// Code 6.
    #[error("failed to decode {what}: {reason}")]
    Decode { what: String, reason: String },

    /// Code 7: names the key and the value.
    #[error("invalid network config: {key}={value}: {reason}")]
    InvalidConfig {
        key: String,
        value: String,
        reason: String,
    },

    /// Code 11.
    #[error("try again later: {reason}")]
    TryAgain { reason: String },

    /// Code 50 (STATUS): ADD cannot succeed now.
    #[error("plugin not available: {reason}")]
    NotAvailable { reason: String },

    /// Code 100: a netlink request failed.
    #[error("netlink {op} failed: {detail}")]
    Netlink { op: String, detail: String },

    /// Code 101: loading, attaching or updating the eBPF datapath failed.
    #[error("datapath {op} failed")]
    Datapath {
        op: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// Code 102: no address left in the configured ranges.
    #[error("no free IP address in {ranges}")]
    IpamExhausted { ranges: String },

    /// Code 103: a specifically requested address cannot be given.
    #[error("requested IP {ip} is not available: {reason}")]
    IpamUnavailable { ip: String, reason: String },

    /// Code 104: a delegated plugin (IPAM) returned an error; its own code is kept
    /// in `code` and is what the runtime sees.
    #[error("delegated plugin {plugin} failed: {msg}")]
    Delegate {
        plugin: String,
        code: u32,
        msg: String,
        details: String,
    },

    /// Maintenance command line (`sluice datapath ...`) not understood.
    #[error("{0}")]
    Usage(String),

    /// Code 105: CHECK found the attachment not as ADD left it.
    #[error("check failed: {what}")]
    CheckFailed { what: String },

    /// Code 106: a hostPort is already mapped, by `owner`.
    #[error("port mapping conflict: {port} is already mapped to {target} by {owner}")]
    PortConflict {
        port: String,
        target: String,
        owner: String,
    },

    /// Several steps of a teardown failed (DEL, GC, rollback go on past an
    /// error). The code is the first one's; the message names them all.
    #[error("{} steps failed: {}", .0.len(), list_details(.0))]
    Several(Vec<Error>),
}

/// The shared kernel interfaces' errors as the plugin's, each with the CNI
/// code it always had: a namespace path comes from `CNI_NETNS` (code 4), a
/// pin root from the config's `pinRoot` (7), a lock held too long asks the
/// runtime to try again (11).
impl From<sluice_host::Error> for Error {
    fn from(e: sluice_host::Error) -> Self {
        use sluice_host::Error as Host;
        match e {
            Host::Netlink { op, source } => Self::Netlink {
                op,
                detail: source.to_string(),
            },
            Host::Io { context, source } => Self::Io { context, source },
            Host::Netns { path, reason } => Self::env("CNI_NETNS", path, reason),
            Host::NotBpffs { path } => Self::config("pinRoot", path, "is not on a bpffs mount"),
            e @ Host::LockBusy { .. } => Self::TryAgain {
                reason: e.to_string(),
            },
        }
    }
}

fn list_details(errors: &[Error]) -> String {
    errors
        .iter()
        .enumerate()
        .map(|(i, e)| format!("({}) {}", i + 1, e.details()))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Collects the errors of steps that go on past failures (teardown), so that
/// none is lost: [`Errors::finish`] gives `Ok`, the one error, or
/// [`Error::Several`].
#[derive(Debug, Default)]
pub struct Errors(Vec<Error>);

impl Errors {
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps the error of `r`, if any.
    pub fn note<T, E: Into<Error>>(&mut self, r: std::result::Result<T, E>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.push(e.into());
                None
            }
        }
    }

    /// Keeps `e` (the parts of an [`Error::Several`] one by one).
    pub fn push(&mut self, e: Error) {
        match e {
            Error::Several(v) => self.0.extend(v),
            e => self.0.push(e),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn finish(mut self) -> Result<()> {
        match self.0.len() {
            0 => Ok(()),
            1 => Err(self.0.remove(0)),
            _ => Err(Error::Several(self.0)),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The CNI error code of this error.
    pub fn code(&self) -> u32 {
        match self {
            Self::IncompatibleVersion { .. } => 1,
            Self::UnsupportedField { .. } => 2,
            Self::UnknownContainer { .. } => 3,
            // A bad command line is a bad environment too.
            Self::InvalidEnv { .. } | Self::Usage(_) => 4,
            Self::Io { .. } => 5,
            Self::Decode { .. } => 6,
            Self::InvalidConfig { .. } => 7,
            Self::TryAgain { .. } => 11,
            Self::NotAvailable { .. } => 50,
            Self::Netlink { .. } => 100,
            Self::Datapath { .. } => 101,
            Self::IpamExhausted { .. } => 102,
            Self::IpamUnavailable { .. } => 103,
            Self::Delegate { code, .. } => *code,
            Self::CheckFailed { .. } => 105,
            Self::PortConflict { .. } => 106,
            Self::Several(v) => v.first().map_or(999, Self::code),
        }
    }

    /// A short phrase for the CNI `msg` field.
    pub fn short(&self) -> &'static str {
        match self {
            Self::IncompatibleVersion { .. } => "incompatible CNI version",
            Self::UnsupportedField { .. } => "unsupported field in network configuration",
            Self::UnknownContainer { .. } => "container unknown or does not exist",
            Self::InvalidEnv { .. } => "invalid environment variables",
            Self::Io { .. } => "I/O failure",
            Self::Decode { .. } => "failed to decode content",
            Self::InvalidConfig { .. } => "invalid network config",
            Self::TryAgain { .. } => "try again later",
            Self::NotAvailable { .. } => "plugin not available",
            Self::Netlink { .. } => "netlink operation failed",
            Self::Datapath { .. } => "eBPF datapath operation failed",
            Self::IpamExhausted { .. } => "no IP addresses available",
            Self::IpamUnavailable { .. } => "requested IP address not available",
            Self::Delegate { .. } => "delegated plugin failed",
            Self::CheckFailed { .. } => "attachment is not as expected",
            Self::PortConflict { .. } => "port mapping conflict",
            Self::Usage(_) => "invalid arguments",
            Self::Several(v) => v.first().map_or("several failures", Self::short),
        }
    }

    /// `Io` with what the plugin was doing.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }

    /// `InvalidConfig` naming the key and the value.
    pub fn config(
        key: impl Into<String>,
        value: impl std::fmt::Display,
        reason: impl Into<String>,
    ) -> Self {
        Self::InvalidConfig {
            key: key.into(),
            value: value.to_string(),
            reason: reason.into(),
        }
    }

    /// `InvalidEnv` naming the variable and its value.
    pub fn env(
        name: impl Into<String>,
        value: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Self::InvalidEnv {
            name: name.into(),
            value: value.into(),
            reason: reason.into(),
        }
    }

    pub fn netlink(op: impl Into<String>, detail: impl std::fmt::Display) -> Self {
        Self::Netlink {
            op: op.into(),
            detail: detail.to_string(),
        }
    }

    /// `Datapath` for `op`, keeping `source` (an error, or a message).
    pub fn datapath(
        op: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Datapath {
            op: op.into(),
            source: source.into(),
        }
    }

    pub fn check(what: impl Into<String>) -> Self {
        Self::CheckFailed { what: what.into() }
    }

    /// The `details` of the CNI error: the full message with its causes.
    pub fn details(&self) -> String {
        match self {
            Self::Delegate { details, .. } if !details.is_empty() => {
                format!("{self}: {details}")
            }
            Self::Several(_) => self.to_string(),
            _ => {
                let mut s = self.to_string();
                let mut src = std::error::Error::source(self);
                while let Some(e) = src {
                    s.push_str(": ");
                    s.push_str(&e.to_string());
                    src = e.source();
                }
                s
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_the_spec_table() {
        let cases: Vec<(Error, u32)> = vec![
            (
                Error::IncompatibleVersion {
                    version: "9.9.9".into(),
                    reason: "x".into(),
                },
                1,
            ),
            (
                Error::UnsupportedField {
                    key: "k".into(),
                    value: "v".into(),
                    reason: "x".into(),
                },
                2,
            ),
            (
                Error::InvalidEnv {
                    name: "CNI_IFNAME".into(),
                    value: String::new(),
                    reason: "x".into(),
                },
                4,
            ),
            (Error::io("reading stdin", io::Error::other("boom")), 5),
            (
                Error::Decode {
                    what: "config".into(),
                    reason: "x".into(),
                },
                6,
            ),
            (Error::config("mtu", "abc", "not a number"), 7),
            (Error::TryAgain { reason: "x".into() }, 11),
        ];
        for (e, code) in cases {
            assert_eq!(e.code(), code, "{e}");
        }
    }

    /// The shared crate's errors keep the codes the plugin always gave them.
    #[test]
    fn host_errors_keep_their_cni_codes() {
        use sluice_host::Error as Host;
        let nl = Host::Netlink {
            op: "add link".into(),
            source: io::Error::from_raw_os_error(libc::EEXIST),
        };
        assert_eq!(Error::from(nl).code(), 100);
        let io = Host::io("reading x", io::Error::other("boom"));
        assert_eq!(Error::from(io).code(), 5);
        let ns = Error::from(Host::Netns {
            path: "/run/netns/gone".into(),
            reason: "cannot open".into(),
        });
        assert_eq!(ns.code(), 4);
        assert!(ns.to_string().contains("CNI_NETNS"), "{ns}");
        let pin = Error::from(Host::NotBpffs {
            path: "/tmp/pins".into(),
        });
        assert_eq!(pin.code(), 7);
        assert!(pin.to_string().contains("pinRoot=/tmp/pins"), "{pin}");
        let busy = Error::from(Host::LockBusy {
            path: "/run/x.lock".into(),
            waited_secs: 30,
        });
        assert_eq!(busy.code(), 11);
        assert!(busy.to_string().contains("/run/x.lock"), "{busy}");
    }

    #[test]
    fn teardown_errors_are_all_kept() {
        let mut errs = Errors::new();
        assert!(errs.note(Ok::<_, Error>(1)).is_some());
        errs.note::<(), Error>(Err(Error::check("first")));
        errs.note::<(), Error>(Err(Error::datapath("detach", "second")));
        let e = errs.finish().unwrap_err();
        assert_eq!(e.code(), 105);
        let d = e.details();
        assert!(
            d.contains("first") && d.contains("detach failed: second"),
            "{d}"
        );
        let mut one = Errors::new();
        one.push(Error::datapath("x", io::Error::other("y")));
        let e = one.finish().unwrap_err();
        assert_eq!(e.code(), 101);
        assert_eq!(e.details(), "datapath x failed: y");
        assert!(Errors::new().finish().is_ok());
    }

    #[test]
    fn config_errors_name_key_and_value() {
        let e = Error::config("ipam.subnet", "10.0.0.0/33", "not a CIDR");
        let s = e.to_string();
        assert!(
            s.contains("ipam.subnet") && s.contains("10.0.0.0/33"),
            "{s}"
        );
    }
}
