//! The per-test world: a node network namespace (where the plugin runs, like a
//! kubelet's host), pod namespaces in it, a pin root of its own and a temporary
//! directory for attachment records and IPAM reservations. Dropping the [`Node`]
//! removes all of it, best effort step by step, also while a failed test unwinds.
use std::{
    collections::BTreeSet,
    fs,
    net::IpAddr,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU32, Ordering},
        Mutex,
    },
};

use serde_json::{json, Value};
use sluice_testbed::cni::Invocation;
use tempfile::TempDir;

use crate::{
    cni::CniOutput,
    counters::Counters,
    err,
    exec::{self, Output},
    look, Result,
};

/// Network name of the configs [`Node::conf`] builds. Every node has its own
/// state and IPAM directories, so tests do not share it in any way that matters.
pub const NETWORK: &str = "sltnet";

/// Counter making names unique within a test process; the pid makes them
/// unique between processes.
static NEXT: AtomicU32 = AtomicU32::new(0);

/// A pod: a network namespace under `/run/netns`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pod {
    pub name: String,
    /// `/run/netns/<name>`: what `CNI_NETNS` gets.
    pub path: PathBuf,
}

impl Pod {
    /// The pod's namespace path as a string (for configs and results).
    pub fn netns(&self) -> String {
        self.path.display().to_string()
    }
}

/// One simulated node. See the module documentation.
pub struct Node {
    name: String,
    pin_root: PathBuf,
    dir: TempDir,
    /// Pod namespaces made by [`Self::pod`] and not yet deleted.
    pods: Mutex<BTreeSet<String>>,
}

pub(crate) use sluice_testbed::netns_path;

/// A name no other namespace of this machine has: `slt<pid><tag><n>`.
pub(crate) fn unique_name(tag: char) -> String {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("slt{}{tag}{n}", std::process::id())
}

pub(crate) use sluice_testbed::netns::add as add_netns;

/// The `CNI_*` environment of one invocation; see [`Node::cni`].
fn cni_env(
    cmd: &str,
    container_id: &str,
    ifname: &str,
    netns: Option<&Pod>,
    extra_env: &[(&str, &str)],
) -> Vec<(String, String)> {
    let mut env = Invocation {
        command: cmd,
        container_id,
        ifname,
        netns: netns.map(|p| p.path.as_path()),
    }
    .env();
    for (k, v) in extra_env {
        env.retain(|(key, _)| key != k);
        env.push(((*k).into(), (*v).into()));
    }
    env
}

impl Node {
    /// Makes the node namespace (with `lo` up) and the temporary directory. Fails
    /// clearly when not root or when `SLUICE_BIN` is unset.
    pub fn new() -> Result<Self> {
        crate::sluice_bin()?;
        if !nix::unistd::Uid::effective().is_root() {
            return Err(err!(
                "the integration tests need root (network namespaces, bpffs)"
            ));
        }
        let name = unique_name('x');
        let dir = tempfile::Builder::new()
            .prefix(&format!("{name}-"))
            .tempdir()?;
        // The pin root goes into the config, which refuses dots (bpffs does).
        if dir.path().to_string_lossy().contains('.') {
            return Err(err!(
                "temporary directory {} has a dot",
                dir.path().display()
            ));
        }
        let node = Self {
            pin_root: Path::new("/sys/fs/bpf").join(&name),
            name,
            dir,
            pods: Mutex::new(BTreeSet::new()),
        };
        // From here on, Drop cleans up whatever was made.
        add_netns(&node.name)?;
        Ok(node)
    }

    /// Name of the node namespace.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/run/netns/<node>`.
    pub fn netns_path(&self) -> PathBuf {
        netns_path(&self.name)
    }

    /// This node's pin root (`/sys/fs/bpf/slt...`), removed when the node goes.
    pub fn pin_root(&self) -> &Path {
        &self.pin_root
    }

    /// This node's temporary directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `stateDir` of the configs: records are in `<stateDir>/<network>/attachments`.
    pub fn state_dir(&self) -> PathBuf {
        self.dir().join("state")
    }

    /// `ipam.dataDir` of the configs: reservations are `<dataDir>/<network>/<ip>`.
    pub fn ipam_dir(&self) -> PathBuf {
        self.dir().join("ipam")
    }

    /// Makes a pod namespace `<node>-<name>` with `lo` up.
    pub fn pod(&self, name: &str) -> Result<Pod> {
        let full = format!("{}-{name}", self.name);
        {
            let mut pods = self.pods.lock().map_err(|_| err!("pod list poisoned"))?;
            if !pods.insert(full.clone()) {
                return Err(err!("pod {full} exists already"));
            }
        }
        add_netns(&full)?;
        Ok(Pod {
            path: netns_path(&full),
            name: full,
        })
    }

    /// Deletes a pod namespace now (e.g. to DEL after the pod is gone).
    pub fn delete_pod(&self, pod: &Pod) -> Result<()> {
        if let Ok(mut pods) = self.pods.lock() {
            pods.remove(&pod.name);
        }
        sluice_testbed::netns::delete(&pod.name)
    }

    /// A config for `sluice` with the built-in IPAM on `subnet`, this node's pin
    /// root, state and IPAM directories, and a default route through the gateway.
    pub fn conf(&self, version: &str, subnet: &str) -> Value {
        json!({
            "cniVersion": version,
            "name": NETWORK,
            "type": "sluice",
            "pinRoot": self.pin_root,
            "stateDir": self.state_dir(),
            "ipam": {
                "type": "sluice",
                "subnet": subnet,
                "dataDir": self.ipam_dir(),
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        })
    }

    /// Runs `sluice` in the node namespace as a runtime does: a cleared
    /// environment with `PATH`, `CNI_COMMAND`, `CNI_CONTAINERID` and `CNI_IFNAME`
    /// (when not empty), `CNI_NETNS` (when a pod is given), `CNI_PATH`, then
    /// `extra_env` (which may override them); `conf` on stdin.
    pub fn cni(
        &self,
        cmd: &str,
        conf: &Value,
        container_id: &str,
        ifname: &str,
        netns: Option<&Pod>,
        extra_env: &[(&str, &str)],
    ) -> Result<CniOutput> {
        let env = cni_env(cmd, container_id, ifname, netns, extra_env);
        self.exec_plugin(&crate::sluice_bin()?, &env, conf.to_string().as_bytes())
    }

    /// Starts `sluice` as [`Self::cni`] runs it (same environment, `conf` on
    /// stdin, in the node namespace) and returns at once: the crash tests kill
    /// it while it works. Dropping the [`exec::Running`] kills it.
    pub fn cni_spawn(
        &self,
        cmd: &str,
        conf: &Value,
        container_id: &str,
        ifname: &str,
        netns: Option<&Pod>,
        extra_env: &[(&str, &str)],
    ) -> Result<exec::Running> {
        self.cni_spawn_wrapped(&[], cmd, conf, container_id, ifname, netns, extra_env)
    }

    /// As [`Self::cni_spawn`] with `sluice` run by `wrapper` (a program and its
    /// arguments, e.g. `strace -f ...`), itself run in the node namespace with
    /// the plugin's environment: `nsenter --net=<node> -- wrapper... sluice`.
    /// An empty `wrapper` runs `sluice` directly.
    #[allow(clippy::too_many_arguments)]
    pub fn cni_spawn_wrapped(
        &self,
        wrapper: &[&str],
        cmd: &str,
        conf: &Value,
        container_id: &str,
        ifname: &str,
        netns: Option<&Pod>,
        extra_env: &[(&str, &str)],
    ) -> Result<exec::Running> {
        let env = cni_env(cmd, container_id, ifname, netns, extra_env);
        let bin = crate::sluice_bin()?;
        let bin_s = bin.display().to_string();
        let (program, args): (&Path, Vec<&str>) = match wrapper.split_first() {
            None => (&bin, Vec::new()),
            Some((w, rest)) => {
                let mut a = rest.to_vec();
                a.push(&bin_s);
                (Path::new(w), a)
            }
        };
        exec::spawn(
            Some(&self.netns_path()),
            program,
            &args,
            &env,
            conf.to_string().as_bytes(),
        )
    }

    /// As [`Self::cni`] for a reference plugin (`portmap`, `host-local`, ...).
    pub fn reference(
        &self,
        plugin: &str,
        cmd: &str,
        conf: &Value,
        container_id: &str,
        ifname: &str,
        netns: Option<&Pod>,
    ) -> Result<CniOutput> {
        let env = cni_env(cmd, container_id, ifname, netns, &[]);
        self.exec_plugin(
            &crate::reference_plugin(plugin)?,
            &env,
            conf.to_string().as_bytes(),
        )
    }

    /// As [`Self::cni`] with another `sluice` binary (e.g. [`crate::sluice_next_bin`]).
    #[allow(clippy::too_many_arguments)]
    pub fn cni_with(
        &self,
        binary: &Path,
        cmd: &str,
        conf: &Value,
        container_id: &str,
        ifname: &str,
        netns: Option<&Pod>,
        extra_env: &[(&str, &str)],
    ) -> Result<CniOutput> {
        let env = cni_env(cmd, container_id, ifname, netns, extra_env);
        self.exec_plugin(binary, &env, conf.to_string().as_bytes())
    }

    /// Runs `program args...` in the node namespace (`nsenter --net=`), e.g.
    /// `sluice datapath reload --pin-root P`.
    pub fn run(&self, program: &Path, args: &[&str]) -> Result<Output> {
        exec::run(Some(&self.netns_path()), program, args, &[], b"")
    }

    /// Runs `sluice` in the node namespace with exactly `env` (plus `PATH`) and
    /// `stdin`: for tests of bad environments and bad input.
    pub fn cni_raw(&self, env: &[(&str, &str)], stdin: &[u8]) -> Result<CniOutput> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect();
        self.exec_plugin(&crate::sluice_bin()?, &env, stdin)
    }

    fn exec_plugin(
        &self,
        binary: &Path,
        env: &[(String, String)],
        stdin: &[u8],
    ) -> Result<CniOutput> {
        let out = exec::run(Some(&self.netns_path()), binary, &[], env, stdin)?;
        Ok(CniOutput::new(out))
    }

    /// Runs `sluicectl --pin-root <pin root> args...` (in the node namespace).
    pub fn sluicectl(&self, args: &[&str]) -> Result<Output> {
        self.sluicectl_at(&self.pin_root, args)
    }

    /// [`Self::sluicectl`] on a datapath pinned elsewhere than the node's pin
    /// root (a config with a `pinRoot` of its own).
    pub fn sluicectl_at(&self, pin_root: &Path, args: &[&str]) -> Result<Output> {
        let root = pin_root.display().to_string();
        let mut all = vec!["--pin-root", root.as_str()];
        all.extend_from_slice(args);
        exec::run(
            Some(&self.netns_path()),
            &crate::sluicectl_bin()?,
            &all,
            &[],
            b"",
        )
    }

    /// `sluicectl endpoints --json`: one object per pod address.
    pub fn endpoints(&self) -> Result<Vec<Value>> {
        let out = self.sluicectl(&["endpoints", "--json"])?;
        if !out.success() {
            return Err(err!("{out}"));
        }
        let v: Value = serde_json::from_str(&out.stdout)
            .map_err(|e| err!("sluicectl printed no JSON ({e}): {out}"))?;
        v.as_array()
            .cloned()
            .ok_or_else(|| err!("sluicectl printed no JSON array: {out}"))
    }

    /// `sluicectl counters --json`: packets per reason, summed over CPUs.
    pub fn counters(&self) -> Result<Counters> {
        Counters::parse(&self.sluicectl_json(&["counters", "--json"])?)
    }

    /// `sluicectl status --json`.
    pub fn status(&self) -> Result<Value> {
        self.sluicectl_json(&["status", "--json"])
    }

    /// `sluicectl args...` that must succeed and print JSON.
    pub fn sluicectl_json(&self, args: &[&str]) -> Result<Value> {
        let out = self.sluicectl(args)?;
        if !out.success() {
            return Err(err!("{out}"));
        }
        serde_json::from_str(&out.stdout)
            .map_err(|e| err!("sluicectl printed no JSON ({e}): {out}"))
    }

    /// The kernel's IP counters of the node namespace (see [`look::snmp`]).
    pub fn snmp(&self) -> Result<std::collections::BTreeMap<String, u64>> {
        look::snmp(&self.netns_path())
    }

    /// Names of the host veths (`sl*`) in the node namespace.
    pub fn host_veths(&self) -> Result<Vec<String>> {
        Ok(look::link_names(&self.name)?
            .into_iter()
            .filter(|n| n.starts_with("sl"))
            .collect())
    }

    /// Attachment records of `network` (file names).
    pub fn records(&self, network: &str) -> Result<Vec<String>> {
        look::files(&self.state_dir().join(network).join("attachments")).map(|v| {
            v.into_iter()
                .filter(|f| Path::new(f).extension().is_some_and(|e| e == "json"))
                .collect()
        })
    }

    /// Addresses reserved for `network` in [`Self::ipam_dir`] (one file per IP,
    /// as host-local keeps them).
    pub fn reservations(&self, network: &str) -> Result<Vec<IpAddr>> {
        Ok(look::files(&self.ipam_dir().join(network))?
            .iter()
            .filter_map(|f| f.parse().ok())
            .collect())
    }

    /// The owner line of a reservation file (`<container id>` then the ifname).
    pub fn reservation_owner(&self, network: &str, ip: IpAddr) -> Result<String> {
        let p = self.ipam_dir().join(network).join(ip.to_string());
        fs::read_to_string(&p).map_err(|e| err!("reading {}: {e}", p.display()))
    }

    /// Pinned tcx links under `<pin root>/links`.
    /// Every pinned link of the datapath, node-wide ones included.
    pub fn all_link_pins(&self) -> Result<Vec<String>> {
        look::files(&self.pin_root.join("links"))
    }

    /// Pinned links of pods (`<host veth>-<program>`, tcx mode). The node-wide
    /// ones (`uplink<ifindex>-*`, `nat_sweep`) stay while the datapath is loaded
    /// and are not a pod's leftovers.
    pub fn link_pins(&self) -> Result<Vec<String>> {
        Ok(look::files(&self.pin_root.join("links"))?
            .into_iter()
            .filter(|p| p.starts_with("sl"))
            .collect())
    }

    /// Asserts that no pod of `network` is left on the node: no `sl*` veth, no
    /// record, no reservation, no pinned link.
    #[track_caller]
    pub fn assert_clean(&self, network: &str) {
        let left = self.leftovers(network);
        assert!(
            left.is_empty(),
            "left behind on node {}: {left:?}",
            self.name
        );
    }

    /// What [`Self::assert_clean`] complains about, as text.
    pub fn leftovers(&self, network: &str) -> Vec<String> {
        let mut left = Vec::new();
        let mut note = |what: &str, r: Result<Vec<String>>| match r {
            Ok(v) if v.is_empty() => {}
            Ok(v) => left.push(format!("{what}: {v:?}")),
            Err(e) => left.push(format!("{what}: cannot look: {e}")),
        };
        note("host veths", self.host_veths());
        note("records", self.records(network));
        note(
            "reservations",
            self.reservations(network)
                .map(|v| v.iter().map(ToString::to_string).collect()),
        );
        note("link pins", self.link_pins());
        left
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let pods: Vec<String> = match self.pods.lock() {
            Ok(p) => p.iter().cloned().collect(),
            Err(p) => p.into_inner().iter().cloned().collect(),
        };
        for p in pods {
            if let Err(e) = sluice_testbed::netns::delete(&p) {
                eprintln!("cleanup: deleting pod netns {p}: {e}");
            }
        }
        if let Err(e) = sluice_testbed::netns::delete(&self.name) {
            eprintln!("cleanup: deleting node netns {}: {e}", self.name);
        }
        // bpffs directories and pins go like files; the kernel drops a tcx link
        // once its pin is its last reference.
        match fs::remove_dir_all(&self.pin_root) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => eprintln!("cleanup: removing {}: {e}", self.pin_root.display()),
        }
        // The TempDir field removes the state and IPAM directories after this.
    }
}
