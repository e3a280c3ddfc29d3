//! `cargo xtask test`: the whole suite, what CI runs.
//!
//! setup, build-ebpf, fmt, clippy, eBPF clippy, unit tests, binaries, then the
//! privileged integration tests between two snapshots of the node (leak check).
use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Result};

use crate::{
    build::{self, Binaries, TestExe},
    cli::TestArgs,
    cmd, ebpf,
    host::{self, fmt_duration},
    leaks::Snapshot,
    libtest, setup, timetable, vm,
    ws::Workspace,
};

/// The reference plugins (containernetworking-plugins), given to the tests as `SLUICE_CNI_PATH`.
const CNI_PATH: &str = "/usr/lib/cni";
const LINT_STAGES: [&str; 3] = ["fmt", "clippy", "ebpf-clippy"];

pub(crate) fn run(ws: &Workspace, args: &TestArgs) -> Result<()> {
    let ci = host::is_ci();
    if ci {
        ensure!(
            !args.no_lint
                && !args.unit_only
                && args.filter.is_empty()
                && args.kernels.is_none(),
            "CI=true: nothing may be skipped, so --no-lint, --unit-only, --kernels and test filters are refused"
        );
    }
    if !args.unit_only && !host::is_root()? {
        bail!(
            "`cargo xtask test` runs the privileged integration tests and must run as root{}",
            if ci {
                " (CI=true: they are never skipped)"
            } else {
                "; `--unit-only` stops before them"
            }
        );
    }
    let mut stages = Stages::default();
    let outcome = run_stages(ws, args, ci, &mut stages);
    println!("{}", stages.table());
    println!("{}", stages.summary(outcome.is_ok()));
    outcome
}

fn run_stages(ws: &Workspace, args: &TestArgs, ci: bool, st: &mut Stages) -> Result<()> {
    st.run("setup", || setup::run_for(setup::Purpose::Test))?;
    let object = st.run("build-ebpf", || ebpf::build(ws))?;
    if args.no_lint {
        st.skip(&LINT_STAGES, "--no-lint");
    } else {
        st.run("fmt", || {
            cmd::run(cargo(ws).args(["fmt", "--all", "--check"]))?;
            // The eBPF crate is its own workspace, outside `--all`.
            let manifest = ws.root.join("ebpf/sluice-ebpf/Cargo.toml");
            cmd::run(
                cargo(ws)
                    .args(["fmt", "--check", "--manifest-path"])
                    .arg(&manifest),
            )
        })?;
    }
    if args.unit_only {
        lints(ws, args, st, &object)?;
        st.run("unit", || {
            cmd::run(
                cargo(ws)
                    .args(["test", "--workspace", "--exclude", "sluice-tests"])
                    .env("SLUICE_EBPF_OBJECT", &object),
            )
        })?;
        st.skip(&["build", "integration", "kernels"], "--unit-only");
        return Ok(());
    }
    let built = st.run("build", || build::build_all(ws, &object))?;
    let next = st.run("build-next", || {
        let variant = ebpf::build_variant(ws, &object)?;
        build::build_next_sluice(ws, &variant, &object)
    })?;
    let prometheus = st.run("prometheus", || crate::prometheus::fetch(ws))?;
    let kube_validate = st.run("kubernetes-validate", || crate::kubevalidate::fetch(ws))?;
    let (image, image_next) = st.run("image", || images(ws, &built.bins, &next))?;
    let env = TestEnv {
        object,
        bins: built.bins,
        next_sluice: next,
        prometheus,
        kube_validate,
        image,
        image_next,
        unit: built.unit,
        integration: built.integration,
    };
    let matrix = args.kernels.as_deref() != Some(&["none".to_string()]);
    if !matrix {
        st.skip(&["kernels"], "--kernels none");
    }
    // The kernel matrix runs beside everything after this point: its guests
    // leave part of the CPU idle (timers, the 9p root), which the lints and
    // the host's tests use. Guests touch nothing of the host's network, so
    // the host's leak check stays exact.
    std::thread::scope(|scope| {
        let vms = matrix.then(|| {
            eprintln!("==> kernels (in the background)");
            scope.spawn(|| {
                let started = Instant::now();
                let report = kernels(ws, args, &env);
                (started.elapsed(), report)
            })
        });
        let host = host_stages(ws, args, ci, st, &env);
        if host.is_err() && vms.is_some() {
            eprintln!("a host stage failed; waiting for the kernel matrix to end");
        }
        let Some(vms) = vms else {
            return host;
        };
        let (took, report) = vms.join().unwrap_or_else(|_| {
            (
                Duration::ZERO,
                Err(anyhow::anyhow!("the kernel matrix panicked")),
            )
        });
        let checked = report.and_then(|r| {
            let failures = r.failures();
            let ok = r.ok();
            st.vm_report = Some(r);
            ensure!(ok, "kernel matrix: {}", failures.join("; "));
            Ok(())
        });
        let kernels = st.record("kernels", took, checked);
        host.and(kernels)
    })
}

/// clippy on the workspace and on the eBPF crate.
fn lints(ws: &Workspace, args: &TestArgs, st: &mut Stages, object: &Path) -> Result<()> {
    if args.no_lint {
        return Ok(());
    }
    st.run("clippy", || {
        cmd::run(
            cargo(ws)
                .args([
                    "clippy",
                    "--workspace",
                    "--all-targets",
                    "--",
                    "-D",
                    "warnings",
                ])
                .env("SLUICE_EBPF_OBJECT", object),
        )
    })?;
    st.run("ebpf-clippy", || ebpf::clippy(ws))
}

/// What runs on the host once everything is built: lints, unit tests, the
/// privileged integration tests.
fn host_stages(
    ws: &Workspace,
    args: &TestArgs,
    ci: bool,
    st: &mut Stages,
    env: &TestEnv,
) -> Result<()> {
    lints(ws, args, st, &env.object)?;
    let mut unit_runs = Vec::new();
    let unit = st.run("unit", || {
        let runs = libtest::run_all(&env.unit, &[], &[("SLUICE_EBPF_OBJECT", &env.object)])?;
        // No doctest exists today; this keeps any new one running (same
        // feature resolution as the build: nothing recompiles).
        cmd::run(
            cargo(ws)
                .args(["test", "--workspace", "--doc"])
                .env("SLUICE_EBPF_OBJECT", &env.object),
        )?;
        keep_runs(runs, &mut unit_runs)
    });
    st.unit_runs = unit_runs;
    unit?;
    let mut host_runs = Vec::new();
    let integration = st.run("integration", || integration(args, ci, env, &mut host_runs));
    st.host_runs = host_runs;
    integration
}

/// Fails when a binary failed, after keeping every binary's run.
fn keep_runs(runs: Vec<libtest::BinaryRun>, keep: &mut Vec<libtest::BinaryRun>) -> Result<()> {
    let failed: Vec<String> = runs
        .iter()
        .filter(|r| !r.ok || !r.failed.is_empty())
        .map(|r| {
            if r.failed.is_empty() {
                format!("{} exited non-zero", r.name)
            } else {
                format!("{}: {}", r.name, r.failed.join(", "))
            }
        })
        .collect();
    keep.extend(runs);
    ensure!(failed.is_empty(), "failed: {}", failed.join("; "));
    Ok(())
}

/// The integration tests on the kernel matrix (`cargo xtask vm-test`), in CI
/// and whenever asked (`--kernels`). Under KVM every binary runs on every
/// kernel; emulated (TCG, ~15x slower, the datapath's load alone ~13 s on 5.10)
/// each kernel runs every feature's main traffic tests (`TCG_MAIN_TESTS`).
fn kernels(ws: &Workspace, args: &TestArgs, env: &TestEnv) -> Result<vm::Report> {
    let kernels = vm::kernels_or_matrix(args.kernels.as_deref().unwrap_or_default());
    let accel = vm::detect_accel(ws, &kernels[0])?;
    let plan = vm::Plan {
        kernels,
        binaries: match accel {
            vm::Accel::Kvm => Vec::new(),
            vm::Accel::Tcg => TCG_MAIN_TESTS
                .iter()
                .map(std::string::ToString::to_string)
                .collect(),
        },
        filter: args.filter.clone(),
        threads: args.test_threads,
        accel,
        deadline: Duration::from_secs(match accel {
            vm::Accel::Kvm => 20 * 60,
            vm::Accel::Tcg => 25 * 60,
        }),
        lanes: vm::default_lanes(),
    };
    let report = vm::matrix(ws, env, &plan)?;
    println!("{report}");
    Ok(report)
}

/// Under emulation, what each kernel runs: every feature's main traffic
/// tests (`binary:filter|filter@kernel+kernel`: libtest's substring filters,
/// then the kernels where the entry applies, every one without). The host
/// runs everything, churn, crash and fuzz included.
///
/// masquerade6 on 5.10: no IPv6 masquerade before the sweeper's kernels, so
/// each of its tests checks the same routed fallback; one does it there. On
/// 6.1, the oldest kernel with IPv6 masquerade, what touches the kernel
/// (traffic, fragments, extension headers, ICMPv6 errors, expiry and the
/// agent's sweep; the rest is the flow table's logic, on the host); later
/// kernels its main traffic and expiry tests. XDP's generic mode on 5.10
/// (native and off everywhere). The node agent's sweep on 5.10 (LRU flow
/// maps, no in-kernel sweeper) and 6.1 (the oldest with it); later kernels add
/// nothing to that test. The node agent's node addresses on 5.10, the oldest
/// kernel's address notifications. All of hostport6 on 5.10 (the oldest
/// socket hooks), its main tests elsewhere.
/// `route_sync` (a netlink follower in userspace) on the oldest and the
/// newest. A flood of new flows (`nat_pressure`) on 5.10 (LRU flow maps:
/// the kernel makes room) and 6.1 (the oldest with eviction and the per-pod
/// share), its IPv6 case on 6.12. The first datagrams after ADD on 6.1
/// (`cls_bpf` attachments, as 5.10's; 80 s on 5.10; the host runs them on
/// tcx). kube-proxy's Services: its iptables mode
/// on 5.10 (the oldest kernel's helpers and `cls_bpf`), its IPVS mode (which
/// only Debian's kernels have: `ip_vs`, `dummy`; ignored on the host) on 6.12
/// with netkit pods, Sluice's and the reference's, and with masquerade on
/// sid; the rule writer's IPVS path on 6.12. Sluice's own Services
/// (`services_proxy`): the socket hooks and closing UDP sockets
/// (`SOCK_DESTROY`) on 5.10, the oldest kernel; the port unreachable
/// `from_pod` answers a Service without endpoints with, both families, on
/// 6.1, the oldest kernel that tells the agent its namespace's cookie (5.10
/// refuses at the socket); Services from outside (`services_uplink`,
/// `uplink_in`'s translation, both families) on 5.10, where `uplink_in`
/// inlines masquerade and its stack is the tightest, and native XDP and the
/// `Local` policy on 6.1 (on 5.10 the native XDP test's packets reached the
/// pod through tc, not XDP: not yet understood); NetworkPolicy's truth
/// tables (`policy`: every check point, the node and a host beyond the
/// uplink), a pod compiled from its attachment record and audit mode on
/// 5.10, the oldest kernel, where `from_pod`'s and `uplink_in`'s stacks are
/// the tightest. Under emulation on a 2-vCPU host the
/// matrix takes about 28 minutes (CI of a32f79a: 28m35s; 5.10 10m31s, 6.1
/// 5m49s, 6.12 5m13s, sid 5m10s), about half of it the verifier: each test's
/// first ADD loads the datapath, its programs verified in parallel (see
/// `datapath/verify.rs`), `uplink_out` the longest.
const TCG_MAIN_TESTS: [&str; 33] = [
    "lifecycle:lifecycle_1_1_0|lifecycle_dual_stack",
    "traffic",
    "routing:pod_to_pod_tcp_is_redirected_past_the_host_stack|netkit_pods|the_first_datagrams@6.1",
    "routing:pod_to_pod_tcp_is_redirected_past_the_host_stack|netkit_pods@5.10+6.12+sid",
    "uplink:xdp_native_carries|xdp_generic_carries|xdp_off_leaves@5.10",
    "uplink:xdp_native_carries|xdp_off_leaves@6.1",
    "uplink:xdp_native_carries|xdp_off_leaves@6.12+sid",
    "masquerade:tcp_udp_and_icmp_echo_leave_with_the_node_address|idle_flows_expire|netkit_pods|the_node_agent_sweeps@5.10+6.1",
    "masquerade:tcp_udp_and_icmp_echo_leave_with_the_node_address|idle_flows_expire|netkit_pods@6.12+sid",
    "masquerade6:ipv6_tcp_udp_and_echo|fragment_from_a_pod|destination_options_header|packet_too_big|idle_ipv6_flows@6.1",
    "masquerade6:ipv6_tcp_udp_and_echo_leave_with_the_node_ipv6_address|idle_ipv6_flows_expire@6.12+sid",
    "masquerade6:ipv6_tcp_udp_and_echo_leave_with_the_node_ipv6_address@5.10",
    "nat_pressure:a_udp_flood_leaves@5.10+6.1",
    "nat_pressure:an_ipv6_udp_flood@6.12",
    "hostport:reach_the_pod_through_the_host_port|the_node_reaches_host_ports|pods_reach_host_ports|netkit_pod|the_node_agent_keeps@5.10",
    "hostport:reach_the_pod_through_the_host_port|the_node_reaches_host_ports|pods_reach_host_ports|netkit_pod@6.1+6.12+sid",
    "hostport6@5.10",
    "hostport6:ipv6_tcp_and_udp_from_outside|the_node_reaches_ipv6@6.1+6.12+sid",
    "bandwidth:a_single_tcp_stream_holds_10_mbit|egress_is_shaped_by_edt|netkit",
    "upgrade:reload_mid_stream_replaces_cls_bpf|reload_keeps_the_uplink_links_native_xdp|netkit",
    "netkit",
    "two_nodes:xdp_auto",
    "gc_status:status_reports",
    "route_sync@5.10+sid",
    "kube_proxy:iptables_mode_every_service_path_works@5.10",
    "kube_proxy:ipvs_mode_every_service_path_works|the_reference_chain_passes_the_same_cases_ipvs@6.12",
    "kube_proxy:ipvs_mode_with_masquerade@sid",
    "kube_proxy_rules@6.12",
    "services_proxy:a_pods_connections_to_a_cluster_ip|connected_udp_sockets@5.10",
    "services_proxy:a_pods_connections_to_a_cluster_ip|ipv6_and_dual_stack@6.1",
    "services_uplink:a_node_port_from_outside|cluster_policy|an_ipv6|a_service_port_without@5.10",
    "services_uplink:native_xdp|local_policy@6.1",
    "policy:every_case|a_pod_named|audit_mode@5.10",
];

/// What the integration tests are given: the eBPF object and the binaries
/// under test, as environment variables.
pub(crate) struct TestEnv {
    pub object: PathBuf,
    pub bins: Binaries,
    pub next_sluice: PathBuf,
    /// Debian's Prometheus, unpacked (the metrics tests scrape with it).
    pub prometheus: crate::prometheus::Prometheus,
    /// `kubernetes-validate` in a virtualenv (the manifest test).
    pub kube_validate: PathBuf,
    /// The OCI archive of `cargo xtask image` with these binaries (the CRI
    /// install test).
    pub image: PathBuf,
    /// The same image with `next_sluice` as its plugin (the install test's
    /// upgrade).
    pub image_next: PathBuf,
    /// The unit test executables (every package but `sluice-tests`).
    pub unit: Vec<TestExe>,
    /// The integration test binaries (`tests/*.rs`).
    pub integration: Vec<TestExe>,
}

/// The image of `bins`, and the one whose plugin is `next` (what an upgrade
/// installs).
fn images(ws: &Workspace, bins: &Binaries, next: &Path) -> Result<(PathBuf, PathBuf)> {
    let image = crate::image::build(ws, bins, "")?;
    let next_bins = Binaries {
        sluice: next.to_path_buf(),
        sluicectl: bins.sluicectl.clone(),
        node: bins.node.clone(),
    };
    Ok((image, crate::image::build(ws, &next_bins, "-next")?))
}

impl TestEnv {
    /// Builds everything the integration tests need (the eBPF object, the
    /// binaries and test executables, the upgrade variant).
    pub(crate) fn build(ws: &Workspace) -> Result<Self> {
        let object = ebpf::build(ws)?;
        let built = build::build_all(ws, &object)?;
        let variant = ebpf::build_variant(ws, &object)?;
        let next_sluice = build::build_next_sluice(ws, &variant, &object)?;
        let prometheus = crate::prometheus::fetch(ws)?;
        let kube_validate = crate::kubevalidate::fetch(ws)?;
        let (image, image_next) = images(ws, &built.bins, &next_sluice)?;
        Ok(Self {
            object,
            bins: built.bins,
            next_sluice,
            prometheus,
            kube_validate,
            image,
            image_next,
            unit: built.unit,
            integration: built.integration,
        })
    }

    pub(crate) fn vars(&self) -> [(&'static str, &Path); 11] {
        [
            ("SLUICE_EBPF_OBJECT", &self.object),
            ("SLUICE_BIN", &self.bins.sluice),
            ("SLUICECTL_BIN", &self.bins.sluicectl),
            ("SLUICE_NODE_BIN", &self.bins.node),
            ("SLUICE_NEXT_BIN", &self.next_sluice),
            ("SLUICE_CNI_PATH", Path::new(CNI_PATH)),
            ("SLUICE_PROMETHEUS_BIN", &self.prometheus.server),
            ("SLUICE_PROMTOOL_BIN", &self.prometheus.promtool),
            ("SLUICE_KUBE_VALIDATE_BIN", &self.kube_validate),
            ("SLUICE_IMAGE_ARCHIVE", &self.image),
            ("SLUICE_IMAGE_NEXT_ARCHIVE", &self.image_next),
        ]
    }
}

fn cargo(ws: &Workspace) -> Command {
    let mut c = Command::new("cargo");
    c.current_dir(&ws.root);
    c
}

/// The integration test binaries, one after the other, between two snapshots
/// of the node (the leak check).
fn integration(
    args: &TestArgs,
    ci: bool,
    env: &TestEnv,
    runs: &mut Vec<libtest::BinaryRun>,
) -> Result<()> {
    for plugin in ["bridge", "host-local", "portmap", "bandwidth", "loopback"] {
        let path = Path::new(CNI_PATH).join(plugin);
        ensure!(
            host::is_executable(&path),
            "no reference plugin {} (package containernetworking-plugins; `cargo xtask setup` installs it)",
            path.display()
        );
    }
    let before = Snapshot::take(ci)?;
    eprintln!("leak check: before the tests: {}", before.summary());
    if let Some(why) = &before.bpf_links_unchecked {
        eprintln!("leak check: bpf links not checked: {why}");
    }
    let mut test_args = vec![format!("--test-threads={}", args.test_threads)];
    test_args.extend(args.filter.iter().cloned());
    let tests = libtest::run_all(&env.integration, &test_args, &env.vars())
        .and_then(|r| keep_runs(r, runs));
    let after = Snapshot::take(ci)?;
    let leaked = before.new_in(&after);

    if leaked.is_empty() {
        eprintln!(
            "leak check: nothing left behind (after: {})",
            after.summary()
        );
        return tests;
    }
    eprintln!(
        "leak check: the integration tests left {} thing(s) behind:",
        leaked.len()
    );
    for item in &leaked {
        eprintln!("  {item}");
    }
    let leaks = format!("leak check: left behind: {}", leaked.join(", "));
    match tests {
        Ok(()) => bail!(leaks),
        Err(e) => Err(e.context(leaks)),
    }
}

/// Timing and outcome of each stage, for the summary line and the time
/// table.
#[derive(Default)]
struct Stages {
    started: Option<Instant>,
    done: Vec<(&'static str, Duration, bool)>,
    skipped: Vec<(&'static str, &'static str)>,
    unit_runs: Vec<libtest::BinaryRun>,
    host_runs: Vec<libtest::BinaryRun>,
    vm_report: Option<vm::Report>,
}

impl Stages {
    fn run<T>(&mut self, name: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.started.get_or_insert_with(Instant::now);
        eprintln!("==> {name}");
        let started = Instant::now();
        let outcome = f();
        self.record(name, started.elapsed(), outcome)
    }

    /// A stage that ran elsewhere (the kernel matrix, beside the others).
    fn record<T>(&mut self, name: &'static str, took: Duration, outcome: Result<T>) -> Result<T> {
        self.done.push((name, took, outcome.is_ok()));
        outcome.map_err(|e| e.context(format!("stage `{name}`")))
    }

    fn skip(&mut self, names: &[&'static str], why: &'static str) {
        self.skipped.extend(names.iter().map(|name| (*name, why)));
    }

    fn total(&self) -> Duration {
        self.started.map(|s| s.elapsed()).unwrap_or_default()
    }

    /// "xtask test: PASSED in 1m02s | setup 120ms, build-ebpf 1.2s, ... | skipped: ..."
    fn summary(&self, ok: bool) -> String {
        let stages: Vec<String> = self
            .done
            .iter()
            .map(|(name, took, ok)| {
                let failed = if *ok { "" } else { " FAILED" };
                format!("{name} {}{failed}", fmt_duration(*took))
            })
            .collect();
        let mut line = format!(
            "xtask test: {} in {} | {}",
            if ok { "PASSED" } else { "FAILED" },
            fmt_duration(self.total()),
            stages.join(", ")
        );
        if !self.skipped.is_empty() {
            let skipped: Vec<String> = self
                .skipped
                .iter()
                .map(|(name, why)| format!("{name} ({why})"))
                .collect();
            let _ = write!(line, " | skipped: {}", skipped.join(", "));
        }
        line
    }

    /// Where the time went, stage by stage against its budget, then per test
    /// binary on the host and on each kernel.
    fn table(&self) -> String {
        timetable::render(&timetable::Input {
            stages: &self.done,
            total: self.total(),
            unit: &self.unit_runs,
            host: &self.host_runs,
            vms: self.vm_report.as_ref(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_names_failures_and_skips() {
        let mut st = Stages::default();
        st.run("setup", || Ok(())).unwrap();
        st.skip(&LINT_STAGES, "--no-lint");
        assert!(st.run("unit", || -> Result<()> { bail!("boom") }).is_err());
        let line = st.summary(false);
        assert!(line.starts_with("xtask test: FAILED in "), "{line}");
        assert!(
            line.contains("setup ") && line.contains(" FAILED |"),
            "{line}"
        );
        assert!(
            line.ends_with("skipped: fmt (--no-lint), clippy (--no-lint), ebpf-clippy (--no-lint)"),
            "{line}"
        );
    }

    #[test]
    fn plan_entries_give_binary_filters_and_kernels() {
        let e = vm::PlanEntry::parse("masquerade6:idle|agent@6.1+sid");
        assert_eq!(
            (e.name, e.filters, e.kernels),
            ("masquerade6", vec!["idle", "agent"], vec!["6.1", "sid"])
        );
        let e = vm::PlanEntry::parse("traffic");
        assert_eq!(
            (e.name, e.filters.len(), e.kernels.len()),
            ("traffic", 0, 0)
        );
        let e = vm::PlanEntry::parse("masquerade6@5.10");
        assert_eq!(
            (e.name, e.filters.len(), e.kernels),
            ("masquerade6", 0, vec!["5.10"])
        );
    }

    /// A kernel named in the plan is one of the matrix (a typo would make
    /// the entry run nowhere), and no binary runs twice on one kernel (its
    /// log and exit status files would collide).
    #[test]
    fn the_tcg_plan_names_matrix_kernels_and_runs_a_binary_once_per_kernel() {
        for k in vm::MATRIX {
            let mut seen = Vec::new();
            for entry in TCG_MAIN_TESTS {
                let e = vm::PlanEntry::parse(entry);
                for o in &e.kernels {
                    assert!(
                        vm::MATRIX.contains(o),
                        "{entry}: no kernel {o} in the matrix"
                    );
                }
                if e.kernels.is_empty() || e.kernels.contains(&k) {
                    assert!(!seen.contains(&e.name), "{} runs twice on {k}", e.name);
                    seen.push(e.name);
                }
            }
        }
    }
}
