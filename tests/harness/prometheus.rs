//! A real Prometheus (Debian's, unpacked by `cargo xtask test`) scraping
//! `sluicectl metrics --listen` inside a test's node namespace, queried through
//! its HTTP API from that namespace; and `promtool check metrics`.
use std::{
    io::{Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use serde_json::Value;

use crate::{binary_from_env, err, exec, masq::in_netns, Node, Result};

/// Where Prometheus listens in the node namespace.
pub const PROMETHEUS_PORT: u16 = 9090;

/// `prometheus` (`SLUICE_PROMETHEUS_BIN`).
pub fn prometheus_bin() -> Result<PathBuf> {
    binary_from_env("SLUICE_PROMETHEUS_BIN", "prometheus")
}

/// `promtool` (`SLUICE_PROMTOOL_BIN`).
pub fn promtool_bin() -> Result<PathBuf> {
    binary_from_env("SLUICE_PROMTOOL_BIN", "promtool")
}

/// `promtool check metrics` on `text`: its complaints, empty when clean.
pub fn check_metrics(text: &str) -> Result<String> {
    let mut child = Command::new(promtool_bin()?)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| err!("cannot run promtool: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| err!("writing to promtool: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| err!("promtool: {e}"))?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(String::new())
    } else {
        Ok(format!("promtool exited with {}: {said}", out.status))
    }
}

/// A Prometheus in `node`'s namespace scraping `targets` every second; killed
/// (and its storage removed) when dropped.
pub struct Prometheus {
    child: Option<Child>,
    netns: PathBuf,
    dir: tempfile::TempDir,
}

impl Prometheus {
    pub fn start(node: &Node, targets: &[&str]) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("slprom").tempdir()?;
        let list = targets
            .iter()
            .map(|t| format!("'{t}'"))
            .collect::<Vec<_>>()
            .join(", ");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
             scrape_configs:\n  - job_name: sluice\n    static_configs:\n      - targets: [{list}]\n"
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config)?;
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", node.netns_path().display()))
            .arg("--")
            .arg(prometheus_bin()?)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{PROMETHEUS_PORT}"))
            .env_clear()
            .env("PATH", exec::PATH)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("prometheus.log"))?);
        exec::die_with_parent(&mut cmd);
        let child = cmd
            .spawn()
            .map_err(|e| err!("cannot start prometheus: {e}"))?;
        Ok(Self {
            child: Some(child),
            netns: node.netns_path(),
            dir,
        })
    }

    /// Prometheus's own log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// The result vector of instant query `promql` (`/api/v1/query`).
    pub fn query(&self, promql: &str) -> Result<Vec<Value>> {
        let path = format!("/api/v1/query?query={}", url_encode(promql));
        let body = http_get(&self.netns, PROMETHEUS_PORT, &path)?;
        let v: Value = serde_json::from_str(&body)
            .map_err(|e| err!("prometheus answered {body:?} to {promql}: {e}"))?;
        if v["status"] != "success" {
            return Err(err!("prometheus: {promql}: {v}"));
        }
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// The value of the single series `promql` selects, if it selects one.
    pub fn value(&self, promql: &str) -> Result<Option<f64>> {
        let r = self.query(promql)?;
        Ok(match r.as_slice() {
            [one] => one["value"][1].as_str().and_then(|s| s.parse().ok()),
            _ => None,
        })
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `GET path` from 127.0.0.1:`port` in the namespace at `netns`: the body of a
/// 200 answer.
pub fn http_get(netns: &Path, port: u16, path: &str) -> Result<String> {
    let path = path.to_string();
    in_netns(netns, move || {
        let mut s = TcpStream::connect(("127.0.0.1", port))
            .map_err(|e| err!("connect to 127.0.0.1:{port}: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            s,
            "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
        )?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        let (head, body) = out
            .split_once("\r\n\r\n")
            .ok_or_else(|| err!("no HTTP answer from 127.0.0.1:{port}{path}: {out:?}"))?;
        if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
            return Err(err!("GET {path}: {head}"));
        }
        Ok(body.to_string())
    })
}

/// `s` percent-encoded for a query string.
fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
