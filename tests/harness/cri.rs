//! A real containerd (Debian's, with its CRI plugin and runc) of the test's own,
//! driven through the CRI gRPC API the way the kubelet drives it.
//!
//! [`Containerd::start`] runs `containerd` in a node namespace (through
//! `nsenter --net=`, so the mount namespace, bpffs and cgroups stay the host's)
//! with a private config: root, state, socket, runc root, log and CNI conf and
//! bin directories all under a directory of the test's, the pod cgroups under a
//! parent of the test's, and `restrict_oom_score_adj` (processes here lack
//! `CAP_SYS_RESOURCE`, so runc cannot lower `oom_score_adj`). The image of
//! [`crate::oci`] is imported with `ctr` and serves as sandbox image as well.
//!
//! Dropping it removes every pod it still knows through the CRI API (so the CNI
//! DEL runs), stops containerd, and then removes whatever a failure left: shims,
//! processes and directories of its cgroup parent, mounts under its directory,
//! pod namespaces. What containerd 1.6 keeps outside the private directories is
//! the shims' sockets (`/run/containerd/s/<hash>`), which they remove on exit.
use std::{
    fs,
    net::IpAddr,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicU32, Ordering},
        Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::{
    image_service_client::ImageServiceClient, runtime_service_client::RuntimeServiceClient,
    Capability, ContainerConfig, ContainerMetadata, ContainerState, ContainerStatusRequest,
    CreateContainerRequest, ExecSyncRequest, ImageSpec, ImageStatusRequest, KeyValue,
    LinuxContainerConfig, LinuxContainerSecurityContext, LinuxPodSandboxConfig,
    LinuxSandboxSecurityContext, Mount, MountPropagation, NamespaceMode, NamespaceOption,
    PodSandboxConfig, PodSandboxMetadata, PodSandboxStatusRequest, PortMapping, Protocol,
    RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest, StatusRequest,
    StopContainerRequest, StopPodSandboxRequest,
};
use serde_json::Value;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::{err, exec, oci, Result};

/// Kubernetes namespace of the pods (a label; nothing in containerd depends on it).
const POD_NAMESPACE: &str = "sluice-test";
/// containerd's namespace for CRI objects.
const CTR_NAMESPACE: &str = "k8s.io";
/// Longest wait for containerd to serve and to see its image and network.
const READY: Duration = Duration::from_mins(1);
/// Longest one CRI call may take (the first `RunPodSandbox` loads the datapath).
const CALL: Duration = Duration::from_mins(2);
/// Longest containerd gets to stop on SIGTERM before SIGKILL.
const STOP: Duration = Duration::from_secs(10);
/// Longest the cleanup waits for a cgroup to empty.
const CGROUP_WAIT: Duration = Duration::from_secs(5);

static NEXT: AtomicU32 = AtomicU32::new(0);

/// What a pod asks for: the CRI fields the kubelet fills from a pod spec.
#[derive(Clone, Debug, Default)]
pub struct PodSpec {
    pub name: String,
    /// (hostPort, containerPort, "tcp" | "udp" | "sctp").
    pub ports: Vec<(u16, u16, &'static str)>,
    /// Pod annotations (`kubernetes.io/ingress-bandwidth`, ...).
    pub annotations: Vec<(String, String)>,
    /// `hostNetwork: true`: the node's namespace, no CNI.
    pub host_network: bool,
}

impl PodSpec {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            ..Self::default()
        }
    }

    pub fn host_port(mut self, host: u16, container: u16, proto: &'static str) -> Self {
        self.ports.push((host, container, proto));
        self
    }

    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.push((key.to_string(), value.to_string()));
        self
    }

    pub fn host_network(mut self) -> Self {
        self.host_network = true;
        self
    }
}

/// A container as a pod spec describes it (the CRI fields the kubelet fills).
#[derive(Clone, Debug, Default)]
pub struct ContainerSpec {
    pub name: String,
    /// Image reference; empty: the busybox image of [`oci`].
    pub image: String,
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
    /// hostPath volumes.
    pub mounts: Vec<HostMount>,
    /// `Some(add)`: every capability dropped, then `add` (`NET_ADMIN`,
    /// `BPF`, ...), as a `securityContext.capabilities` does; `None`: the
    /// runtime's defaults.
    pub capabilities: Option<Vec<String>>,
}

/// A hostPath volume mounted into a container.
#[derive(Clone, Debug)]
pub struct HostMount {
    pub host: PathBuf,
    pub container: String,
    pub readonly: bool,
    /// `mountPropagation: HostToContainer`: mounts made on the host later
    /// show up inside.
    pub host_to_container: bool,
}

impl HostMount {
    pub fn new(host: impl Into<PathBuf>, container: &str) -> Self {
        Self {
            host: host.into(),
            container: container.into(),
            readonly: false,
            host_to_container: false,
        }
    }

    pub fn readonly(mut self) -> Self {
        self.readonly = true;
        self
    }

    pub fn host_to_container(mut self) -> Self {
        self.host_to_container = true;
        self
    }
}

/// A pod sandbox containerd runs.
#[derive(Clone, Debug)]
pub struct Sandbox {
    pub id: String,
    pub name: String,
    /// The address containerd reports (from the CNI result); unspecified for
    /// a host-network pod.
    pub ip: IpAddr,
    /// The pod's network namespace (`/var/run/netns/cni-...`); empty for a
    /// host-network pod.
    pub netns: PathBuf,
    config: PodSandboxConfig,
}

/// What an `ExecSync` in a container gave.
#[derive(Clone, Debug)]
pub struct Exec {
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// See the module documentation.
pub struct Containerd {
    dir: PathBuf,
    sock: PathBuf,
    process: Option<Child>,
    rt: tokio::runtime::Runtime,
    channel: Channel,
    /// `/sluice-cri-<pid>-<n>`: the pods' cgroup parent in every hierarchy.
    cgroup_parent: String,
    /// Pods made and not removed yet: (id, netns).
    pods: Mutex<Vec<(String, PathBuf)>>,
}

impl Containerd {
    /// Starts containerd in `node_netns` with `conflist` as its only CNI
    /// network and `plugins` (plus `loopback`, which the CRI plugin always runs)
    /// in its CNI bin directory; everything under `dir` (made here). Returns
    /// when it serves, has the image and reports the network ready.
    pub fn start(
        node_netns: &Path,
        dir: &Path,
        conflist: &Value,
        plugins: &[PathBuf],
    ) -> Result<Self> {
        Self::start_with(node_netns, dir, Some(conflist), plugins, &[])
    }

    /// [`Self::start`] with no network yet (`conflist` `None`: containerd
    /// reports `NetworkReady` false until a conflist appears in
    /// [`Self::cni_conf_dir`]; only host-network pods run) and more images
    /// (OCI archives) imported.
    pub fn start_with(
        node_netns: &Path,
        dir: &Path,
        conflist: Option<&Value>,
        plugins: &[PathBuf],
        images: &[PathBuf],
    ) -> Result<Self> {
        let bin = dir.join("cni/bin");
        let conf = dir.join("cni/conf");
        for d in [&bin, &conf, &dir.join("logs"), &dir.join("image")] {
            fs::create_dir_all(d).map_err(|e| err!("creating {}: {e}", d.display()))?;
        }
        let loopback = crate::reference_plugin("loopback")?;
        for p in plugins.iter().chain([&loopback]) {
            let name = p
                .file_name()
                .ok_or_else(|| err!("plugin path {} has no file name", p.display()))?;
            symlink(p, bin.join(name)).map_err(|e| err!("linking {}: {e}", p.display()))?;
        }
        if let Some(conflist) = conflist {
            let conf_file = conf.join("10-test.conflist");
            fs::write(&conf_file, conflist.to_string())
                .map_err(|e| err!("writing {}: {e}", conf_file.display()))?;
        }
        let image = oci::build(&dir.join("image"))?;

        let sock = dir.join("containerd.sock");
        let config = dir.join("config.toml");
        fs::write(&config, config_toml(dir, &sock))
            .map_err(|e| err!("writing {}: {e}", config.display()))?;
        let log_path = dir.join("containerd.log");
        let log = fs::File::create(&log_path)
            .map_err(|e| err!("creating {}: {e}", log_path.display()))?;
        let log2 = log.try_clone()?;
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", node_netns.display()))
            .arg("--")
            .arg("containerd")
            .arg("--config")
            .arg(&config)
            .env_clear()
            .env("PATH", exec::PATH)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        exec::die_with_parent(&mut cmd);
        let process = cmd
            .spawn()
            .map_err(|e| err!("cannot start containerd (package containerd): {e}"))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let channel = {
            let _in_runtime = rt.enter();
            lazy_channel(sock.clone())?
        };
        let mut c = Self {
            dir: dir.to_path_buf(),
            sock,
            process: Some(process),
            rt,
            channel,
            cgroup_parent: format!("/sluice-cri-{}-{n}", std::process::id()),
            pods: Mutex::new(Vec::new()),
        };
        // From here on, Drop cleans up.
        c.wait_serving()?;
        for archive in std::iter::once(&image).chain(images) {
            exec::tool(
                None,
                "ctr",
                &[
                    "-a",
                    &c.sock.display().to_string(),
                    "-n",
                    CTR_NAMESPACE,
                    "images",
                    "import",
                    &archive.display().to_string(),
                ],
            )
            .map_err(|e| err!("ctr images import {}: {e}", archive.display()))?;
        }
        c.wait_ready(conflist.is_some())?;
        Ok(c)
    }

    /// The CNI bin directory containerd runs plugins from.
    pub fn cni_bin_dir(&self) -> PathBuf {
        self.dir.join("cni/bin")
    }

    /// The CNI config directory containerd reads (and watches).
    pub fn cni_conf_dir(&self) -> PathBuf {
        self.dir.join("cni/conf")
    }

    /// Waits until containerd reports `NetworkReady` (it found a conflist
    /// and its plugins).
    pub fn wait_network_ready(&self) -> Result<()> {
        self.wait_ready(true)
    }

    /// The last lines containerd logged (for failure messages).
    pub fn log_tail(&self, lines: usize) -> String {
        let s = fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default();
        let all: Vec<&str> = s.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn runtime(&self) -> RuntimeServiceClient<Channel> {
        RuntimeServiceClient::new(self.channel.clone())
    }

    /// Runs `fut` on the client's runtime, at most [`CALL`].
    fn call<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T> {
        match self
            .rt
            .block_on(async { tokio::time::timeout(CALL, fut).await })
        {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(s)) => Err(err!("{what}: {:?}: {}", s.code(), s.message())),
            Err(_) => Err(err!("{what}: no answer after {CALL:?}")),
        }
    }

    fn wait_serving(&mut self) -> Result<()> {
        let deadline = Instant::now() + READY;
        loop {
            let mut rs = self.runtime();
            let attempt = self.rt.block_on(async {
                let version = rs.version(k8s_cri::v1::VersionRequest {
                    version: "v1".into(),
                });
                tokio::time::timeout(Duration::from_secs(2), version).await
            });
            if let Ok(Ok(_)) = attempt {
                return Ok(());
            }
            if let Some(Ok(Some(st))) = self.process.as_mut().map(Child::try_wait) {
                return Err(err!(
                    "containerd ended ({st}) before serving:\n{}",
                    self.log_tail(30)
                ));
            }
            if Instant::now() > deadline {
                return Err(err!(
                    "containerd does not serve on {} after {READY:?}:\n{}",
                    self.sock.display(),
                    self.log_tail(30)
                ));
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the CRI plugin has the imported image and, with
    /// `network`, reports `NetworkReady` (it found the conflist and its plugins).
    fn wait_ready(&self, network: bool) -> Result<()> {
        let deadline = Instant::now() + READY;
        loop {
            let mut images = ImageServiceClient::new(self.channel.clone());
            let image = self.call(
                "ImageStatus",
                images.image_status(ImageStatusRequest {
                    image: Some(ImageSpec {
                        image: oci::IMAGE.into(),
                        ..ImageSpec::default()
                    }),
                    verbose: false,
                }),
            )?;
            let mut rs = self.runtime();
            let status = self.call("Status", rs.status(StatusRequest { verbose: false }))?;
            let network_ready = status.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.r#type == "NetworkReady" && c.status)
            });
            if image.image.is_some() && (network_ready || !network) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(err!(
                    "containerd is not ready after {READY:?} (image {}: {}, runtime status {:?}):\n{}",
                    oci::IMAGE,
                    image.image.is_some(),
                    status.status,
                    self.log_tail(30)
                ));
            }
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// `RunPodSandbox` as the kubelet sends it for `spec`, then `PodSandboxStatus`
    /// (verbose) for its address and network namespace.
    pub fn run_pod(&self, spec: &PodSpec) -> Result<Sandbox> {
        let config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: spec.name.clone(),
                uid: format!("uid-{}-{}", spec.name, std::process::id()),
                namespace: POD_NAMESPACE.into(),
                attempt: 0,
            }),
            // A host-network pod shares the node's UTS namespace: the kubelet
            // sends no hostname for it (runc refuses one).
            hostname: if spec.host_network {
                String::new()
            } else {
                spec.name.clone()
            },
            log_directory: self.dir.join("logs").join(&spec.name).display().to_string(),
            port_mappings: spec
                .ports
                .iter()
                .map(|&(host, container, proto)| PortMapping {
                    protocol: match proto {
                        "udp" => Protocol::Udp,
                        "sctp" => Protocol::Sctp,
                        _ => Protocol::Tcp,
                    } as i32,
                    container_port: i32::from(container),
                    host_port: i32::from(host),
                    host_ip: String::new(),
                })
                .collect(),
            annotations: spec.annotations.iter().cloned().collect(),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: self.cgroup_parent.clone(),
                security_context: spec.host_network.then(|| LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: NamespaceMode::Node as i32,
                        ..NamespaceOption::default()
                    }),
                    ..LinuxSandboxSecurityContext::default()
                }),
                ..LinuxPodSandboxConfig::default()
            }),
            ..PodSandboxConfig::default()
        };
        let mut rs = self.runtime();
        let id = self
            .call(
                &format!("RunPodSandbox {}", spec.name),
                rs.run_pod_sandbox(RunPodSandboxRequest {
                    config: Some(config.clone()),
                    runtime_handler: String::new(),
                }),
            )?
            .pod_sandbox_id;
        let st = self.call(
            &format!("PodSandboxStatus {}", spec.name),
            rs.pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id.clone(),
                verbose: true,
            }),
        );
        // Recorded before anything else can fail, so that Drop removes it.
        let netns = st
            .as_ref()
            .ok()
            .and_then(|st| st.info.get("info"))
            .and_then(|i| serde_json::from_str::<Value>(i).ok())
            .and_then(|i| netns_of(&i));
        if let Ok(mut pods) = self.pods.lock() {
            pods.push((id.clone(), netns.clone().unwrap_or_default()));
        }
        let st = st?;
        if spec.host_network {
            return Ok(Sandbox {
                id,
                name: spec.name.clone(),
                ip: IpAddr::from([0, 0, 0, 0]),
                netns: PathBuf::new(),
                config,
            });
        }
        let ip = st
            .status
            .as_ref()
            .and_then(|s| s.network.as_ref())
            .and_then(|n| n.ip.parse().ok())
            .ok_or_else(|| {
                err!(
                    "PodSandboxStatus of {} has no IP: {:?}",
                    spec.name,
                    st.status
                )
            })?;
        let netns = netns.ok_or_else(|| {
            err!(
                "PodSandboxStatus of {} names no network namespace: {:?}",
                spec.name,
                st.info
            )
        })?;
        Ok(Sandbox {
            id,
            name: spec.name.clone(),
            ip,
            netns,
            config,
        })
    }

    /// `CreateContainer` + `StartContainer` of `command` in the image, in `sb`.
    pub fn run_container(&self, sb: &Sandbox, name: &str, command: &[&str]) -> Result<String> {
        self.run_container_spec(
            sb,
            &ContainerSpec {
                name: name.into(),
                command: command.iter().map(|s| (*s).to_string()).collect(),
                ..ContainerSpec::default()
            },
        )
    }

    /// `CreateContainer` + `StartContainer` of `c` in `sb`.
    pub fn run_container_spec(&self, sb: &Sandbox, c: &ContainerSpec) -> Result<String> {
        let name = &c.name;
        let image = if c.image.is_empty() {
            oci::IMAGE.to_string()
        } else {
            c.image.clone()
        };
        let mut rs = self.runtime();
        let id = self
            .call(
                &format!("CreateContainer {name} in {}", sb.name),
                rs.create_container(CreateContainerRequest {
                    pod_sandbox_id: sb.id.clone(),
                    config: Some(ContainerConfig {
                        metadata: Some(ContainerMetadata {
                            name: name.clone(),
                            attempt: 0,
                        }),
                        image: Some(ImageSpec {
                            image,
                            ..ImageSpec::default()
                        }),
                        command: c.command.clone(),
                        envs: c
                            .env
                            .iter()
                            .map(|(key, value)| KeyValue {
                                key: key.clone(),
                                value: value.clone(),
                            })
                            .collect(),
                        mounts: c
                            .mounts
                            .iter()
                            .map(|m| Mount {
                                host_path: m.host.display().to_string(),
                                container_path: m.container.clone(),
                                readonly: m.readonly,
                                propagation: if m.host_to_container {
                                    MountPropagation::PropagationHostToContainer as i32
                                } else {
                                    MountPropagation::PropagationPrivate as i32
                                },
                                ..Mount::default()
                            })
                            .collect(),
                        linux: c.capabilities.as_ref().map(|add| LinuxContainerConfig {
                            security_context: Some(LinuxContainerSecurityContext {
                                capabilities: Some(Capability {
                                    add_capabilities: add.clone(),
                                    drop_capabilities: vec!["ALL".into()],
                                    ..Capability::default()
                                }),
                                ..LinuxContainerSecurityContext::default()
                            }),
                            ..LinuxContainerConfig::default()
                        }),
                        log_path: format!("{name}.log"),
                        ..ContainerConfig::default()
                    }),
                    sandbox_config: Some(sb.config.clone()),
                }),
            )?
            .container_id;
        self.call(
            &format!("StartContainer {name} in {}", sb.name),
            rs.start_container(StartContainerRequest {
                container_id: id.clone(),
            }),
        )?;
        Ok(id)
    }

    /// Waits at most `timeout` for container `id` (named `name` in `sb`) to
    /// exit; its exit code and what it wrote (the CRI log's messages).
    pub fn wait_exited(
        &self,
        sb: &Sandbox,
        id: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<(i32, String)> {
        let deadline = Instant::now() + timeout;
        let log = Path::new(&sb.config.log_directory).join(format!("{name}.log"));
        let read_log = || {
            // "<time> <stream> <F|P> <message>" per line.
            fs::read_to_string(&log)
                .unwrap_or_default()
                .lines()
                .map(|l| l.splitn(4, ' ').nth(3).unwrap_or(l).to_string())
                .collect::<Vec<_>>()
                .join("\n")
        };
        loop {
            let mut rs = self.runtime();
            let st = self.call(
                &format!("ContainerStatus {name}"),
                rs.container_status(ContainerStatusRequest {
                    container_id: id.into(),
                    verbose: false,
                }),
            )?;
            if let Some(st) = st.status {
                if st.state == ContainerState::ContainerExited as i32 {
                    return Ok((st.exit_code, read_log()));
                }
            }
            if Instant::now() > deadline {
                return Err(err!(
                    "container {name} still runs after {timeout:?}; it wrote:\n{}",
                    read_log()
                ));
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// `ExecSync` `cmd` in container `id`, at most `timeout_secs`.
    pub fn exec(&self, id: &str, cmd: &[&str], timeout_secs: i64) -> Result<Exec> {
        let mut rs = self.runtime();
        let r = self.call(
            &format!("ExecSync {cmd:?}"),
            rs.exec_sync(ExecSyncRequest {
                container_id: id.into(),
                cmd: cmd.iter().map(|s| (*s).to_string()).collect(),
                timeout: timeout_secs,
            }),
        )?;
        Ok(Exec {
            exit_code: r.exit_code,
            stdout: String::from_utf8_lossy(&r.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&r.stderr).into_owned(),
        })
    }

    /// `StopPodSandbox` then `RemovePodSandbox`, as the kubelet does when a pod goes.
    /// Stops container `id` as the kubelet does when a pod is deleted: SIGTERM,
    /// then SIGKILL after `grace` seconds (`terminationGracePeriodSeconds`).
    /// (`StopPodSandbox` alone kills at once.)
    pub fn stop_container(&self, id: &str, grace: i64) -> Result<()> {
        let mut rs = self.runtime();
        self.call(
            &format!("StopContainer {id}"),
            rs.stop_container(StopContainerRequest {
                container_id: id.into(),
                timeout: grace,
            }),
        )?;
        Ok(())
    }

    pub fn remove_pod(&self, sb: &Sandbox) -> Result<()> {
        self.remove_by_id(&sb.id)
    }

    fn remove_by_id(&self, id: &str) -> Result<()> {
        let mut rs = self.runtime();
        self.call(
            &format!("StopPodSandbox {id}"),
            rs.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: id.into(),
            }),
        )?;
        self.call(
            &format!("RemovePodSandbox {id}"),
            rs.remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: id.into(),
            }),
        )?;
        if let Ok(mut pods) = self.pods.lock() {
            pods.retain(|(p, _)| p != id);
        }
        Ok(())
    }

    /// Stops containerd: SIGTERM, then SIGKILL after [`STOP`].
    fn stop_process(&mut self) {
        let Some(mut child) = self.process.take() else {
            return;
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let deadline = Instant::now() + STOP;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(50));
        }
        eprintln!("cleanup: containerd did not stop on SIGTERM; SIGKILL");
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A channel to containerd's socket that connects on first use (the socket
/// appears once containerd runs). Called within the runtime (its buffer task is
/// spawned there).
fn lazy_channel(sock: PathBuf) -> Result<Channel> {
    // The URI is required by tonic and ignored by the connector.
    let endpoint = Endpoint::try_from("http://[::]:50051").map_err(|e| err!("endpoint: {e}"))?;
    Ok(
        endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let sock = sock.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(sock).await?))
            }
        })),
    )
}

/// The network namespace path in containerd 1.6's verbose sandbox info
/// (`runtimeSpec.linux.namespaces[type=network].path`).
fn netns_of(info: &Value) -> Option<PathBuf> {
    info["runtimeSpec"]["linux"]["namespaces"]
        .as_array()?
        .iter()
        .find(|n| n["type"] == "network")
        .and_then(|n| n["path"].as_str())
        .map(PathBuf::from)
}

fn config_toml(dir: &Path, sock: &Path) -> String {
    let d = dir.display();
    let s = sock.display();
    format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"
# Nothing of the host's: no /opt plugin directory, no other snapshotters, no tracing.
disabled_plugins = [
  "io.containerd.internal.v1.opt",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp",
]

[grpc]
  address = "{s}"

[ttrpc]
  address = "{s}.ttrpc"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{image}"
  # runc cannot lower oom_score_adj without CAP_SYS_RESOURCE.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{d}/cni/bin"
    conf_dir = "{d}/cni/conf"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "{d}/runc"
"#,
        image = oci::IMAGE,
    )
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let pods: Vec<(String, PathBuf)> = self.pods.lock().map(|p| p.clone()).unwrap_or_default();
        if self.process.is_some() {
            for (id, _) in &pods {
                if let Err(e) = self.remove_by_id(id) {
                    eprintln!("cleanup: {e}");
                }
            }
        }
        self.stop_process();
        kill_shims(&self.sock);
        remove_cgroups(&self.cgroup_parent);
        unmount_under(&self.dir);
        for (_, netns) in pods {
            if netns.as_os_str().is_empty() || !netns.exists() {
                continue;
            }
            let _ = nix::mount::umount2(&netns, nix::mount::MntFlags::MNT_DETACH);
            if let Err(e) = fs::remove_file(&netns) {
                eprintln!("cleanup: removing {}: {e}", netns.display());
            }
        }
    }
}

/// SIGKILLs the shims serving containerd at `sock` (their command line names it).
fn kill_shims(sock: &Path) {
    let want = sock.display().to_string();
    let Ok(procs) = fs::read_dir("/proc") else {
        return;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = fs::read(p.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_shim = args.first().is_some_and(|a| a.contains("containerd-shim"));
        if is_shim && args.iter().any(|a| a == &want) {
            eprintln!("cleanup: killing shim {pid}");
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Mount points of every cgroup hierarchy (v1 and v2), from mountinfo.
fn cgroup_mounts() -> Vec<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let fstype = right.split_whitespace().next()?;
            (fstype == "cgroup" || fstype == "cgroup2")
                .then(|| left.split_whitespace().nth(4).map(PathBuf::from))
                .flatten()
        })
        .collect()
}

/// Kills what is left under the pods' cgroup parent in every hierarchy and
/// removes its directories, deepest first.
fn remove_cgroups(parent: &str) {
    for mount in cgroup_mounts() {
        let top = mount.join(parent.trim_start_matches('/'));
        if !top.exists() {
            continue;
        }
        let mut dirs = Vec::new();
        collect_dirs(&top, &mut dirs);
        // Deepest first: a parent goes only once its children are gone.
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for d in dirs {
            let deadline = Instant::now() + CGROUP_WAIT;
            loop {
                let procs = fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
                let pids: Vec<i32> = procs
                    .lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect();
                for pid in &pids {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(*pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                match fs::remove_dir(&d) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(e) if Instant::now() > deadline => {
                        eprintln!("cleanup: removing cgroup {}: {e}", d.display());
                        break;
                    }
                    Err(_) => thread::sleep(Duration::from_millis(50)),
                }
            }
        }
    }
}

fn collect_dirs(d: &Path, out: &mut Vec<PathBuf>) {
    out.push(d.to_path_buf());
    if let Ok(rd) = fs::read_dir(d) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&e.path(), out);
            }
        }
    }
}

/// Detaches every mount under `dir` (rootfs overlays and shm of a shim that
/// died), deepest first.
fn unmount_under(dir: &Path) {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4).map(PathBuf::from))
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in points {
        if let Err(e) = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH) {
            eprintln!("cleanup: unmounting {}: {e}", p.display());
        }
    }
}
