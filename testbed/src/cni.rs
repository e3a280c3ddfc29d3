//! A CNI plugin run as a runtime runs it (CNI spec, "Section 2: Execution
//! Protocol"): parameters in `CNI_*` environment variables, the network config
//! on stdin, a result or an error on stdout.
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{
    err,
    exec::{self, Output},
    Result,
};

/// Directory of the reference CNI plugins (`SLUICE_CNI_PATH`, default
/// `/usr/lib/cni`, where Debian's containernetworking-plugins puts them).
pub fn reference_dir() -> PathBuf {
    std::env::var_os("SLUICE_CNI_PATH")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("/usr/lib/cni"), PathBuf::from)
}

/// A reference plugin (`bridge`, `host-local`, `portmap`, ...) from [`reference_dir`].
pub fn reference_plugin(name: &str) -> Result<PathBuf> {
    let p = reference_dir().join(name);
    if p.is_file() {
        Ok(p)
    } else {
        Err(err!(
            "reference plugin {} not found; install containernetworking-plugins or set SLUICE_CNI_PATH",
            p.display()
        ))
    }
}

/// The parameters of one invocation.
#[derive(Clone, Copy, Debug)]
pub struct Invocation<'a> {
    pub command: &'a str,
    /// Left out of the environment when empty (tests of missing parameters).
    pub container_id: &'a str,
    /// Left out of the environment when empty.
    pub ifname: &'a str,
    /// The pod's namespace (`CNI_NETNS`), when there is one.
    pub netns: Option<&'a Path>,
}

impl Invocation<'_> {
    /// The `CNI_*` environment: `CNI_COMMAND`, `CNI_CONTAINERID` and
    /// `CNI_IFNAME` (when not empty), `CNI_NETNS` (when given), `CNI_PATH` (the
    /// reference plugins' directory, for delegated IPAM).
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![("CNI_COMMAND".to_string(), self.command.to_string())];
        if !self.container_id.is_empty() {
            env.push(("CNI_CONTAINERID".into(), self.container_id.into()));
        }
        if !self.ifname.is_empty() {
            env.push(("CNI_IFNAME".into(), self.ifname.into()));
        }
        if let Some(p) = self.netns {
            env.push(("CNI_NETNS".into(), p.display().to_string()));
        }
        env.push(("CNI_PATH".into(), reference_dir().display().to_string()));
        env
    }

    /// Runs `plugin` with this environment and `conf` on stdin, in the
    /// namespace at `node` when given (else in the caller's), and returns its
    /// result: the parsed stdout (Null when empty). A failed run is an error
    /// carrying what the plugin printed.
    pub fn run(&self, node: Option<&Path>, plugin: &Path, conf: &Value) -> Result<Value> {
        let out = exec::run(node, plugin, &[], &self.env(), conf.to_string().as_bytes())?;
        result(self.command, &out)
    }
}

/// The result a plugin run printed: its stdout parsed (Null when empty), or an
/// error with everything it printed when it failed.
pub fn result(command: &str, out: &Output) -> Result<Value> {
    if !out.success() {
        return Err(err!("{command} failed: {out}"));
    }
    if out.stdout.trim().is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_str(&out.stdout)
        .map_err(|e| err!("{command} printed no JSON result ({e}): {out}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(status: Option<i32>, stdout: &str) -> Output {
        Output {
            what: "sluice".into(),
            status,
            stdout: stdout.into(),
            stderr: String::new(),
        }
    }

    #[test]
    fn the_environment_leaves_out_empty_parameters() {
        let pod = Path::new("/run/netns/p");
        let full = Invocation {
            command: "ADD",
            container_id: "c1",
            ifname: "eth0",
            netns: Some(pod),
        }
        .env();
        let keys: Vec<&str> = full.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "CNI_COMMAND",
                "CNI_CONTAINERID",
                "CNI_IFNAME",
                "CNI_NETNS",
                "CNI_PATH"
            ]
        );
        assert_eq!(full[3].1, "/run/netns/p");
        let bare = Invocation {
            command: "STATUS",
            container_id: "",
            ifname: "",
            netns: None,
        }
        .env();
        let keys: Vec<&str> = bare.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["CNI_COMMAND", "CNI_PATH"]);
    }

    #[test]
    fn a_result_is_parsed_and_a_failure_carries_the_output() {
        let ok = result("ADD", &output(Some(0), r#"{"cniVersion":"1.1.0"}"#)).unwrap();
        assert_eq!(ok["cniVersion"], "1.1.0");
        assert!(result("DEL", &output(Some(0), " \n")).unwrap().is_null());
        let e = result("ADD", &output(Some(1), r#"{"code":7,"msg":"bad"}"#)).unwrap_err();
        assert!(
            e.0.contains("ADD failed") && e.0.contains("\"code\":7"),
            "{e}"
        );
        let e = result("ADD", &output(Some(0), "not json")).unwrap_err();
        assert!(e.0.contains("no JSON result"), "{e}");
    }
}
