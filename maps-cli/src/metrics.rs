//! `sluicectl metrics`: the datapath's counters and gauges in the Prometheus
//! text exposition format (version 0.0.4), printed once (for `node_exporter`'s
//! textfile collector) or served on `/metrics` (`--listen`), read afresh from
//! the pinned maps at each scrape.
//!
//! Names follow Prometheus conventions (`_total` counters, base units) and,
//! where a figure is the same, Cilium's (`drop_count_total{reason,direction}`,
//! `forward_count_total`, `forward_bytes_total`, `bpf_map_pressure{map_name}`),
//! with the `sluice_` prefix, so a Cilium dashboard translates by renaming.
//! Per-pod series are bounded: at most `--max-endpoints` pod interfaces get
//! their own series (the rest are summed into the node-wide ones, which always
//! hold everything).
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use sluice_common::{maps, reason};
use sluice_maps::{
    hostport::{V4, V6},
    services::service_owner,
};

use crate::{
    args::{MetricsArgs, Target},
    counters::{self, EndpointCounters},
    signals,
    target::Datapath,
};

/// `Content-Type` of the text format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Pods with a `sluice_nat_pod_flows` series: those holding the most flows.
const NAT_TOP_PODS: usize = 10;
/// Longest a scrape's request may take to arrive.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest request head read.
const MAX_REQUEST: usize = 8 << 10;

pub(crate) fn execute(t: &Target, a: &MetricsArgs) -> Result<()> {
    let dp = Datapath::open(t)?;
    let scrape = Scrape {
        state_dir: a.state_dir.clone().or_else(|| default_state_dir(t, &dp)),
        dp,
        max_endpoints: usize::try_from(a.max_endpoints).unwrap_or(usize::MAX),
        policy_state: a.policy_state.clone(),
        service_state: a.service_state.clone(),
    };
    let Some(addr) = a.listen else {
        print!("{}", render(&scrape)?);
        return Ok(());
    };
    serve(&scrape, addr, a)
}

/// What one scrape reads.
struct Scrape {
    dp: Datapath,
    /// Per-pod series for at most this many pod interfaces.
    max_endpoints: usize,
    /// The network's attachment records (`<stateDir>/<network>`), for the
    /// `namespace` and `pod` labels.
    state_dir: Option<PathBuf>,
    /// The state file `sluice-node policy` writes: the rules' labels.
    policy_state: PathBuf,
    /// The state file `sluice-node proxy` writes: the Service ports' labels.
    service_state: PathBuf,
}

/// The plugin's default state directory of the network: `-n`'s name, or the
/// network whose default pin root is this one (see [`state_dir_of_pin`]).
fn default_state_dir(t: &Target, dp: &Datapath) -> Option<PathBuf> {
    let base = Path::new(sluice_common::DEFAULT_STATE_DIR);
    match &t.network {
        Some(network) => Some(base.join(network)),
        None => Some(state_dir_of_pin(base, dp.pin_root.file_name()?.to_str()?)),
    }
}

/// The state directory under `base` of the network whose pin directory is
/// named `pin_name`. That name is the network's own, or for a name with a
/// '.' (which bpffs refuses) a lossy form of it
/// (`sluice_common::user::pin_dir_name`), so it is the directory whose name
/// maps to it; the name itself when none does.
fn state_dir_of_pin(base: &Path, pin_name: &str) -> PathBuf {
    std::fs::read_dir(base)
        .into_iter()
        .flatten()
        .flatten()
        .find(|e| {
            e.file_name().to_str().is_some_and(|n| {
                n.contains('.') && sluice_common::user::pin_dir_name(n) == pin_name
            })
        })
        .map_or_else(|| base.join(pin_name), |e| e.path())
}

/// (container id, interface) -> (namespace, pod) of every attachment record
/// under `dir` that names its pod (`K8S_POD_*` in `CNI_ARGS`). A directory
/// that cannot be read gives none: the labels stay empty.
fn pod_names(dir: &Path) -> BTreeMap<(String, String), (String, String)> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir.join("attachments")) else {
        return out;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let Some(v) = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        else {
            continue;
        };
        let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
        if v["pod"].is_object() {
            out.insert(
                (text(&v["containerId"]), text(&v["ifname"])),
                (text(&v["pod"]["namespace"]), text(&v["pod"]["name"])),
            );
        }
    }
    out
}

/// Serves `/metrics` on `addr` until SIGINT/SIGTERM or `--duration`, one
/// request at a time (a scrape every few seconds needs no more).
fn serve(scrape: &Scrape, addr: SocketAddr, a: &MetricsArgs) -> Result<()> {
    let listener = TcpListener::bind(addr).with_context(|| format!("listen on {addr}"))?;
    listener.set_nonblocking(true)?;
    signals::install();
    eprintln!(
        "sluicectl: serving metrics on http://{}/metrics",
        listener.local_addr()?
    );
    let end = a.duration.map(|s| Instant::now() + Duration::from_secs(s));
    loop {
        if end.is_some_and(|e| Instant::now() >= e) || signals::stop_requested() {
            return Ok(());
        }
        match listener.accept() {
            Ok((stream, _)) => {
                if let Err(e) = answer(scrape, stream) {
                    eprintln!("sluicectl: a metrics request failed: {e:#}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if signals::sleep(Duration::from_millis(50)) {
                    return Ok(());
                }
            }
            Err(e) => return Err(e).context("accept a metrics connection"),
        }
    }
}

/// Reads one request and answers it: `GET /metrics` (or `/`) gets the
/// exposition, anything else 404 or 405. The connection is then closed.
fn answer(scrape: &Scrape, mut stream: TcpStream) -> Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&head);
    let (status, body, ctype) = match route(&head) {
        Route::Metrics { .. } => match render(scrape) {
            Ok(text) => ("200 OK", text, CONTENT_TYPE),
            Err(e) => (
                "500 Internal Server Error",
                format!("reading the datapath failed: {e:#}\n"),
                "text/plain",
            ),
        },
        Route::NotFound => ("404 Not Found", "try /metrics\n".into(), "text/plain"),
        Route::NotAllowed => (
            "405 Method Not Allowed",
            "only GET and HEAD\n".into(),
            "text/plain",
        ),
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if route(&head) != (Route::Metrics { head: true }) {
        out.push_str(&body);
    }
    stream.write_all(out.as_bytes())?;
    Ok(())
}

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    /// `GET` or (`head`) `HEAD` of `/metrics` or `/`.
    Metrics {
        head: bool,
    },
    NotFound,
    NotAllowed,
}

/// The route of a request from its first line (`GET /metrics?x HTTP/1.1`).
fn route(request: &str) -> Route {
    let mut parts = request
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET" | "HEAD", "/metrics" | "/") => Route::Metrics {
            head: method == "HEAD",
        },
        ("GET" | "HEAD", _) => Route::NotFound,
        _ => Route::NotAllowed,
    }
}

/// The exposition text: `# HELP` and `# TYPE` once per family, then its samples.
#[derive(Default)]
struct Exposition {
    out: String,
}

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }
}

/// A label value as the text format wants it: `\`, `"` and newlines escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Which way a drop reason's packets were going, as Cilium labels drops:
/// `egress` (sent by a pod), `ingress` (on the way to one), `unknown` (both).
fn drop_direction(name: &str) -> &'static str {
    match name {
        "drop_bw_ingress" | "drop_policy_ingress" => "ingress",
        "drop_malformed" | "drop_policy_pending" => "unknown",
        _ => "egress",
    }
}

/// A container id as `crictl ps` shows it (12 characters).
fn short_id(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

/// Every figure of the datapath, per-pod series for at most
/// `max_endpoints` pod interfaces.
fn render(scrape: &Scrape) -> Result<String> {
    let dp = &scrape.dp;
    let mut x = Exposition::default();
    let meta = sluice_maps::node::read_meta(&dp.root)?;
    let cfg = sluice_maps::node::config(&dp.root)?;
    let xdp = crate::status::xdp_mode(cfg.flags);
    x.family(
        "sluice_datapath_info",
        "gauge",
        "The loaded datapath: its object hash, map layout and uplink XDP mode (always 1).",
    );
    x.sample(
        "sluice_datapath_info",
        &[
            ("object_hash", &format!("{:016x}", meta.object_hash)),
            ("layout_version", &meta.layout_version.to_string()),
            ("xdp", xdp),
        ],
        1,
    );
    x.family(
        "sluice_datapath_loaded_timestamp_seconds",
        "gauge",
        "When the datapath's programs were loaded (Unix time).",
    );
    x.sample(
        "sluice_datapath_loaded_timestamp_seconds",
        &[],
        meta.loaded_unix,
    );

    let mut reading = counters::read_all(dp)?;
    if let Some(dir) = &scrape.state_dir {
        let pods = pod_names(dir);
        for e in &mut reading.endpoints {
            if let Some((ns, name)) = pods.get(&(e.container_id.clone(), e.ifname.clone())) {
                e.namespace.clone_from(ns);
                e.pod.clone_from(name);
            }
        }
    }
    x.family(
        "sluice_datapath_packets_total",
        "counter",
        "Packets the programs redirected, translated or passed to the kernel, by reason (sluicectl counters).",
    );
    for (name, n) in reading.node.iter().filter(|(n, _)| !n.starts_with("drop_")) {
        x.sample("sluice_datapath_packets_total", &[("reason", name)], n);
    }
    x.family(
        "sluice_drop_count_total",
        "counter",
        "Packets the programs dropped, by reason and direction (egress: sent by a pod).",
    );
    for (name, n) in reading.node.iter().filter(|(n, _)| n.starts_with("drop_")) {
        let short = name.trim_start_matches("drop_");
        x.sample(
            "sluice_drop_count_total",
            &[("reason", short), ("direction", drop_direction(name))],
            n,
        );
    }
    endpoint_families(&mut x, &reading.endpoints, scrape.max_endpoints);

    x.family(
        "sluice_nat_flows",
        "gauge",
        "Masqueraded flows in the NAT table, by address family.",
    );
    let flows = [
        (
            "ipv4",
            sluice_maps::nat::flows(&dp.root)?.len(),
            maps::NAT_FWD,
        ),
        (
            "ipv6",
            sluice_maps::nat::flows6(&dp.root)?.len(),
            maps::NAT6_FWD,
        ),
    ];
    for (family, n, _) in &flows {
        x.sample("sluice_nat_flows", &[("family", family)], n);
    }
    x.family(
        "sluice_nat_flows_max",
        "gauge",
        "Flows the NAT table holds at most (natMaxFlows), by address family.",
    );
    let mut pressure = Vec::new();
    for (family, n, spec) in &flows {
        let cap = dp.root.capacity(spec)?;
        x.sample("sluice_nat_flows_max", &[("family", family)], cap);
        pressure.push((spec.name, *n as f64 / f64::from(cap.max(1))));
    }
    // Who sweeps idle flows (README, "Masquerade"); a datapath an older sluice
    // loaded has no lease map.
    if sluice_maps::sweep::supported(&dp.root) {
        x.family(
            "sluice_nat_sweep_by_agent",
            "gauge",
            "1 while the node agent (sluice-node) holds the NAT sweep lease and the in-kernel sweeper stands back.",
        );
        x.sample(
            "sluice_nat_sweep_by_agent",
            &[],
            u8::from(sluice_maps::sweep::lease_left_ns(&dp.root)? > 0),
        );
        x.family(
            "sluice_nat_agent_expired_total",
            "counter",
            "Idle NAT flows the node agent removed (the datapath's own: sluice_datapath_packets_total{reason=\"nat_expired\"}).",
        );
        x.sample(
            "sluice_nat_agent_expired_total",
            &[],
            sluice_maps::sweep::agent_expired(&dp.root)?,
        );
        x.family(
            "sluice_node_addrs_by_agent",
            "gauge",
            "1 while the node agent (sluice-node) keeps the node addresses hostPorts answer on, and ADDs leave them alone.",
        );
        x.sample(
            "sluice_node_addrs_by_agent",
            &[],
            u8::from(sluice_maps::hostport::node_addrs_lease_left_ns(&dp.root)? > 0),
        );
    }
    nat_pressure_families(&mut x, dp, &reading, scrape.max_endpoints)?;
    service_families(&mut x, dp, &mut pressure)?;
    lb_families(&mut x, dp, &scrape.service_state, &mut pressure)?;
    x.family(
        "sluice_bpf_map_pressure",
        "gauge",
        "Fill of a bounded map: entries in use over its capacity (0 to 1).",
    );
    for (map, p) in pressure {
        x.sample("sluice_bpf_map_pressure", &[("map_name", map)], p);
    }

    x.family(
        "sluice_hostport_mappings",
        "gauge",
        "hostPort mappings (from pods' portMappings and sluicectl ports add), by address family.",
    );
    x.sample(
        "sluice_hostport_mappings",
        &[("family", "ipv4")],
        sluice_maps::hostport::list::<V4>(&dp.root)?.len(),
    );
    x.sample(
        "sluice_hostport_mappings",
        &[("family", "ipv6")],
        sluice_maps::hostport::list::<V6>(&dp.root)?.len(),
    );

    bandwidth_families(&mut x, dp, &reading.endpoints, scrape.max_endpoints)?;
    policy_families(&mut x, dp, &scrape.policy_state)?;
    Ok(x.out)
}

/// What keeps a full NAT table open to every pod: evictions by reason, the
/// per-pod share, the unreplied UDP timeout, the flows of the pods holding
/// most (at most [`NAT_TOP_PODS`], and `max` pods). A datapath an older sluice
/// loaded has none of it: no families then, as for the Service ones.
fn nat_pressure_families(
    x: &mut Exposition,
    dp: &Datapath,
    reading: &counters::Reading,
    max: usize,
) -> Result<()> {
    if !dp.root.has(&maps::NAT_LIMITS) {
        return Ok(());
    }
    let limits = sluice_maps::nat_pressure::limits(&dp.root)?;
    let masq = sluice_maps::nat::config(&dp.root)?;
    let count = |r: u32| reading.node.get(r as usize).map_or(0, |(_, n)| *n);
    x.family(
        "sluice_nat_evictions_total",
        "counter",
        "Masqueraded flows a full NAT table (or a pod at its share) evicted for a new flow, by the rule that picked them (also sluice_datapath_packets_total{reason=~\"nat_evict_.*\"}).",
    );
    for (label, r) in [
        ("unreplied", reason::NAT_EVICT_UNREPLIED),
        ("idle", reason::NAT_EVICT_IDLE),
        ("pod_share", reason::NAT_EVICT_POD_SHARE),
    ] {
        x.sample("sluice_nat_evictions_total", &[("reason", label)], count(r));
    }
    x.family(
        "sluice_nat_pod_share_flows",
        "gauge",
        "Masqueraded flows one pod may hold (natPodShare of natMaxFlows) before its new flows replace its own; 0: no share.",
    );
    x.sample("sluice_nat_pod_share_flows", &[], limits.pod_max_flows);
    x.family(
        "sluice_nat_unreplied_timeout_seconds",
        "gauge",
        "Idle timeout of a masqueraded UDP flow that never saw a reply (natTimeouts.udpUnreplied, or the UDP timeout when that is not shorter).",
    );
    x.sample(
        "sluice_nat_unreplied_timeout_seconds",
        &[],
        crate::nat::udp_unreplied_secs(&masq, &limits),
    );
    x.family(
        "sluice_nat_pod_flows",
        "gauge",
        "Masqueraded flows (both families) of the pods holding the most, at most 10.",
    );
    let top = sluice_maps::nat_pressure::pod_counts(&dp.root)?;
    nat_pod_samples(x, &top, &reading.endpoints, NAT_TOP_PODS.min(max));
    Ok(())
}

/// `sluice_nat_pod_flows` of the first `n` pods of `top` (largest first)
/// that are endpoints of the datapath and hold a flow.
fn nat_pod_samples(x: &mut Exposition, top: &[(u32, u64)], eps: &[EndpointCounters], n: usize) {
    let shown = top
        .iter()
        .filter(|(_, flows)| *flows > 0)
        .filter_map(|(ifindex, flows)| Some((eps.iter().find(|e| e.ifindex == *ifindex)?, flows)))
        .take(n);
    for (e, flows) in shown {
        x.sample("sluice_nat_pod_flows", &pod_labels(e, []), flows);
    }
}

/// Service traffic (kube-proxy): the Service ranges by who set them, the
/// kernel flows and their table's capacity (its fill joins `pressure`). A
/// datapath an older Sluice pinned has no Service maps: no families then, as
/// for the NAT sweep lease.
fn service_families(
    x: &mut Exposition,
    dp: &Datapath,
    pressure: &mut Vec<(&'static str, f64)>,
) -> Result<()> {
    let s = crate::services::Summary::read(dp)?;
    if !s.supported {
        return Ok(());
    }
    x.family(
        "sluice_service_ranges",
        "gauge",
        "Service ranges whose traffic from pods goes to the node's stack (kube-proxy), by who set them (config: serviceCIDRs; agent: the node agent); a range both set counts for each.",
    );
    for (owner, bit) in [
        ("config", service_owner::CONFIG),
        ("agent", service_owner::AGENT),
    ] {
        x.sample(
            "sluice_service_ranges",
            &[("owner", owner)],
            s.ranges_of(bit),
        );
    }
    x.family(
        "sluice_kernel_flows",
        "gauge",
        "Flows the node's stack translates (Services, any DNAT) that the datapath keeps on the stack's path.",
    );
    x.sample("sluice_kernel_flows", &[], s.flows);
    x.family(
        "sluice_kernel_flows_max",
        "gauge",
        "Kernel flows the table holds at most (natMaxFlows); the least recently used goes when it is full.",
    );
    x.sample("sluice_kernel_flows_max", &[], s.capacity);
    pressure.push((
        maps::KFLOWS.name,
        s.flows as f64 / f64::from(s.capacity.max(1)),
    ));
    Ok(())
}

/// The Services Sluice translates itself (`sluice-node proxy`), per Service
/// port (labelled by its first frontend, its scope (`node`: the cluster's
/// own connections, `outside`: the uplink's) and, from the agent's state
/// file, its Service and port): its backends and the connections sent to
/// them; the fill of the frontend and backend maps joins `pressure` (a
/// full one is a Service port the agent could not write). None without the
/// Service maps.
fn lb_families(
    x: &mut Exposition,
    dp: &Datapath,
    state: &Path,
    pressure: &mut Vec<(&'static str, f64)>,
) -> Result<()> {
    let Some(maps) = sluice_maps::lb::LbMaps::open(&dp.root)? else {
        return Ok(());
    };
    let rows = crate::lb::rows(&maps, &crate::lb::state(state));
    let frontends: usize = rows.iter().map(|r| r.frontends.len()).sum();
    let backends: usize = rows.iter().map(|r| r.backends.len()).sum();
    for (spec, n) in [(&maps::LB_SVC, frontends), (&maps::LB_BACKENDS, backends)] {
        let cap = dp.root.capacity(spec)?;
        pressure.push((spec.name, n as f64 / f64::from(cap.max(1))));
    }
    x.family(
        "sluice_service_ports",
        "gauge",
        "Service ports Sluice translates at the socket (sluice-node proxy).",
    );
    x.sample("sluice_service_ports", &[], rows.len());
    x.family(
        "sluice_service_backends",
        "gauge",
        "Backends of a Service port Sluice translates (0: connections to it are refused).",
    );
    let labels = |r: &crate::lb::Row| {
        (
            r.frontends.first().cloned().unwrap_or_default(),
            if r.external { "outside" } else { "node" },
            r.service().unwrap_or("").to_string(),
            r.port_name().unwrap_or_default(),
        )
    };
    for r in &rows {
        let (f, scope, svc, port) = labels(r);
        x.sample(
            "sluice_service_backends",
            &[
                ("frontend", &f),
                ("scope", scope),
                ("service", &svc),
                ("port", &port),
            ],
            r.backends.len(),
        );
    }
    x.family(
        "sluice_service_translations_total",
        "counter",
        "New connections (and datagrams of unconnected UDP) to a Service port sent to a backend: at the socket, and new flows from outside or per packet.",
    );
    for r in &rows {
        let (f, scope, svc, port) = labels(r);
        x.sample(
            "sluice_service_translations_total",
            &[
                ("frontend", &f),
                ("scope", scope),
                ("service", &svc),
                ("port", &port),
            ],
            r.translations,
        );
    }
    Ok(())
}

/// NetworkPolicy (`sluice-node policy`): the mode, the pods here by
/// isolation, and each compiled rule's new flows, labelled with its policy
/// (`namespace/name`), direction and index in the policy (from the agent's
/// state file). Policy drops are `sluice_drops_total`'s `drop_policy_*`
/// reasons, with their direction. None without the policy maps.
fn policy_families(x: &mut Exposition, dp: &Datapath, state: &Path) -> Result<()> {
    let Some(cfg) = sluice_maps::policy::config(&dp.root)? else {
        return Ok(());
    };
    let st: serde_json::Value = std::fs::read(state)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    x.family(
        "sluice_policy_info",
        "gauge",
        "NetworkPolicy in the datapath: its mode (off, enforce, audit; always 1).",
    );
    x.sample(
        "sluice_policy_info",
        &[("mode", crate::policy::mode(cfg.flags))],
        1,
    );
    let report = &st["report"];
    let pods = report["pods"].as_array().cloned().unwrap_or_default();
    x.family(
        "sluice_policy_pods",
        "gauge",
        "Pods on the node the policy agent compiled, by the directions they are isolated for.",
    );
    for iso in ["none", "ingress", "egress", "both"] {
        let n = pods
            .iter()
            .filter(|p| {
                let (i, e) = (
                    p["ingressIsolated"].as_bool().unwrap_or(false),
                    p["egressIsolated"].as_bool().unwrap_or(false),
                );
                iso == match (i, e) {
                    (false, false) => "none",
                    (true, false) => "ingress",
                    (false, true) => "egress",
                    (true, true) => "both",
                }
            })
            .count();
        x.sample("sluice_policy_pods", &[("isolated", iso)], n);
    }
    let rules = report["rules"].as_array().cloned().unwrap_or_default();
    let ids: Vec<u16> = rules
        .iter()
        .filter_map(|r| r["id"].as_u64().and_then(|i| u16::try_from(i).ok()))
        .collect();
    let hits = sluice_maps::policy::hits_of(&dp.root, &ids)?;
    x.family(
        "sluice_policy_rule_flows_total",
        "counter",
        "New flows a NetworkPolicy rule let in (the first rule that allowed each), since the agent started.",
    );
    for r in &rules {
        let Some(id) = r["id"].as_u64().and_then(|i| u16::try_from(i).ok()) else {
            continue;
        };
        x.sample(
            "sluice_policy_rule_flows_total",
            &[
                ("policy", r["policy"].as_str().unwrap_or("")),
                ("direction", r["direction"].as_str().unwrap_or("")),
                ("rule", &r["index"].to_string()),
            ],
            hits.get(&id).copied().unwrap_or(0),
        );
    }
    Ok(())
}

/// The labels of every per-pod series (which pod interface), then `more`.
fn pod_labels<'a, const N: usize>(
    e: &'a EndpointCounters,
    more: [(&'a str, &'a str); N],
) -> Vec<(&'a str, &'a str)> {
    let mut l = vec![
        ("namespace", e.namespace.as_str()),
        ("pod", e.pod.as_str()),
        ("container_id", short_id(&e.container_id)),
        ("interface", e.ifname.as_str()),
    ];
    l.extend(more);
    l
}

/// Node-wide traffic of every pod, then the per-pod series.
fn endpoint_families(x: &mut Exposition, eps: &[EndpointCounters], max: usize) {
    let sum = |f: fn(&EndpointCounters) -> u64| eps.iter().map(f).sum::<u64>();
    let node_wide: [(&str, &str, [u64; 2]); 2] = [
        (
            "sluice_forward_count_total",
            "Packets of the node's pods through the datapath: sent by them (egress) and delivered to them (ingress).",
            [sum(|e| e.sent.0), sum(|e| e.received.0)],
        ),
        (
            "sluice_forward_bytes_total",
            "Bytes of those packets.",
            [sum(|e| e.sent.1), sum(|e| e.received.1)],
        ),
    ];
    for (name, help, [egress, ingress]) in node_wide {
        x.family(name, "counter", help);
        x.sample(name, &[("direction", "egress")], egress);
        x.sample(name, &[("direction", "ingress")], ingress);
    }
    x.family(
        "sluice_endpoints",
        "gauge",
        "Pod interfaces attached to the datapath.",
    );
    x.sample("sluice_endpoints", &[], eps.len());
    x.family(
        "sluice_endpoint_series_truncated",
        "gauge",
        "1 when more pod interfaces exist than --max-endpoints lets have their own series.",
    );
    x.sample(
        "sluice_endpoint_series_truncated",
        &[],
        u8::from(eps.len() > max),
    );
    let shown = &eps[..eps.len().min(max)];
    for (name, help, f) in [
        (
            "sluice_endpoint_packets_total",
            "Packets a pod interface sent (egress) and received (ingress).",
            (|e: &EndpointCounters| (e.sent.0, e.received.0))
                as fn(&EndpointCounters) -> (u64, u64),
        ),
        (
            "sluice_endpoint_bytes_total",
            "Bytes a pod interface sent (egress) and received (ingress).",
            |e: &EndpointCounters| (e.sent.1, e.received.1),
        ),
    ] {
        x.family(name, "counter", help);
        for e in shown {
            let (out, inn) = f(e);
            for (dir, v) in [("egress", out), ("ingress", inn)] {
                x.sample(name, &pod_labels(e, [("direction", dir)]), v);
            }
        }
    }
    x.family(
        "sluice_endpoint_drop_count_total",
        "counter",
        "Packets of a pod interface the programs dropped, by reason.",
    );
    for e in shown {
        for (reason, n) in &e.drops {
            let labels = [
                ("reason", reason.trim_start_matches("drop_")),
                ("direction", drop_direction(reason)),
            ];
            x.sample(
                "sluice_endpoint_drop_count_total",
                &pod_labels(e, labels),
                n,
            );
        }
    }
}

/// Pods with bandwidth limits and each one's limits (bits/s).
fn bandwidth_families(
    x: &mut Exposition,
    dp: &Datapath,
    eps: &[EndpointCounters],
    max: usize,
) -> Result<()> {
    let limited = sluice_maps::bandwidth::list(&dp.root)?;
    x.family(
        "sluice_bandwidth_limited_pods",
        "gauge",
        "Pod interfaces with a bandwidth limit.",
    );
    x.sample("sluice_bandwidth_limited_pods", &[], limited.len());
    x.family(
        "sluice_bandwidth_limit_bits_per_second",
        "gauge",
        "A pod interface's bandwidth limit, by direction (drops over it: sluice_drop_count_total{reason=~\"bw_.*\"}).",
    );
    let shown = &eps[..eps.len().min(max)];
    for (ifindex, state) in &limited {
        let Some(e) = shown.iter().find(|e| e.ifindex == *ifindex) else {
            continue;
        };
        for (dir, bucket) in [("egress", &state.egress), ("ingress", &state.ingress)] {
            if bucket.rate == 0 {
                continue;
            }
            x.sample(
                "sluice_bandwidth_limit_bits_per_second",
                &pod_labels(e, [("direction", dir)]),
                bucket.rate.saturating_mul(8),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_dir_of_a_pin_root_is_its_networks_even_with_a_dot_in_the_name() {
        let base = tempfile::tempdir().unwrap();
        for n in ["net.a", "net_a", "plain"] {
            std::fs::create_dir(base.path().join(n)).unwrap();
        }
        let pin = sluice_common::user::pin_dir_name("net.a");
        assert_ne!(pin, "net_a");
        assert_eq!(
            state_dir_of_pin(base.path(), &pin),
            base.path().join("net.a")
        );
        // Names without a dot are their own pin directory's.
        assert_eq!(
            state_dir_of_pin(base.path(), "net_a"),
            base.path().join("net_a")
        );
        assert_eq!(
            state_dir_of_pin(base.path(), "plain"),
            base.path().join("plain")
        );
        assert_eq!(
            state_dir_of_pin(base.path(), "gone"),
            base.path().join("gone")
        );
        let missing = base.path().join("missing");
        assert_eq!(state_dir_of_pin(&missing, "x"), missing.join("x"));
    }

    #[test]
    fn label_values_are_escaped() {
        let mut x = Exposition::default();
        x.sample("m_total", &[("a", "x\"y\\z\nw")], 3);
        assert_eq!(x.out, "m_total{a=\"x\\\"y\\\\z\\nw\"} 3\n");
    }

    #[test]
    fn families_have_help_and_type_before_samples() {
        let mut x = Exposition::default();
        x.family("sluice_endpoints", "gauge", "Pods.");
        x.sample("sluice_endpoints", &[], 2);
        assert_eq!(
            x.out,
            "# HELP sluice_endpoints Pods.\n# TYPE sluice_endpoints gauge\nsluice_endpoints 2\n"
        );
    }

    #[test]
    fn drop_reasons_get_a_direction_and_ids_are_shortened() {
        assert_eq!(drop_direction("drop_bw_ingress"), "ingress");
        assert_eq!(drop_direction("drop_spoofed"), "egress");
        assert_eq!(drop_direction("drop_malformed"), "unknown");
        assert_eq!(short_id("0123456789abcdef"), "0123456789ab");
        assert_eq!(short_id("abc"), "abc");
    }

    #[test]
    fn only_get_and_head_of_metrics_are_served() {
        let get = Route::Metrics { head: false };
        assert_eq!(route("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), get);
        assert_eq!(route("GET /metrics?name[]=up HTTP/1.1\r\n"), get);
        assert_eq!(route("GET / HTTP/1.0\r\n"), get);
        assert_eq!(
            route("HEAD /metrics HTTP/1.1\r\n"),
            Route::Metrics { head: true }
        );
        assert_eq!(route("GET /other HTTP/1.1\r\n"), Route::NotFound);
        assert_eq!(route("POST /metrics HTTP/1.1\r\n"), Route::NotAllowed);
        assert_eq!(route(""), Route::NotAllowed);
    }

    #[test]
    fn per_pod_series_stop_at_the_limit_and_say_so() {
        let eps: Vec<EndpointCounters> = (0..3)
            .map(|i| EndpointCounters {
                ifindex: i,
                container_id: format!("container{i}xxxxxxxxx"),
                ifname: "eth0".into(),
                sent: (1, 100),
                received: (2, 200),
                ..Default::default()
            })
            .collect();
        let mut x = Exposition::default();
        endpoint_families(&mut x, &eps, 2);
        assert!(x
            .out
            .contains("sluice_forward_count_total{direction=\"egress\"} 3\n"));
        assert!(x
            .out
            .contains("sluice_forward_bytes_total{direction=\"ingress\"} 600\n"));
        assert!(x.out.contains("sluice_endpoint_series_truncated 1\n"));
        assert!(x.out.contains("container_id=\"container1xx\""));
        assert!(!x.out.contains("container_id=\"container2xx\""));
    }

    #[test]
    fn nat_pod_series_are_the_largest_known_pods() {
        let eps: Vec<EndpointCounters> = [3, 5, 7]
            .into_iter()
            .map(|i| EndpointCounters {
                ifindex: i,
                namespace: "shop".into(),
                pod: format!("web-{i}"),
                container_id: format!("container{i}xxxxxxxxx"),
                ifname: "eth0".into(),
                ..Default::default()
            })
            .collect();
        // ifindex 9 has no endpoint (gone), 3 holds no flow.
        let top = [(9, 900), (7, 700), (5, 500), (3, 0)];
        let mut x = Exposition::default();
        nat_pod_samples(&mut x, &top, &eps, 10);
        assert_eq!(
            x.out,
            "sluice_nat_pod_flows{namespace=\"shop\",pod=\"web-7\",container_id=\"container7xx\",interface=\"eth0\"} 700\n\
             sluice_nat_pod_flows{namespace=\"shop\",pod=\"web-5\",container_id=\"container5xx\",interface=\"eth0\"} 500\n"
        );
        let mut one = Exposition::default();
        nat_pod_samples(&mut one, &top, &eps, 1);
        assert_eq!(one.out.lines().count(), 1);
        assert!(one.out.contains("web-7"));
    }

    #[test]
    fn pod_names_come_from_records_that_have_them() {
        let d = tempfile::tempdir().unwrap();
        let att = d.path().join("attachments");
        std::fs::create_dir(&att).unwrap();
        std::fs::write(
            att.join("c1.eth0.json"),
            r#"{"containerId":"c1","ifname":"eth0","pod":{"namespace":"shop","name":"web-0"}}"#,
        )
        .unwrap();
        std::fs::write(
            att.join("c2.eth0.json"),
            r#"{"containerId":"c2","ifname":"eth0"}"#,
        )
        .unwrap();
        std::fs::write(att.join("junk.json"), "not json").unwrap();
        let m = pod_names(d.path());
        assert_eq!(m.len(), 1);
        assert_eq!(
            m[&("c1".to_string(), "eth0".to_string())],
            ("shop".to_string(), "web-0".to_string())
        );
        assert!(pod_names(&d.path().join("missing")).is_empty());
    }
}
