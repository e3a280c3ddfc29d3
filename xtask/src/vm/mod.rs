//! `cargo xtask vm-test`: the integration tests on Debian's kernels, each booted
//! in qemu with this machine's userspace (the host's `/` read-only over 9p).
//!
//! Kernels come from Debian's archive (`kernels.rs`), the guest's first
//! userspace from `initramfs.rs`, the boot from `qemu.rs`. In the guest a job
//! script mounts what the tests need (bpffs, cgroup2, /run/netns), loads the
//! modules a node has (veth, clsact, `cls_bpf`, fq, ...), runs each test binary
//! built on the host and writes its output and exit status to a shared
//! directory, around a leak check of its own (netns, links, bpffs). Everything
//! is cached under `target/vm`.
pub(crate) mod bench;
mod initramfs;
mod kernels;
mod qemu;
pub(crate) mod times;

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{bail, Result};

use self::kernels::Kernel;
use crate::{cli::VmTestArgs, host::fmt_duration, test::TestEnv, ws::Workspace};

pub(crate) use qemu::Accel;

/// The kernels of the matrix: Debian 11, 12, 13 and unstable.
pub(crate) const MATRIX: [&str; 4] = ["5.10", "6.1", "6.12", "sid"];

/// Modules a node has loaded (or auto-loads) that the guest loads up front; a
/// missing one is not an error (built in, or absent from that kernel).
const GUEST_MODULES: &[&str] = &[
    "veth",
    "sch_ingress",
    "cls_bpf",
    "act_bpf",
    "sch_fq",
    "sch_tbf",
    "sch_htb",
    "ifb",
    "act_mirred",
    "netkit",
    "nf_conntrack",
    "nf_nat",
    "iptable_nat",
    "iptable_filter",
    "ip6table_nat",
    "ip6table_filter",
    "xt_MASQUERADE",
    "xt_comment",
    "xt_mark",
    "xt_multiport",
    "xt_addrtype",
    "bridge",
    "br_netfilter",
    "tun",
    // kube-proxy's modes (tests/kube_proxy.rs): IPVS with its dummy device
    // and ipsets, nftables, and the matches its iptables rules use.
    "dummy",
    "ip_vs",
    "ip_vs_rr",
    "xt_ipvs",
    "ip_set",
    "ip_set_hash_ip",
    "ip_set_hash_ipport",
    "ip_set_hash_ipportip",
    "ip_set_hash_ipportnet",
    "ip_set_hash_net",
    "ip_set_bitmap_port",
    "xt_set",
    "xt_statistic",
    "xt_conntrack",
    "xt_nfacct",
    "nf_tables",
    "nft_chain_nat",
    "nft_ct",
    "nft_numgen",
    "nft_fib_inet",
    "nft_reject_inet",
];

pub(crate) fn run(ws: &Workspace, args: &VmTestArgs) -> Result<()> {
    let env = TestEnv::build(ws)?;
    let kernels = kernels_or_matrix(&args.kernel);
    let accel = detect_accel(ws, &kernels[0])?;
    let plan = Plan {
        kernels,
        binaries: args.tests.clone(),
        filter: args.filter.clone(),
        threads: args.test_threads,
        accel,
        deadline: Duration::from_secs(u64::from(args.timeout_mins) * 60),
        lanes: default_lanes(),
    };
    let report = matrix(ws, &env, &plan)?;
    println!("{}", crate::timetable::render_vms(&report));
    println!("{report}");
    if report.ok() {
        Ok(())
    } else {
        bail!("vm-test: {}", report.failures().join("; "))
    }
}

/// Guests at once: one, unless `SLUICE_VM_LANES` says otherwise. Measured
/// under emulation on 2 host CPUs (issue 50): two 2-vCPU guests at once ran
/// each test binary 1.7-3x slower than one guest alone, 13% less work done
/// per minute than one after the other (a guest's vCPU thread preempted while
/// the other spins on a lock it holds); the matrix is CPU-bound, not idle.
pub(crate) fn default_lanes() -> usize {
    env_number("SLUICE_VM_LANES").unwrap_or(1)
}

/// vCPUs per guest: two (the tests run two at a time), or `SLUICE_VM_CPUS`.
fn guest_cpus() -> u32 {
    env_number("SLUICE_VM_CPUS").unwrap_or(2)
}

fn env_number<T: std::str::FromStr>(key: &str) -> Option<T> {
    std::env::var(key).ok().and_then(|v| v.trim().parse().ok())
}

/// The kernels named on the command line, or the whole [`MATRIX`] when none is.
pub(crate) fn kernels_or_matrix(named: &[String]) -> Vec<String> {
    if named.is_empty() {
        MATRIX.iter().map(ToString::to_string).collect()
    } else {
        named.to_vec()
    }
}

/// How guests will run here: a probe boot of kernel `name` under KVM, if
/// /dev/kvm is there (see `Accel::detect`).
pub(crate) fn detect_accel(ws: &Workspace, name: &str) -> Result<Accel> {
    let dir = ws.target.join("vm");
    let kernel = kernels::fetch(&dir, &[name.to_string()])?.remove(0);
    let kdir = dir.join("runs").join(&kernel.release);
    fs::create_dir_all(&kdir)?;
    let initrd = initramfs::build(&kernel, &kdir.join("initrd"))?;
    let out = qemu::fresh_dir(&kdir.join("out"))?;
    Ok(Accel::detect(&kernel, &initrd, &out))
}

/// Test binaries "every one" leaves out: `cri` runs containerd, whose
/// overlayfs snapshotter cannot stack on the guest's overlay root, and tests
/// userspace (containerd's CNI calls), which the other binaries' datapath tests
/// already cover per kernel. Named in `--tests`, they still run.
const HOST_ONLY: [&str; 1] = ["cri"];

/// What to run where.
pub(crate) struct Plan {
    pub kernels: Vec<String>,
    /// Test binaries by name (`lifecycle`), each optionally with test name
    /// filters of its own (`masquerade:idle_flows|tcp_udp`) and the kernels
    /// it runs on (`masquerade6@6.1+6.12`: `+`, since the command line splits
    /// at commas; without: every kernel); empty: every binary. A binary may
    /// appear twice, for disjoint kernels.
    pub binaries: Vec<String>,
    /// Passed to each binary (a test name filter), after its own.
    pub filter: Vec<String>,
    pub threads: u16,
    pub accel: Accel,
    /// Per kernel, boot to power-off.
    pub deadline: Duration,
    /// Guests booted at once.
    pub lanes: usize,
}

/// Runs `plan` with the binaries of `env`.
pub(crate) fn matrix(ws: &Workspace, env: &TestEnv, plan: &Plan) -> Result<Report> {
    let dir = ws.target.join("vm");
    let kernels = kernels::fetch(&dir, &plan.kernels)?;
    let built = &env.integration;
    let tests: Vec<Run> = if plan.binaries.is_empty() {
        built
            .iter()
            .filter(|t| !HOST_ONLY.contains(&t.name.as_str()))
            .map(|t| Run {
                name: t.name.clone(),
                exe: t.exe.clone(),
                filters: plan.filter.clone(),
                kernels: Vec::new(),
            })
            .collect()
    } else {
        let mut runs = Vec::new();
        for entry in &plan.binaries {
            let PlanEntry {
                name,
                filters: own,
                kernels,
            } = PlanEntry::parse(entry);
            let Some(t) = built.iter().find(|t| t.name == name) else {
                let known: Vec<&str> = built.iter().map(|t| t.name.as_str()).collect();
                bail!(
                    "no integration test binary {name:?}; there are: {}",
                    known.join(", ")
                );
            };
            let mut filters: Vec<String> = own.iter().map(|f| (*f).to_string()).collect();
            filters.extend(plan.filter.iter().cloned());
            runs.push(Run {
                name: name.to_string(),
                exe: t.exe.clone(),
                filters,
                kernels: kernels.iter().map(|k| (*k).to_string()).collect(),
            });
        }
        runs
    };
    println!(
        "vm-test: {} kernel(s), {} test binaries, {:?}",
        kernels.len(),
        tests.len(),
        plan.accel
    );
    // Guests in `lanes` lanes, each taking the next kernel of the matrix (the
    // oldest, slowest, first).
    let lanes = plan.lanes.clamp(1, kernels.len().max(1));
    let next = std::sync::Mutex::new(kernels.iter().enumerate());
    let results: std::sync::Mutex<Vec<(usize, Result<KernelResult>)>> = std::sync::Mutex::default();
    std::thread::scope(|scope| {
        for _ in 0..lanes {
            scope.spawn(|| {
                while let Some((i, kernel)) = next.lock().map(|mut n| n.next()).ok().flatten() {
                    let result = boot_job(&dir, kernel, plan.accel, plan.deadline, |k| {
                        job_script(ws, env, k, &tests, plan)
                    })
                    .map(|(out, console)| KernelResult::read(kernel, &tests, &out, &console));
                    if let Ok(mut r) = results.lock() {
                        r.push((i, result));
                    }
                }
            });
        }
    });
    let mut results = results
        .into_inner()
        .map_err(|_| anyhow::anyhow!("a kernel lane panicked"))?;
    results.sort_by_key(|(i, _)| *i);
    let mut report = Report::default();
    for (_, result) in results {
        report.kernels.push(result?);
    }
    Ok(report)
}

/// Boots `kernel` with the job `job` writes, under `target/vm/runs/<release>`;
/// returns the guest's output directory and its console.
fn boot_job(
    dir: &Path,
    kernel: &Kernel,
    accel: Accel,
    deadline: Duration,
    job: impl Fn(&Kernel) -> String,
) -> Result<(PathBuf, qemu::Console)> {
    let kdir = dir.join("runs").join(&kernel.release);
    fs::create_dir_all(&kdir)?;
    let initrd = initramfs::build(kernel, &kdir.join("initrd"))?;
    let out = qemu::fresh_dir(&kdir.join("out"))?;
    let script = kdir.join("job.sh");
    fs::write(&script, job(kernel))?;
    println!("==> {} ({})", kernel.name, kernel.release);
    let boot = qemu::Boot {
        kernel,
        initrd: &initrd,
        job: &script.display().to_string(),
        out: &out,
        accel,
        cpus: guest_cpus(),
        memory_mib: 4096,
        deadline,
        prefix: format!("[{}] ", kernel.name),
    };
    let mut console = boot.run()?;
    // A guest that dies before its userspace starts ran none of our code: seen
    // once, Debian's 7.2 panicking in its own boot-time crypto self-test
    // under emulation (TCG). It gets one more boot; a second failure stands.
    if !console.booted() && !console.timed_out {
        println!(
            "vm: {} died before its userspace started; booting it once more",
            kernel.name
        );
        qemu::fresh_dir(&out)?;
        console = boot.run()?;
    }
    Ok((out, console))
}

/// One entry of [`Plan::binaries`]: `binary[:filter|filter][@kernel+kernel]`.
pub(crate) struct PlanEntry<'a> {
    pub name: &'a str,
    pub filters: Vec<&'a str>,
    /// Empty: every kernel.
    pub kernels: Vec<&'a str>,
}

impl<'a> PlanEntry<'a> {
    pub(crate) fn parse(entry: &'a str) -> Self {
        let (rest, only) = entry.split_once('@').unwrap_or((entry, ""));
        let (name, own) = rest.split_once(':').unwrap_or((rest, ""));
        let list = |s: &'a str, sep: char| s.split(sep).filter(|x| !x.is_empty()).collect();
        Self {
            name,
            filters: list(own, '|'),
            kernels: list(only, '+'),
        }
    }
}

/// One test binary to run in the guest, with its test name filters.
struct Run {
    name: String,
    exe: PathBuf,
    filters: Vec<String>,
    /// The kernels (matrix names) it runs on; empty: every one.
    kernels: Vec<String>,
}

impl Run {
    fn runs_on(&self, kernel: &Kernel) -> bool {
        self.kernels.is_empty() || self.kernels.contains(&kernel.name)
    }
}

/// The guest's job: the prelude, each test binary with its log and exit
/// status in /out, and a leak check around them.
fn job_script(
    ws: &Workspace,
    env: &TestEnv,
    kernel: &Kernel,
    tests: &[Run],
    plan: &Plan,
) -> String {
    let mut s = prelude(ws, kernel, &env.vars());
    s.push_str(
        "snapshot() { ip netns list; ip -o link | cut -d: -f2; find /sys/fs/bpf; }\n\
         snapshot | sort > /out/before\n",
    );
    for Run {
        name, exe, filters, ..
    } in tests.iter().filter(|r| r.runs_on(kernel))
    {
        let filter: Vec<String> = filters.iter().map(|f| format!("'{f}'")).collect();
        // Around each binary: the guest's uptime and CPU counters (`cpu` of
        // /proc/stat), and every plugin step's duration (`SLUICE_TIMING`, one
        // file per binary), for the time table (`GuestTimes`).
        let _ = writeln!(
            s,
            "echo 'SLUICE-VM-TEST {name}'\n\
             echo \"start $(cut -d' ' -f1 /proc/uptime) $(head -1 /proc/stat)\" > /out/{name}.stat\n\
             export SLUICE_TIMING=/out/{name}.timing\n\
             ( '{}' --include-ignored --test-threads={} {} 2>&1; echo $? > /out/{name}.rc ) | tee /out/{name}.log | grep -E '^test .*(FAILED|ok)$|^test result:'\n\
             echo \"end $(cut -d' ' -f1 /proc/uptime) $(head -1 /proc/stat)\" >> /out/{name}.stat",
            exe.display(),
            plan.threads,
            filter.join(" ")
        );
    }
    s.push_str(
        "snapshot | sort > /out/after\n\
         comm -13 /out/before /out/after > /out/leaks\n\
         sync\n\
         echo SLUICE-VM-DONE\n",
    );
    s
}

/// The start of every guest job: /out mounted, the mounts and modules a node
/// has, the environment `vars`, the workspace as working directory, the
/// kernel's release in /out/kernel.
fn prelude(ws: &Workspace, kernel: &Kernel, vars: &[(&str, &Path)]) -> String {
    let mut s = String::from("#!/bin/sh\n# Written by cargo xtask; runs in the guest.\n");
    s.push_str(
        "mkdir -p /out && mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 out /out \
         || { echo 'SLUICE-VM-ERROR out'; exit 1; }\n\
         mount -t tmpfs tmpfs /run && mkdir -p /run/netns /run/lock\n\
         mount -t bpf bpf /sys/fs/bpf\n\
         mount -t cgroup2 cgroup2 /sys/fs/cgroup\n\
         mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null\n\
         mkdir -p /lib/modules\n",
    );
    let _ = writeln!(
        s,
        "ln -sfn {} /lib/modules/$(uname -r)",
        kernel.modules.display()
    );
    let _ = writeln!(
        s,
        "for m in {}; do modprobe -q $m 2>/dev/null; done",
        GUEST_MODULES.join(" ")
    );
    s.push_str(
        "ip link set lo up\n\
         hostname sluice-vm\n\
         export HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n",
    );
    for (key, value) in vars {
        let _ = writeln!(s, "export {key}='{}'", value.display());
    }
    // Step timing asked for on the host (`SLUICE_TIMING`, any value): the
    // guest's commands write theirs to `target/vm/runs/<release>/out/timing`
    // (the test jobs: one file per binary, see `job_script`).
    if std::env::var_os("SLUICE_TIMING").is_some() {
        s.push_str("export SLUICE_TIMING=/out/timing\n");
    }
    // (The overlay root is writable already: no tmpfs on /tmp, which could hide
    // a workspace cloned there.)
    let _ = writeln!(
        s,
        "cd '{}' || {{ echo 'SLUICE-VM-ERROR workspace not visible'; exit 1; }}",
        ws.root.display()
    );
    s.push_str("echo \"SLUICE-VM-KERNEL $(uname -r)\" | tee /out/kernel\n");
    s
}

/// One test binary on one kernel.
#[derive(Debug)]
pub(crate) struct BinaryResult {
    pub name: String,
    /// Exit status, None when it never ended (killed, guest crashed).
    pub status: Option<i32>,
    pub passed: u32,
    pub failed: Vec<String>,
    /// None when it never ended.
    pub times: Option<times::GuestTimes>,
}

/// One kernel's run.
#[derive(Debug)]
pub(crate) struct KernelResult {
    pub name: String,
    pub release: String,
    pub booted: bool,
    pub timed_out: bool,
    pub took: Duration,
    /// Power-on to the guest's userspace.
    pub boot: Option<Duration>,
    pub binaries: Vec<BinaryResult>,
    pub leaks: Vec<String>,
}

impl KernelResult {
    fn read(kernel: &Kernel, tests: &[Run], out: &Path, console: &qemu::Console) -> Self {
        let binaries = tests
            .iter()
            .filter(|r| r.runs_on(kernel))
            .map(|Run { name, .. }| {
                let log = fs::read_to_string(out.join(format!("{name}.log"))).unwrap_or_default();
                let status = fs::read_to_string(out.join(format!("{name}.rc")))
                    .ok()
                    .and_then(|s| s.trim().parse().ok());
                let (passed, failed) = crate::libtest::parse_libtest(&log);
                BinaryResult {
                    name: name.clone(),
                    status,
                    passed,
                    failed,
                    times: times::GuestTimes::read(out, name),
                }
            })
            .collect();
        let leaks = fs::read_to_string(out.join("leaks")).map_or_else(
            |_| vec!["(no leak check: the job did not finish)".to_string()],
            |s| s.lines().map(str::to_string).collect(),
        );
        Self {
            name: kernel.name.clone(),
            release: kernel.release.clone(),
            booted: console.booted(),
            timed_out: console.timed_out,
            took: console.took,
            boot: console.booted_in,
            binaries,
            leaks,
        }
    }

    pub(crate) fn ok(&self) -> bool {
        self.booted
            && !self.timed_out
            && self.leaks.is_empty()
            && self
                .binaries
                .iter()
                .all(|b| b.status == Some(0) && b.failed.is_empty())
    }
}

/// Every kernel's results.
#[derive(Debug, Default)]
pub(crate) struct Report {
    pub kernels: Vec<KernelResult>,
}

impl Report {
    pub(crate) fn ok(&self) -> bool {
        !self.kernels.is_empty() && self.kernels.iter().all(KernelResult::ok)
    }

    /// One line per problem: "5.10: hostport: `external_tcp`... failed".
    pub(crate) fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        for k in &self.kernels {
            if !k.booted {
                out.push(format!("{}: the guest did not boot", k.name));
            }
            if k.timed_out {
                out.push(format!("{}: killed after {}", k.name, fmt_duration(k.took)));
            }
            for b in &k.binaries {
                for f in &b.failed {
                    out.push(format!("{}: {}: {f} failed", k.name, b.name));
                }
                match b.status {
                    Some(0) => {}
                    // The failed tests are named above.
                    Some(_) if !b.failed.is_empty() => {}
                    Some(rc) => out.push(format!("{}: {} exited with {rc}", k.name, b.name)),
                    None => out.push(format!("{}: {} did not finish", k.name, b.name)),
                }
            }
            if !k.leaks.is_empty() {
                out.push(format!("{}: left behind: {}", k.name, k.leaks.join(", ")));
            }
        }
        out
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "vm-test results:")?;
        for k in &self.kernels {
            let passed: u32 = k.binaries.iter().map(|b| b.passed).sum();
            let failed: usize = k.binaries.iter().map(|b| b.failed.len()).sum();
            writeln!(
                f,
                "  {:<5} {:<24} {} in {}: {passed} passed, {failed} failed",
                k.name,
                k.release,
                if k.ok() { "ok    " } else { "FAILED" },
                fmt_duration(k.took)
            )?;
        }
        for line in self.failures() {
            writeln!(f, "  - {line}")?;
        }
        Ok(())
    }
}
