//! Harness of Sluice's privileged integration tests, in the spirit of netavark's
//! `test/helpers.bash`: every test builds its own node namespace ([`Node`]) with
//! pod namespaces ([`Pod`]) in it, runs the real `sluice` binary in the node
//! namespace the way a container runtime does, looks at what it made with `ip`
//! and `bpftool`, and removes everything it made when it ends, also when it fails.
//!
//! Binaries come from the environment, never from guessed paths:
//! - `SLUICE_BIN`: the `sluice` plugin (absolute path, required);
//! - `SLUICECTL_BIN`: `sluicectl` (absolute path, required by the tests using it);
//! - `SLUICE_NODE_BIN`: `sluice-node`, the node agent (required by its tests);
//! - `SLUICE_KUBE_VALIDATE_BIN`: `kubernetes-validate` (the manifest test);
//! - `SLUICE_CNI_PATH`: directory of the reference plugins (default `/usr/lib/cni`);
//! - `SLUICE_NEXT_BIN`: a second `sluice` embedding another eBPF object (absolute
//!   path, required by the upgrade tests).
//!
//! Functions that can fail for reasons outside the test's control return
//! [`Result`]; the `expect_*`/`assert_*` helpers panic with the whole context
//! (command, exit code, stdout, stderr) when what they check does not hold.
// Test packets, socket options and payloads are built from small lengths and
// values that fit the fields they go into.
#![expect(clippy::cast_possible_truncation, reason = "test packets: values fit")]

pub mod agent;
pub mod apiserver;
pub mod attached;
pub mod bandwidth;
pub mod cni;
pub mod counters;
pub mod cri;
pub mod ctl;
pub mod fixtures;
pub mod host;
pub mod hostport;
pub mod kernel;
pub mod kube_cluster;
pub mod kube_services;
pub mod leaks;
pub mod look;
pub mod masq;
pub mod node;
pub mod oci;
pub mod prometheus;
pub mod raw;
pub mod reach;
pub mod schema;
pub mod sockopt;
pub mod stream;
pub mod traffic;

use std::path::PathBuf;

pub use cni::{with_prev_result, CniError, CniOutput};
pub use counters::Counters;
pub use host::Host;
pub use node::{Node, Pod, NETWORK};

/// Every CNI version Sluice supports, oldest first.
pub const VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

// One error type with the testbed the harness is built on: its `Result`, its
// `err!`, its program runner.
pub use sluice_testbed::{err, exec, kube_proxy, Error, Result};

/// An absolute path from a required environment variable.
fn binary_from_env(var: &str, what: &str) -> Result<PathBuf> {
    let v = std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            err!(
                "{var} is not set: point it at the {what} binary with an absolute path \
             (e.g. {var}=$PWD/target/debug/{what}); the tests do not guess paths"
            )
        })?;
    let p = PathBuf::from(v);
    if !p.is_absolute() {
        return Err(err!("{var}={} must be an absolute path", p.display()));
    }
    if !p.is_file() {
        return Err(err!("{var}={} is not a file; build it first", p.display()));
    }
    Ok(p)
}

/// The `sluice` plugin under test (`SLUICE_BIN`).
pub fn sluice_bin() -> Result<PathBuf> {
    binary_from_env("SLUICE_BIN", "sluice")
}

/// `sluicectl` (`SLUICECTL_BIN`).
pub fn sluicectl_bin() -> Result<PathBuf> {
    binary_from_env("SLUICECTL_BIN", "sluicectl")
}

/// `kubernetes-validate` (`SLUICE_KUBE_VALIDATE_BIN`; `cargo xtask test`
/// installs it in a virtualenv whose `python` has PyYAML).
pub fn kube_validate_bin() -> Result<PathBuf> {
    binary_from_env("SLUICE_KUBE_VALIDATE_BIN", "kubernetes-validate")
}

/// `sluice-node`, the node agent (`SLUICE_NODE_BIN`).
pub fn sluice_node_bin() -> Result<PathBuf> {
    binary_from_env("SLUICE_NODE_BIN", "sluice-node")
}

/// A `sluice` embedding a different eBPF object than [`sluice_bin`]'s
/// (`SLUICE_NEXT_BIN`, built by `cargo xtask test`): what an upgrade installs.
pub fn sluice_next_bin() -> Result<PathBuf> {
    binary_from_env("SLUICE_NEXT_BIN", "sluice-next")
}

/// `embeddedObjectHash` of `<binary> datapath version`: the eBPF object a
/// `sluice` binary carries.
pub fn embedded_object_hash(binary: &std::path::Path) -> Result<String> {
    let out = exec::run(None, binary, &["datapath", "version"], &[], b"")?;
    if !out.success() {
        return Err(err!("{out}"));
    }
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim())?;
    v["embeddedObjectHash"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| err!("no embeddedObjectHash: {out}"))
}

/// Directory of the reference CNI plugins (`SLUICE_CNI_PATH`, default `/usr/lib/cni`).
pub fn cni_path() -> PathBuf {
    sluice_testbed::cni::reference_dir()
}

/// A reference plugin from [`cni_path`].
pub fn reference_plugin(name: &str) -> Result<PathBuf> {
    sluice_testbed::cni::reference_plugin(name)
}
