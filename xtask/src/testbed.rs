//! A namespace testbed for the demo and the benchmarks: nodes, pods, wires, and
//! CNI plugins driven as a runtime drives them. Everything it makes carries one
//! name prefix and is removed on drop (also on error), and before use in case an
//! interrupted run left something behind. It never touches the host's own
//! interfaces, routes or sysctls.
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::cmd;

/// One network namespace, removed on drop.
pub(crate) struct Netns {
    pub name: String,
}

impl Netns {
    pub(crate) fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// `nsenter --net=<ns> <program>`: runs in the namespace without remounting
    /// /sys (unlike `ip netns exec`), so bpffs stays visible.
    pub(crate) fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.path().display()))
            .arg("--")
            .arg(program);
        c
    }

    /// `ip -n <ns> <args>`, failing on a non-zero exit.
    pub(crate) fn ip(&self, args: &[&str]) -> Result<()> {
        cmd::stdout(Command::new("ip").arg("-n").arg(&self.name).args(args)).map(drop)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .stderr(Stdio::null())
            .status();
    }
}

/// Everything of one run: namespaces, pin roots, scratch directories.
pub(crate) struct Testbed {
    prefix: String,
    pub dir: PathBuf,
    netns: Vec<Netns>,
}

impl Testbed {
    /// A testbed whose names all start with `prefix` (short: netns and interface
    /// names are limited). Leftovers of an earlier interrupted run are removed.
    pub(crate) fn new(prefix: &str) -> Result<Self> {
        clean(prefix);
        let dir = std::env::temp_dir().join(format!("{prefix}-run"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self {
            prefix: prefix.to_string(),
            dir,
            netns: Vec::new(),
        })
    }

    /// A new namespace `<prefix>-<name>` with loopback up.
    pub(crate) fn netns(&mut self, name: &str) -> Result<usize> {
        let full = format!("{}-{name}", self.prefix);
        cmd::stdout(Command::new("ip").args(["netns", "add", &full]))?;
        let ns = Netns { name: full };
        ns.ip(&["link", "set", "lo", "up"])?;
        self.netns.push(ns);
        Ok(self.netns.len() - 1)
    }

    pub(crate) fn ns(&self, i: usize) -> &Netns {
        &self.netns[i]
    }

    /// A bpffs pin root for this run (no dots: bpffs refuses them).
    pub(crate) fn pin_root(&self, name: &str) -> PathBuf {
        PathBuf::from("/sys/fs/bpf").join(format!("{}-{name}", self.prefix))
    }

    /// A veth "wire" between two namespaces with an address on each end.
    pub(crate) fn wire(
        &self,
        a: usize,
        a_if: &str,
        a_addr: &str,
        b: usize,
        b_if: &str,
        b_addr: &str,
    ) -> Result<()> {
        let (na, nb) = (&self.netns[a], &self.netns[b]);
        na.ip(&[
            "link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", &nb.name,
        ])?;
        na.ip(&["addr", "add", a_addr, "dev", a_if])?;
        nb.ip(&["addr", "add", b_addr, "dev", b_if])?;
        na.ip(&["link", "set", a_if, "up"])?;
        nb.ip(&["link", "set", b_if, "up"])
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        // Namespaces first (their veths and the links to them go too), then pins.
        self.netns.clear();
        clean(&self.prefix);
    }
}

/// Removes every namespace, pin root and scratch dir named with `prefix`.
fn clean(prefix: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some(name) = line.split_whitespace().next() {
                if name.starts_with(&format!("{prefix}-")) {
                    let _ = Command::new("ip").args(["netns", "del", name]).status();
                }
            }
        }
    }
    if let Ok(rd) = std::fs::read_dir("/sys/fs/bpf") {
        for e in rd.filter_map(Result::ok) {
            if e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{prefix}-"))
            {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("{prefix}-run")));
}

/// A CNI plugin run in a node namespace as a runtime runs it.
#[expect(clippy::struct_field_names, reason = "CNI_PATH's name")]
pub(crate) struct Cni<'a> {
    pub node: &'a Netns,
    pub plugin: &'a Path,
    /// `CNI_PATH` (for delegated IPAM).
    pub cni_path: &'a str,
}

impl Cni<'_> {
    /// Runs `command` with the CNI environment and `conf` on stdin. Returns the
    /// parsed stdout (Null when empty); a non-zero exit is an error carrying the
    /// plugin's CNI error.
    pub(crate) fn run(
        &self,
        command: &str,
        conf: &Value,
        container_id: &str,
        ifname: &str,
        pod: Option<&Netns>,
    ) -> Result<Value> {
        run_cni(self, command, conf, container_id, ifname, pod)
    }
}

fn run_cni(
    cni: &Cni<'_>,
    command: &str,
    conf: &Value,
    container_id: &str,
    ifname: &str,
    pod: Option<&Netns>,
) -> Result<Value> {
    let netns = pod.map(Netns::path);
    run_plugin(
        &mut cni.node.command(cni.plugin),
        &PluginRun {
            plugin: cni.plugin,
            command,
            conf,
            container_id,
            ifname,
            cni_path: cni.cni_path,
            netns: netns.as_deref(),
        },
    )
}

/// What a plugin run gets: the CNI environment and its config.
pub(crate) struct PluginRun<'a> {
    /// The plugin binary (named in errors).
    pub plugin: &'a Path,
    pub command: &'a str,
    pub conf: &'a Value,
    pub container_id: &'a str,
    pub ifname: &'a str,
    pub cni_path: &'a str,
    pub netns: Option<&'a Path>,
}

/// Runs the plugin `c` executes (directly, or through nsenter) with the CNI
/// environment of `r` and its config on stdin. Returns the parsed stdout (Null
/// when empty); a non-zero exit is an error carrying the plugin's CNI error.
pub(crate) fn run_plugin(c: &mut Command, r: &PluginRun<'_>) -> Result<Value> {
    use std::io::Write;
    c.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("CNI_COMMAND", r.command)
        .env("CNI_CONTAINERID", r.container_id)
        .env("CNI_IFNAME", r.ifname)
        .env("CNI_PATH", r.cni_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(p) = r.netns {
        c.env("CNI_NETNS", p);
    }
    let what = r.plugin.display();
    let mut child = c.spawn().with_context(|| format!("starting {what}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(r.conf.to_string().as_bytes())?;
    }
    let out = child.wait_with_output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "{what} {} for {} failed: {} {}",
            r.command,
            r.container_id,
            text.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    if text.trim().is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_str(&text).with_context(|| format!("parsing {} result {text}", r.command))
}

/// A background process (a server), killed on drop.
pub(crate) struct Background(Child);

impl Background {
    pub(crate) fn spawn(mut c: Command) -> Result<Self> {
        let child = c
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting `{}`", cmd::describe(&c)))?;
        Ok(Self(child))
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until something listens on TCP or UDP `port` inside `ns` (`ss`), for at
/// most `limit`. No probe connection: a one-shot server would take it for a client.
pub(crate) fn wait_listening(ns: &Netns, port: u16, limit: Duration) -> Result<()> {
    let start = Instant::now();
    loop {
        let out = cmd::capture(ns.command("ss").args(["-Hltun"]))?;
        let listening = String::from_utf8_lossy(&out.stdout).lines().any(|l| {
            l.split_whitespace()
                .nth(4)
                .is_some_and(|a| a.ends_with(&format!(":{port}")))
        });
        if listening {
            return Ok(());
        }
        if start.elapsed() > limit {
            bail!(
                "nothing listens on port {port} in {} after {limit:?}",
                ns.name
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
