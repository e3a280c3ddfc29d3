//! Delegation to another IPAM plugin (spec section 4): find it in `CNI_PATH`, run it
//! with our environment and the whole network config on stdin, pass its stderr
//! through, and read its result or error from stdout.
use std::{
    io::{Read, Write},
    path::{Path, PathBuf},
    process::{Command as Process, Stdio},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    cni::{env::Command, result::CniResult, AttachmentId},
    error::Error,
};

/// A delegated plugin that has not answered after this long is killed.
pub const DELEGATE_TIMEOUT: Duration = Duration::from_mins(1);

/// Most a delegated plugin may print.
const MAX_OUTPUT: u64 = 4 << 20;

pub struct Delegate {
    plugin: String,
    binary: PathBuf,
}

impl Delegate {
    /// Looks `plugin` up in the `CNI_PATH` directories.
    pub fn find(plugin: &str, cni_path: &[PathBuf]) -> Result<Self, Error> {
        if cni_path.is_empty() {
            return Err(Error::env(
                "CNI_PATH",
                "",
                format!("is needed to find the IPAM plugin {plugin:?}"),
            ));
        }
        for dir in cni_path {
            let p = dir.join(plugin);
            if is_executable(&p) {
                return Ok(Self {
                    plugin: plugin.to_string(),
                    binary: p,
                });
            }
        }
        let joined: Vec<String> = cni_path.iter().map(|p| p.display().to_string()).collect();
        Err(Error::config(
            "ipam.type",
            plugin,
            format!(
                "no executable of that name in CNI_PATH ({})",
                joined.join(":")
            ),
        ))
    }

    pub fn name(&self) -> &str {
        &self.plugin
    }

    /// Runs the plugin with `command`, the rest of our environment unchanged, and
    /// `stdin`. Returns its stdout on success.
    pub fn exec(&self, command: Command, stdin: &[u8]) -> Result<Vec<u8>, Error> {
        self.exec_as(command, stdin, None)
    }

    /// As [`Self::exec`], on behalf of attachment `id` (GC runs DEL for attachments
    /// it did not get in its environment).
    pub fn exec_as(
        &self,
        command: Command,
        stdin: &[u8],
        id: Option<&AttachmentId>,
    ) -> Result<Vec<u8>, Error> {
        let mut proc = Process::new(&self.binary);
        proc.env("CNI_COMMAND", command.to_string());
        if let Some(id) = id {
            proc.env("CNI_CONTAINERID", &id.container_id)
                .env("CNI_IFNAME", &id.ifname);
        }
        let mut child = proc
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| Error::io(format!("executing {}", self.binary.display()), e))?;
        let mut child_stdin = child.stdin.take();
        let mut child_stdout = child.stdout.take();
        // Feed stdin and drain stdout on their own threads so that neither pipe can
        // fill up and stall the plugin while we wait for it with a deadline.
        let input = stdin.to_vec();
        let writer = thread::spawn(move || {
            if let Some(mut s) = child_stdin.take() {
                let _ = s.write_all(&input);
            }
        });
        let reader = thread::spawn(move || {
            let mut out = Vec::new();
            if let Some(s) = child_stdout.take() {
                let _ = s.take(MAX_OUTPUT).read_to_end(&mut out);
            }
            out
        });
        let start = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(st)) => break st,
                Ok(None) if start.elapsed() > DELEGATE_TIMEOUT => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(Error::TryAgain {
                        reason: format!(
                            "IPAM plugin {} did not finish {command} within {}s",
                            self.plugin,
                            DELEGATE_TIMEOUT.as_secs()
                        ),
                    });
                }
                Ok(None) => thread::sleep(Duration::from_millis(2)),
                Err(e) => return Err(Error::io(format!("waiting for {}", self.plugin), e)),
            }
        };
        let _ = writer.join();
        let out = reader.join().unwrap_or_default();
        if status.success() {
            return Ok(out);
        }
        Err(self.error_from(&out, status.code()))
    }

    /// The plugin's CNI error, keeping its code; or a generic one if it printed none.
    fn error_from(&self, out: &[u8], exit: Option<i32>) -> Error {
        let parsed: Option<Value> = serde_json::from_slice(out).ok();
        let field = |k: &str| {
            parsed
                .as_ref()
                .and_then(|v| v.get(k))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let code = parsed
            .as_ref()
            .and_then(|v| v.get("code"))
            .and_then(Value::as_u64)
            .and_then(|c| u32::try_from(c).ok())
            .unwrap_or(999);
        let mut msg = field("msg");
        if msg.is_empty() {
            msg = format!(
                "exited with status {} and no CNI error on stdout",
                exit.map_or("signal".to_string(), |c| c.to_string())
            );
        }
        Error::Delegate {
            plugin: self.plugin.clone(),
            code,
            msg,
            details: field("details"),
        }
    }

    /// ADD: the plugin's (abbreviated) result.
    pub fn add(&self, stdin: &[u8]) -> Result<CniResult, Error> {
        let out = self.exec(Command::Add, stdin)?;
        let v: Value = serde_json::from_slice(&out).map_err(|e| Error::Decode {
            what: format!("result of IPAM plugin {}", self.plugin),
            reason: e.to_string(),
        })?;
        CniResult::from_json(&v, &format!("result of IPAM plugin {}", self.plugin))
    }

    /// Whether the plugin speaks `version` (its VERSION answer lists it).
    pub fn supports(&self, version: &str) -> bool {
        let probe = format!("{{\"cniVersion\":\"{version}\"}}");
        self.exec(Command::Version, probe.as_bytes())
            .ok()
            .and_then(|out| serde_json::from_slice::<Value>(&out).ok())
            .and_then(|v| v.get("supportedVersions").cloned())
            .and_then(|s| s.as_array().cloned())
            .is_some_and(|a| a.iter().any(|x| x.as_str() == Some(version)))
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn finds_plugin_in_cni_path_and_names_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        script(dir.path(), "fake-ipam", "exit 0");
        assert!(Delegate::find(
            "fake-ipam",
            &[PathBuf::from("/nonexistent"), dir.path().into()]
        )
        .is_ok());
        let e = Delegate::find("nope", &[dir.path().into()]).err().unwrap();
        assert_eq!(e.code(), 7);
        assert!(e.to_string().contains("nope"));
        let e = Delegate::find("fake-ipam", &[]).err().unwrap();
        assert_eq!(e.code(), 4);
        assert!(e.to_string().contains("CNI_PATH"));
    }

    #[test]
    fn reads_result_and_passes_command_and_stdin() {
        let dir = tempfile::tempdir().unwrap();
        // Echo the command into the result so the test sees what the plugin got.
        script(
            dir.path(),
            "fake-ipam",
            r#"read -r line; [ "$CNI_COMMAND" = ADD ] || exit 3
printf '{"cniVersion":"1.0.0","ips":[{"address":"10.5.0.2/24","gateway":"10.5.0.1"}]}'"#,
        );
        let d = Delegate::find("fake-ipam", &[dir.path().into()]).unwrap();
        let r = d.add(b"{\"x\":1}\n").unwrap();
        assert_eq!(r.ips[0].address.to_string(), "10.5.0.2/24");
    }

    #[test]
    fn keeps_the_delegate_error_code() {
        let dir = tempfile::tempdir().unwrap();
        script(
            dir.path(),
            "fake-ipam",
            r#"printf '{"cniVersion":"1.0.0","code":11,"msg":"busy","details":"try later"}'; exit 1"#,
        );
        let d = Delegate::find("fake-ipam", &[dir.path().into()]).unwrap();
        let e = d.add(b"{}").unwrap_err();
        assert_eq!(e.code(), 11);
        assert!(e.details().contains("try later"));
        script(dir.path(), "silent", "exit 2");
        let d = Delegate::find("silent", &[dir.path().into()]).unwrap();
        let e = d.exec(Command::Del, b"{}").unwrap_err();
        assert_eq!(e.code(), 999);
        assert!(e.to_string().contains("status 2"));
    }
}
