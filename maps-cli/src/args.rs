//! The command-line tree.
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "sluicectl",
    version,
    about = "Inspect and change Sluice's pinned eBPF datapath",
    after_help = "\
The pin root: --pin-root, else /sys/fs/bpf/sluice/<--network>, else the only network
pinned under /sys/fs/bpf/sluice. Run as root in the node's network namespace.
A pod (--pod, POD) is an address or a container id prefix. Every refusal exits 1.

Examples:
  sluicectl -n pods status
  sluicectl -n pods counters --pod 10.22.0.5 --watch
  sluicectl -n pods monitor --type drop --pod 10.22.0.5
  sluicectl -n pods nat list --proto tcp --dst 1.1.1.1 --json
  sluicectl -n pods nat pods                   # flows per pod against its share
  sluicectl -n pods services flows --pod 10.22.0.5
  sluicectl -n pods ports add --host-port 8443 --pod 10.22.0.5 --container-port 443
  sluicectl -n pods bandwidth set 10.22.0.5 --egress-rate 50000000
  sluicectl -n pods datapath detach-all        # says what it would do; --yes does it"
)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub target: Target,
    #[command(subcommand)]
    pub command: Command,
}

/// Which network's datapath: by name (default pin root) or by pin root.
#[derive(Args, Clone)]
pub(crate) struct Target {
    /// Network name from the CNI config; the pin root is /sys/fs/bpf/sluice/<name>.
    #[arg(long, short = 'n', global = true, env = "SLUICE_NETWORK")]
    pub network: Option<String>,
    /// Pin root of the datapath (overrides --network).
    #[arg(long, global = true, env = "SLUICE_PIN_ROOT")]
    pub pin_root: Option<PathBuf>,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Datapath version, pin root, uplink and XDP mode, attachments, counters.
    Status(JsonArgs),
    /// List pod endpoints with their packet and byte counters.
    Endpoints(EndpointsArgs),
    /// Per-reason packet counters of the node, and per endpoint: packets and
    /// bytes each way plus drops by reason (summed over CPUs); `--watch` refreshes.
    #[command(after_help = "\
Examples:
  sluicectl -n pods counters                   # non-zero node reasons + every endpoint
  sluicectl -n pods counters --all --node      # every reason of the node
  sluicectl -n pods counters --pod 10.22.0.5 --watch 2
  sluicectl -n pods counters --json            # {\"node\": {...}, \"endpoints\": [...]}")]
    Counters(CountersArgs),
    /// Stream datapath events: drops with their reason, new and evicted
    /// masquerade flows, new hostPort flows, and the programs' debug lines when the network config has
    /// `"debug": true`. Runs until Ctrl-C, `--count` or `--duration`.
    #[command(after_help = "\
Events are written only while a monitor runs (a lease renewed every second, gone
3 s after the last monitor stops). A full ring buffer loses events, never packets;
the count of lost events is printed when the monitor stops.

Examples:
  sluicectl -n pods monitor
  sluicectl -n pods monitor --type drop --reason drop_bw_egress
  sluicectl -n pods monitor --pod 10.22.0.5 --proto tcp --port 443 --json")]
    Monitor(MonitorArgs),
    /// The loaded programs: version, reload, detach-all.
    #[command(subcommand)]
    Datapath(DatapathCommand),
    /// Masqueraded flows: list, pods (flows per pod against its share), flush.
    #[command(subcommand)]
    Nat(NatCommand),
    /// hostPort mappings: list, add, del.
    #[command(subcommand)]
    Ports(PortsCommand),
    /// Per-pod bandwidth limits: list, get, set (live).
    #[command(subcommand)]
    Bandwidth(BandwidthCommand),
    /// How Service traffic is handled (kube-proxy): the Service ranges, the
    /// flows the node's stack translates.
    #[command(subcommand)]
    Services(ServicesCommand),
    /// NetworkPolicy (`sluice-node policy`): the mode, the pods here and the
    /// policies that select them, the compiled rules with their flows, the
    /// drops by direction.
    #[command(after_help = "\
Examples:
  sluicectl -n pods policy
  sluicectl -n pods policy --pod shop/web-0 --json
  sluicectl -n pods policy --pod 10.22.0.5 --state /run/sluice/policy.json")]
    Policy(PolicyArgs),
    /// The datapath's counters and gauges in the Prometheus text format: printed
    /// once (for the textfile collector of `node_exporter`), or served on `/metrics`
    /// with `--listen`.
    #[command(after_help = "\
Examples:
  sluicectl -n pods metrics > /var/lib/node_exporter/textfile/sluice.prom.$$ && mv ...
  sluicectl -n pods metrics --listen 127.0.0.1:9964       # until Ctrl-C or SIGTERM
  sluicectl -n pods metrics --listen [::]:9964 --max-endpoints 200")]
    Metrics(MetricsArgs),
    /// Print a shell completion script (e.g. `sluicectl completions bash >
    /// /etc/bash_completion.d/sluicectl`).
    Completions(CompletionsArgs),
}

impl Command {
    /// The name of a command that changes the datapath (`None`: it only reads).
    pub(crate) fn write_name(&self) -> Option<&'static str> {
        match self {
            Command::Ports(PortsCommand::Add(_)) => Some("ports add"),
            Command::Ports(PortsCommand::Del(_)) => Some("ports del"),
            Command::Bandwidth(BandwidthCommand::Set(_)) => Some("bandwidth set"),
            Command::Nat(NatCommand::Flush(_)) => Some("nat flush"),
            Command::Datapath(DatapathCommand::Reload(_)) => Some("datapath reload"),
            Command::Datapath(DatapathCommand::DetachAll(d)) if d.yes => {
                Some("datapath detach-all")
            }
            // The monitor writes its lease, which only switches events on.
            _ => None,
        }
    }
}

#[derive(Args)]
pub(crate) struct CountersArgs {
    /// Print JSON (stable field names) instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Only this pod's endpoint rows (its IP, or a container id prefix).
    #[arg(long)]
    pub pod: Option<String>,
    /// Only the node-wide counters.
    #[arg(long, conflicts_with = "pod")]
    pub node: bool,
    /// Show every reason, also those still at zero.
    #[arg(long)]
    pub all: bool,
    /// Refresh every SECONDS (default 1), showing what changed since the last
    /// refresh; stops on Ctrl-C or after --count refreshes.
    #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "1",
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub watch: Option<u64>,
    /// With --watch: stop after this many refreshes.
    #[arg(long, requires = "watch", value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
}

#[derive(Args)]
pub(crate) struct MonitorArgs {
    /// Print one JSON object per line (stable field names) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Only events of these types (repeatable).
    #[arg(long = "type", value_name = "TYPE", value_parser = ["drop", "nat", "hostport", "service", "policy", "debug"])]
    pub types: Vec<String>,
    /// Only events of this pod (its IP, or a container id prefix).
    #[arg(long)]
    pub pod: Option<String>,
    /// Only events with this address as source, destination or NAT address.
    #[arg(long)]
    pub ip: Option<std::net::IpAddr>,
    /// Only events with this port on either side (or as the NAT port).
    #[arg(long)]
    pub port: Option<u16>,
    /// Only this protocol.
    #[arg(long, value_parser = ["tcp", "udp", "icmp", "sctp"])]
    pub proto: Option<String>,
    /// Only drops with this reason (a `drop_*` name from `sluicectl counters --all`).
    #[arg(long)]
    pub reason: Option<String>,
    /// Stop after this many events.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    pub duration: Option<u64>,
    /// The state file `sluice-node policy` writes: NetworkPolicy drops and
    /// audit events name the policies that select the pod.
    #[arg(long, default_value = "/run/sluice/policy.json")]
    pub policy_state: std::path::PathBuf,
}

#[derive(Args)]
pub(crate) struct MetricsArgs {
    /// Serve `/metrics` on this address instead of printing once.
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<std::net::SocketAddr>,
    /// With --listen: stop after this many seconds (default: until SIGINT/SIGTERM).
    #[arg(long, value_name = "SECONDS", requires = "listen",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub duration: Option<u64>,
    /// Pod interfaces that get series of their own, at most (the node-wide
    /// series count every pod).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(0..=100_000))]
    pub max_endpoints: u64,
    /// The network's state directory (the config's `stateDir` plus the
    /// network name), whose attachment records give the `namespace` and `pod`
    /// labels [default: /var/lib/cni/sluice/<network>, the network from -n or
    /// the one whose default pin root is --pin-root].
    #[arg(long, env = "SLUICE_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<std::path::PathBuf>,
    /// The state file `sluice-node policy` writes: the NetworkPolicy rules'
    /// labels.
    #[arg(
        long,
        env = "SLUICE_POLICY_STATE",
        default_value = "/run/sluice/policy.json"
    )]
    pub policy_state: std::path::PathBuf,
    /// The state file `sluice-node proxy --state-file` writes: the Service
    /// series' `service` and `port` labels.
    #[arg(
        long,
        env = "SLUICE_SERVICE_STATE",
        default_value = "/run/sluice/services.json"
    )]
    pub service_state: std::path::PathBuf,
}

#[derive(Args)]
pub(crate) struct CompletionsArgs {
    pub shell: clap_complete::Shell,
}

#[derive(Subcommand)]
pub(crate) enum BandwidthCommand {
    /// Pods with bandwidth limits, with packets passed and dropped.
    List(BandwidthListArgs),
    /// One pod's limits.
    Get(BandwidthGetArgs),
    /// Change a running pod's limits; the next packet sees them.
    Set(BandwidthSetArgs),
}

#[derive(Args)]
pub(crate) struct BandwidthListArgs {
    /// Print JSON (stable field names) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Only this pod (its IP, or a container id prefix).
    #[arg(long)]
    pub pod: Option<String>,
}

#[derive(Args)]
pub(crate) struct BandwidthGetArgs {
    /// The pod: an address, or a container id prefix.
    pub pod: String,
    /// Print JSON (stable field names) instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub(crate) struct BandwidthSetArgs {
    /// The pod: an address, or a container id prefix.
    pub pod: String,
    /// Traffic into the pod, bits per second.
    #[arg(long)]
    pub ingress_rate: Option<u64>,
    /// Bits (default: 300 ms of the rate).
    #[arg(long, requires = "ingress_rate")]
    pub ingress_burst: Option<u64>,
    /// Traffic from the pod, bits per second.
    #[arg(long)]
    pub egress_rate: Option<u64>,
    /// Bits (default: 300 ms of the rate).
    #[arg(long, requires = "egress_rate")]
    pub egress_burst: Option<u64>,
    /// Remove the ingress limit.
    #[arg(long, conflicts_with = "ingress_rate")]
    pub clear_ingress: bool,
    /// Remove the egress limit.
    #[arg(long, conflicts_with = "egress_rate")]
    pub clear_egress: bool,
}

#[derive(Subcommand)]
pub(crate) enum PortsCommand {
    /// List hostPort mappings (host address:port -> pod address:port, owner).
    List(PortsListArgs),
    /// Map a host port to a pod's port (refused when the port is taken).
    Add(PortsAddArgs),
    /// Remove a hostPort mapping (whoever added it).
    Del(PortsDelArgs),
}

#[derive(Args)]
pub(crate) struct PortsListArgs {
    /// Print JSON (stable field names) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Only mappings to this pod (its IP, or a container id prefix).
    #[arg(long)]
    pub pod: Option<String>,
    /// Only this host port.
    #[arg(long)]
    pub port: Option<u16>,
    /// Only this protocol.
    #[arg(long, value_parser = ["tcp", "udp", "sctp"])]
    pub proto: Option<String>,
}

#[derive(Args)]
pub(crate) struct PortsAddArgs {
    /// The port on the node.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub host_port: u16,
    /// The pod: its IPv4 address, or a container id prefix.
    #[arg(long)]
    pub pod: String,
    /// The port in the pod.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub container_port: u16,
    #[arg(long, default_value = "tcp", value_parser = ["tcp", "udp", "sctp"])]
    pub proto: String,
    /// Only this node address (default: every node address of the pod
    /// address's family).
    #[arg(long)]
    pub host_ip: Option<std::net::IpAddr>,
}

#[derive(Args)]
pub(crate) struct PortsDelArgs {
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub host_port: u16,
    #[arg(long, default_value = "tcp", value_parser = ["tcp", "udp", "sctp"])]
    pub proto: String,
    /// The mapping's node address (default: the IPv4 every-address mapping;
    /// `::` the IPv6 one).
    #[arg(long)]
    pub host_ip: Option<std::net::IpAddr>,
}

#[derive(Subcommand)]
pub(crate) enum NatCommand {
    /// List masqueraded flows (pod side -> NAT address:port -> destination).
    List(NatListArgs),
    /// Flows per pod in the masquerade tables (both families), largest first,
    /// and how much of its share (`natPodShare` of `natMaxFlows`) each holds: a
    /// pod at its share replaces its own flows (`nat_evict_pod_share`) or has
    /// its new ones dropped (`drop_masq_pod_share`).
    Pods(NatPodsArgs),
    /// Delete masqueraded flows: all, or those of one pod. UDP and ICMP open a
    /// new flow with their next packet (its NAT port is chosen again by a hash of
    /// the flow, so it is usually the same port); a TCP connection in the middle
    /// has no flow any more and its segments are dropped (`drop_masq_no_flow`)
    /// until the application reconnects.
    Flush(NatFlushArgs),
}

#[derive(Args)]
pub(crate) struct NatListArgs {
    /// Print JSON (stable field names) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Only flows of this pod (its IP, or a container id prefix).
    #[arg(long)]
    pub pod: Option<String>,
    /// Only this protocol.
    #[arg(long, value_parser = ["tcp", "udp", "icmp", "icmpv6"])]
    pub proto: Option<String>,
    /// Only flows to this destination address (IPv4 or IPv6).
    #[arg(long)]
    pub dst: Option<std::net::IpAddr>,
    /// Only flows with this port: the pod's, the NAT port or the destination's.
    #[arg(long)]
    pub port: Option<u16>,
}

#[derive(Args)]
pub(crate) struct NatPodsArgs {
    /// Print JSON (stable field names) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Only this pod (its IP, or a container id prefix).
    #[arg(long)]
    pub pod: Option<String>,
}

#[derive(Args)]
pub(crate) struct NatFlushArgs {
    /// Only flows of this pod (its IP, or a container id prefix).
    #[arg(long, conflicts_with = "all")]
    pub pod: Option<String>,
    /// Every masqueraded flow of the node.
    #[arg(long, required_unless_present = "pod")]
    pub all: bool,
}

#[derive(Subcommand)]
pub(crate) enum ServicesCommand {
    /// The Service ranges (config `serviceCIDRs`, the node agent's) whose
    /// traffic from pods goes to the node's stack, where kube-proxy translates
    /// it; who set each; the kernel flow table's fill.
    List(JsonArgs),
    /// The flows the node's stack translates: delivered into a pod (a Service
    /// endpoint) or routed out of the uplink from one. Every packet of them
    /// takes the stack's path, so conntrack undoes the translation on replies.
    Flows(ServicesFlowsArgs),
    /// The Services Sluice translates itself (`sluice-node proxy`): each
    /// Service port's frontends, backends and translations at the socket.
    Lb(ServicesLbArgs),
}

#[derive(Args)]
pub(crate) struct ServicesFlowsArgs {
    /// Print JSON (stable field names) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Only flows of this pod (its IP, or a container id prefix).
    #[arg(long)]
    pub pod: Option<String>,
    /// Only this protocol.
    #[arg(long, value_parser = ["tcp", "udp", "sctp"])]
    pub proto: Option<String>,
}

#[derive(Args)]
pub(crate) struct PolicyArgs {
    /// Print JSON (stable field names) instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Only this pod (an address, or namespace/name) and the rules of the
    /// policies that select it.
    #[arg(long)]
    pub pod: Option<String>,
    /// The state file `sluice-node policy` writes.
    #[arg(long, default_value = "/run/sluice/policy.json")]
    pub state: std::path::PathBuf,
}

#[derive(Args)]
pub(crate) struct JsonArgs {
    /// Print JSON (stable field names) instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub(crate) struct ServicesLbArgs {
    /// Print JSON (stable field names) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Only the Service ports with this frontend: an address (`10.96.0.10`,
    /// `fd00::10`) or an address and port (`10.96.0.10:53`, `[fd00::10]:53`).
    #[arg(long)]
    pub frontend: Option<String>,
    /// Only this Service (`namespace/name`) or Service port
    /// (`namespace/name:port`, its name or number), with each endpoint's
    /// state; names come from the agent's state file.
    #[arg(long)]
    pub service: Option<String>,
    /// The state file `sluice-node proxy --state-file` writes (Service
    /// names and endpoint states).
    #[arg(
        long,
        env = "SLUICE_SERVICE_STATE",
        default_value = "/run/sluice/services.json"
    )]
    pub state: std::path::PathBuf,
}

#[derive(Subcommand)]
pub(crate) enum DatapathCommand {
    /// The pinned object's hash next to the one a `sluice` binary embeds.
    Version(SluiceBin),
    /// Load the programs a `sluice` binary embeds and move every attachment to them
    /// atomically, keeping the maps (what the next ADD does after an upgrade).
    Reload(SluiceBin),
    /// Take every program off its hook: the pods' tc programs, the uplink's tc
    /// and XDP programs, the hostPort socket hooks and the NAT sweeper. Maps and
    /// programs stay pinned, and pods keep plain kernel routing (without
    /// masquerade, hostPorts or bandwidth limits). The next ADD attaches the
    /// uplink again; `sluicectl datapath reload` does not re-attach pods.
    DetachAll(DetachAllArgs),
}

#[derive(Args)]
pub(crate) struct DetachAllArgs {
    #[command(flatten)]
    pub sluice: SluiceBin,
    /// Confirm: without it, only say what would be detached.
    #[arg(long)]
    pub yes: bool,
}

#[derive(Args)]
pub(crate) struct SluiceBin {
    /// The `sluice` plugin binary [default: first of /opt/cni/bin/sluice,
    /// /usr/lib/cni/sluice, sluice on PATH].
    #[arg(long, value_name = "PATH")]
    pub sluice: Option<PathBuf>,
}

#[derive(Args)]
pub(crate) struct EndpointsArgs {
    /// Print JSON (stable field names) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Only endpoints of this container id (prefix match).
    #[arg(long)]
    pub container: Option<String>,
    /// Only this pod address.
    #[arg(long)]
    pub ip: Option<std::net::IpAddr>,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_tree_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn completions_cover_every_subcommand() {
        let mut out = Vec::new();
        clap_complete::generate(
            clap_complete::Shell::Bash,
            &mut Cli::command(),
            "sluicectl",
            &mut out,
        );
        let script = String::from_utf8(out).unwrap();
        for sub in [
            "status",
            "endpoints",
            "counters",
            "datapath",
            "nat",
            "ports",
            "bandwidth",
            "services",
            "monitor",
            "detach-all",
            "completions",
        ] {
            assert!(
                script.contains(sub),
                "{sub} missing from the bash completions"
            );
        }
        assert!(script.contains("--egress-rate") && script.contains("--host-port"));
    }
}
