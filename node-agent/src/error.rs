//! The agent's one error type. Each message names the value that was wrong.
use std::io;

#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },

    /// A flag, environment variable or API field with a value we cannot use.
    #[error("{what}={value:?}: {why}")]
    Invalid {
        what: String,
        value: String,
        why: String,
    },

    #[error("Kubernetes API: {what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: Box<kube::Error>,
    },

    #[error("Kubernetes client configuration (KUBECONFIG, or the pod's service account): {0}")]
    KubeConfig(String),

    /// Netlink, a network namespace, a lock or bpffs.
    #[error(transparent)]
    Host(#[from] sluice_host::Error),

    #[error(transparent)]
    Maps(#[from] sluice_maps::Error),
}

impl Error {
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }

    pub(crate) fn invalid(
        what: impl Into<String>,
        value: impl std::fmt::Display,
        why: impl Into<String>,
    ) -> Self {
        Self::Invalid {
            what: what.into(),
            value: value.to_string(),
            why: why.into(),
        }
    }

    pub(crate) fn kube(what: impl Into<String>, source: kube::Error) -> Self {
        Self::Kube {
            what: what.into(),
            source: Box::new(source),
        }
    }
}

pub(crate) type Result<T> = std::result::Result<T, Error>;
