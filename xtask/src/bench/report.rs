//! The figures, their medians over rounds, ratios and the targets, as a terminal
//! table and as docs/benchmarks.md.
use std::fmt::Write;

use crate::cli::{BenchArgs, BenchTable};

use super::{
    filling::{FILL_AT, FILL_PODS, FILL_ROUNDS, FILL_SETTLE_SECS, FILL_WINDOW},
    measure::CPU,
    measure::UDP_LEN,
    topology::{
        BW_BURSTS_MS, BW_DEFAULT_BURST, BW_RATES, HP_SIZES, HP_TIMED_PODS_REFERENCE,
        HP_TIMED_PODS_SLUICE,
    },
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Figure {
    PodPodGbps,
    PodPodRttP50,
    PodPodRttP99,
    PodPodUdpKpps,
    /// New TCP connections per second, pod -> pod (connect, one byte each
    /// way, the server closes first).
    PodPodConnsPerSec,
    PodExtGbps,
    PodExtRttP50,
    ExtPodGbps,
    ExtPodRttP50,
    AddP50,
    AddP99,
    DelP50,
    DelP99,
    MasqGbps,
    MasqRttP50,
    MasqRttP99,
    MasqConnsPerSec,
    /// The same while another pod of the node floods new flows
    /// (`measure::FLOOD_FLOWS` datagrams to as many ports).
    MasqConnsPerSecFlood,
    /// TCP RTT median (us), pod -> a Service's ClusterIP (kube-proxy's DNAT
    /// to a pod of the same node).
    CiRttP50,
    /// Its p99.
    CiRttP99,
    /// New TCP connections per second, pod -> the ClusterIP (as
    /// `PodPodConnsPerSec`).
    CiConnsPerSec,
    HpGbps,
    HpRttP50,
    HpRttP99,
    HpAddP50,
    /// Received Mbit/s of one TCP stream to or from the pod limited to
    /// `BW_RATES[rate]` with `BW_BURSTS_MS[burst]` (ingress: external host ->
    /// pod): (rate, burst, ingress).
    BwTcpMbps(BwAt),
    /// The sender's retransmissions in that run.
    BwTcpRetransmits(BwAt),
    /// TCP RTT median (us) through the pod's limit while one TCP stream fills
    /// it (at `BW_UDP_RATE`).
    BwLoadedRttP50(BwAt),
    /// Its p99.
    BwLoadedRttP99(BwAt),
    /// Received Mbit/s of UDP sent at twice the `BW_UDP_RATE` limit.
    BwUdpMbps {
        ingress: bool,
    },
    /// Busy CPU seconds of the machine per Gbit received, TCP at the
    /// `BW_CPU_RATE` limit.
    BwCpuPerGbit {
        ingress: bool,
    },
    /// ADD p50 (ms) of the pods that brought a node to `FILL_AT[i]` pods (the
    /// setup says which `i`), each pod with a hostPort or none.
    FillAddP50 {
        hostport: bool,
    },
    /// DEL p50 (ms) of the pods taken from a node holding `FILL_AT[i]` pods.
    FillDelP50 {
        hostport: bool,
    },
}

/// Where a bandwidth figure was measured: (index into `BW_RATES`, index into
/// `BW_BURSTS_MS`, ingress).
pub(super) type BwAt = (usize, usize, bool);

/// The limit (index into `BW_RATES`) of the UDP figure and of the CPU figure.
pub(super) const BW_UDP_RATE: usize = 1;
pub(super) const BW_CPU_RATE: usize = 2;

/// Setup indexes (the order `bench::run` builds them in).
pub(super) const LIMIT: usize = 0;
pub(super) const REFERENCE: usize = 1;
pub(super) const SLUICE: usize = 2;
pub(super) const REFERENCE_MASQ: usize = 3;
pub(super) const SLUICE_MASQ: usize = 4;
/// The port-mapping setups: reference and Sluice with `HP_SIZES[0]` mappings;
/// those with `HP_SIZES[i]` are `2 * i` further on.
pub(super) const REFERENCE_HP: usize = 5;
pub(super) const SLUICE_HP: usize = 6;
/// The bandwidth setups (after the three port-mapping pairs).
pub(super) const REFERENCE_BW: usize = 11;
pub(super) const SLUICE_BW: usize = 12;
/// The IPv6 masquerade setups (the masquerade figures, on IPv6).
pub(super) const REFERENCE_MASQ6: usize = 13;
pub(super) const SLUICE_MASQ6: usize = 14;
/// The filling-up setups: reference, Sluice and the kernel's own veth pair
/// (the limit) at `FILL_AT[0]` pods; at `FILL_AT[i]` they are `3 * i` further on.
pub(super) const REFERENCE_FILL: usize = 15;
pub(super) const SLUICE_FILL: usize = 16;
pub(super) const KERNEL_FILL: usize = 17;
/// Sluice with netkit pods, in the routing table (kernels with netkit only).
pub(super) const SLUICE_NETKIT: usize = 24;
/// The ClusterIP setups: both plugins with kube-proxy's iptables-mode rules.
pub(super) const REFERENCE_CI: usize = 25;
pub(super) const SLUICE_CI: usize = 26;
/// Setups a run may not have: their columns and ratios are left out then.
const OPTIONAL: [usize; 1] = [SLUICE_NETKIT];

/// Setup names, by index.
const NAMES: [&str; 27] = [
    "bare veth",
    "bridge+host-local",
    "sluice",
    "bridge ipMasq",
    "sluice ipMasq",
    "bridge+portmap",
    "sluice",
    "bridge+portmap",
    "sluice",
    "bridge+portmap",
    "sluice",
    "bridge+bandwidth",
    "sluice",
    "bridge ipMasq",
    "sluice ipMasq",
    "bridge+host-local(+portmap)",
    "sluice",
    "kernel veth pair",
    "bridge+host-local(+portmap)",
    "sluice",
    "kernel veth pair",
    "bridge+host-local(+portmap)",
    "sluice",
    "kernel veth pair",
    "sluice netkit",
    "bridge+kube-proxy",
    "sluice+kube-proxy",
];

/// The name of setup `setup` in tables.
pub(super) const fn name(setup: usize) -> &'static str {
    NAMES[setup]
}

/// The setup of `base` (`REFERENCE_HP` or `SLUICE_HP`) with `HP_SIZES[i]` mappings.
pub(super) const fn hp(base: usize, i: usize) -> usize {
    base + 2 * i
}

/// The setup of `base` (`REFERENCE_FILL`, `SLUICE_FILL` or `KERNEL_FILL`) at
/// `FILL_AT[i]` pods.
pub(super) const fn filling(base: usize, i: usize) -> usize {
    base + 3 * i
}

/// One table: its figures, the setups it shows, and Sluice's ratios to the others.
struct Table {
    title: &'static str,
    figures: &'static [Figure],
    columns: &'static [usize],
    /// (header, numerator setup, denominator setup)
    ratios: &'static [(&'static str, usize, usize)],
    /// Rows per number of mappings (`HP_SIZES`), each column's setup moved on
    /// with `hp`, and a row of the change from the first count to the last.
    by_size: bool,
    which: BenchTable,
}

/// The bandwidth table's figures (rows per limit and direction instead).
const BW_FIGURES: &[Figure] = &[
    Figure::BwTcpMbps((0, 0, false)),
    Figure::BwTcpRetransmits((0, 0, false)),
    Figure::BwLoadedRttP50((0, 0, false)),
    Figure::BwLoadedRttP99((0, 0, false)),
    Figure::BwUdpMbps { ingress: false },
    Figure::BwCpuPerGbit { ingress: false },
];

/// The masquerade tables' figures (IPv4 and IPv6, each on its own setups).
const MASQ_FIGURES: &[Figure] = &[
    Figure::MasqGbps,
    Figure::MasqRttP50,
    Figure::MasqRttP99,
    Figure::MasqConnsPerSec,
    Figure::MasqConnsPerSecFlood,
];

const TABLES: [Table; 7] = [
    Table {
        which: BenchTable::Routing,
        by_size: false,
        title: "Routing",
        figures: &[
            Figure::PodPodGbps,
            Figure::PodPodRttP50,
            Figure::PodPodRttP99,
            Figure::PodPodUdpKpps,
            Figure::PodPodConnsPerSec,
            Figure::PodExtGbps,
            Figure::PodExtRttP50,
            Figure::ExtPodGbps,
            Figure::ExtPodRttP50,
            Figure::AddP50,
            Figure::AddP99,
            Figure::DelP50,
            Figure::DelP99,
        ],
        columns: &[LIMIT, REFERENCE, SLUICE, SLUICE_NETKIT],
        ratios: &[
            ("sluice/reference", SLUICE, REFERENCE),
            ("sluice/limit", SLUICE, LIMIT),
            ("netkit/limit", SLUICE_NETKIT, LIMIT),
        ],
    },
    Table {
        title: "Masquerade (pod -> external host without a route to the pods)",
        figures: MASQ_FIGURES,
        columns: &[REFERENCE_MASQ, SLUICE_MASQ],
        ratios: &[("sluice/reference", SLUICE_MASQ, REFERENCE_MASQ)],
        which: BenchTable::Masquerade,
        by_size: false,
    },
    Table {
        title: "IPv6 masquerade (dual-stack pod -> external host's IPv6 address, \
                without a route to the pods)",
        figures: MASQ_FIGURES,
        columns: &[REFERENCE_MASQ6, SLUICE_MASQ6],
        ratios: &[("sluice/reference", SLUICE_MASQ6, REFERENCE_MASQ6)],
        which: BenchTable::Masquerade6,
        by_size: false,
    },
    Table {
        title: "ClusterIP through kube-proxy (iptables mode)",
        figures: &[Figure::CiRttP50, Figure::CiRttP99, Figure::CiConnsPerSec],
        columns: &[REFERENCE_CI, SLUICE_CI],
        ratios: &[("sluice/reference", SLUICE_CI, REFERENCE_CI)],
        which: BenchTable::Clusterip,
        by_size: false,
    },
    Table {
        title: "Port mapping (hostPort: external host -> node address:hostPort)",
        figures: &[
            Figure::HpGbps,
            Figure::HpRttP50,
            Figure::HpRttP99,
            Figure::HpAddP50,
        ],
        columns: &[REFERENCE_HP, SLUICE_HP],
        ratios: &[("sluice/reference", SLUICE_HP, REFERENCE_HP)],
        which: BenchTable::Hostport,
        by_size: true,
    },
    Table {
        title: "Bandwidth limits (pod limited both ways; egress: pod -> external host, \
                ingress: external host -> pod)",
        figures: BW_FIGURES,
        columns: &[REFERENCE_BW, SLUICE_BW],
        ratios: &[("sluice/reference", SLUICE_BW, REFERENCE_BW)],
        which: BenchTable::Bandwidth,
        by_size: false,
    },
    Table {
        title: "A node filling up (each ADD and DEL as the node goes to 1,000 pods and back)",
        figures: &[
            Figure::FillAddP50 { hostport: false },
            Figure::FillAddP50 { hostport: true },
            Figure::FillDelP50 { hostport: false },
            Figure::FillDelP50 { hostport: true },
        ],
        columns: &[REFERENCE_FILL, SLUICE_FILL, KERNEL_FILL],
        ratios: &[
            ("sluice/reference", SLUICE_FILL, REFERENCE_FILL),
            ("sluice/kernel", SLUICE_FILL, KERNEL_FILL),
        ],
        which: BenchTable::Filling,
        by_size: false,
    },
];

impl Figure {
    fn label(self) -> &'static str {
        match self {
            Self::PodPodGbps => "pod->pod TCP throughput (Gbit/s)",
            Self::PodPodRttP50 => "pod->pod TCP RTT median (us)",
            Self::PodPodRttP99 => "pod->pod TCP RTT p99 (us)",
            Self::PodPodUdpKpps => "pod->pod UDP 64 B received (kpps)",
            Self::PodPodConnsPerSec => "pod->pod new TCP connections per second",
            Self::PodExtGbps => "pod->external TCP throughput (Gbit/s)",
            Self::PodExtRttP50 => "pod->external TCP RTT median (us)",
            Self::ExtPodGbps => "external->pod TCP throughput (Gbit/s)",
            Self::ExtPodRttP50 => "external->pod TCP RTT median (us)",
            Self::AddP50 => "ADD latency p50 (ms)",
            Self::AddP99 => "ADD latency p99 (ms)",
            Self::DelP50 => "DEL latency p50 (ms)",
            Self::DelP99 => "DEL latency p99 (ms)",
            Self::MasqGbps => "masqueraded TCP throughput (Gbit/s)",
            Self::MasqRttP50 => "masqueraded TCP RTT median (us)",
            Self::MasqRttP99 => "masqueraded TCP RTT p99 (us)",
            Self::MasqConnsPerSec => "masqueraded new TCP connections per second",
            Self::MasqConnsPerSecFlood => {
                "masqueraded new TCP connections per second, another pod flooding new flows"
            }
            Self::CiRttP50 => "pod->ClusterIP TCP RTT median (us)",
            Self::CiRttP99 => "pod->ClusterIP TCP RTT p99 (us)",
            Self::CiConnsPerSec => "pod->ClusterIP new TCP connections per second",
            Self::HpGbps => "TCP throughput (Gbit/s)",
            Self::HpRttP50 => "TCP RTT median (us)",
            Self::HpRttP99 => "TCP RTT p99 (us)",
            Self::HpAddP50 => "ADD latency p50, pod with 1 mapping (ms)",
            Self::BwTcpMbps(_) => "TCP, one stream, received (Mbit/s)",
            Self::BwTcpRetransmits(_) => "TCP, one stream, retransmissions per run",
            Self::BwLoadedRttP50(_) => "TCP RTT median under load (us)",
            Self::BwLoadedRttP99(_) => "TCP RTT p99 under load (us)",
            Self::BwUdpMbps { .. } => "UDP sent at 2x the limit, received (Mbit/s)",
            Self::BwCpuPerGbit { .. } => "CPU per Gbit/s, TCP (CPU-seconds per Gbit)",
            Self::FillAddP50 { hostport: false } => "ADD p50, pods without mappings (ms)",
            Self::FillAddP50 { hostport: true } => "ADD p50, pods with a hostPort each (ms)",
            Self::FillDelP50 { hostport: false } => "DEL p50, pods without mappings (ms)",
            Self::FillDelP50 { hostport: true } => "DEL p50, pods with a hostPort each (ms)",
        }
    }

    /// Decimals of a cell's median and of its range.
    fn precision(self) -> (usize, usize) {
        match self {
            // Fractions of a CPU: the usual one decimal would hide the range.
            Self::BwCpuPerGbit { .. } => (3, 3),
            Self::BwTcpRetransmits(_) => (0, 0),
            _ => (2, 1),
        }
    }

    fn higher_is_better(self) -> bool {
        matches!(
            self,
            Self::PodPodGbps
                | Self::PodPodUdpKpps
                | Self::PodPodConnsPerSec
                | Self::PodExtGbps
                | Self::ExtPodGbps
                | Self::MasqGbps
                | Self::MasqConnsPerSec
                | Self::MasqConnsPerSecFlood
                | Self::CiConnsPerSec
                | Self::HpGbps
                | Self::BwTcpMbps(_)
                | Self::BwUdpMbps { .. }
        )
    }
}

pub(super) struct Report {
    /// What the floods did to Sluice's masquerade tables (setup index, text).
    pub masq_pressure: Vec<(usize, String)>,
    only: Option<BenchTable>,
    values: Vec<(Figure, usize, f64)>,
    /// How Sluice's bandwidth pods sent (EDT or the policer), as `sluicectl
    /// status` said after their ADD.
    pub sluice_egress: Option<String>,
    /// The Services table (its own rows: sizes and ways of translating).
    pub services: super::services::Results,
    /// The NetworkPolicy table (its own rows: numbers of rules).
    pub policy: super::policy::Results,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

impl Report {
    pub(super) fn new(only: Option<BenchTable>) -> Self {
        Self {
            masq_pressure: Vec::new(),
            only,
            values: Vec::new(),
            sluice_egress: None,
            services: super::services::Results::default(),
            policy: super::policy::Results::default(),
        }
    }

    /// The tables this run measures.
    fn tables(&self) -> impl Iterator<Item = &'static Table> + '_ {
        TABLES
            .iter()
            .filter(|t| self.only.is_none_or(|o| o == t.which))
    }

    /// Whether this run measured `setup` (a setup in [`OPTIONAL`] may be left
    /// out: netkit where the kernel has none).
    fn measured(&self, setup: usize) -> bool {
        !OPTIONAL.contains(&setup) || self.values.iter().any(|(_, s, _)| *s == setup)
    }

    /// The columns of `t` this run has.
    fn columns<'a>(&'a self, t: &'a Table) -> impl Iterator<Item = usize> + 'a {
        t.columns.iter().copied().filter(|s| self.measured(*s))
    }

    /// The ratios of `t` whose setups this run has.
    fn ratios<'a>(
        &'a self,
        t: &'a Table,
    ) -> impl Iterator<Item = &'a (&'static str, usize, usize)> + 'a {
        t.ratios
            .iter()
            .filter(|(_, a, b)| self.measured(*a) && self.measured(*b))
    }

    pub(super) fn add(&mut self, f: Figure, setup: usize, v: f64) {
        self.values.push((f, setup, v));
    }

    fn samples(&self, f: Figure, setup: usize) -> Vec<f64> {
        self.values
            .iter()
            .filter(|(g, s, _)| *g == f && *s == setup)
            .map(|(_, _, v)| *v)
            .collect()
    }

    fn value(&self, f: Figure, setup: usize) -> Option<f64> {
        median(self.samples(f, setup))
    }

    /// "median (min-max)" over the rounds, or the median alone for one sample.
    fn cell(&self, f: Figure, setup: usize) -> String {
        let s = self.samples(f, setup);
        match self.value(f, setup) {
            None => "-".into(),
            Some(m) if s.len() < 2 => format!("{m:.p$}", p = f.precision().0),
            Some(m) => {
                let (p, q) = f.precision();
                let lo = s.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                format!("{m:.p$} ({lo:.q$}-{hi:.q$})")
            }
        }
    }

    /// Rows of table `t`: label, one cell per setup, then Sluice's ratios.
    fn rows(&self, t: &Table) -> Vec<Vec<String>> {
        if t.by_size {
            return self.size_rows(t);
        }
        if t.which == BenchTable::Bandwidth {
            return self.bw_rows(t);
        }
        if t.which == BenchTable::Filling {
            return self.filling_rows(t);
        }
        t.figures
            .iter()
            .map(|f| {
                let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
                    (Some(a), Some(b)) if b != 0.0 => format!("{:.2}x", a / b),
                    _ => "-".into(),
                };
                let mut row = vec![format!(
                    "{}{}",
                    f.label(),
                    if f.higher_is_better() {
                        ""
                    } else {
                        " [lower is better]"
                    }
                )];
                row.extend(self.columns(t).map(|s| self.cell(*f, s)));
                row.extend(
                    self.ratios(t)
                        .map(|(_, a, b)| ratio(self.value(*f, *a), self.value(*f, *b))),
                );
                row
            })
            .collect()
    }

    /// Rows of a `by_size` table: per figure, one row per number of mappings
    /// (cells and ratios of the setups with that many), then the change from
    /// the fewest to the most mappings for each column.
    fn size_rows(&self, t: &Table) -> Vec<Vec<String>> {
        let last = HP_SIZES.len() - 1;
        let change = format!(
            "change {} -> {}",
            thousands(HP_SIZES[0]),
            thousands(HP_SIZES[last])
        );
        self.rows_by(t, &HP_SIZES, hp, &change, |f, s| {
            self.change(f, s)
                .map_or_else(|| "-".into(), |c| format!("{c:+.1}%"))
        })
    }

    /// Rows per size: for each figure, one row per entry of `sizes` (the cells
    /// of setup `at(column, i)` and their ratios), then a row `last` with
    /// `summary(figure, column)` for each column.
    fn rows_by(
        &self,
        t: &Table,
        sizes: &[usize],
        at: fn(usize, usize) -> usize,
        last: &str,
        summary: impl Fn(Figure, usize) -> String,
    ) -> Vec<Vec<String>> {
        let mut rows = Vec::new();
        for f in t.figures {
            let label = with_direction(*f);
            for (i, n) in sizes.iter().enumerate() {
                let mut row = vec![label.clone(), thousands(*n)];
                row.extend(t.columns.iter().map(|s| self.cell(*f, at(*s, i))));
                row.extend(t.ratios.iter().map(|(_, a, b)| {
                    ratio_text(self.value(*f, at(*a, i)), self.value(*f, at(*b, i)))
                }));
                rows.push(row);
            }
            let mut row = vec![label, last.to_string()];
            row.extend(t.columns.iter().map(|s| summary(*f, *s)));
            row.extend(t.ratios.iter().map(|_| String::new()));
            rows.push(row);
        }
        rows
    }

    /// Rows of the bandwidth table: per figure, one row per limit, burst and
    /// direction (TCP: every limit and burst; UDP and CPU: `BW_UDP_RATE`,
    /// `BW_CPU_RATE` at the default burst), the cells, each column's ratio to
    /// the limit (rates only), then Sluice's ratio to the reference.
    fn bw_rows(&self, t: &Table) -> Vec<Vec<String>> {
        let mut rows = Vec::new();
        let mut push = |f: Figure, (rate, burst, ingress): BwAt| {
            let limit_mbps = BW_RATES[rate] as f64 / 1e6;
            let mut row = vec![
                with_direction(f),
                format!(
                    "{}, {} ms burst, {}",
                    rate_text(BW_RATES[rate]),
                    BW_BURSTS_MS[burst],
                    if ingress { "ingress" } else { "egress" }
                ),
            ];
            row.extend(t.columns.iter().map(|s| self.cell(f, *s)));
            let is_rate = matches!(f, Figure::BwTcpMbps(_) | Figure::BwUdpMbps { .. });
            row.extend(t.columns.iter().map(|s| match self.value(f, *s) {
                Some(v) if is_rate => format!("{:.3}", v / limit_mbps),
                _ => String::new(),
            }));
            row.extend(t.ratios.iter().map(|(_, a, b)| {
                match (self.value(f, *a), self.value(f, *b)) {
                    (Some(a), Some(b)) if b != 0.0 => format!("{:.2}x", a / b),
                    _ => "-".into(),
                }
            }));
            rows.push(row);
        };
        let all = || {
            (0..BW_RATES.len()).flat_map(|rate| {
                (0..BW_BURSTS_MS.len())
                    .flat_map(move |burst| [false, true].map(|ingress| (rate, burst, ingress)))
            })
        };
        for at in all() {
            push(Figure::BwTcpMbps(at), at);
        }
        for at in all() {
            push(Figure::BwTcpRetransmits(at), at);
        }
        for f in [Figure::BwLoadedRttP50, Figure::BwLoadedRttP99] {
            for burst in 0..BW_BURSTS_MS.len() {
                for ingress in [false, true] {
                    let at = (BW_UDP_RATE, burst, ingress);
                    push(f(at), at);
                }
            }
        }
        for ingress in [false, true] {
            let at = (BW_UDP_RATE, BW_DEFAULT_BURST, ingress);
            push(Figure::BwUdpMbps { ingress }, at);
        }
        for ingress in [false, true] {
            let at = (BW_CPU_RATE, BW_DEFAULT_BURST, ingress);
            push(Figure::BwCpuPerGbit { ingress }, at);
        }
        rows
    }

    /// Rows of the filling-up table: per figure, one row per node size
    /// (`FILL_AT`), then each column's growth from the smallest to the largest.
    fn filling_rows(&self, t: &Table) -> Vec<Vec<String>> {
        let last = format!(
            "{} / {}",
            thousands(FILL_AT[FILL_AT.len() - 1]),
            thousands(FILL_AT[0])
        );
        self.rows_by(t, &FILL_AT, filling, &last, |f, s| {
            self.growth(f, s)
                .map_or_else(|| "-".into(), |g| format!("{g:.2}x"))
        })
    }

    /// `f` at the most pods over `f` at the fewest, for the filling setups
    /// starting at `base`.
    fn growth(&self, f: Figure, base: usize) -> Option<f64> {
        let first = self.value(f, filling(base, 0))?;
        let last = self.value(f, filling(base, FILL_AT.len() - 1))?;
        (first != 0.0).then(|| last / first)
    }

    /// Issue 18: ADD flat as the node fills up, DEL well under the reference's.
    fn filling_targets(&self) -> Vec<String> {
        let check = |ok: bool| if ok { "met" } else { "NOT met" };
        let ms = |f, base, i| {
            self.value(f, filling(base, i))
                .map_or_else(|| "-".into(), |v| format!("{v:.1} ms"))
        };
        let (first, last) = (thousands(FILL_AT[0]), thousands(FILL_AT[FILL_AT.len() - 1]));
        let top = FILL_AT.len() - 1;
        let times = |g: Option<f64>| g.map_or_else(|| "-".into(), |g| format!("{g:.2}x"));
        let mut out = Vec::new();
        let mut dels = Vec::new();
        for hostport in [false, true] {
            let what = if hostport {
                "a hostPort each"
            } else {
                "no mappings"
            };
            let add = Figure::FillAddP50 { hostport };
            let g = self.growth(add, SLUICE_FILL);
            out.push(format!(
                "ADD p50 at {last} pods <= 1.2x ADD p50 at {first} ({what}): {} ({} -> {}), {}; \
                 reference {} ({} -> {})",
                times(g),
                ms(add, SLUICE_FILL, 0),
                ms(add, SLUICE_FILL, top),
                check(g.is_some_and(|g| g <= 1.2)),
                times(self.growth(add, REFERENCE_FILL)),
                ms(add, REFERENCE_FILL, 0),
                ms(add, REFERENCE_FILL, top),
            ));
            let del = Figure::FillDelP50 { hostport };
            let r = match (
                self.value(del, filling(SLUICE_FILL, top)),
                self.value(del, filling(REFERENCE_FILL, top)),
            ) {
                (Some(a), Some(b)) if b != 0.0 => Some(a / b),
                _ => None,
            };
            // The kernel's own veth pair removal bounds any plugin's DEL: say
            // how close Sluice is to it where the run measured it.
            let kernel = match (
                self.value(del, filling(SLUICE_FILL, top)),
                self.value(del, filling(KERNEL_FILL, top)),
            ) {
                (Some(a), Some(k)) if k != 0.0 => format!(
                    "; the kernel's own veth pair removal {}, Sluice {:.2}x of it",
                    ms(del, KERNEL_FILL, top),
                    a / k
                ),
                _ => String::new(),
            };
            dels.push(format!(
                "DEL p50 at {last} pods <= 0.6x the reference's ({what}): {} ({} vs {}), {}{kernel}",
                times(r),
                ms(del, SLUICE_FILL, top),
                ms(del, REFERENCE_FILL, top),
                check(r.is_some_and(|r| r <= 0.6)),
            ));
        }
        out.extend(dels);
        out
    }

    /// Change of `f` in percent from the fewest to the most mappings, for the
    /// port-mapping setups starting at `base`.
    fn change(&self, f: Figure, base: usize) -> Option<f64> {
        let first = self.value(f, hp(base, 0))?;
        let last = self.value(f, hp(base, HP_SIZES.len() - 1))?;
        (first != 0.0).then(|| (last / first - 1.0) * 100.0)
    }

    fn header(&self, t: &Table) -> Vec<String> {
        let mut h = vec!["figure".to_string()];
        if t.by_size {
            h.push("mappings".into());
        }
        if t.which == BenchTable::Filling {
            h.push("pods on the node".into());
        }
        let bw = t.which == BenchTable::Bandwidth;
        if bw {
            h.push("limit".into());
        }
        h.extend(self.columns(t).map(|s| NAMES[s].to_string()));
        if bw {
            h.extend(t.columns.iter().map(|s| format!("{}/limit", NAMES[*s])));
        }
        h.extend(self.ratios(t).map(|(name, _, _)| (*name).to_string()));
        h
    }

    /// The issues' targets of the tables this run measures, each with the
    /// same-run figures it is judged on.
    fn targets(&self) -> Vec<String> {
        let v = |f, s| self.value(f, s).unwrap_or(f64::NAN);
        let check = |ok: bool| if ok { "met" } else { "NOT met" };
        let mut out = Vec::new();
        for t in self.tables() {
            match t.which {
                BenchTable::Routing => {
                    let tput_lim = v(Figure::PodPodGbps, SLUICE) / v(Figure::PodPodGbps, LIMIT);
                    let tput_ref = v(Figure::PodPodGbps, SLUICE) / v(Figure::PodPodGbps, REFERENCE);
                    let rtt_lim = v(Figure::PodPodRttP50, SLUICE) / v(Figure::PodPodRttP50, LIMIT);
                    let add_ref = v(Figure::AddP50, SLUICE) / v(Figure::AddP50, REFERENCE);
                    let lim = |f| v(f, SLUICE) / v(f, LIMIT);
                    let (conns_lim, udp_lim) =
                        (lim(Figure::PodPodConnsPerSec), lim(Figure::PodPodUdpKpps));
                    out.extend([
                        format!(
                            "pod->pod throughput >= 0.95x limit: {tput_lim:.3}x, {}",
                            check(tput_lim >= 0.95)
                        ),
                        format!(
                            "pod->pod throughput >= 1.1x reference: {tput_ref:.3}x, {}",
                            check(tput_ref >= 1.1)
                        ),
                        format!(
                            "pod->pod median RTT <= 1.1x limit: {rtt_lim:.3}x, {}",
                            check(rtt_lim <= 1.1)
                        ),
                        format!(
                            "ADD p50 <= 0.5x reference: {add_ref:.3}x, {}",
                            check(add_ref <= 0.5)
                        ),
                        format!(
                            "pod->pod median RTT <= 1.05x limit (issue 18, veth pods): {rtt_lim:.3}x, {}",
                            check(rtt_lim <= 1.05)
                        ),
                        format!(
                            "pod->pod new connections/s >= 0.95x limit: {conns_lim:.3}x, {}",
                            check(conns_lim >= 0.95)
                        ),
                        format!(
                            "pod->pod UDP 64 B >= 0.95x limit: {udp_lim:.3}x, {}",
                            check(udp_lim >= 0.95)
                        ),
                    ]);
                    if self.values.iter().any(|(_, s, _)| *s == SLUICE_NETKIT) {
                        let nk = |f| v(f, SLUICE_NETKIT) / v(f, LIMIT);
                        let (rtt, conns, udp) = (
                            nk(Figure::PodPodRttP50),
                            nk(Figure::PodPodConnsPerSec),
                            nk(Figure::PodPodUdpKpps),
                        );
                        out.extend([
                            format!(
                                "netkit pod->pod median RTT <= 1.05x limit (issue 18): {rtt:.3}x, {}",
                                check(rtt <= 1.05)
                            ),
                            format!(
                                "netkit pod->pod new connections/s >= 0.95x limit: {conns:.3}x, {}",
                                check(conns >= 0.95)
                            ),
                            format!(
                                "netkit pod->pod UDP 64 B >= 0.95x limit: {udp:.3}x, {}",
                                check(udp >= 0.95)
                            ),
                        ]);
                    }
                }
                BenchTable::Masquerade | BenchTable::Masquerade6 => {
                    let &[(_, sluice, reference)] = t.ratios else {
                        continue;
                    };
                    let what = if t.which == BenchTable::Masquerade6 {
                        "IPv6 masqueraded"
                    } else {
                        "masqueraded"
                    };
                    let masq = |f| v(f, sluice) / v(f, reference);
                    let (masq_tput, masq_conns) =
                        (masq(Figure::MasqGbps), masq(Figure::MasqConnsPerSec));
                    out.extend([
                        format!(
                            "{what} throughput >= 1.0x reference (bridge ipMasq): {masq_tput:.3}x, {}",
                            check(masq_tput >= 1.0)
                        ),
                        format!(
                            "{what} new connections/s >= 1.2x reference (bridge ipMasq): {masq_conns:.3}x, {}",
                            check(masq_conns >= 1.2)
                        ),
                    ]);
                    if t.which == BenchTable::Masquerade {
                        out.push(self.masq_conns_issue_18(masq_conns, reference));
                    }
                    out.push(self.masq_flood_target(what, sluice, reference));
                }
                // The issue asks for the figures beside the reference's, with
                // no target ratio.
                // Services and NetworkPolicy: their own sections print theirs.
                BenchTable::Clusterip | BenchTable::Services | BenchTable::Policy => {}
                BenchTable::Hostport => out.extend(self.hostport_targets()),
                BenchTable::Bandwidth => out.extend(self.bandwidth_targets()),
                BenchTable::Filling => out.extend(self.filling_targets()),
            }
        }
        out
    }

    /// Issue 18's masquerade target, and, when the routing table ran too, how
    /// 1.5x the reference compares with a bare veth pair's connection rate: a
    /// masqueraded connection crosses two veth pairs (pod -> node -> external
    /// host), forwarding and NAT, so it cannot be faster than one bare pair.
    fn masq_conns_issue_18(&self, ratio: f64, reference: usize) -> String {
        let verdict = if ratio >= 1.5 { "met" } else { "NOT met" };
        let mut line = format!(
            "masqueraded new connections/s >= 1.5x reference (issue 18): {ratio:.3}x, {verdict}"
        );
        let wanted = self
            .value(Figure::MasqConnsPerSec, reference)
            .map(|r| 1.5 * r);
        if let (Some(wanted), Some(bare)) = (wanted, self.value(Figure::PodPodConnsPerSec, LIMIT)) {
            let _ = write!(
                line,
                " (1.5x the reference is {wanted:.0}/s; a bare veth pair, one hop, made {bare:.0}/s in this run)"
            );
        }
        line
    }

    /// Issue 49: a well-behaved pod's new connections while another pod
    /// floods new flows, against its rate without the flood (>= 0.9x), with
    /// the reference's (conntrack) beside it.
    fn masq_flood_target(&self, what: &str, sluice: usize, reference: usize) -> String {
        let pressure = self
            .masq_pressure
            .iter()
            .find(|(i, _)| *i == sluice)
            .map_or(String::new(), |(_, p)| format!("; Sluice's table: {p}"));
        let kept = |i| {
            Some(
                self.value(Figure::MasqConnsPerSecFlood, i)?
                    / self.value(Figure::MasqConnsPerSec, i)?,
            )
        };
        let line = match (kept(sluice), kept(reference)) {
            (Some(s), Some(r)) => {
                format!(
                "{what} new connections/s during a flood >= 0.9x without (issue 49): {s:.3}x, {} \
                 (the reference keeps {r:.3}x; flooded sluice/reference {:.3}x)",
                if s >= 0.9 { "met" } else { "NOT met" },
                self.value(Figure::MasqConnsPerSecFlood, sluice).unwrap_or(0.0)
                    / self.value(Figure::MasqConnsPerSecFlood, reference).unwrap_or(f64::NAN)
            )
            }
            _ => format!("{what} new connections/s during a flood (issue 49): not measured"),
        };
        line + &pressure
    }

    /// Issue 5: Sluice's latency and ADD time do not grow with the number of
    /// mappings; the reference's growth alongside.
    fn hostport_targets(&self) -> Vec<String> {
        let check = |c: Option<f64>, limit: f64| match c {
            Some(c) if c <= limit => "met",
            _ => "NOT met",
        };
        let pct = |c: Option<f64>| c.map_or_else(|| "-".into(), |c| format!("{c:+.1}%"));
        let (first, last) = (
            thousands(HP_SIZES[0]),
            thousands(HP_SIZES[HP_SIZES.len() - 1]),
        );
        let rtt = self.change(Figure::HpRttP50, SLUICE_HP);
        let add = self.change(Figure::HpAddP50, SLUICE_HP);
        let ms = |base, i| {
            self.value(Figure::HpAddP50, hp(base, i))
                .map_or_else(|| "-".into(), |v| format!("{v:.1} ms"))
        };
        vec![
            format!(
                "hostPort RTT median flat, {first} -> {last} mappings (change <= +5%): {}, {}",
                pct(rtt),
                check(rtt, 5.0)
            ),
            format!(
                "hostPort ADD p50 flat, {first} -> {last} mappings (change <= +10%, see method): {} \
                 ({} -> {}), {}",
                pct(add),
                ms(SLUICE_HP, 0),
                ms(SLUICE_HP, HP_SIZES.len() - 1),
                check(add, 10.0)
            ),
            format!(
                "reference (bridge+portmap), {first} -> {last} mappings, for comparison: RTT median {}, \
                 RTT p99 {}, throughput {}, ADD p50 {} ({} -> {})",
                pct(self.change(Figure::HpRttP50, REFERENCE_HP)),
                pct(self.change(Figure::HpRttP99, REFERENCE_HP)),
                pct(self.change(Figure::HpGbps, REFERENCE_HP)),
                pct(self.change(Figure::HpAddP50, REFERENCE_HP)),
                ms(REFERENCE_HP, 0),
                ms(REFERENCE_HP, HP_SIZES.len() - 1),
            ),
        ]
    }

    /// Issues 6 and 16: one TCP stream through a Sluice limit receives the
    /// limit within ±10%, at every limit, burst and direction; the reference
    /// alongside.
    fn bandwidth_targets(&self) -> Vec<String> {
        let ratios = |setup: usize| -> (Vec<String>, usize, usize) {
            let (mut parts, mut ok, mut all) = (Vec::new(), 0, 0);
            for (rate, limit) in BW_RATES.iter().enumerate() {
                for (burst, ms) in BW_BURSTS_MS.iter().enumerate() {
                    for ingress in [false, true] {
                        all += 1;
                        let dir = if ingress { "in" } else { "eg" };
                        let what = format!("{}/{ms}ms/{dir}", rate_text(*limit));
                        match self.value(Figure::BwTcpMbps((rate, burst, ingress)), setup) {
                            Some(v) => {
                                let r = v * 1e6 / *limit as f64;
                                if (0.9..=1.1).contains(&r) {
                                    ok += 1;
                                }
                                parts.push(format!("{what} {r:.3}"));
                            }
                            None => parts.push(format!("{what} -")),
                        }
                    }
                }
            }
            (parts, ok, all)
        };
        let (sl, sl_ok, all) = ratios(SLUICE_BW);
        let (rf, rf_ok, _) = ratios(REFERENCE_BW);
        // Retransmissions summed over every limit and burst, per direction.
        let retransmits = |setup: usize, ingress: bool| -> f64 {
            (0..BW_RATES.len())
                .flat_map(|rate| (0..BW_BURSTS_MS.len()).map(move |burst| (rate, burst)))
                .filter_map(|(rate, burst)| {
                    self.value(Figure::BwTcpRetransmits((rate, burst, ingress)), setup)
                })
                .sum()
        };
        let sums = |ingress: bool| {
            format!(
                "{}: Sluice {:.0}, reference {:.0}",
                if ingress { "ingress" } else { "egress" },
                retransmits(SLUICE_BW, ingress),
                retransmits(REFERENCE_BW, ingress)
            )
        };
        vec![
            format!(
                "bandwidth: TCP retransmissions, summed over every limit and burst (Sluice's egress: {}): {}; {}",
                self.sluice_egress.as_deref().unwrap_or("not measured"),
                sums(false),
                sums(true)
            ),
            format!(
                "bandwidth: Sluice one TCP stream within ±10% of the limit (received/limit 0.9-1.1) at \
                 every limit, burst and direction: {}; {sl_ok} of {all} within, {}",
                sl.join(", "),
                if sl_ok == all { "met" } else { "NOT met" }
            ),
            format!(
                "reference (bridge+bandwidth, tbf) for comparison: {}; {rf_ok} of {all} within ±10%",
                rf.join(", ")
            ),
        ]
    }

    /// The method text of the tables that ran, from the template
    /// `bench/method.md` (one paragraph each).
    fn method(&self, args: &BenchArgs) -> Vec<String> {
        let mut names = vec!["all"];
        for t in self.tables() {
            let sections: &[&str] = match t.which {
                BenchTable::Routing => &["routing"],
                BenchTable::Masquerade => &["masquerade"],
                // What both masquerade tables share, once.
                BenchTable::Masquerade6 => &["masquerade", "masquerade6"],
                BenchTable::Clusterip => &["clusterip"],
                BenchTable::Hostport => &["hostport"],
                BenchTable::Bandwidth => &["bandwidth"],
                BenchTable::Filling => &["filling"],
                // Their own sections (`services.rs`, `policy.rs`), not
                // `TABLES`.
                BenchTable::Services | BenchTable::Policy => &[],
            };
            for s in sections {
                if !names.contains(s) {
                    names.push(s);
                }
            }
        }
        let vars = method_vars(args, self.sluice_egress.as_deref());
        names
            .into_iter()
            .filter_map(|n| method_section(n))
            .map(|text| fill(text, &vars))
            .collect()
    }

    pub(super) fn render(&self, args: &BenchArgs) -> String {
        let mut out = String::new();
        for t in self.tables() {
            let rows = self.rows(t);
            let header = self.header(t);
            let mut widths: Vec<usize> = header.iter().map(String::len).collect();
            for r in &rows {
                for (w, c) in widths.iter_mut().zip(r) {
                    *w = (*w).max(c.len());
                }
            }
            let line = |cells: &[String]| {
                cells
                    .iter()
                    .zip(&widths)
                    .map(|(c, w)| format!("{c:<w$}"))
                    .collect::<Vec<_>>()
                    .join("  ")
                    .trim_end()
                    .to_string()
            };
            let _ = writeln!(out, "\n{}:\n{}", t.title, line(&header));
            for r in &rows {
                let _ = writeln!(out, "{}", line(r));
            }
        }
        if !self.services.is_empty() {
            out.push_str(&self.services.text());
        }
        if !self.policy.is_empty() {
            out.push_str(&self.policy.text());
        }
        let _ = writeln!(out, "\ntargets:");
        for t in self.targets() {
            let _ = writeln!(out, "  {t}");
        }
        let _ = writeln!(out, "\nmethod:");
        for p in self.method(args) {
            let _ = writeln!(out, "  {p}");
        }
        out
    }

    pub(super) fn markdown(&self, args: &BenchArgs) -> String {
        let mut md = String::from("# Benchmarks\n\nGenerated by `cargo xtask bench");
        let _ = write!(
            md,
            " --rounds {} --seconds {} --pods {}` (as root). ",
            args.rounds, args.seconds, args.pods
        );
        md.push_str(
            "Sluice, the reference plugins and the limit (a bare veth pair between two namespaces) \
             run on the same namespace testbed in one run. Absolute numbers drift by 30% or more \
             between runs on these VMs; compare the ratios.\n\n",
        );
        md.push_str(&self.markdown_results("##"));
        md.push_str(&self.markdown_method(args, "##"));
        md.push('\n');
        md.push_str(HISTORY);
        md
    }

    /// The machine, the tables and the targets, sections at heading `level`.
    pub(super) fn markdown_results(&self, level: &str) -> String {
        let mut md = format!("Machine: {}\n\n", machine());
        for t in self.tables() {
            let header = self.header(t);
            let _ = writeln!(md, "{level} {}\n", t.title);
            let _ = writeln!(md, "| {} |", header.join(" | "));
            let _ = writeln!(md, "|{}", " --- |".repeat(header.len()));
            for r in self.rows(t) {
                let _ = writeln!(md, "| {} |", r.join(" | "));
            }
            md.push('\n');
        }
        if !self.services.is_empty() {
            md.push_str(&self.services.markdown(level));
        }
        if !self.policy.is_empty() {
            md.push_str(&self.policy.markdown(level));
        }
        let _ = writeln!(
            md,
            "{level} Targets (issues: routing datapath, masquerade, IPv6 masquerade, hostPort, bandwidth)\n"
        );
        for t in self.targets() {
            let _ = writeln!(md, "- {t}");
        }
        md
    }

    /// The method and what the packets go through, sections at heading `level`.
    pub(super) fn markdown_method(&self, args: &BenchArgs, level: &str) -> String {
        let mut md = format!("\n{level} Method\n");
        for p in self.method(args) {
            let _ = writeln!(md, "\n{p}");
        }
        md.push_str(&PATHS.replace("\n## ", &format!("\n{level} ")));
        md
    }
}

/// `a / b` as "1.23x", or "-" without both.
fn ratio_text(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b != 0.0 => format!("{:.2}x", a / b),
        _ => "-".into(),
    }
}

/// 10000 -> "10,000".
pub(super) fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `10_000_000` -> "10 Mbit/s", `1_000_000_000` -> "1 Gbit/s".
fn rate_text(bps: u64) -> String {
    if bps >= 1_000_000_000 && bps.is_multiple_of(1_000_000_000) {
        format!("{} Gbit/s", bps / 1_000_000_000)
    } else {
        format!("{} Mbit/s", bps as f64 / 1e6)
    }
}

/// A bandwidth figure's label (the direction is in the row's limit column).
fn with_direction(f: Figure) -> String {
    format!(
        "{}{}",
        f.label(),
        if f.higher_is_better() {
            ""
        } else {
            " [lower is better]"
        }
    )
}

/// The method text: `[name]` sections (`all`, then one per table) of one
/// paragraph each, with `{placeholders}` for the run's parameters.
const METHOD: &str = include_str!("method.md");
/// What earlier measurements found (the end of docs/benchmarks.md, kept
/// across runs).
const HISTORY: &str = include_str!("history.md");

/// The paragraph of section `name` of [`METHOD`].
fn method_section(name: &str) -> Option<&'static str> {
    let start = METHOD.find(&format!("[{name}]\n"))? + name.len() + 3;
    let rest = &METHOD[start..];
    Some(rest[..rest.find("\n[").unwrap_or(rest.len())].trim())
}

/// The values of [`METHOD`]'s placeholders for this run.
fn method_vars(args: &BenchArgs, sluice_egress: Option<&str>) -> Vec<(&'static str, String)> {
    vec![
        (
            "sluice_egress",
            sluice_egress.unwrap_or("not measured").to_string(),
        ),
        ("rounds", args.rounds.to_string()),
        ("seconds", args.seconds.to_string()),
        ("pods", args.pods.to_string()),
        ("cpu", CPU.to_string()),
        ("warmup", super::connloop::WARMUP.to_string()),
        ("sizes", HP_SIZES.map(thousands).join(", ")),
        ("hp", super::topology::HP_HOST_PORT.to_string()),
        ("cp", super::topology::HP_CONTAINER_PORT.to_string()),
        ("cni", super::hostport::CNI_MAPPINGS.to_string()),
        ("pods_sl", HP_TIMED_PODS_SLUICE.to_string()),
        ("pods_ref", HP_TIMED_PODS_REFERENCE.to_string()),
        ("rates", BW_RATES.map(rate_text).join(", ")),
        ("bursts", BW_BURSTS_MS.map(|b| b.to_string()).join(", ")),
        ("bw_secs", super::BW_SECS.to_string()),
        ("udp_len", UDP_LEN.to_string()),
        ("udp", rate_text(BW_RATES[BW_UDP_RATE])),
        ("cpu_rate", rate_text(BW_RATES[BW_CPU_RATE])),
        ("fill_pods", thousands(FILL_PODS)),
        ("fill_at", FILL_AT.map(thousands).join(", ")),
        ("fill_window", FILL_WINDOW.to_string()),
        ("fill_rounds", FILL_ROUNDS.to_string()),
        ("settle", FILL_SETTLE_SECS.to_string()),
        ("service_cidr", super::topology::SERVICE_CIDR.to_string()),
        ("cluster_ip", super::topology::CLUSTER_IP.to_string()),
        ("sockperf_port", super::measure::SOCKPERF_PORT.to_string()),
        ("conn_port", super::measure::CONN_LOOP_PORT.to_string()),
    ]
}

/// `text` with every `{name}` of `vars` replaced by its value.
fn fill(text: &str, vars: &[(&str, String)]) -> String {
    vars.iter().fold(text.to_string(), |t, (k, v)| {
        t.replace(&format!("{{{k}}}"), v)
    })
}

const PATHS: &str = "
## What the packets go through

- **bare veth**: one veth pair between two namespaces; no node in between. The limit.
- **bridge+host-local**: pod veth -> Linux bridge -> the node's IP stack (routing,
  netfilter hooks) -> bridge -> pod veth; to the outside through the node's stack and
  the uplink veth.
- **sluice** (defaults: cls_bpf on pod veths, no XDP on a veth uplink): pod -> pod:
  `from_pod` on the sender's host veth redirects with `bpf_redirect_peer` straight
  into the receiver; the node's IP stack never sees the packet. pod -> external:
  `from_pod` looks up the FIB and `bpf_redirect`s to the uplink's egress. external ->
  pod: `uplink_in` on the uplink's ingress redirects with `bpf_redirect_peer` into
  the pod.
- **bridge ipMasq**: as bridge+host-local, plus the bridge plugin's iptables chain
  (`MASQUERADE` for everything outside the pod subnet; for the IPv6 range the same
  chain in ip6tables) in the node namespace: nf_conntrack tracks every flow and
  nf_nat rewrites it on the way out and back.
- **sluice ipMasq**: as sluice, plus `uplink_out` on the uplink's tc egress, which
  tracks the flow in Sluice's NAT maps and rewrites source address and port;
  `uplink_in` translates the replies back and redirects them into the pod. The
  node's netfilter never sees these packets. IPv6 (the IPv6 masquerade table):
  the same in `sl_nat6_fwd` and `sl_nat6_rev`, keyed by IPv6 addresses, the
  address change going into the L4 checksum's pseudo header (IPv6 has no header
  checksum).
- **bridge+kube-proxy** (ClusterIP table): the pod's packet to the ClusterIP goes
  up the bridge to the node's IP stack (the pods' gateway), where the first packet
  of a connection walks kube-proxy's nat chains (`KUBE-SERVICES` -> `KUBE-SVC-*` ->
  `KUBE-SEP-*`) to its DNAT and nf_conntrack translates the rest; routed back down
  the bridge into the endpoint pod. The endpoint's replies are bridged straight to
  the client pod, and br_netfilter passes them through the netfilter hooks, where
  nf_conntrack translates their source back to the ClusterIP.
- **sluice+kube-proxy** (ClusterIP table): `from_pod` finds the destination in the
  Service ranges (`sl_svc`) and hands the packet to the node's IP stack instead of
  redirecting it: the same chains and DNAT as above, then the stack routes it to
  the endpoint's host veth, where `to_pod` remembers the flow in `sl_kflows`. The
  endpoint's replies are found there by `from_pod` and go to the stack too, whose
  nf_conntrack translates them back and routes them to the client's host veth.
  Every packet of the connection, both ways, takes the stack's path.
- **bridge+portmap** (port mapping table): the external host's packets to node
  address:hostPort pass the node's nat PREROUTING, where the first packet of a
  connection walks `CNI-HOSTPORT-DNAT` (one multiport rule per 15 mappings) and the
  container's `CNI-DN-*` chain to its DNAT rule; nf_conntrack then translates the
  rest of the connection without the rules, both ways. Then routing, the bridge and
  the pod's veth.
- **sluice** (port mapping table): `uplink_in` looks the destination up in
  `sl_ports` (a hash map: one lookup whatever the number of mappings), records the
  flow in `sl_hp_ct`, rewrites the destination and delivers into the pod; the pod's
  replies are translated back by `from_pod` on its host veth and sent out of the
  uplink. No netfilter on the way.
- **bridge+bandwidth** (bandwidth table): as bridge+host-local, plus the reference
  `bandwidth` plugin's qdiscs: traffic into the pod waits in a tbf qdisc on its host
  veth; traffic from the pod is redirected from the host veth's ingress qdisc to an
  ifb device and waits in a tbf qdisc there (a shaper: packets queue up to
  25 ms of rate beyond the burst, then drop).
- **sluice** (bandwidth table): as sluice, plus a token bucket per pod and direction
  in `sl_bw`, checked at every delivery into the pod (ingress) and, on kernels
  without `sch_fq`, by `from_pod` (egress): a packet without enough tokens is dropped
  (a policer, no queue). With `sch_fq` (the method says which this run had), egress
  is EDT: `pod_edt` on the pod's own `eth0` stamps each packet's departure time from
  the pod's clock in `sl_edt`, and an `fq` qdisc there holds it until then.

## Reading the targets

One TCP stream through the reference bridge already runs within a few percent of the
bare veth: big GSO segments (64 KiB) hide the per-packet cost of the bridge and the
node's stack. A target of 1.1x the reference therefore asks for more than the limit
on this figure, and the ratio to the reference sits at the reference's own distance
from the limit. The per-packet cost that Sluice removes shows in the round trips and
the 64-byte UDP rate. Both ends of every figure run on one CPU, so a throughput
figure also includes the sender's and receiver's own work.

In the bandwidth table a ratio to the limit a little above 1.0 is what a correct
limit gives: the bucket starts full, so the first 300 ms of burst come on top of
4 s of rate (+7.5%), and iperf3 counts payload while the limits count frames
(-4.4% for a full-size TCP segment, -2.9% for a 1400-byte datagram). The tbf of the
reference counts a GSO packet as the frames it becomes on the wire; Sluice's
policer counts its `skb->len`, the headers once, so where GSO packets are big
(1 Gbit/s) it passes a few percent more wire bytes than the reference for the same
limit.
";

pub(super) fn machine() -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map_or("unknown CPU", str::trim)
        .to_string();
    format!("Linux {}, {cpus} vCPUs ({model})", kernel.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_method_template_has_every_section_and_no_unfilled_placeholder() {
        let args = BenchArgs {
            rounds: 3,
            seconds: 3,
            pods: 50,
            only: None,
            prebuilt: false,
            markdown_parts: None,
        };
        for name in [
            "all",
            "routing",
            "masquerade",
            "masquerade6",
            "clusterip",
            "hostport",
            "bandwidth",
        ] {
            let text = method_section(name).unwrap_or_else(|| panic!("no [{name}] section"));
            let filled = fill(text, &method_vars(&args, Some("EDT")));
            assert!(
                !filled.contains('{') && !filled.contains('['),
                "{name}: {filled}"
            );
            assert!(filled.len() > 80, "{name}: {filled}");
        }
        assert!(method_section("nosuch").is_none());
    }

    fn args(only: Option<BenchTable>) -> BenchArgs {
        BenchArgs {
            rounds: 1,
            seconds: 3,
            pods: 50,
            only,
            prebuilt: false,
            markdown_parts: None,
        }
    }

    /// A report with the masquerade figures of `reference` and `sluice`:
    /// throughput, RTT median and p99, connections/s.
    fn with_masq(r: &mut Report, (reference, sluice): (usize, usize), v: [[f64; 5]; 2]) {
        for (setup, values) in [reference, sluice].into_iter().zip(v) {
            for (f, x) in MASQ_FIGURES.iter().zip(values) {
                r.add(*f, setup, x);
            }
        }
    }

    #[test]
    fn every_table_once_with_known_setups_and_a_method() {
        use clap::ValueEnum;
        for which in BenchTable::value_variants() {
            // Their own rows and method (`services.rs`, `policy.rs`), not
            // `TABLES`.
            if matches!(*which, BenchTable::Services | BenchTable::Policy) {
                continue;
            }
            let t: Vec<&Table> = TABLES.iter().filter(|t| t.which == *which).collect();
            assert_eq!(t.len(), 1, "{which:?}");
            for s in t[0].columns {
                assert!(*s < NAMES.len(), "{which:?}: setup {s}");
            }
            let r = Report::new(Some(*which));
            assert!(r.method(&args(Some(*which))).len() >= 2, "{which:?}");
        }
        let mut setups = vec![
            LIMIT,
            REFERENCE,
            SLUICE,
            REFERENCE_MASQ,
            SLUICE_MASQ,
            REFERENCE_MASQ6,
            SLUICE_MASQ6,
            REFERENCE_BW,
            SLUICE_BW,
            SLUICE_NETKIT,
            REFERENCE_CI,
            SLUICE_CI,
        ];
        for i in 0..HP_SIZES.len() {
            setups.extend([hp(REFERENCE_HP, i), hp(SLUICE_HP, i)]);
        }
        for i in 0..FILL_AT.len() {
            setups.extend([
                filling(REFERENCE_FILL, i),
                filling(SLUICE_FILL, i),
                filling(KERNEL_FILL, i),
            ]);
        }
        let n = setups.len();
        setups.sort_unstable();
        setups.dedup();
        assert_eq!(setups.len(), n, "two setups share an index");
        assert_eq!(n, NAMES.len());
    }

    #[test]
    fn the_netkit_column_shows_only_where_the_run_measured_it() {
        let figures = [
            Figure::PodPodRttP50,
            Figure::PodPodConnsPerSec,
            Figure::PodPodUdpKpps,
        ];
        let mut r = Report::new(Some(BenchTable::Routing));
        for (setup, x) in [(LIMIT, 10.0), (REFERENCE, 14.0), (SLUICE, 11.0)] {
            for f in figures {
                r.add(f, setup, x);
            }
        }
        let out = r.render(&args(Some(BenchTable::Routing)));
        // (The method text names the setup either way.)
        for absent in ["sluice netkit ", "netkit/limit", "netkit pod->pod"] {
            assert!(!out.contains(absent), "{absent}: {out}");
        }
        for f in figures {
            r.add(f, SLUICE_NETKIT, 10.2);
        }
        let out = r.render(&args(Some(BenchTable::Routing)));
        assert!(out.contains("sluice netkit"), "{out}");
        assert!(out.contains("netkit/limit"), "{out}");
        // RTT 10.2 / 10 = 1.02x the limit: met; conns and UDP 1.02x: met.
        assert!(
            out.contains("netkit pod->pod median RTT <= 1.05x limit (issue 18): 1.020x, met"),
            "{out}"
        );
        assert!(
            out.contains("netkit pod->pod new connections/s >= 0.95x limit: 1.020x, met"),
            "{out}"
        );
    }

    #[test]
    fn the_masquerade_connection_target_of_issue_18_names_the_one_hop_rate() {
        let mut r = Report::new(Some(BenchTable::Masquerade));
        with_masq(
            &mut r,
            (REFERENCE_MASQ, SLUICE_MASQ),
            [
                [10.0, 20.0, 40.0, 10_000.0, 10_000.0],
                [11.0, 15.0, 30.0, 12_500.0, 12_500.0],
            ],
        );
        let line = "masqueraded new connections/s >= 1.5x reference (issue 18): 1.250x, NOT met";
        let out = r.render(&args(Some(BenchTable::Masquerade)));
        assert!(out.contains(&format!("{line}\n")), "{out}");
        r.add(Figure::PodPodConnsPerSec, LIMIT, 14_000.0);
        let out = r.render(&args(Some(BenchTable::Masquerade)));
        assert!(
            out.contains(&format!(
                "{line} (1.5x the reference is 15000/s; a bare veth pair, one hop, made 14000/s in this run)"
            )),
            "{out}"
        );
    }

    #[test]
    fn the_ipv6_masquerade_table_shows_its_own_setups_ratios_and_targets() {
        let mut r = Report::new(Some(BenchTable::Masquerade6));
        // IPv4 figures that must not show in the IPv6 table.
        with_masq(&mut r, (REFERENCE_MASQ, SLUICE_MASQ), [[1.0; 5], [9.0; 5]]);
        with_masq(
            &mut r,
            (REFERENCE_MASQ6, SLUICE_MASQ6),
            [
                [10.0, 20.0, 40.0, 1000.0, 900.0],
                [11.0, 15.0, 30.0, 1300.0, 1235.0],
            ],
        );
        let out = r.render(&args(Some(BenchTable::Masquerade6)));
        assert!(out.contains("IPv6 masquerade (dual-stack pod"), "{out}");
        assert!(!out.contains("\nMasquerade ("), "{out}");
        let row = |label: &str| {
            out.lines()
                .find(|l| l.starts_with(label))
                .unwrap_or_else(|| panic!("no {label} row: {out}"))
                .split_whitespace()
                .rev()
                .take(3)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            row("masqueraded TCP throughput"),
            ["1.10x", "11.00", "10.00"]
        );
        assert_eq!(
            row("masqueraded TCP RTT median"),
            ["0.75x", "15.00", "20.00"]
        );
        assert_eq!(row("masqueraded TCP RTT p99"), ["0.75x", "30.00", "40.00"]);
        assert_eq!(
            row("masqueraded new TCP connections"),
            ["1.30x", "1300.00", "1000.00"]
        );
        let targets = r.targets();
        assert_eq!(
            targets,
            [
                "IPv6 masqueraded throughput >= 1.0x reference (bridge ipMasq): 1.100x, met",
                "IPv6 masqueraded new connections/s >= 1.2x reference (bridge ipMasq): 1.300x, met",
                "IPv6 masqueraded new connections/s during a flood >= 0.9x without (issue 49): \
                 0.950x, met (the reference keeps 0.900x; flooded sluice/reference 1.372x)",
            ]
        );
        // Both masquerade paragraphs, the shared one once.
        let method = r.method(&args(Some(BenchTable::Masquerade6)));
        assert_eq!(method.len(), 3, "{method:#?}");
        assert!(method[1].starts_with("Masquerade:"), "{}", method[1]);
        assert!(method[2].starts_with("IPv6 masquerade:"), "{}", method[2]);
    }

    #[test]
    fn the_clusterip_table_shows_its_setups_figures_and_ratio() {
        let mut r = Report::new(Some(BenchTable::Clusterip));
        // Figures of other tables that must not show in this one.
        with_masq(&mut r, (REFERENCE_MASQ, SLUICE_MASQ), [[1.0; 5], [9.0; 5]]);
        r.add(Figure::PodPodRttP50, SLUICE, 7.0);
        // Two rounds: RTT median, p99 and connections/s of each setup.
        for (setup, rounds) in [
            (
                REFERENCE_CI,
                [[20.0, 40.0, 10_000.0], [22.0, 44.0, 9_000.0]],
            ),
            (SLUICE_CI, [[18.0, 30.0, 12_000.0], [16.0, 34.0, 11_000.0]]),
        ] {
            for values in rounds {
                let figures = [Figure::CiRttP50, Figure::CiRttP99, Figure::CiConnsPerSec];
                for (f, x) in figures.into_iter().zip(values) {
                    r.add(f, setup, x);
                }
            }
        }
        let out = r.render(&args(Some(BenchTable::Clusterip)));
        assert!(
            out.contains("\nClusterIP through kube-proxy (iptables mode):\n"),
            "{out}"
        );
        assert!(!out.contains("Masquerade ("), "{out}");
        let header = out
            .lines()
            .find(|l| l.starts_with("figure"))
            .unwrap_or_else(|| panic!("no header: {out}"));
        assert_eq!(
            header
                .split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .collect::<Vec<_>>(),
            [
                "figure",
                "bridge+kube-proxy",
                "sluice+kube-proxy",
                "sluice/reference"
            ]
        );
        // A row's cells (padded with two spaces or more; cells have single ones).
        let row = |label: &str| {
            out.lines()
                .find(|l| l.starts_with(label))
                .unwrap_or_else(|| panic!("no {label} row: {out}"))
                .split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        // Medians of two rounds: the upper one (as every figure's).
        assert_eq!(
            row("pod->ClusterIP TCP RTT median"),
            [
                "pod->ClusterIP TCP RTT median (us) [lower is better]",
                "22.00 (20.0-22.0)",
                "18.00 (16.0-18.0)",
                "0.82x"
            ]
        );
        assert_eq!(
            row("pod->ClusterIP TCP RTT p99"),
            [
                "pod->ClusterIP TCP RTT p99 (us) [lower is better]",
                "44.00 (40.0-44.0)",
                "34.00 (30.0-34.0)",
                "0.77x"
            ]
        );
        assert_eq!(
            row("pod->ClusterIP new TCP"),
            [
                "pod->ClusterIP new TCP connections per second",
                "10000.00 (9000.0-10000.0)",
                "12000.00 (11000.0-12000.0)",
                "1.20x"
            ]
        );
        // No target of its own; the method has its paragraph, filled.
        assert!(r.targets().is_empty(), "{:?}", r.targets());
        let method = r.method(&args(Some(BenchTable::Clusterip)));
        assert_eq!(method.len(), 2, "{method:#?}");
        assert!(method[1].starts_with("ClusterIP:"), "{}", method[1]);
        for want in [
            "10.96.0.10",
            "10.96.0.0/16",
            "11311",
            "5302",
            "iptables-restore",
        ] {
            assert!(method[1].contains(want), "{want}: {}", method[1]);
        }
        let md = r.markdown_results("##");
        assert!(
            md.contains(
                "| pod->ClusterIP new TCP connections per second | 10000.00 (9000.0-10000.0) | \
                 12000.00 (11000.0-12000.0) | 1.20x |"
            ),
            "{md}"
        );
    }

    #[test]
    fn the_filling_table_shows_each_size_the_growth_and_judges_it() {
        let mut r = Report::new(Some(BenchTable::Filling));
        // ADD p50 by node size: the reference 10, 20, 40 ms; Sluice 5, 5.5, 6 ms.
        for (i, (rf, sl)) in [(10.0, 5.0), (20.0, 5.5), (40.0, 6.0)]
            .into_iter()
            .enumerate()
        {
            for hostport in [false, true] {
                r.add(
                    Figure::FillAddP50 { hostport },
                    filling(REFERENCE_FILL, i),
                    rf,
                );
                r.add(Figure::FillAddP50 { hostport }, filling(SLUICE_FILL, i), sl);
                r.add(
                    Figure::FillDelP50 { hostport },
                    filling(REFERENCE_FILL, i),
                    4.0 * rf,
                );
                r.add(
                    Figure::FillDelP50 { hostport },
                    filling(SLUICE_FILL, i),
                    25.0,
                );
                // The kernel's pair: 3, 3.5, 4 ms to make; 24 ms to remove.
                let k = 3.0 + 0.5 * i as f64;
                r.add(Figure::FillAddP50 { hostport }, filling(KERNEL_FILL, i), k);
                r.add(
                    Figure::FillDelP50 { hostport },
                    filling(KERNEL_FILL, i),
                    24.0,
                );
            }
        }
        let t = TABLES
            .iter()
            .find(|t| t.which == BenchTable::Filling)
            .unwrap();
        let rows = r.rows(t);
        assert_eq!(rows.len(), 4 * (FILL_AT.len() + 1));
        assert_eq!(
            rows[2],
            [
                "ADD p50, pods without mappings (ms) [lower is better]",
                "1,000",
                "40.00",
                "6.00",
                "4.00",
                "0.15x",
                "1.50x"
            ]
        );
        assert_eq!(rows[3][1..5], ["1,000 / 20", "4.00x", "1.20x", "1.33x"]);
        let targets = r.targets();
        assert_eq!(
            targets[0],
            "ADD p50 at 1,000 pods <= 1.2x ADD p50 at 20 (no mappings): 1.20x (5.0 ms -> 6.0 ms), \
             met; reference 4.00x (10.0 ms -> 40.0 ms)"
        );
        assert_eq!(
            targets[3],
            "DEL p50 at 1,000 pods <= 0.6x the reference's (a hostPort each): 0.16x \
             (25.0 ms vs 160.0 ms), met; the kernel's own veth pair removal 24.0 ms, Sluice 1.04x \
             of it"
        );
    }

    #[test]
    fn both_masquerade_tables_judge_their_own_figures() {
        let mut r = Report::new(None);
        with_masq(
            &mut r,
            (REFERENCE_MASQ, SLUICE_MASQ),
            [
                [10.0, 20.0, 40.0, 1000.0, 950.0],
                [9.0, 15.0, 30.0, 1250.0, 1200.0],
            ],
        );
        with_masq(
            &mut r,
            (REFERENCE_MASQ6, SLUICE_MASQ6),
            [
                [10.0, 20.0, 40.0, 1000.0, 1000.0],
                [10.0, 15.0, 30.0, 1100.0, 880.0],
            ],
        );
        r.masq_pressure
            .push((SLUICE_MASQ, "evictions: 7 to the pod's share".into()));
        let targets = r.targets();
        let masq: Vec<&String> = targets
            .iter()
            .filter(|t| t.contains("masqueraded"))
            .collect();
        assert_eq!(
            masq,
            [
                "masqueraded throughput >= 1.0x reference (bridge ipMasq): 0.900x, NOT met",
                "masqueraded new connections/s >= 1.2x reference (bridge ipMasq): 1.250x, met",
                "masqueraded new connections/s >= 1.5x reference (issue 18): 1.250x, NOT met",
                "masqueraded new connections/s during a flood >= 0.9x without (issue 49): 0.960x, \
                 met (the reference keeps 0.950x; flooded sluice/reference 1.263x); \
                 Sluice's table: evictions: 7 to the pod's share",
                "IPv6 masqueraded throughput >= 1.0x reference (bridge ipMasq): 1.000x, met",
                "IPv6 masqueraded new connections/s >= 1.2x reference (bridge ipMasq): 1.100x, NOT met",
                "IPv6 masqueraded new connections/s during a flood >= 0.9x without (issue 49): \
                 0.800x, NOT met (the reference keeps 1.000x; flooded sluice/reference 0.880x)",
            ]
        );
        let method = r.method(&args(None));
        let shared = method
            .iter()
            .filter(|p| p.starts_with("Masquerade:"))
            .count();
        assert_eq!(shared, 1, "{method:#?}");
        let md = r.markdown_results("##");
        assert!(md.contains("## IPv6 masquerade (dual-stack pod"), "{md}");
        assert!(
            md.contains("| masqueraded TCP throughput (Gbit/s) | 10.00 | 10.00 | 1.00x |"),
            "{md}"
        );
    }

    #[test]
    fn rate_texts() {
        assert_eq!(
            BW_RATES.map(rate_text),
            ["10 Mbit/s", "100 Mbit/s", "1 Gbit/s"]
        );
        assert_eq!(rate_text(2_500_000), "2.5 Mbit/s");
    }
}
