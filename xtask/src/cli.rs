//! The whole `cargo xtask` command line, in one place.
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "Sluice developer tasks: toolchain setup, eBPF build, build, test"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Install what this machine lacks: Debian packages, nightly + rust-src,
    /// bpf-linker (against the nightly's LLVM), bpffs mount. Fast no-op when all is there.
    Setup(SetupArgs),
    /// Build the eBPF object (nightly, -Z build-std=core, BTF) into target/ebpf.
    BuildEbpf(BuildEbpfArgs),
    /// Build the eBPF object, then `sluice` and `sluicectl` with it embedded.
    Build(BuildArgs),
    /// The OCI image the Kubernetes DaemonSet runs (buildah, from scratch):
    /// target/image/sluice.oci.tar, reference localhost/sluice:<version>.
    Image(ImageArgs),
    /// The whole suite, what CI runs: setup, eBPF build, lints, unit tests,
    /// privileged integration tests (as root) with a leak check.
    Test(TestArgs),
    /// The integration tests on Debian's kernels (5.10, 6.1, 6.12, sid), each
    /// booted in qemu with this machine's userspace (as root).
    VmTest(VmTestArgs),
    /// Live demo on namespaces: pods attached through the CNI protocol, traffic
    /// through the eBPF datapath, the pinned maps shown with sluicectl (as root).
    Demo(DemoArgs),
    /// Benchmarks: Sluice, the reference plugins and a bare veth pair on one
    /// namespace testbed, interleaved, as ratios; writes docs/benchmarks.md (root).
    Bench(BenchArgs),
    /// Where a pod->pod round trip, a new pod->pod connection and a new
    /// masqueraded connection spend CPU time: the bench's figures under `perf
    /// record`, per symbol, Sluice against the bare veth pair and the
    /// reference; writes docs/profile.md (as root).
    Profile(ProfileArgs),
    /// The bandwidth benchmark (`bench --only bandwidth`) inside Debian's
    /// kernels in qemu, whose `sch_fq` gives Sluice EDT egress; writes
    /// docs/benchmarks-kernels.md (as root).
    VmBench(VmBenchArgs),
    /// The connection loop `bench` runs inside a namespace (one side of the
    /// new-connections-per-second figure, or of the IPv6 round trips).
    #[command(hide = true)]
    ConnLoop(ConnLoopArgs),
}

#[derive(Debug, Default, Args)]
pub(crate) struct SetupArgs {
    /// Install only the Debian packages one command needs: `demo`, `bench`
    /// (also `profile`) or `test` (everything, also `vm-test` and `vm-bench`).
    #[arg(
        long = "for",
        value_enum,
        value_name = "COMMAND",
        default_value = "test"
    )]
    pub purpose: crate::setup::Purpose,
    /// Install bpf-linker under this root (`cargo install --root DIR`, binary in DIR/bin)
    /// instead of $`CARGO_HOME`; the check then looks only there.
    #[arg(long, value_name = "DIR")]
    pub bpf_linker_root: Option<PathBuf>,
    /// Directory whose lib/ gets the symlinks to the nightly's libLLVM that
    /// bpf-linker is built and run against [default: ~/.local/llvm-rust-nightly].
    #[arg(long, value_name = "DIR")]
    pub llvm_prefix: Option<PathBuf>,
    /// Rebuild bpf-linker even when the installed one fits the nightly's LLVM.
    #[arg(long)]
    pub reinstall_bpf_linker: bool,
}

#[derive(Debug, Args)]
pub(crate) struct BuildEbpfArgs {
    /// Run `cargo +nightly clippy -- -D warnings` on the eBPF crate instead of building it.
    #[arg(long)]
    pub check: bool,
}

#[derive(Debug, Args)]
pub(crate) struct BuildArgs {
    /// Build the userspace binaries with the release profile.
    #[arg(long)]
    pub release: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ImageArgs {
    /// Put the debug binaries in the image (faster to build).
    #[arg(long)]
    pub debug: bool,
}

#[derive(Debug, Args)]
pub(crate) struct TestArgs {
    /// Skip `cargo fmt --check` and both clippy runs (refused when CI=true).
    #[arg(long)]
    pub no_lint: bool,
    /// Stop after the unit tests: no binaries, no privileged integration tests
    /// (refused when CI=true).
    #[arg(long)]
    pub unit_only: bool,
    /// Parallel integration tests (`cargo test -- --test-threads=N`).
    #[arg(long, value_name = "N", default_value_t = 2,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub test_threads: u16,
    /// Kernels for the matrix stage (comma-separated: 5.10,6.1,6.12,sid or a
    /// linux-image package name) [default: all four]. `--kernels none` skips the
    /// stage (refused when CI=true).
    #[arg(long, value_delimiter = ',', value_name = "K,...")]
    pub kernels: Option<Vec<String>>,
    /// Passed to the integration test binary after `--test-threads`, e.g. a test name filter.
    #[arg(last = true, value_name = "FILTER")]
    pub filter: Vec<String>,
}

#[derive(Debug, Args)]
pub(crate) struct VmTestArgs {
    /// Kernels to boot (comma-separated: 5.10, 6.1, 6.12, sid, or a full
    /// linux-image-*-amd64-unsigned package name) [default: 5.10,6.1,6.12,sid].
    #[arg(long, value_delimiter = ',', value_name = "K,...")]
    pub kernel: Vec<String>,
    /// Integration test binaries to run (comma-separated: lifecycle, hostport, ...),
    /// each optionally with test name filters of its own
    /// (`masquerade:idle_flows|native`) [default: all].
    #[arg(long, value_delimiter = ',', value_name = "NAME,...")]
    pub tests: Vec<String>,
    /// Parallel tests inside each binary.
    #[arg(long, value_name = "N", default_value_t = 2,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub test_threads: u16,
    /// Each kernel's run is killed after this many minutes.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=240))]
    pub timeout_mins: u32,
    /// Passed to each test binary, e.g. a test name filter.
    #[arg(last = true, value_name = "FILTER")]
    pub filter: Vec<String>,
}

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {}

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// Rounds of every traffic figure; the report shows the median.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub rounds: u32,
    /// Seconds per traffic measurement.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=60))]
    pub seconds: u32,
    /// Pods for the ADD/DEL latency figures.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=200))]
    pub pods: u64,
    /// Run one table alone (quicker; docs/benchmarks.md is then left as it is).
    #[arg(long, value_enum, value_name = "TABLE")]
    pub only: Option<BenchTable>,
    /// Take `sluice` and `sluicectl` from $`SLUICE_BIN` and $`SLUICECTL_BIN`
    /// instead of setting up and building (how `vm-bench` runs it in a guest).
    #[arg(long, hide = true)]
    pub prebuilt: bool,
    /// Also write the results (`results.md`: machine, tables, targets) and the
    /// method (`method.md`) as markdown into DIR (how `vm-bench` collects them).
    #[arg(long, hide = true, value_name = "DIR")]
    pub markdown_parts: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct ProfileArgs {
    /// Rounds of every figure; samples and work are summed over them.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub rounds: u32,
    /// Seconds per figure and setup.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=60))]
    pub seconds: u32,
    /// perf's sampling frequency (Hz).
    #[arg(long, default_value_t = 4999, value_parser = clap::value_parser!(u32).range(100..=50_000))]
    pub frequency: u32,
    /// Only the eBPF programs' own run time (kernel statistics), no perf: for
    /// a guest under emulation, where perf records no samples.
    #[arg(long)]
    pub no_perf: bool,
    /// Write the report here instead of docs/profile.md.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Take `sluice` and `sluicectl` from $`SLUICE_BIN` and $`SLUICECTL_BIN`
    /// instead of setting up and building (how `vm-bench --profile` runs it).
    #[arg(long, hide = true)]
    pub prebuilt: bool,
}

#[derive(Debug, Args)]
pub(crate) struct VmBenchArgs {
    /// Kernels to boot (comma-separated, as for vm-test) [default: 5.10,6.1,6.12,sid].
    #[arg(long, value_delimiter = ',', value_name = "K,...")]
    pub kernel: Vec<String>,
    /// Rounds of every figure in each guest; the report shows the median.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub rounds: u32,
    /// Each kernel's run is killed after this many minutes.
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u32).range(1..=240))]
    pub timeout_mins: u32,
    /// The table each guest runs: `bandwidth` (EDT, which the host's kernel
    /// lacks) or `routing` (with netkit pods, from 6.7), ...
    #[arg(long, value_enum, default_value_t = BenchTable::Bandwidth)]
    pub only: BenchTable,
    /// Run `cargo xtask profile --no-perf` instead of a table: the eBPF
    /// programs' own time per packet, veth and netkit pods
    /// (docs/profile-kernels.md).
    #[arg(long, conflicts_with = "only")]
    pub profile: bool,
}

/// The tables of `cargo xtask bench`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum BenchTable {
    /// pod <-> pod and pod <-> external host, ADD/DEL latency.
    Routing,
    /// pod -> external host through masquerade.
    Masquerade,
    /// pod -> external host's IPv6 address through masquerade (dual-stack pods).
    Masquerade6,
    /// pod -> a Service's ClusterIP through kube-proxy's iptables-mode rules.
    Clusterip,
    /// external host -> node address:hostPort with 1, 1,000 and 10,000 mappings.
    Hostport,
    /// pods with bandwidth limits (10 Mbit/s, 100 Mbit/s, 1 Gbit/s; bursts of 10, 100, 300 ms) both ways.
    Bandwidth,
    /// ADD and DEL as a node fills up to 1,000 pods, without and with a hostPort each.
    Filling,
    /// pod -> ClusterIP with 1, 1,000 and 10,000 Services: Sluice's own
    /// Services (socket hooks) against kube-proxy's iptables rules.
    Services,
    /// pod -> pod on one node with NetworkPolicy off, and on with 0, 100 and
    /// 1,000 rules selecting the server (`sluice-node policy`); its apply times.
    Policy,
}

#[derive(Debug, Args)]
pub(crate) struct ConnLoopArgs {
    #[arg(value_enum)]
    pub mode: ConnLoopMode,
    /// serve: the address to listen on; connect, ping: the server's (IPv4 or
    /// IPv6, e.g. `[fd00::2]:5302`).
    #[arg(long)]
    pub addr: std::net::SocketAddr,
    /// How long to connect (the server stays up 30 s longer).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=60))]
    pub secs: u32,
    /// At most this many connections.
    #[arg(long, default_value_t = 20_000)]
    pub max: u64,
    /// serve: echo every message until the client closes (for `ping`),
    /// instead of answering one byte and closing first.
    #[arg(long)]
    pub echo: bool,
    /// ping: bytes per message.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub size: u32,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum ConnLoopMode {
    Serve,
    Connect,
    /// Round trips of `--size`-byte messages on one connection (ping-pong),
    /// for `--secs`: their median and p99 in microseconds.
    Ping,
    /// `--max` UDP datagrams spread evenly over `--secs`, each to the next of
    /// 50,000 ports from `--addr`'s: a new flow each, never answered (a port
    /// scan, or a pod resolving names through an outside resolver).
    Flood,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn test_filter_passes_through() {
        let cli =
            Cli::try_parse_from(["xtask", "test", "--test-threads", "3", "--", "add_del"]).unwrap();
        let Command::Test(args) = cli.command else {
            panic!("parsed {:?}", cli.command)
        };
        assert_eq!(args.test_threads, 3);
        assert_eq!(args.filter, ["add_del"]);
        assert!(Cli::try_parse_from(["xtask", "test", "--test-threads", "0"]).is_err());
    }
}
