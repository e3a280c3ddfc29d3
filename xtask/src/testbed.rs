//! The demo's and the benchmarks' namespaces, built with the testbed the
//! integration tests use (crate `sluice-testbed`): one [`Testbed`] per run,
//! whose namespaces, pin roots and scratch directory all carry one name prefix.
//! They are removed on drop (also on error), and before use in case an
//! interrupted run left something behind. It never touches the host's own
//! interfaces, routes or sysctls.
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context, Result};
use serde_json::Value;
pub(crate) use sluice_testbed::Netns;
use sluice_testbed::{cni::Invocation, Uplink};

/// Everything of one run: namespaces, pin roots, scratch directories, and
/// processes that live as long as the run (a node agent).
pub(crate) struct Testbed {
    prefix: String,
    pub dir: PathBuf,
    netns: Vec<Netns>,
    processes: Vec<std::process::Child>,
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
            processes: Vec::new(),
        })
    }

    /// Keeps `child` until the run ends: then it gets SIGTERM and 5 s to end
    /// (SIGKILL after), before the namespaces and pins go.
    pub(crate) fn keep_process(&mut self, child: std::process::Child) {
        self.processes.push(child);
    }

    /// A new namespace `<prefix>-<name>` with loopback up; its index.
    pub(crate) fn netns(&mut self, name: &str) -> Result<usize> {
        self.netns
            .push(Netns::add(format!("{}-{name}", self.prefix))?);
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
        let (na, nb) = (self.ns(a).name(), self.ns(b).name());
        Ok(sluice_testbed::wire(na, a_if, a_addr, nb, b_if, b_addr)?)
    }

    /// A node namespace `<tag>-node` wired to an external host `<tag>-ext`
    /// (see [`Uplink::subnet`]: 192.168.`n`.1 and .2, the host's end `eth0`);
    /// with `pods`, the host routes them to the node. The indexes of both.
    pub(crate) fn node_with_uplink(
        &mut self,
        tag: &str,
        n: u8,
        pods: Option<&str>,
    ) -> Result<(usize, usize, Uplink)> {
        let node = self.netns(&format!("{tag}-node"))?;
        let ext = self.netns(&format!("{tag}-ext"))?;
        let up = Uplink::subnet(n, "eth0");
        up.connect(self.ns(node).name(), self.ns(ext).name(), pods)?;
        Ok((node, ext, up))
    }

    /// Gives the uplink `up` between namespaces `node` and `ext` an IPv6
    /// subnet too (/64, no duplicate address detection): `node_ip` on the
    /// node's end, `ext_ip` on the host's, the node's default IPv6 route via
    /// the host; with `pods` (a CIDR), the host routes that range via the node.
    pub(crate) fn uplink6(
        &self,
        node: usize,
        ext: usize,
        up: &Uplink,
        (node_ip, ext_ip): (&str, &str),
        pods: Option<&str>,
    ) -> Result<()> {
        let (n, e) = (self.ns(node), self.ns(ext));
        n.ip(&[
            "addr",
            "add",
            &format!("{node_ip}/64"),
            "dev",
            &up.node_if,
            "nodad",
        ])?;
        e.ip(&[
            "addr",
            "add",
            &format!("{ext_ip}/64"),
            "dev",
            &up.ext_if,
            "nodad",
        ])?;
        n.ip(&["-6", "route", "add", "default", "via", ext_ip])?;
        if let Some(pods) = pods {
            e.ip(&["-6", "route", "add", pods, "via", node_ip])?;
        }
        Ok(())
    }

    /// Runs CNI `command` of `plugin` with `conf` in namespace `node` for
    /// container `id` (interface `eth0`) in namespace `pod`, as a runtime does;
    /// its result.
    pub(crate) fn cni(
        &self,
        node: usize,
        plugin: &Path,
        command: &str,
        conf: &Value,
        id: &str,
        pod: Option<usize>,
    ) -> Result<Value> {
        let netns = pod.map(|p| self.ns(p).path());
        let run = Invocation {
            command,
            container_id: id,
            ifname: "eth0",
            netns: netns.as_deref(),
        };
        run.run(Some(&self.ns(node).path()), plugin, conf)
            .with_context(|| format!("{} {command} {id}", plugin.display()))
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        for mut c in self.processes.drain(..) {
            let _ =
                sluice_testbed::exec::terminate(&mut c, Duration::from_secs(5), "a kept process");
        }
        // Namespaces first (their veths and the links to them go too), then pins.
        self.netns.clear();
        clean(&self.prefix);
    }
}

/// Removes every namespace, pin root and scratch dir named with `prefix`.
fn clean(prefix: &str) {
    let mine = |name: &str| name.starts_with(&format!("{prefix}-"));
    if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some(name) = line.split_whitespace().next().filter(|n| mine(n)) {
                let _ = sluice_testbed::netns::delete(name);
            }
        }
    }
    if let Ok(rd) = std::fs::read_dir("/sys/fs/bpf") {
        for e in rd.filter_map(Result::ok) {
            if mine(&e.file_name().to_string_lossy()) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("{prefix}-run")));
}
