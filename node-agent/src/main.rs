//! `sluice-node`: Sluice's optional per-node agent for Kubernetes. The plugin
//! itself stays agentless (a runtime executes it per pod); this binary does the
//! node-level work a cluster needs around it:
//!
//! - `install` (a DaemonSet's init container): copies the plugin into the
//!   host's CNI bin directory and writes the conflist from the Node's
//!   `spec.podCIDRs`, both atomically;
//! - `route-sync` (the DaemonSet's container): routes to other nodes' pods,
//!   the NAT sweep, the node's addresses for hostPorts and the Service
//!   addresses kube-proxy translates;
//! - `sweep`: the NAT sweep alone (nodes without Kubernetes): idle flows
//!   removed from process context instead of the in-kernel sweeper's hard
//!   interrupt;
//! - `node-addrs`: the node's addresses for hostPorts alone (nodes without
//!   Kubernetes), followed from the kernel's notifications instead of read by
//!   every ADD with hostPorts;
//! - `services`: the Service addresses alone (ServiceCIDRs, ClusterIPs,
//!   externalIPs, load balancer IPs), whose traffic from pods the datapath
//!   hands to kube-proxy;
//! - `proxy`: Sluice translates the Services itself (ClusterIPs, external
//!   and load balancer IPs at the socket), instead of kube-proxy;
//! - `uninstall`.
mod atomic;
mod cluster;
mod conflist;
mod error;
mod install;
mod node_addrs;
mod policy;
mod proxy;
mod records;
mod routes;
mod services;
mod shutdown;
mod sweep;
mod sync;

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};
use ipnetwork::IpNetwork;
use serde_json::{Map, Value};

use error::{Error, Result};

#[derive(Parser)]
#[command(
    name = "sluice-node",
    version,
    about = "Sluice's node agent for Kubernetes"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Copy the plugin into the CNI bin directory and write the conflist
    /// from the Node's pod CIDRs (both atomically).
    Install(Box<InstallArgs>),
    /// Remove the conflist (if sluice-node wrote it) and the plugin.
    Uninstall(Dirs),
    /// Keep routes to other nodes' pod CIDRs (`podCIDR via InternalIP`) and
    /// the datapath's non-masquerade ranges in step with the cluster's Nodes.
    RouteSync(SyncArgs),
    /// Remove idle NAT flows from this process, once a second, instead of the
    /// datapath's in-kernel sweeper (a perf-event program, in hard interrupt
    /// context); the in-kernel one takes over again when this stops.
    Sweep(Datapath),
    /// Keep the datapath's copy of the node's addresses (on which hostPorts
    /// answer) current from the kernel's address notifications, instead of
    /// each ADD with hostPorts reading them; ADDs read them again when this
    /// stops.
    NodeAddrs(Datapath),
    /// Keep the addresses kube-proxy translates (ServiceCIDRs, or each
    /// ClusterIP where the cluster has no ServiceCIDR API; externalIPs; load
    /// balancer IPs) in the datapath's Service ranges, so that pods' traffic
    /// to them goes to the node's stack.
    Services(ServicesArgs),
    /// Translate the cluster's Services in the datapath instead of
    /// kube-proxy: keep the Service maps in step with Services and
    /// EndpointSlices and attach the Service socket hooks to a cgroup.
    Proxy(ProxyArgs),
    /// Enforce the cluster's `NetworkPolicy` objects in the datapath: keep
    /// the policy maps in step with them and with Pods and Namespaces.
    Policy(PolicyArgs),
}

/// A comma-separated list of CIDRs (`10.96.0.0/12,fd00:10:96::/112`); an
/// empty one (a `ConfigMap` key left empty) is no CIDR at all.
#[derive(Clone, Debug, Default)]
struct Cidrs(Vec<IpNetwork>);

fn parse_cidrs(s: &str) -> std::result::Result<Cidrs, String> {
    let mut v = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        v.push(
            item.parse::<IpNetwork>()
                .map_err(|e| format!("{item:?} is not a CIDR ({e})"))?,
        );
    }
    Ok(Cidrs(v))
}

/// Where the network's datapath is pinned.
#[derive(clap::Args)]
struct Datapath {
    /// The network's name; its datapath is pinned where the plugin pins it by
    /// default (/sys/fs/bpf/sluice/<network>, dots replaced as bpffs requires).
    #[arg(long, env = "SLUICE_NETWORK", default_value = "sluice")]
    network: String,
    /// The datapath's pin root, if the conflist sets `pinRoot`.
    #[arg(long, env = "SLUICE_PIN_ROOT")]
    pin_root: Option<PathBuf>,
}

impl Datapath {
    fn pin_root(self) -> PathBuf {
        self.pin_root
            .unwrap_or_else(|| sluice_common::user::default_pin_root(&self.network))
    }
}

#[derive(clap::Args)]
struct Dirs {
    /// The host's CNI bin directory, as mounted in the container.
    #[arg(long, env = "SLUICE_CNI_BIN_DIR", default_value = "/host/opt/cni/bin")]
    cni_bin_dir: PathBuf,
    /// The host's CNI config directory, as mounted in the container.
    #[arg(
        long,
        env = "SLUICE_CNI_CONF_DIR",
        default_value = "/host/etc/cni/net.d"
    )]
    cni_conf_dir: PathBuf,
    /// File name of the conflist.
    #[arg(
        long,
        env = "SLUICE_CONFLIST_NAME",
        default_value = "10-sluice.conflist"
    )]
    conflist_name: String,
    /// The network's name (the conflist's `name`).
    #[arg(long, env = "SLUICE_NETWORK", default_value = "sluice")]
    network: String,
}

#[derive(clap::Args)]
struct InstallArgs {
    #[command(flatten)]
    dirs: Dirs,
    /// Directory holding the `sluice` binary to install (default: this
    /// binary's directory).
    #[arg(long)]
    from: Option<PathBuf>,
    /// The Node whose spec.podCIDRs the conflist uses (the downward API's
    /// spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Pod CIDRs to use instead of reading the Node (comma-separated, at
    /// most one per family).
    #[arg(long, env = "SLUICE_POD_CIDRS", value_parser = parse_cidrs)]
    pod_cidrs: Option<Cidrs>,
    /// The cluster's pod CIDRs (comma-separated): never masqueraded. Without
    /// them, route-sync adds the other nodes' ranges as they appear.
    #[arg(long, env = "SLUICE_CLUSTER_CIDRS", value_parser = parse_cidrs)]
    cluster_cidrs: Option<Cidrs>,
    /// The cluster's Service CIDRs (comma-separated; kube-apiserver's
    /// --service-cluster-ip-range): the conflist's serviceCIDRs, whose traffic
    /// from pods goes to kube-proxy. Without them, the ServiceCIDR objects'
    /// ranges (Kubernetes 1.33+), else none (route-sync then writes each
    /// ClusterIP).
    #[arg(long, env = "SLUICE_SERVICE_CIDRS", value_parser = parse_cidrs)]
    service_cidrs: Option<Cidrs>,
    /// Do not masquerade pod traffic leaving the cluster.
    #[arg(long, env = "SLUICE_NO_MASQUERADE")]
    no_masquerade: bool,
    /// The conflist's cniVersion (containerd 1.6 reads up to 1.0.0).
    #[arg(long, env = "SLUICE_CNI_VERSION", default_value = "1.0.0")]
    cni_version: String,
    /// More keys of the plugin's entry, a JSON object (e.g. {"uplink":"ens3","podDevice":"auto"}).
    #[arg(long, env = "SLUICE_PLUGIN_CONFIG")]
    plugin_config: Option<String>,
    /// How long to wait for the Node to get pod CIDRs, in seconds.
    #[arg(long, default_value_t = 300)]
    wait_secs: u64,
    /// Mount bpffs here if it is not mounted (needs `CAP_SYS_ADMIN` and
    /// bidirectional mount propagation; otherwise the plugin does it).
    #[arg(long)]
    bpffs: Option<PathBuf>,
}

#[derive(clap::Args)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "command-line switches, one per duty"
)]
struct SyncArgs {
    /// This node's name: its own pod CIDRs get no route.
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    #[command(flatten)]
    datapath: Datapath,
    /// Leave idle NAT flows to the datapath's in-kernel sweeper (see `sweep`).
    #[arg(long, env = "SLUICE_NO_NAT_SWEEP")]
    no_nat_sweep: bool,
    /// Leave the node's addresses for hostPorts to each ADD (see `node-addrs`).
    #[arg(long, env = "SLUICE_NO_NODE_ADDRS")]
    no_node_addrs: bool,
    /// Leave the Service addresses to the config's serviceCIDRs (see `services`).
    #[arg(long, env = "SLUICE_NO_SERVICES")]
    no_services: bool,
    /// Translate Services in the datapath instead of kube-proxy (see `proxy`).
    #[arg(long, env = "SLUICE_SERVICE_PROXY")]
    service_proxy: bool,
    /// With `--service-proxy`: the cgroup v2 directory whose processes'
    /// sockets the Service hooks translate (default: the hierarchy's root;
    /// the DaemonSet mounts the host's at /host/sys/fs/cgroup).
    #[arg(long, env = "SLUICE_SERVICE_CGROUP")]
    service_cgroup: Option<PathBuf>,
    /// With `--service-proxy`: the plugin's state directory (its
    /// `stateDir`), whose attachment records name the pods' network
    /// namespaces (runtimes bind-mount them under /run/netns): UDP sockets
    /// there connected to a removed backend are closed.
    #[arg(long, env = "SLUICE_CNI_STATE_DIR", default_value = sluice_common::DEFAULT_STATE_DIR)]
    cni_state_dir: PathBuf,
    /// With `--service-proxy`: see `proxy --node-ip`.
    #[arg(long, env = "SLUICE_NODE_IP")]
    node_ip: Option<std::net::IpAddr>,
    /// With `--service-proxy`: see `proxy --state-file`.
    #[arg(long, env = "SLUICE_SERVICE_STATE")]
    service_state_file: Option<PathBuf>,
    /// Enforce the cluster's `NetworkPolicy` objects in the datapath
    /// (`enforce`), or only count and report what they would drop
    /// (`audit`); see `policy`. Without it, policy is off in the datapath.
    #[arg(long, env = "SLUICE_NETWORK_POLICY", value_parser = ["enforce", "audit", "off", ""])]
    network_policy: Option<String>,
    /// With `--network-policy`: see `policy --state-file`.
    #[arg(long, env = "SLUICE_POLICY_STATE", default_value = DEFAULT_POLICY_STATE)]
    policy_state_file: PathBuf,
    /// Reconcile everything this often (seconds) even without a change.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    resync_secs: u64,
}

#[derive(clap::Args)]
struct ServicesArgs {
    #[command(flatten)]
    datapath: Datapath,
    /// Write everything again this often (seconds) even without a change; a
    /// cluster without the ServiceCIDR API is asked for it again this often.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    resync_secs: u64,
}

#[derive(clap::Args)]
struct ProxyArgs {
    #[command(flatten)]
    datapath: Datapath,
    /// This node's name (`internalTrafficPolicy: Local` keeps its endpoints).
    #[arg(long, env = "NODE_NAME", required_unless_present = "stop")]
    node_name: Option<String>,
    /// The cgroup v2 directory whose processes' sockets the Service hooks
    /// translate (default: the root of the cgroup v2 hierarchy: every pod
    /// and the node's own processes).
    #[arg(long, env = "SLUICE_SERVICE_CGROUP")]
    cgroup: Option<PathBuf>,
    /// The plugin's state directory (its `stateDir`), whose attachment
    /// records name the pods' network namespaces: UDP sockets there
    /// connected to a removed backend are closed.
    #[arg(long, env = "SLUICE_CNI_STATE_DIR", default_value = sluice_common::DEFAULT_STATE_DIR)]
    cni_state_dir: PathBuf,
    /// This node's IPv4 address (the DaemonSet gives `status.hostIP`): the
    /// source of flows from outside to an external or load balancer IP that
    /// go on to a backend on another node. Without it (or with an IPv6 one)
    /// such flows are left to the node's stack.
    #[arg(long, env = "SLUICE_NODE_IP")]
    node_ip: Option<std::net::IpAddr>,
    /// Write each Service port's name, frontends and endpoints (with their
    /// state) here, for `sluicectl services lb` and the metrics (the maps
    /// hold addresses only); the DaemonSet uses /run/sluice/services.json.
    #[arg(long, env = "SLUICE_SERVICE_STATE")]
    state_file: Option<PathBuf>,
    /// Compare everything again this often (seconds) even without a change.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    resync_secs: u64,
    /// Remove the Service socket hooks and exit (back to kube-proxy).
    #[arg(long)]
    stop: bool,
}

#[derive(clap::Args)]
struct PolicyArgs {
    #[command(flatten)]
    datapath: Datapath,
    /// Audit (dry run): flows policy would refuse are counted and reported
    /// (`policy_audit_*`, the monitor) and let through.
    #[arg(long, env = "SLUICE_POLICY_AUDIT")]
    audit: bool,
    /// Where the compiled policy is written for `sluicectl policy`.
    #[arg(long, env = "SLUICE_POLICY_STATE", default_value = DEFAULT_POLICY_STATE)]
    state_file: PathBuf,
    /// The plugin's state directory (its `stateDir`): the attachment
    /// records name the pod of each address on this node.
    #[arg(long, env = "SLUICE_CNI_STATE_DIR", default_value = sluice_common::DEFAULT_STATE_DIR)]
    cni_state_dir: PathBuf,
    /// Compare everything again this often (seconds) even without a change.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    resync_secs: u64,
    /// Switch policy off in the datapath (every flow passes) and exit.
    #[arg(long)]
    stop: bool,
}

/// Where `sluice-node policy` writes the compiled policy by default (and
/// where `sluicectl policy` reads it).
const DEFAULT_POLICY_STATE: &str = "/run/sluice/policy.json";

/// `--node-ip` as the IPv4 address flows from outside leave with (an IPv6
/// one, as `status.hostIP` is on an IPv6-first node, is not used: IPv6 from
/// outside is left to the stack).
fn node_ip4(ip: Option<std::net::IpAddr>) -> Option<std::net::Ipv4Addr> {
    match ip? {
        std::net::IpAddr::V4(v4) => Some(v4),
        std::net::IpAddr::V6(v6) => {
            log(&format!(
                "proxy: --node-ip {v6} is not IPv4: flows from outside to an external or load balancer IP with an endpoint on another node are left to the node's stack"
            ));
            None
        }
    }
}

/// The cgroup the Service hooks attach to: `given`, or the root of the
/// cgroup v2 hierarchy.
fn service_cgroup(given: Option<PathBuf>) -> Result<PathBuf> {
    match given {
        Some(c) => Ok(c),
        None => sluice_common::user::cgroup2_mount().ok_or_else(|| {
            Error::invalid(
                "--cgroup",
                "",
                "no cgroup v2 hierarchy is mounted on this node; name a cgroup v2 directory",
            )
        }),
    }
}

/// One line on stderr (the container's log).
pub(crate) fn log(msg: &str) {
    eprintln!("sluice-node: {msg}");
}

fn plugin_extra(json: Option<&str>) -> Result<Map<String, Value>> {
    match json {
        None => Ok(Map::new()),
        Some(s) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Object(m)) => Ok(m),
            Ok(_) => Err(Error::invalid("--plugin-config", s, "is not a JSON object")),
            Err(e) => Err(Error::invalid("--plugin-config", s, e.to_string())),
        },
    }
}

async fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Install(a) => {
            let from = match a.from {
                Some(f) => f,
                None => std::env::current_exe()
                    .map_err(|e| Error::io("finding this binary", e))?
                    .parent()
                    .map(PathBuf::from)
                    .unwrap_or_default(),
            };
            install::install(install::Options {
                from,
                service_cidrs_from_api: a.service_cidrs.as_ref().is_none_or(|c| c.0.is_empty()),
                spec: conflist::Spec {
                    name: a.dirs.network.clone(),
                    cni_version: a.cni_version,
                    pod_cidrs: a.pod_cidrs.unwrap_or_default().0,
                    cluster_cidrs: a.cluster_cidrs.unwrap_or_default().0,
                    service_cidrs: a.service_cidrs.unwrap_or_default().0,
                    masquerade: !a.no_masquerade,
                    extra: plugin_extra(a.plugin_config.as_deref())?,
                },
                cni_bin_dir: a.dirs.cni_bin_dir,
                cni_conf_dir: a.dirs.cni_conf_dir,
                conflist_name: a.dirs.conflist_name,
                node_name: a.node_name,
                wait: Duration::from_secs(a.wait_secs),
                bpffs: a.bpffs,
            })
            .await
        }
        Cmd::Uninstall(d) => install::uninstall(
            &d.cni_bin_dir,
            &d.cni_conf_dir,
            &d.conflist_name,
            &d.network,
        ),
        Cmd::RouteSync(a) => {
            let client = cluster::client().await?;
            let resync = Duration::from_secs(a.resync_secs);
            let no_services = a.no_services;
            let pin_root = a.datapath.pin_root();
            let proxy_opts = if a.service_proxy {
                Some(proxy::Options {
                    pin_root: pin_root.clone(),
                    node_name: a.node_name.clone(),
                    cgroup: service_cgroup(a.service_cgroup)?,
                    cni_state_dir: a.cni_state_dir.clone(),
                    resync,
                    node_ip: node_ip4(a.node_ip),
                    state_file: a.service_state_file.clone(),
                })
            } else {
                // Back to kube-proxy: the hooks an earlier `--service-proxy`
                // attached go (route-sync owns the mode).
                if sluice_maps::lb::hooks_attached(&sluice_maps::PinRoot::new(&pin_root)) {
                    proxy::stop(&pin_root)?;
                }
                None
            };
            let policy_opts =
                if let Some(mode @ ("enforce" | "audit")) = a.network_policy.as_deref() {
                    Some(policy::Options {
                        pin_root: pin_root.clone(),
                        audit: mode == "audit",
                        state_file: a.policy_state_file.clone(),
                        cni_state_dir: a.cni_state_dir.clone(),
                        resync,
                    })
                } else {
                    // Policy off: what an earlier `--network-policy` switched
                    // on goes (route-sync owns the mode), so no pod waits for
                    // a compiler that is not running.
                    let root = sluice_maps::PinRoot::new(&pin_root);
                    if sluice_maps::policy::config(&root)
                        .ok()
                        .flatten()
                        .is_some_and(|c| c.flags != 0)
                    {
                        policy::stop(&pin_root)?;
                    }
                    None
                };
            let services_opts = services::Options {
                pin_root: pin_root.clone(),
                resync,
            };
            let sync_opts = sync::Options {
                pin_root,
                node_name: a.node_name,
                resync,
                nat_sweep: !a.no_nat_sweep,
                node_addrs: !a.no_node_addrs,
            };
            let shutdown = shutdown::on_signals()?;
            let routes = sync::run(client.clone(), &sync_opts, shutdown.clone());
            let services = async {
                let ranges = async {
                    if no_services {
                        return Ok(());
                    }
                    services::run(client.clone(), &services_opts, shutdown.clone())
                        .await
                        .inspect_err(|e| {
                            log(&format!(
                                "services: {e}; route-sync goes on without the Service addresses"
                            ));
                        })
                };
                let proxied = async {
                    let Some(o) = &proxy_opts else {
                        return Ok(());
                    };
                    proxy::run(client.clone(), o, shutdown.clone())
                        .await
                        .inspect_err(|e| {
                            log(&format!(
                                "proxy: {e}; route-sync goes on without translating Services"
                            ));
                        })
                };
                let policed = async {
                    let Some(o) = &policy_opts else {
                        return Ok(());
                    };
                    policy::run(client.clone(), o, shutdown.clone())
                        .await
                        .inspect_err(|e| {
                            log(&format!(
                                "policy: {e}; route-sync goes on without NetworkPolicy (pods keep the policy last written)"
                            ));
                        })
                };
                let (r, p, n) = futures::join!(ranges, proxied, policed);
                r.and(p).and(n)
            };
            futures::pin_mut!(routes, services);
            // Both end at SIGTERM. The routes' end (a signal or an error) ends
            // the process: the Service duty has nothing to clean up. The
            // Service duty failing leaves the routes to go on.
            tokio::select! {
                r = &mut routes => r,
                s = &mut services => {
                    let r = routes.await;
                    r.and(s)
                }
            }
        }
        Cmd::Services(a) => {
            let client = cluster::client().await?;
            services::run(
                client,
                &services::Options {
                    pin_root: a.datapath.pin_root(),
                    resync: Duration::from_secs(a.resync_secs),
                },
                shutdown::on_signals()?,
            )
            .await
        }
        Cmd::Proxy(a) => {
            let pin_root = a.datapath.pin_root();
            if a.stop {
                return proxy::stop(&pin_root);
            }
            let cgroup = service_cgroup(a.cgroup)?;
            let client = cluster::client().await?;
            proxy::run(
                client,
                &proxy::Options {
                    pin_root,
                    node_name: a.node_name.unwrap_or_default(),
                    cgroup,
                    cni_state_dir: a.cni_state_dir,
                    resync: Duration::from_secs(a.resync_secs),
                    node_ip: node_ip4(a.node_ip),
                    state_file: a.state_file,
                },
                shutdown::on_signals()?,
            )
            .await
        }
        Cmd::Policy(a) => {
            let pin_root = a.datapath.pin_root();
            if a.stop {
                return policy::stop(&pin_root);
            }
            let client = cluster::client().await?;
            policy::run(
                client,
                &policy::Options {
                    pin_root,
                    audit: a.audit,
                    state_file: a.state_file,
                    cni_state_dir: a.cni_state_dir,
                    resync: Duration::from_secs(a.resync_secs),
                },
                shutdown::on_signals()?,
            )
            .await
        }
        Cmd::Sweep(d) => sweep::run(d.pin_root(), shutdown::on_signals()?).await,
        Cmd::NodeAddrs(d) => node_addrs::run(d.pin_root(), shutdown::on_signals()?).await,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            log(&format!("starting the runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log(&format!("error: {e}"));
            ExitCode::FAILURE
        }
    }
}
