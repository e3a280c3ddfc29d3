//! `sluicectl monitor`: datapath events as they happen.
//!
//! The programs write events to the pinned `sl_events` ring buffer only while a
//! monitor holds a lease in `sl_monitor` (refreshed every second, expiring
//! [`monitor_slot::EVENTS_LEASE_NS`] after the last refresh), so an idle node
//! pays nothing and a killed monitor stops the events by itself. Memory is
//! bounded on both sides: the ring has a fixed size (a full ring loses events,
//! counted as `events_lost`, never packets) and events are printed one by one.
//! With `"debug": true` in the network config the programs also write aya-log
//! lines, read here from the `AYA_LOGS` ring of the pinned programs.
use std::{
    collections::HashMap,
    fmt::Write as _,
    io::Write,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsRawFd, RawFd},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Result};
use serde_json::{json, Value};
use sluice_common::{event_kind, monitor_slot, prog_names, reason, user::monotonic_ns, Event};

use crate::{
    args::{MonitorArgs, Target},
    ports::select_pods,
    signals, table,
    target::Datapath,
};

/// How often the lease is renewed and the pod table re-read.
const RENEW: Duration = Duration::from_secs(1);

pub(crate) fn execute(t: &Target, a: &MonitorArgs) -> Result<()> {
    let dp = Datapath::open(t)?;
    if let Some(r) = &a.reason {
        let known = reason::NAMES.iter().position(|n| n == r);
        if !known.is_some_and(|i| u32::try_from(i).is_ok_and(reason::is_drop)) {
            bail!("{r:?} is not a drop reason; the drop_* names of `sluicectl counters --all` are");
        }
    }
    let mut ring = sluice_maps::events::Events::open(&dp.root)?;
    let debug_on = sluice_maps::node::monitor_slot(&dp.root, monitor_slot::DEBUG)? != 0;
    let want_debug = a.types.is_empty() || a.types.iter().any(|t| t == "debug");
    let muted = Arc::new(AtomicBool::new(true));
    let mut logger = if debug_on && want_debug {
        let id = sluice_maps::programs::id(&dp.root, prog_names::FROM_POD)?;
        Some(sluice_maps::events::DebugLog::open(
            id,
            DebugLines {
                json: a.json,
                muted: muted.clone(),
            },
        )?)
    } else {
        None
    };
    signals::install();
    // What is in the rings already happened before this monitor: not shown
    // (debug lines carry no time to tell them apart).
    ring.drain();
    if let Some(l) = &mut logger {
        l.flush();
    }
    muted.store(false, Ordering::Relaxed);
    let lost_before = lost(&dp);
    let mut pods = Pods::read(&dp, a)?;
    let mut policies = PolicyNames::new(&a.policy_state);
    // One write: tests (and scripts) wait for this whole line, and stderr is
    // unbuffered, so `eprintln!` would write it in pieces.
    let started = format!(
        "sluicectl: monitoring {} (Ctrl-C to stop){}\n",
        dp.pin_root.display(),
        if debug_on {
            "; debug lines on"
        } else {
            "; debug lines off (\"debug\": true in the network config turns them on)"
        }
    );
    let _ = std::io::stderr().write_all(started.as_bytes());
    let start = Instant::now();
    let mut renewed: Option<Instant> = None;
    let mut shown: u64 = 0;
    let fds: Vec<RawFd> = std::iter::once(ring.as_raw_fd())
        .chain(logger.as_ref().map(AsRawFd::as_raw_fd))
        .collect();
    'outer: loop {
        if signals::stop_requested() || a.duration.is_some_and(|d| start.elapsed().as_secs() >= d) {
            break;
        }
        if renewed.is_none_or(|r| r.elapsed() >= RENEW) {
            sluice_maps::node::set_monitor_slot(
                &dp.root,
                monitor_slot::EVENTS_UNTIL_NS,
                monotonic_ns() + monitor_slot::EVENTS_LEASE_NS,
            )?;
            if renewed.is_some() {
                pods = Pods::read(&dp, a)?;
            }
            renewed = Some(Instant::now());
        }
        wait_readable(&fds, 200);
        while let Some(ev) = ring.next_event() {
            if !pods.matches(&ev, a) {
                continue;
            }
            let selecting = policies.of(&ev);
            print_event(&ev, &pods, selecting.as_ref(), a.json)?;
            shown += 1;
            if a.count.is_some_and(|c| shown >= c) {
                break 'outer;
            }
        }
        if let Some(l) = &mut logger {
            l.flush();
        }
    }
    let lost = lost(&dp).saturating_sub(lost_before);
    eprintln!(
        "sluicectl: {shown} events shown{}",
        if lost > 0 {
            format!(", {lost} lost (the ring buffer was full)")
        } else {
            String::new()
        }
    );
    Ok(())
}

fn lost(dp: &Datapath) -> u64 {
    sluice_maps::counters::named(&dp.root)
        .ok()
        .and_then(|c| c.get(reason::EVENTS_LOST as usize).map(|(_, n)| *n))
        .unwrap_or(0)
}

/// Waits until one of `fds` is readable or `timeout_ms` passed (EINTR from
/// Ctrl-C returns early, which is what we want).
fn wait_readable(fds: &[RawFd], timeout_ms: i32) {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `p` is a valid array of `p.len()` pollfds.
    unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, timeout_ms) };
}

/// The pods of the datapath by host ifindex, and the `--pod` selection.
struct Pods {
    by_ifindex: HashMap<u32, (String, String)>,
    selected_ifindexes: Option<Vec<u32>>,
    selected_ips: Vec<IpAddr>,
}

impl Pods {
    fn read(dp: &Datapath, a: &MonitorArgs) -> Result<Self> {
        let rows: Vec<sluice_maps::endpoint::EndpointRow> =
            sluice_maps::endpoint::Endpoints::open(&dp.root)?.rows()?;
        let by_ifindex = rows
            .iter()
            .filter_map(|r| {
                r.owner.as_ref().map(|o| {
                    (
                        r.endpoint.ifindex,
                        (table::text(&o.container_id), table::text(&o.ifname)),
                    )
                })
            })
            .collect();
        let (selected_ifindexes, selected_ips) = match &a.pod {
            Some(p) => {
                let sel = select_pods(&rows, p)?;
                (
                    Some(sel.iter().map(|r| r.endpoint.ifindex).collect()),
                    sel.iter().map(|r| r.ip).collect(),
                )
            }
            None => (None, Vec::new()),
        };
        Ok(Self {
            by_ifindex,
            selected_ifindexes,
            selected_ips,
        })
    }

    fn matches(&self, ev: &Event, a: &MonitorArgs) -> bool {
        let (src, dst) = (addr(ev.family, &ev.src), addr(ev.family, &ev.dst));
        let ips = [src, dst, nat_addr(ev)];
        // `--type policy`: audit events and NetworkPolicy's drops.
        let policy_drop = ev.kind == event_kind::DROP
            && matches!(
                ev.reason,
                reason::DROP_POLICY_INGRESS
                    | reason::DROP_POLICY_EGRESS
                    | reason::DROP_POLICY_PENDING
            );
        if !a.types.is_empty()
            && !a
                .types
                .iter()
                .any(|t| t == type_filter_name(ev.kind) || (t == "policy" && policy_drop))
        {
            return false;
        }
        if let Some(sel) = &self.selected_ifindexes {
            let by_ip = ips
                .iter()
                .flatten()
                .any(|ip| self.selected_ips.contains(ip));
            if !sel.contains(&ev.ifindex) && !by_ip {
                return false;
            }
        }
        if a.ip
            .is_some_and(|want| !ips.iter().flatten().any(|ip| *ip == want))
        {
            return false;
        }
        if a.port
            .is_some_and(|p| ev.sport != p && ev.dport != p && ev.nat_port != p)
        {
            return false;
        }
        if a.proto
            .as_deref()
            .is_some_and(|p| table::proto_name(ev.proto) != p)
        {
            return false;
        }
        if let Some(r) = &a.reason {
            if ev.kind != event_kind::DROP || reason_name(ev.reason) != r {
                return false;
            }
        }
        true
    }
}

fn type_filter_name(kind: u8) -> &'static str {
    match kind {
        event_kind::DROP => "drop",
        event_kind::NAT_NEW | event_kind::NAT_INBOUND | event_kind::NAT_EVICT => "nat",
        event_kind::HOSTPORT_NEW => "hostport",
        event_kind::SERVICE | event_kind::SERVICE_FLOW => "service",
        event_kind::POLICY_AUDIT => "policy",
        _ => "?",
    }
}

/// The `type` field of the JSON form.
fn type_name(kind: u8) -> &'static str {
    match kind {
        event_kind::DROP => "drop",
        event_kind::NAT_NEW => "nat-new",
        event_kind::NAT_INBOUND => "nat-inbound",
        event_kind::NAT_EVICT => "nat-evict",
        event_kind::HOSTPORT_NEW => "hostport-new",
        event_kind::SERVICE => "service",
        event_kind::SERVICE_FLOW => "service-flow",
        event_kind::POLICY_AUDIT => "policy-audit",
        _ => "unknown",
    }
}

fn reason_name(r: u32) -> &'static str {
    reason::NAMES.get(r as usize).copied().unwrap_or("unknown")
}

/// Why a flow was evicted, as the text line and the metrics' `reason` label
/// say it (`unreplied`, `idle`, `pod_share`): the counter's name without
/// `nat_evict_`.
fn evict_reason(r: u32) -> &'static str {
    let name = reason_name(r);
    name.strip_prefix("nat_evict_").unwrap_or(name)
}

fn addr(family: u8, a: &[u8; 16]) -> Option<IpAddr> {
    match family {
        4 => Some(IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3]))),
        6 => Some(IpAddr::V6(Ipv6Addr::from(*a))),
        _ => None,
    }
}

/// The translated address of a NAT or hostPort event, of the event's family
/// (an all-zero address: none).
fn nat_addr(ev: &Event) -> Option<IpAddr> {
    if ev.nat_addr == [0; 16] {
        return None;
    }
    addr(ev.family, &ev.nat_addr)
}

/// Wall-clock time of a `bpf_ktime_get_ns` (`CLOCK_MONOTONIC`) timestamp.
fn unix_time(ts_ns: u64) -> f64 {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let age = monotonic_ns().saturating_sub(ts_ns) as f64 / 1e9;
    wall - age
}

/// HH:MM:SS.micro (UTC) of a unix time.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "a timestamp of the kernel's clock: positive, far below 2^64 us"
)]
fn clock(unix: f64) -> String {
    let micros = (unix * 1e6) as u64;
    let secs = micros / 1_000_000;
    format!(
        "{:02}:{:02}:{:02}.{:06}",
        secs / 3600 % 24,
        secs / 60 % 60,
        secs % 60,
        micros % 1_000_000
    )
}

fn endpoint(ip: Option<IpAddr>, port: u16, proto: u8) -> String {
    let Some(ip) = ip else { return "?".into() };
    let ported = matches!(proto, 6 | 17 | 132) && port != 0;
    match (ip, ported) {
        (IpAddr::V6(v6), true) => format!("[{v6}]:{port}"),
        (ip, true) => format!("{ip}:{port}"),
        (ip, false) => ip.to_string(),
    }
}

/// The NetworkPolicy side of an event: for a policy drop or audit event,
/// the direction and the policies that select the pod (from the agent's
/// state file, read again when it changes).
struct PolicyNames {
    path: std::path::PathBuf,
    modified: Option<std::time::SystemTime>,
    by_ip: HashMap<IpAddr, Vec<String>>,
}

impl PolicyNames {
    fn new(path: &std::path::Path) -> Self {
        Self {
            path: path.to_path_buf(),
            modified: None,
            by_ip: HashMap::new(),
        }
    }

    fn refresh(&mut self) {
        let modified = std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .ok();
        if modified.is_none() || modified == self.modified {
            return;
        }
        self.modified = modified;
        self.by_ip.clear();
        let Some(v) = std::fs::read(&self.path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        else {
            return;
        };
        for p in v["report"]["pods"].as_array().into_iter().flatten() {
            let names: Vec<String> = p["policies"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|x| x.as_str().map(String::from))
                .collect();
            for ip in p["ips"].as_array().into_iter().flatten() {
                if let Some(ip) = ip.as_str().and_then(|s| s.parse().ok()) {
                    self.by_ip.insert(ip, names.clone());
                }
            }
        }
    }

    /// (direction, policies) of a policy event; `None` for other events.
    fn of(&mut self, ev: &Event) -> Option<(&'static str, Vec<String>)> {
        let ingress = match (ev.kind, ev.reason) {
            (event_kind::DROP, reason::DROP_POLICY_INGRESS)
            | (event_kind::POLICY_AUDIT, reason::POLICY_AUDIT_INGRESS) => true,
            (event_kind::DROP, reason::DROP_POLICY_EGRESS)
            | (event_kind::POLICY_AUDIT, reason::POLICY_AUDIT_EGRESS) => false,
            (event_kind::DROP, reason::DROP_POLICY_PENDING) => {
                return Some(("pending", Vec::new()));
            }
            _ => return None,
        };
        self.refresh();
        let pod = if ingress {
            addr(ev.family, &ev.dst)
        } else {
            addr(ev.family, &ev.src)
        };
        let names = pod
            .and_then(|ip| self.by_ip.get(&ip))
            .cloned()
            .unwrap_or_default();
        Some((if ingress { "ingress" } else { "egress" }, names))
    }
}

fn print_event(
    ev: &Event,
    pods: &Pods,
    policy: Option<&(&'static str, Vec<String>)>,
    json_out: bool,
) -> Result<()> {
    let unix = unix_time(ev.ts_ns);
    let pod = pods.by_ifindex.get(&ev.ifindex);
    let src = addr(ev.family, &ev.src);
    let dst = addr(ev.family, &ev.dst);
    let nat = nat_addr(ev);
    if json_out {
        let v: Value = json!({
            "timeUnix": unix,
            "monotonicNs": ev.ts_ns,
            "type": type_name(ev.kind),
            "reason": reason_name(ev.reason),
            "ifindex": ev.ifindex,
            "containerId": pod.map(|p| p.0.clone()),
            "ifname": pod.map(|p| p.1.clone()),
            "family": ev.family,
            "proto": table::proto_name(ev.proto),
            "src": src.map(|a| a.to_string()),
            "sport": ev.sport,
            "dst": dst.map(|a| a.to_string()),
            "dport": ev.dport,
            "natAddress": nat.map(|a| a.to_string()),
            "natPort": ev.nat_port,
            "len": ev.len,
        });
        let mut v = v;
        if let Some((direction, names)) = policy {
            v["direction"] = json!(direction);
            v["policies"] = json!(names);
        }
        println!("{}", serde_json::to_string(&v)?);
        return Ok(());
    }
    let who = match pod {
        Some((cid, ifname)) => format!("pod {}/{ifname}", table::short_id(cid)),
        None if ev.ifindex != 0 => format!("ifindex {}", ev.ifindex),
        None => "-".into(),
    };
    let mut line = text_line(ev, &who);
    if let Some((direction, names)) = policy {
        if names.is_empty() {
            let _ = write!(line, "  ({direction})");
        } else {
            let _ = write!(line, "  ({direction}; selected by {})", names.join(", "));
        }
    }
    println!("{} {line}", clock(unix));
    Ok(())
}

/// The text form of an event (after its time), `who` being the pod it is of.
fn text_line(ev: &Event, who: &str) -> String {
    let src = addr(ev.family, &ev.src);
    let dst = addr(ev.family, &ev.dst);
    let nat = nat_addr(ev);
    let flow = format!(
        "{} {} -> {}",
        table::proto_name(ev.proto),
        endpoint(src, ev.sport, ev.proto),
        endpoint(dst, ev.dport, ev.proto)
    );
    match ev.kind {
        event_kind::DROP => format!(
            "drop      {:<22} {who}  {flow}  len {}",
            reason_name(ev.reason),
            ev.len
        ),
        event_kind::NAT_NEW => format!(
            "nat       new flow               {who}  {flow}  as {}",
            endpoint(nat, ev.nat_port, ev.proto)
        ),
        event_kind::NAT_INBOUND => {
            format!("nat       inbound connection     {who}  {flow}  (replies untranslated)")
        }
        event_kind::HOSTPORT_NEW => format!(
            "hostport  new flow               {flow}  to {}",
            endpoint(nat, ev.nat_port, ev.proto)
        ),
        event_kind::NAT_EVICT => format!(
            "nat       {:<22} {who}  {flow}  was {}",
            format!("evicted ({})", evict_reason(ev.reason)),
            endpoint(nat, ev.nat_port, ev.proto)
        ),
        // A socket hook's: no source yet, no pod known.
        event_kind::SERVICE => {
            let svc = format!(
                "{} {}",
                table::proto_name(ev.proto),
                endpoint(dst, ev.dport, ev.proto)
            );
            match nat {
                Some(_) => format!(
                    "service   connect                {svc}  to {}",
                    endpoint(nat, ev.nat_port, ev.proto)
                ),
                None => format!(
                    "service   {:<22} {svc}  refused at the socket",
                    reason_name(ev.reason)
                ),
            }
        }
        // From outside: the client, the address it sent to, the backend.
        event_kind::SERVICE_FLOW => format!(
            "service   new flow from outside  {flow}  to {}",
            endpoint(nat, ev.nat_port, ev.proto)
        ),
        event_kind::POLICY_AUDIT => format!(
            "policy    {:<22} {who}  {flow}  let through (audit)",
            reason_name(ev.reason)
        ),
        k => format!("event kind {k}"),
    }
}

/// The programs' aya-log lines, printed as they arrive; `reason=N` gets its name.
struct DebugLines {
    json: bool,
    /// Set while the lines from before the monitor started are drained.
    muted: Arc<AtomicBool>,
}

impl log::Log for DebugLines {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.muted.load(Ordering::Relaxed) {
            return;
        }
        let msg = name_reasons(&record.args().to_string());
        if self.json {
            println!("{}", json!({ "type": "debug", "message": msg }));
        } else {
            println!("debug     {msg}");
        }
    }

    fn flush(&self) {}
}

/// Replaces `reason=<number>` with `reason=<name>`.
fn name_reasons(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    let mut rest = msg;
    while let Some(i) = rest.find("reason=") {
        let (head, tail) = rest.split_at(i + "reason=".len());
        out.push_str(head);
        let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
        match tail[..digits].parse::<u32>() {
            Ok(n) => out.push_str(reason_name(n)),
            Err(_) => out.push_str(&tail[..digits]),
        }
        rest = &tail[digits..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_lines_get_reason_names() {
        assert_eq!(
            name_reasons("drop reason=37 ifindex=5 reason=x"),
            "drop reason=drop_bw_egress ifindex=5 reason=x"
        );
        assert_eq!(name_reasons("no reason here"), "no reason here");
    }

    #[test]
    fn clock_is_utc_time_of_day() {
        assert_eq!(clock(3661.5), "01:01:01.500000");
    }

    #[test]
    fn events_parse_from_ring_bytes() {
        let ev = Event {
            kind: event_kind::DROP,
            reason: reason::DROP_BW_INGRESS,
            family: 4,
            src: [10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            ..Event::default()
        };
        // SAFETY: reading the bytes of a plain old data value.
        let bytes = unsafe {
            std::slice::from_raw_parts((&raw const ev).cast::<u8>(), std::mem::size_of::<Event>())
        };
        assert_eq!(sluice_maps::events::parse(bytes), Some(ev));
        assert_eq!(sluice_maps::events::parse(&bytes[..10]), None);
        assert_eq!(
            addr(ev.family, &ev.src),
            Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)))
        );
        assert_eq!(endpoint(addr(4, &ev.src), 80, 6), "10.0.0.1:80");
        assert_eq!(endpoint(addr(4, &ev.src), 0, 1), "10.0.0.1");
        assert_eq!(nat_addr(&ev), None);
    }

    #[test]
    fn ipv6_nat_events_show_the_16_byte_address() {
        let nat: Ipv6Addr = "fd00:5a::1".parse().unwrap();
        let ev = Event {
            kind: event_kind::NAT_NEW,
            reason: reason::MASQ_NEW_FLOW,
            family: 6,
            proto: 17,
            nat_addr: nat.octets(),
            nat_port: 61000,
            ..Event::default()
        };
        // SAFETY: reading the bytes of a plain old data value.
        let bytes = unsafe {
            std::slice::from_raw_parts((&raw const ev).cast::<u8>(), std::mem::size_of::<Event>())
        };
        let back = sluice_maps::events::parse(bytes).unwrap();
        assert_eq!(nat_addr(&back), Some(IpAddr::V6(nat)));
        assert_eq!(
            endpoint(nat_addr(&back), back.nat_port, back.proto),
            "[fd00:5a::1]:61000"
        );
        let mut v4 = ev;
        v4.family = 4;
        v4.nat_addr = [0; 16];
        v4.nat_addr[..4].copy_from_slice(&[192, 168, 50, 1]);
        assert_eq!(endpoint(nat_addr(&v4), 61000, 6), "192.168.50.1:61000");
    }

    /// A record of the layout before the 16-byte NAT address (72 bytes, the
    /// NAT address in 4 bytes at offset 60, its port at 64) is read as such,
    /// not as the first 72 bytes of the current layout.
    #[test]
    fn older_datapath_records_keep_their_nat_address_and_port() {
        let mut rec = [0u8; sluice_common::EVENT_V1_SIZE];
        rec[8] = event_kind::HOSTPORT_NEW;
        rec[9] = 4;
        rec[10] = 6;
        rec[60..64].copy_from_slice(&[10, 0, 0, 7]);
        rec[64..66].copy_from_slice(&8080u16.to_ne_bytes());
        let ev = sluice_maps::events::parse(&rec).unwrap();
        assert_eq!(
            endpoint(nat_addr(&ev), ev.nat_port, ev.proto),
            "10.0.0.7:8080"
        );
        assert_eq!(sluice_maps::events::parse(&rec[..71]), None);
    }

    /// An evicted masquerade flow: a `nat` event (`--type nat`), `nat-evict`
    /// in JSON, and a text line with the rule that picked it and the
    /// translation the flow had.
    #[test]
    fn evicted_nat_flows_say_why_and_what_they_were() {
        let mut rec = [0u8; std::mem::size_of::<Event>()];
        rec[8] = event_kind::NAT_EVICT;
        rec[9] = 4;
        rec[10] = 17;
        rec[12..16].copy_from_slice(&reason::NAT_EVICT_UNREPLIED.to_ne_bytes());
        rec[16..20].copy_from_slice(&7u32.to_ne_bytes());
        rec[24..28].copy_from_slice(&[10, 88, 0, 2]);
        rec[40..44].copy_from_slice(&[1, 1, 1, 1]);
        rec[56..58].copy_from_slice(&40000u16.to_ne_bytes());
        rec[58..60].copy_from_slice(&53u16.to_ne_bytes());
        rec[60..64].copy_from_slice(&[192, 168, 77, 1]);
        rec[76..78].copy_from_slice(&61000u16.to_ne_bytes());
        let ev = sluice_maps::events::parse(&rec).unwrap();
        assert_eq!(ev.kind, event_kind::NAT_EVICT);
        assert_eq!(ev.ifindex, 7);
        assert_eq!(type_filter_name(ev.kind), "nat");
        assert_eq!(type_name(ev.kind), "nat-evict");
        assert_eq!(reason_name(ev.reason), "nat_evict_unreplied");
        assert_eq!(
            text_line(&ev, "pod web/eth0"),
            "nat       evicted (unreplied)    pod web/eth0  \
             udp 10.88.0.2:40000 -> 1.1.1.1:53  was 192.168.77.1:61000"
        );
        for (r, short) in [
            (reason::NAT_EVICT_IDLE, "idle"),
            (reason::NAT_EVICT_POD_SHARE, "pod_share"),
        ] {
            assert_eq!(evict_reason(r), short);
        }
        // The same columns as a new flow's line.
        let mut new = ev;
        new.kind = event_kind::NAT_NEW;
        let (a, b) = (text_line(&ev, "-"), text_line(&new, "-"));
        assert_eq!(a.find(" - "), b.find(" - "), "{a}\n{b}");
    }

    /// A socket hook's Service event: the Service and the backend picked,
    /// or a refusal; `--type service`.
    #[test]
    fn service_events_show_the_service_and_its_backend() {
        let mut rec = [0u8; std::mem::size_of::<Event>()];
        rec[8] = event_kind::SERVICE;
        rec[9] = 4;
        rec[10] = 6;
        rec[12..16].copy_from_slice(&reason::LB_SOCK.to_ne_bytes());
        rec[40..44].copy_from_slice(&[10, 96, 0, 10]);
        rec[58..60].copy_from_slice(&53u16.to_ne_bytes());
        rec[60..64].copy_from_slice(&[10, 88, 1, 7]);
        rec[76..78].copy_from_slice(&5353u16.to_ne_bytes());
        let ev = sluice_maps::events::parse(&rec).unwrap();
        assert_eq!(type_filter_name(ev.kind), "service");
        assert_eq!(type_name(ev.kind), "service");
        assert_eq!(
            text_line(&ev, "-"),
            "service   connect                tcp 10.96.0.10:53  to 10.88.1.7:5353"
        );
        let mut refused = ev;
        refused.reason = reason::DROP_LB_NO_ENDPOINT;
        refused.nat_addr = [0; 16];
        refused.nat_port = 0;
        assert_eq!(
            text_line(&refused, "-"),
            "service   drop_lb_no_endpoint    tcp 10.96.0.10:53  refused at the socket"
        );
    }

    /// A flow from outside given a Service backend in `uplink_in`.
    #[test]
    fn service_flows_from_outside_show_client_frontend_and_backend() {
        let mut rec = [0u8; std::mem::size_of::<Event>()];
        rec[8] = event_kind::SERVICE_FLOW;
        rec[9] = 4;
        rec[10] = 6;
        rec[12..16].copy_from_slice(&reason::LB_UPLINK_NEW.to_ne_bytes());
        rec[24..28].copy_from_slice(&[192, 168, 51, 2]);
        rec[40..44].copy_from_slice(&[192, 168, 50, 1]);
        rec[56..58].copy_from_slice(&40000u16.to_ne_bytes());
        rec[58..60].copy_from_slice(&30080u16.to_ne_bytes());
        rec[60..64].copy_from_slice(&[10, 94, 0, 2]);
        rec[76..78].copy_from_slice(&8080u16.to_ne_bytes());
        let ev = sluice_maps::events::parse(&rec).unwrap();
        assert_eq!(type_filter_name(ev.kind), "service");
        assert_eq!(type_name(ev.kind), "service-flow");
        let line = text_line(&ev, "-");
        assert!(
            line.starts_with("service   new flow from outside  "),
            "{line}"
        );
        assert!(line.contains("192.168.51.2:40000"), "{line}");
        assert!(line.contains("192.168.50.1:30080"), "{line}");
        assert!(line.ends_with("to 10.94.0.2:8080"), "{line}");
    }
}
