//! `cargo xtask profile`: where a pod -> pod round trip, a new pod -> pod
//! connection and a new masqueraded connection spend CPU time, on the bench's
//! testbed. Each figure runs as in `cargo xtask bench` (both ends pinned to one
//! CPU) under `perf record` on that CPU; the samples of every symbol (self
//! time, kernel and eBPF programs) are divided by the work done (round trips,
//! connections), and each Sluice setup is set against the bare veth pair (the
//! limit) and the reference. What Sluice spends beyond the limit is listed
//! symbol by symbol: that names the kernel path a figure's gap is made of.
//! Written to docs/profile.md.
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    os::unix::process::ExitStatusExt as _,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use nix::{sys::signal, unistd::Pid};

use super::{
    measure::{self, CPU},
    progstats,
    report::{self, LIMIT, REFERENCE, REFERENCE_MASQ, SLUICE, SLUICE_MASQ, SLUICE_NETKIT},
    topology::{self, Family, Setup},
};
use crate::{build::Binaries, cli::ProfileArgs, cmd, testbed::Testbed, ws::Workspace};

/// Symbols in which a CPU waits for work: a tickless idle CPU takes no
/// cpu-clock samples, but a polling one would.
const IDLE: [&str; 7] = [
    "pv_native_safe_halt",
    "native_safe_halt",
    "default_idle",
    "acpi_safe_halt",
    "cpu_idle_poll",
    "poll_idle",
    "intel_idle",
];

/// Symbols listed per figure: the largest differences to the limit.
const TOP: usize = 20;

/// The kernel paths Sluice adds, by the symbols they run (a symbol's
/// `.constprop.0`-style suffix ignored; `bpf_prog_` and `bpf_` prefixes for
/// the programs and the helpers they call).
const PATHS: [(&str, &[&str]); 5] = [
    (
        "tc hook",
        &[
            "tc_run",
            "tcf_classify",
            "__tcf_classify",
            "cls_bpf_classify",
            "tcx_run",
        ],
    ),
    ("eBPF programs", &["bpf_prog_"]),
    (
        "BPF maps",
        &[
            "__htab_map_lookup_elem",
            "htab_map_hash",
            "lookup_nulls_elem_raw",
            "htab_map_update_elem",
            "htab_lru_map_lookup_elem",
            "__htab_lru_percpu_map_update_elem",
            "array_map_lookup_elem",
            "percpu_array_map_lookup_elem",
        ],
    ),
    (
        "redirect",
        &[
            "skb_do_redirect",
            "veth_peer_dev",
            "dev_get_by_index_rcu",
            "netkit_peer_dev",
        ],
    ),
    ("other BPF helpers", &["bpf_"]),
];

/// The path of [`PATHS`] a symbol is on, if any (the first that matches).
fn path_of(sym: &str) -> Option<&'static str> {
    let base = sym.split('.').next().unwrap_or(sym);
    PATHS.iter().find_map(|(name, syms)| {
        syms.iter()
            .any(|s| {
                if s.ends_with('_') {
                    base.starts_with(s)
                } else {
                    base == *s
                }
            })
            .then_some(*name)
    })
}

/// The figures profiled.
#[derive(Clone, Copy)]
enum Figure {
    /// sockperf ping-pong, 64 B, pod -> pod: per round trip.
    RoundTrip,
    /// `conn-loop connect`, pod -> pod: per connection.
    PodConnection,
    /// `conn-loop connect`, pod -> external host, masqueraded (the limit:
    /// the bare veth pair, one hop): per connection.
    MasqConnection,
}

impl Figure {
    fn title(self) -> &'static str {
        match self {
            Self::RoundTrip => "pod -> pod TCP round trip (sockperf ping-pong, 64 B)",
            Self::PodConnection => "new pod -> pod TCP connection (conn-loop)",
            Self::MasqConnection => {
                "new masqueraded TCP connection, pod -> external host (conn-loop; the limit: the bare veth pair)"
            }
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Self::RoundTrip => "round trip",
            Self::PodConnection | Self::MasqConnection => "connection",
        }
    }

    /// Runs the figure on `s`.
    fn run(self, tb: &Testbed, s: &Setup, secs: u32) -> Result<Run> {
        let ns = |i| tb.ns(i);
        let conns = |n: f64, t: f64| Run {
            value: format!("{:.0}/s", n / t),
            ops: n,
            wall_us: t * 1e6 / n,
        };
        match self {
            Self::RoundTrip => {
                let (p50, n) = measure::tcp_round_trips(ns(s.pod1), ns(s.pod2), &s.pod2_ip, secs)?;
                Ok(Run {
                    value: format!("median {p50:.1} µs"),
                    ops: n,
                    wall_us: p50,
                })
            }
            Self::PodConnection => {
                let (n, t) = measure::conns(ns(s.pod1), ns(s.pod2), &s.pod2_ip, secs)?;
                Ok(conns(n, t))
            }
            Self::MasqConnection => {
                let (n, t) = measure::conns(ns(s.pod1), ns(s.ext), &s.ext_ip, secs)?;
                Ok(conns(n, t))
            }
        }
    }
}

/// One run of a figure on one setup.
struct Run {
    /// For the table ("median 14.2 µs", "12345/s").
    value: String,
    /// Work done: round trips or connections.
    ops: f64,
    /// Wall time per unit of work: the median round trip, or the run's
    /// seconds over its connections (µs).
    wall_us: f64,
}

/// Samples per symbol and the work they paid for, summed over rounds.
#[derive(Default)]
struct Profile {
    samples: BTreeMap<String, f64>,
    /// CPU time one sample stands for: cpu-clock samples every 1/frequency
    /// seconds of time the CPU runs (not while it idles).
    us_per_sample: f64,
    total_samples: f64,
    ops: f64,
    values: Vec<String>,
}

impl Profile {
    fn new(frequency: u32) -> Self {
        Self {
            us_per_sample: 1e6 / f64::from(frequency),
            ..Self::default()
        }
    }

    /// Microseconds per unit of work of `n` samples.
    fn per_op(&self, n: f64) -> f64 {
        if self.ops <= 0.0 {
            return 0.0;
        }
        n * self.us_per_sample / self.ops
    }

    fn symbol(&self, sym: &str) -> f64 {
        self.per_op(self.samples.get(sym).copied().unwrap_or(0.0))
    }

    fn idle(&self) -> f64 {
        self.per_op(IDLE.iter().filter_map(|s| self.samples.get(*s)).sum())
    }

    fn busy(&self) -> f64 {
        self.per_op(self.total_samples) - self.idle()
    }
}

pub(crate) fn run(ws: &Workspace, bins: &Binaries, args: &ProfileArgs) -> Result<()> {
    if !args.no_perf {
        check_perf()?;
    }
    let mut tb = Testbed::new("slprof")?;
    // Each with its index in the report's setup names.
    let mut setups = vec![
        (LIMIT, topology::limit(&mut tb)?),
        (REFERENCE, topology::reference(&mut tb)?),
        (SLUICE, topology::sluice(&mut tb, bins)?),
    ];
    setups.extend(topology::sluice_netkit(&mut tb, bins)?.map(|s| (SLUICE_NETKIT, s)));
    let pods = setups.len();
    setups.push((
        REFERENCE_MASQ,
        topology::reference_masq(&mut tb, Family::V4)?,
    ));
    setups.push((
        SLUICE_MASQ,
        topology::sluice_masq(&mut tb, bins, Family::V4)?,
    ));
    // Each figure: the setups (positions in `setups`) it runs on, and those
    // whose gap to the limit it lists. Masqueraded connections go to the
    // external host; the limit's "external host" is its other end.
    let routing: Vec<usize> = (0..pods).collect();
    let masq = vec![0, pods, pods + 1];
    let figures = [
        (
            Figure::RoundTrip,
            routing.clone(),
            &[SLUICE, SLUICE_NETKIT][..],
        ),
        (Figure::PodConnection, routing, &[SLUICE, SLUICE_NETKIT][..]),
        (Figure::MasqConnection, masq, &[SLUICE_MASQ][..]),
    ];
    let data = tb.dir.join("perf.data");
    let mut profiles: Vec<Vec<Profile>> = figures
        .iter()
        .map(|(_, on, _)| on.iter().map(|_| Profile::new(args.frequency)).collect())
        .collect();
    let perf_rounds = if args.no_perf { 0 } else { args.rounds };
    for round in 0..perf_rounds {
        eprintln!("profile: perf, round {} of {}", round + 1, args.rounds);
        for ((figure, on, _), profiles) in figures.iter().zip(&mut profiles) {
            for (&at, p) in on.iter().zip(profiles.iter_mut()) {
                let s = &setups[at].1;
                let rec = Recording::start(&data, args.frequency)?;
                let Run { value, ops, .. } = figure.run(&tb, s, args.seconds)?;
                rec.stop()?;
                let samples = symbol_samples(&data)?;
                let total: u64 = samples.values().sum();
                for (sym, n) in samples {
                    *p.samples.entry(sym).or_default() += n as f64;
                }
                p.total_samples += total as f64;
                p.ops += ops;
                p.values.push(value);
            }
        }
    }
    // The programs' own time: separate runs, since statistics cost every
    // program run two clock reads.
    let mut programs: Vec<Programs> = figures
        .iter()
        .map(|(_, on, _)| Programs::new(on.len()))
        .collect();
    {
        let _stats = progstats::Enabled::new()?;
        for round in 0..args.rounds {
            eprintln!(
                "profile: programs' run time, round {} of {}",
                round + 1,
                args.rounds
            );
            for ((figure, on, ours), p) in figures.iter().zip(&mut programs) {
                for (i, &at) in on.iter().enumerate() {
                    let (k, s) = &setups[at];
                    let pins = ours
                        .contains(k)
                        .then(|| s.cni.as_ref().and_then(|c| c.conf["pinRoot"].as_str()))
                        .flatten()
                        .map(Path::new);
                    let before = pins.map(progstats::snapshot).transpose()?;
                    let run = figure.run(&tb, s, args.seconds)?;
                    if let (Some(pins), Some(before)) = (pins, before) {
                        let d = progstats::delta(&before, &progstats::snapshot(pins)?);
                        let runs = p.runs.entry(*k).or_default();
                        for (name, r) in d {
                            let e = runs.entry(name).or_default();
                            e.ns += r.ns;
                            e.count += r.count;
                        }
                    }
                    p.add(i, run);
                }
            }
        }
    }
    let agent = topology::agent_report(&tb, Family::V4);
    drop(tb);
    let mut text = format!(
        "# Where the per-packet time goes\n\nGenerated by `cargo xtask profile{}` (as root): {}\n\
         Machine: {}\n\n",
        if args.no_perf { " --no-perf" } else { "" },
        if args.no_perf {
            format!(
                "the bench's testbed (docs/benchmarks.md, \"Method\"), each figure run for {} s \
                 per setup in each of {} rounds, setups interleaved, both ends pinned to CPU \
                 {CPU}, without perf.\n",
                args.seconds, args.rounds
            )
        } else {
            method(args)
        },
        report::machine()
    );
    for (((figure, on, ours), profiles), progs) in figures.iter().zip(&profiles).zip(&programs) {
        let names: Vec<usize> = on.iter().map(|&at| setups[at].0).collect();
        if !args.no_perf {
            table(&mut text, *figure, &names, profiles, ours)?;
        }
        programs_table(&mut text, *figure, &names, progs, ours)?;
    }
    // The masquerade node's idle flows go from the node agent (topology::
    // sluice_masq); `nat_sweep` above is the in-kernel sweeper finding its lease.
    let _ = writeln!(
        text,
        "The Sluice masquerade node runs the node agent's NAT sweep (`sluice-node sweep`, as a \
         cluster node's route-sync does); while it holds its lease, `nat_sweep` only reads the \
         lease. The agent's last report: {agent}\n"
    );
    print!("{text}");
    let path = args
        .out
        .clone()
        .unwrap_or_else(|| ws.root.join("docs").join("profile.md"));
    std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    println!("written to {}", path.display());
    Ok(())
}

fn check_perf() -> Result<()> {
    let mut c = Command::new("perf");
    c.arg("--version");
    cmd::stdout(&mut c)
        .context("perf is needed (Debian's linux-perf; `cargo xtask setup` installs it)")?;
    Ok(())
}

/// `perf record` of the benchmarks' CPU, stopped with SIGINT (which makes
/// perf finish its file); killed if dropped while still running.
struct Recording {
    child: Child,
}

impl Recording {
    fn start(data: &Path, frequency: u32) -> Result<Self> {
        let _ = std::fs::remove_file(data);
        let log = data.with_extension("log");
        let log =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut c = Command::new("perf");
        c.args([
            "record",
            "-q",
            // Named: a guest under emulation may show a PMU whose `cycles`
            // never count, and perf would default to it.
            "-e",
            "cpu-clock",
            "-C",
            CPU,
            "-F",
            &frequency.to_string(),
            "-o",
        ])
        .arg(data)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
        sluice_testbed::exec::die_with_parent(&mut c);
        let child = c.spawn().context("starting perf record")?;
        let mut rec = Self { child };
        // perf writes its file's header once its events are open.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !data.exists() {
            if let Some(status) = rec.child.try_wait()? {
                bail!("perf record exited before recording: {status}");
            }
            if Instant::now() > deadline {
                bail!("perf record made no {} in 10 s", data.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(rec)
    }

    /// Stops the recording, its file complete.
    fn stop(mut self) -> Result<()> {
        let pid = Pid::from_raw(i32::try_from(self.child.id())?);
        signal::kill(pid, signal::Signal::SIGINT).context("stopping perf record")?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait()? {
                // perf finishes its file, then dies of the SIGINT it caught
                // (`record__sig_exit`).
                let interrupted = status.signal() == Some(signal::Signal::SIGINT as i32);
                if !status.success() && !interrupted {
                    bail!("perf record: {status}");
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("perf record did not finish its file within 30 s of SIGINT");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Samples per symbol of a recording (self time).
fn symbol_samples(data: &Path) -> Result<BTreeMap<String, u64>> {
    let mut c = Command::new("perf");
    c.args([
        "report",
        "--stdio",
        "--no-children",
        "--sort",
        "sym",
        "-n",
        "-q",
    ])
    .args(["--percent-limit", "0", "-i"])
    .arg(data);
    let out = cmd::capture(&mut c)?;
    let m = parse_report(&String::from_utf8_lossy(&out.stdout));
    if m.is_empty() {
        let record = std::fs::read_to_string(data.with_extension("log")).unwrap_or_default();
        bail!(
            "perf report found no samples on CPU {CPU} in {} ({}): {}; perf record said: {}",
            data.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            record.trim()
        );
    }
    Ok(m)
}

/// `perf report -n --sort sym` lines: `  12.34%  567  [k] symbol`.
fn parse_report(out: &str) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for line in out.lines() {
        let mut f = line.split_whitespace();
        let (Some(pct), Some(n), Some(_space)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let sym = f.collect::<Vec<_>>().join(" ");
        let Ok(n) = n.parse::<u64>() else { continue };
        if !pct.ends_with('%') || sym.is_empty() {
            continue;
        }
        *m.entry(sym).or_default() += n;
    }
    m
}

/// How the figures were made (one paragraph).
fn method(args: &ProfileArgs) -> String {
    format!(
        "the bench's testbed (docs/benchmarks.md, \"Method\"), each figure run for {} s per \
         setup in each of {} rounds, setups interleaved, both ends pinned to CPU {CPU}, under \
         `perf record -e cpu-clock -C {CPU} -F {}` (one sample per 1/{} s the CPU runs, none \
         while it idles; a VM's PMU may be missing or emulated). A symbol's figure is its self time on that CPU \
         divided by the work done (round trips, connections), in microseconds. Each recording \
         runs from before the figure's server starts until its client exits, so the tools' \
         start-up is in every setup's CPU time alike. Absolute figures move 30% between runs \
         on these VMs; compare columns.\n",
        args.seconds, args.rounds, args.frequency, args.frequency
    )
}

/// The programs pass of one figure: per setup (as positioned in the
/// figure's list) its runs, and per Sluice setup what its programs ran.
struct Programs {
    values: Vec<Vec<String>>,
    ops: Vec<f64>,
    wall_us: Vec<Vec<f64>>,
    /// By setup index in the report, then by program.
    runs: BTreeMap<usize, BTreeMap<String, progstats::Runs>>,
}

impl Programs {
    fn new(setups: usize) -> Self {
        Self {
            values: vec![Vec::new(); setups],
            ops: vec![0.0; setups],
            wall_us: vec![Vec::new(); setups],
            runs: BTreeMap::new(),
        }
    }

    fn add(&mut self, i: usize, run: Run) {
        self.values[i].push(run.value);
        self.ops[i] += run.ops;
        self.wall_us[i].push(run.wall_us);
    }

    /// Setup `i`'s median wall time per unit over the rounds.
    fn wall(&self, i: usize) -> Option<f64> {
        let mut w = self.wall_us[i].clone();
        if w.is_empty() {
            return None;
        }
        w.sort_by(f64::total_cmp);
        Some(w[w.len() / 2])
    }
}

/// The programs' own time for one figure: each setup's wall time per unit,
/// then for each of `ours` the run has, its programs' runs and time per unit
/// against its gap to the limit.
fn programs_table(
    text: &mut String,
    figure: Figure,
    setups: &[usize],
    p: &Programs,
    ours: &[usize],
) -> Result<()> {
    let unit = figure.unit();
    let _ = writeln!(
        text,
        "## {}: the eBPF programs' own time\n\n\
         With the kernel's run-time statistics on (`BPF_ENABLE_STATS`; each program run \
         timed by two `sched_clock` reads, helpers and map lookups included), in runs of \
         their own:\n",
        figure.title()
    );
    let _ = writeln!(
        text,
        "| setup | figure (per round) | wall µs per {unit} (median round) |"
    );
    let _ = writeln!(text, "| --- | --- | --- |");
    for (i, k) in setups.iter().enumerate() {
        let _ = writeln!(
            text,
            "| {} | {} | {} |",
            report::name(*k),
            p.values[i].join(", "),
            p.wall(i).map_or_else(|| "-".into(), |w| format!("{w:.2}"))
        );
    }
    let at = |k: usize| setups.iter().position(|s| *s == k);
    let Some(limit) = at(LIMIT) else {
        bail!("profile: no limit setup for {}", figure.title());
    };
    for (k, runs) in &p.runs {
        let Some(i) = at(*k).filter(|_| ours.contains(k)) else {
            continue;
        };
        let ops = p.ops[i];
        if ops <= 0.0 {
            continue;
        }
        let _ = writeln!(
            text,
            "\n{}'s programs (the sweeper, once a second, spread over the {unit}s):\n\n\
             | program | runs per {unit} | ns per run | ns per {unit} |\n| --- | --- | --- | --- |",
            report::name(*k)
        );
        let mut total = 0.0;
        for (name, r) in runs.iter().filter(|(_, r)| r.count > 0) {
            let per_unit = r.ns as f64 / ops;
            total += per_unit;
            let _ = writeln!(
                text,
                "| `{name}` | {:.2} | {:.0} | {per_unit:.0} |",
                r.count as f64 / ops,
                r.ns as f64 / r.count as f64
            );
        }
        let gap = match (p.wall(i), p.wall(limit)) {
            (Some(a), Some(b)) => gap_sentence(unit, a, b, total / 1e3),
            _ => String::new(),
        };
        let _ = writeln!(text, "\nIn all {:.2} µs per {unit}{gap}.", total / 1e3);
    }
    let _ = writeln!(text);
    Ok(())
}

/// How a setup's wall time per `unit` (`a` µs) compares with the limit's
/// (`b`), and what its programs' `ours` µs are of the difference. A setup
/// faster than the limit (netkit pods skip the bare pair's backlog) has no
/// gap to share out.
fn gap_sentence(unit: &str, a: f64, b: f64, ours: f64) -> String {
    if a > b {
        format!(
            "; its {unit} takes {:.2} µs more wall time than the limit's ({a:.2} against \
             {b:.2}), so its programs are {:.0}% of that gap and the kernel's path the rest",
            a - b,
            ours / (a - b) * 1e2
        )
    } else {
        format!(
            "; its {unit} takes {:.2} µs less wall time than the limit's ({a:.2} against {b:.2})",
            b - a
        )
    }
}

/// One figure: each setup's value, CPU time per unit of work, then, for each
/// of `ours` the run has, the symbols where it spends most beyond the limit.
fn table(
    text: &mut String,
    figure: Figure,
    setups: &[usize],
    profiles: &[Profile],
    ours: &[usize],
) -> Result<()> {
    let unit = figure.unit();
    let _ = writeln!(text, "## {}\n", figure.title());
    let _ = writeln!(
        text,
        "| setup | figure (per round) | {unit}s | CPU µs per {unit} |"
    );
    let _ = writeln!(text, "| --- | --- | --- | --- |");
    for (k, p) in setups.iter().zip(profiles) {
        let _ = writeln!(
            text,
            "| {} | {} | {:.0} | {:.2} |",
            report::name(*k),
            p.values.join(", "),
            p.ops,
            p.busy(),
        );
    }
    let at = |k: usize| setups.iter().position(|s| *s == k);
    let Some(limit) = at(LIMIT) else {
        bail!("profile: no limit setup for {}", figure.title());
    };
    let lim = &profiles[limit];
    for (sluice, sl) in ours.iter().filter_map(|k| Some((*k, &profiles[at(*k)?]))) {
        let mut syms: Vec<(f64, &str)> = sl
            .samples
            .keys()
            .chain(lim.samples.keys())
            .filter(|s| !IDLE.contains(&s.as_str()))
            .map(|s| (sl.symbol(s) - lim.symbol(s), s.as_str()))
            .collect();
        syms.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
        syms.dedup_by(|a, b| a.1 == b.1);
        let _ = writeln!(
            text,
            "\n{} spends {:.2} µs more CPU time per {unit} than the limit ({:.2} against \
             {:.2}). The {TOP} symbols where it spends most beyond the limit (µs per {unit}):\n",
            report::name(sluice),
            sl.busy() - lim.busy(),
            sl.busy(),
            lim.busy()
        );
        let mut head = String::from("| symbol |");
        let mut rule = String::from("| --- |");
        for k in setups {
            let _ = write!(head, " {} |", report::name(*k));
            rule.push_str(" --- |");
        }
        let _ = writeln!(
            text,
            "{head} {} - limit |\n{rule} --- |",
            report::name(sluice)
        );
        for (d, s) in syms.iter().take(TOP) {
            let mut row = format!("| `{s}` |");
            for p in profiles {
                let _ = write!(row, " {:.3} |", p.symbol(s));
            }
            let _ = writeln!(text, "{row} {d:+.3} |");
        }
        let mut by_path: Vec<String> = Vec::new();
        for (name, _) in PATHS {
            let d: f64 = syms
                .iter()
                .filter(|(_, s)| path_of(s) == Some(name))
                .map(|(d, _)| d)
                .sum();
            by_path.push(format!("{name} {d:+.3}"));
        }
        let _ = writeln!(
            text,
            "\nBy path, all symbols (µs per {unit}, {} - limit): {}.",
            report::name(sluice),
            by_path.join(", ")
        );
    }
    let _ = writeln!(text);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setup_faster_than_the_limit_has_no_gap_to_share_out() {
        let slower = gap_sentence("round trip", 15.0, 14.0, 0.5);
        assert!(slower.contains("1.00 µs more wall time"), "{slower}");
        assert!(slower.contains("programs are 50% of that gap"), "{slower}");
        let faster = gap_sentence("round trip", 493.42, 625.56, 25.84);
        assert!(faster.contains("132.14 µs less wall time"), "{faster}");
        assert!(!faster.contains('%'), "{faster}");
    }

    #[test]
    fn parses_perf_report_lines() {
        let out = "    49.68%  6029  [k] pv_native_safe_halt\n     0.63%    89  [k] bpf_prog_9080215735d63004_from_pod\n\n#\n     0.01%     1  [.] 0x0000000000001234\n";
        let m = parse_report(out);
        assert_eq!(m["pv_native_safe_halt"], 6029);
        assert_eq!(m["bpf_prog_9080215735d63004_from_pod"], 89);
        assert_eq!(m["0x0000000000001234"], 1);
        assert_eq!(m.len(), 3);
    }

    #[test]
    fn symbols_fall_on_their_paths() {
        assert_eq!(path_of("__tcf_classify.constprop.0"), Some("tc hook"));
        assert_eq!(
            path_of("bpf_prog_5d9fb21341c8ef98_from_pod"),
            Some("eBPF programs")
        );
        assert_eq!(path_of("lookup_nulls_elem_raw"), Some("BPF maps"));
        assert_eq!(path_of("veth_peer_dev"), Some("redirect"));
        assert_eq!(path_of("bpf_l4_csum_replace"), Some("other BPF helpers"));
        assert_eq!(path_of("tcp_v4_rcv"), None);
        assert_eq!(path_of("tc_run_other"), None);
    }

    #[test]
    fn per_op_divides_sampled_time_by_work() {
        let mut p = Profile::new(100_000); // 10 µs per sample
        p.samples.insert("a".into(), 100.0);
        p.samples.insert("pv_native_safe_halt".into(), 300.0);
        p.total_samples = 400.0;
        p.ops = 10.0;
        assert!((p.symbol("a") - 100.0).abs() < 1e-9);
        assert!((p.idle() - 300.0).abs() < 1e-9);
        assert!((p.busy() - 100.0).abs() < 1e-9);
        assert!(p.symbol("absent").abs() < 1e-9);
    }
}
