//! The node agent's Service mode on the Services table's Sluice nodes:
//! `sluice-node proxy` against the tests' stand-in API server
//! (`sluice-test-apiserver`: list, watch, resource versions, bookmarks, as
//! kube-rs uses them; `tests/harness/apiserver.rs` says what it leaves out)
//! writes the node's Service maps and attaches the socket hooks, as on a
//! cluster. Its apply times are figures of the table: from the agent's
//! start to every Service port written (a cold start: list, compute,
//! write), and from one EndpointSlice changed in the API to its Service
//! port rewritten (watch, compute, write), each the agent's own log line.
use std::{
    io::{BufRead, BufReader, Write},
    net::IpAddr,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use sluice_testbed::kube_proxy::{Protocol, Service};

/// Longest a cold start may take (10,000 Services on a slow machine).
pub(super) const COLD: Duration = Duration::from_mins(3);
/// Longest one change may take to show.
pub(super) const CHANGE: Duration = Duration::from_secs(20);

/// The stand-in API server, a child process fed over stdin.
pub(super) struct StandIn {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pub(super) port: u16,
}

impl StandIn {
    /// Starts `bin` serving on 127.0.0.1 inside `netns`.
    pub(super) fn start(bin: &Path, netns: &Path) -> Result<Self> {
        let mut child = Command::new(bin)
            .arg(netns)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            bail!("{}: no pipes", bin.display());
        };
        let mut s = Self {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            port: 0,
        };
        let first: Value = serde_json::from_str(&s.line()?)?;
        s.port = first["port"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .context("the stand-in API server printed no port")?;
        Ok(s)
    }

    fn line(&mut self) -> Result<String> {
        let mut l = String::new();
        if self.stdout.read_line(&mut l)? == 0 {
            bail!("the stand-in API server ended");
        }
        Ok(l.trim().to_string())
    }

    /// Creates or replaces `object` as a `resource`; the instant it was
    /// stored (what watches see from then on).
    pub(super) fn put(&mut self, resource: &str, object: &Value) -> Result<Instant> {
        writeln!(self.stdin, "{}", json!({"put": resource, "object": object}))?;
        self.stdin.flush()?;
        let answer = self.line()?;
        if answer != "ok" {
            bail!("the stand-in API server refused a {resource}: {answer}");
        }
        Ok(Instant::now())
    }

    /// Deletes the `resource` `namespace/name`; the instant it was stored
    /// (what watches see from then on).
    pub(super) fn delete(
        &mut self,
        resource: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Instant> {
        writeln!(
            self.stdin,
            "{}",
            json!({"delete": resource, "namespace": namespace, "name": name})
        )?;
        self.stdin.flush()?;
        let answer = self.line()?;
        if answer != "ok" {
            bail!(
                "the stand-in API server refused to delete {resource} {namespace}/{name}: {answer}"
            );
        }
        Ok(Instant::now())
    }

    /// A kubeconfig for a client in the stand-in's namespace.
    pub(super) fn kubeconfig(&self) -> String {
        json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": format!("http://127.0.0.1:{}", self.port)}}],
            "users": [{"name": "u", "user": {}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        })
        .to_string()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `svc` as the API serves it: the Service and its EndpointSlice (every
/// endpoint ready, on `node`).
pub(super) fn objects(svc: &Service) -> (Value, Value) {
    let proto = |p: Protocol| p.lower().to_uppercase();
    let ports: Vec<Value> = svc
        .ports
        .iter()
        .map(|p| json!({"name": p.name, "protocol": proto(p.protocol), "port": p.port, "targetPort": p.target_port}))
        .collect();
    let service = json!({
        "metadata": {"name": svc.name, "namespace": svc.namespace},
        "spec": {"type": "ClusterIP", "clusterIP": svc.cluster_ip.to_string(),
                 "clusterIPs": [svc.cluster_ip.to_string()], "ports": ports},
    });
    (
        service,
        slice(
            svc,
            &svc.endpoints
                .iter()
                .map(|e| (e.ip, e.node.as_str()))
                .collect::<Vec<_>>(),
        ),
    )
}

/// The EndpointSlice of `svc` with `endpoints` (address, node).
pub(super) fn slice(svc: &Service, endpoints: &[(IpAddr, &str)]) -> Value {
    let family = if svc.cluster_ip.is_ipv4() {
        "IPv4"
    } else {
        "IPv6"
    };
    json!({
        "metadata": {"name": format!("{}-1", svc.name), "namespace": svc.namespace,
                     "labels": {"kubernetes.io/service-name": svc.name,
                                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
        "addressType": family,
        "endpoints": endpoints.iter().map(|(ip, node)| json!({"addresses": [ip.to_string()], "nodeName": node,
            "conditions": {"ready": true, "serving": true, "terminating": false}})).collect::<Vec<_>>(),
        "ports": svc.ports.iter().map(|p| json!({"name": p.name, "protocol": p.protocol.lower().to_uppercase(),
            "port": p.target_port})).collect::<Vec<_>>(),
    })
}

/// `sluice-node proxy`, its log read as it comes.
pub(super) struct Agent {
    child: Child,
    lines: mpsc::Receiver<(Instant, String)>,
    /// Everything it said, for errors.
    said: Vec<String>,
}

impl Agent {
    /// Starts the agent of the node at `netns` (pin root `pin`), its hooks
    /// on `cgroup`, reaching the API with `kubeconfig` (a file).
    pub(super) fn start(
        bin: &Path,
        netns: &Path,
        kubeconfig: &Path,
        (pin, cgroup, node): (&Path, &Path, &str),
    ) -> Result<(Self, Instant)> {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", netns.display()))
            .arg(bin)
            .args(["proxy", "--node-name", node, "--pin-root"])
            .arg(pin)
            .arg("--cgroup")
            .arg(cgroup)
            // No pod's records: the bench's Services are TCP ones.
            .args(["--cni-state-dir", "/nonexistent"])
            .env("KUBECONFIG", kubeconfig);
        Self::spawn(bin, c)
    }

    /// Starts `sluice-node <args>` for the node at `netns`, reaching the API
    /// with `kubeconfig` (a file), with the environment `env`; killed with
    /// the bench if it dies (it may run through a whole table).
    pub(super) fn start_with(
        bin: &Path,
        netns: &Path,
        kubeconfig: &Path,
        args: &[std::ffi::OsString],
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Result<(Self, Instant)> {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", netns.display()))
            .arg("--")
            .arg(bin)
            .args(args)
            .env("KUBECONFIG", kubeconfig);
        for (k, v) in env {
            c.env(k, v);
        }
        sluice_testbed::exec::die_with_parent(&mut c);
        Self::spawn(bin, c)
    }

    fn spawn(bin: &Path, mut c: Command) -> Result<(Self, Instant)> {
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let t0 = Instant::now();
        let mut child = c
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let err = child.stderr.take().context("the agent's stderr")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(err)
                .lines()
                .map_while(std::result::Result::ok)
            {
                if tx.send((Instant::now(), l)).is_err() {
                    break;
                }
            }
        });
        Ok((
            Self {
                child,
                lines: rx,
                said: Vec::new(),
            },
            t0,
        ))
    }

    /// The first line from now on that `want` accepts, and when it came.
    pub(super) fn wait_for(
        &mut self,
        within: Duration,
        want: impl Fn(&str) -> bool,
    ) -> Result<Instant> {
        let end = Instant::now() + within;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((at, l)) => {
                    let hit = want(&l);
                    self.said.push(l);
                    if hit {
                        return Ok(at);
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => bail!(
                    "the agent did not get there within {within:?}; it said:\n{}",
                    self.said.join("\n")
                ),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    bail!("the agent ended; it said:\n{}", self.said.join("\n"))
                }
            }
        }
    }
}

impl Agent {
    /// Fails if the agent has ended, with what it said.
    pub(super) fn check_running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            while let Ok((_, l)) = self.lines.try_recv() {
                self.said.push(l);
            }
            bail!(
                "the agent ended ({status}); it said:\n{}",
                self.said.join("\n")
            );
        }
        Ok(())
    }

    /// What it said that no [`Agent::wait_for`] has read yet.
    pub(super) fn unread(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok((_, l)) = self.lines.try_recv() {
            self.said.push(l.clone());
            out.push(l);
        }
        out
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `line` is the agent's report of a pass that wrote `n` Service
/// ports (`proxy: N Service ports written, ...`).
pub(super) fn wrote(line: &str, n: usize) -> bool {
    line.strip_prefix("sluice-node: proxy: ")
        .and_then(|r| r.split_once(" Service ports written"))
        .is_some_and(|(k, _)| k.parse::<usize>() == Ok(n))
}

/// A file of the bench's own for the kubeconfig of node `tag`.
pub(super) fn kubeconfig_file(tag: &str, text: &str) -> Result<PathBuf> {
    let p = std::env::temp_dir().join(format!("slbench-{tag}-{}.kubeconfig", std::process::id()));
    std::fs::write(&p, text)?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_pass_lines_are_recognised() {
        assert!(wrote(
            "sluice-node: proxy: 10001 Service ports written, 0 removed; 10001 in the maps",
            10001
        ));
        assert!(!wrote(
            "sluice-node: proxy: 1 Service ports written, 0 removed; 2 in the maps",
            2
        ));
        assert!(!wrote(
            "sluice-node: proxy: Service socket hooks attached",
            1
        ));
    }
}
