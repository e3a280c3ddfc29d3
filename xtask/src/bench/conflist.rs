//! A network configuration list (conflist) run the way a runtime runs it (CNI
//! spec, "Section 3: Execution of Network Configurations"): ADD executes the
//! plugins in order, each one's result the next one's `prevResult`; DEL executes
//! them in reverse with the cached result as `prevResult`; each plugin gets
//! `runtimeConfig` only for the capabilities its config declares. Every plugin is
//! spawned by a thread that entered the node's network namespace (as a runtime in
//! that namespace runs it), so whatever a plugin changes (links, iptables,
//! sysctls) is the node namespace's, and the timed path has no nsenter in it.
use std::{
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::{Context, Result};
use serde_json::{Map, Value};
use sluice_testbed::cni::Invocation;

pub(super) struct Conflist {
    pub name: String,
    pub cni_version: String,
    /// Each plugin's binary and its config object (without name/cniVersion).
    pub plugins: Vec<(PathBuf, Value)>,
}

/// One container's attachment: what ADD was given and returned, for DEL.
pub(super) struct Attachment {
    pub container_id: String,
    pub netns: PathBuf,
    /// The interface name the runtime asked for (`CNI_IFNAME`).
    pub ifname: String,
    pub runtime_config: Value,
    pub result: Value,
}

impl Conflist {
    /// The config one plugin of the list gets on stdin.
    fn plugin_conf(&self, conf: &Value, runtime: &Value, prev: Option<&Value>) -> Value {
        let mut c = conf.clone();
        c["name"] = Value::from(self.name.as_str());
        c["cniVersion"] = Value::from(self.cni_version.as_str());
        let mut rc = Map::new();
        if let Some(runtime) = runtime.as_object() {
            for (k, v) in runtime {
                if conf["capabilities"][k].as_bool() == Some(true) {
                    rc.insert(k.clone(), v.clone());
                }
            }
        }
        if !rc.is_empty() {
            c["runtimeConfig"] = Value::Object(rc);
        }
        if let Some(p) = prev {
            c["prevResult"] = p.clone();
        }
        c
    }

    /// ADD of the whole list in `node` as `eth0`: the attachment and the time
    /// the plugins took, all of them one after the other, in ms.
    pub(super) fn add(
        &self,
        node: &Path,
        container_id: &str,
        netns: &Path,
        runtime_config: Value,
    ) -> Result<(Attachment, f64)> {
        self.add_as(node, (container_id, "eth0"), netns, runtime_config)
    }

    /// The same with interface name `ifname` (several networks' interfaces in
    /// one pod namespace).
    pub(super) fn add_as(
        &self,
        node: &Path,
        (container_id, ifname): (&str, &str),
        netns: &Path,
        runtime_config: Value,
    ) -> Result<(Attachment, f64)> {
        in_netns(node, || {
            let started = Instant::now();
            let mut prev: Option<Value> = None;
            for (plugin, conf) in &self.plugins {
                let c = self.plugin_conf(conf, &runtime_config, prev.as_ref());
                let at = (container_id, ifname, netns);
                prev = Some(exec(plugin, "ADD", &c, at)?);
            }
            let ms = started.elapsed().as_secs_f64() * 1e3;
            let result = prev.context("a conflist without plugins")?;
            Ok((
                Attachment {
                    container_id: container_id.to_string(),
                    netns: netns.to_path_buf(),
                    ifname: ifname.to_string(),
                    runtime_config,
                    result,
                },
                ms,
            ))
        })
    }

    /// DEL of the whole list in `node`, plugins in reverse order; the time in ms.
    pub(super) fn del(&self, node: &Path, a: &Attachment) -> Result<f64> {
        in_netns(node, || {
            let started = Instant::now();
            for (plugin, conf) in self.plugins.iter().rev() {
                let c = self.plugin_conf(conf, &a.runtime_config, Some(&a.result));
                exec(plugin, "DEL", &c, (&a.container_id, &a.ifname, &a.netns))?;
            }
            Ok(started.elapsed().as_secs_f64() * 1e3)
        })
    }
}

/// Runs `f` on a thread that entered the network namespace at `ns` (and ends
/// with it: the calling thread's namespace never changes).
pub(super) fn in_netns<T: Send>(ns: &Path, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let file =
                    std::fs::File::open(ns).with_context(|| format!("opening {}", ns.display()))?;
                nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET)
                    .with_context(|| format!("entering {}", ns.display()))?;
                f()
            })
            .join()
            .map_err(|_| anyhow::anyhow!("the thread in {} panicked", ns.display()))?
    })
}

/// One plugin run, from the calling thread (already in the node namespace):
/// container `cid`'s interface `ifname` in `netns`.
fn exec(
    plugin: &Path,
    command: &str,
    conf: &Value,
    (cid, ifname, netns): (&str, &str, &Path),
) -> Result<Value> {
    let run = Invocation {
        command,
        container_id: cid,
        ifname,
        netns: Some(netns),
    };
    run.run(None, plugin, conf)
        .with_context(|| format!("{} {command} {cid}", plugin.display()))
}
