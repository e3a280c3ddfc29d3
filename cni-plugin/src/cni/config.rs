//! The network configuration on stdin (spec section 1 and 3): the well-known keys,
//! Sluice's own keys, `runtimeConfig`, `args`, `prevResult` and, for GC,
//! `cni.dev/valid-attachments`. Unknown keys are accepted: runtimes add their own.
use std::{net::IpAddr, path::PathBuf};

use serde_json::Value;

use super::{
    json::{self, array, boolean, object, string, uint},
    keys::{Fields, Match},
    result::{CniResult, Dns},
    runtime_config::{parse_ip_list, Bandwidth, RuntimeConfig},
    version::{self, Version},
    AttachmentId,
};
use crate::error::Error;

/// Largest network config accepted on stdin. A config is a few KiB; 10,000 port
/// mappings are under 1 MiB. Anything bigger is refused rather than read unbounded.
pub const MAX_STDIN_BYTES: u64 = 8 << 20;

/// XDP on the uplink (config `xdp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpMode {
    /// The default: native, except off on a veth uplink (see `datapath`).
    Auto,
    /// In the driver; falls back to generic when the driver lacks it (logged).
    Native,
    /// In the core stack (works on any device, slower).
    Generic,
    Off,
}

/// How the pod programs attach to a host veth (config `podAttach`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodAttach {
    /// `cls_bpf` filters on a clsact qdisc through netlink (the default): no RCU
    /// grace period per ADD. A clsact qdisc excludes an `ingress` qdisc, which the
    /// reference `bandwidth` plugin adds for pod egress limits.
    Tc,
    /// Pinned tcx links: coexist with any qdisc, but each first attachment of a
    /// device and direction waits for an RCU grace period (~10 ms).
    Tcx,
}

/// The pod's network device (config `podDevice`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodDeviceKind {
    /// A veth pair (the default; every kernel).
    Veth,
    /// A netkit pair (Linux 6.7+ with `CONFIG_NETKIT`): the pod programs run
    /// in the pod device's own transmit, with no backlog queue between the pod
    /// and them. An ADD fails on a kernel without netkit.
    Netkit,
    /// netkit where the kernel has it, veth elsewhere.
    Auto,
}

/// Masquerade settings: `nonMasqueradeCIDRs`, `masqueradeAddress`,
/// `masqueradePorts`, `natMaxFlows`, `natPodShare`, `natTimeouts`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MasqSettings {
    /// `None`: this network's pod ranges (and `nodes`' pod CIDRs). A family
    /// without an entry in the list keeps that default for itself.
    pub non_masq: Option<Vec<ipnetwork::IpNetwork>>,
    /// `None`: the uplink's first IPv4 address.
    pub address: Option<std::net::Ipv4Addr>,
    /// `None`: the uplink's first global IPv6 address (without one, IPv6 is
    /// not masqueraded).
    pub address6: Option<std::net::Ipv6Addr>,
    /// `None`: the ports from 1024 up outside the node's `ip_local_port_range`.
    pub ports: Option<(u16, u16)>,
    pub max_flows: u32,
    /// Percent of `max_flows` one pod may hold before its new flows replace
    /// its own (`natPodShare`).
    pub pod_share: u32,
    pub timeouts: NatTimeouts,
}

/// Idle timeouts of masqueraded flows, in seconds (config `natTimeouts`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NatTimeouts {
    pub tcp_syn: u32,
    pub tcp_established: u32,
    pub tcp_closing: u32,
    pub udp: u32,
    /// A UDP flow that never saw a reply (`udpUnreplied`).
    pub udp_unreplied: u32,
    pub icmp: u32,
}

impl Default for NatTimeouts {
    /// Close to Cilium's and conntrack's: a SYN without answer a minute, an
    /// established connection six hours, a closing one ten seconds, UDP a minute
    /// (half a minute until the first reply, as conntrack's unreplied UDP
    /// entries), ICMP half a minute.
    fn default() -> Self {
        Self {
            tcp_syn: 60,
            tcp_established: 21_600,
            tcp_closing: 10,
            udp: 60,
            udp_unreplied: 30,
            icmp: 30,
        }
    }
}

/// `masqueradeAddress`: one address (IPv4 or IPv6) or a list of at most one per
/// family.
fn masquerade_addresses(
    o: &json::Object,
) -> Result<(Option<std::net::Ipv4Addr>, Option<std::net::Ipv6Addr>), Error> {
    const KEY: &str = "masqueradeAddress";
    let items: Vec<(String, &Value)> = match o.get(KEY) {
        None | Some(Value::Null) => return Ok((None, None)),
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, v)| (format!("{KEY}[{i}]"), v))
            .collect(),
        Some(v) => vec![(KEY.to_string(), v)],
    };
    let (mut v4, mut v6) = (None, None);
    for (key, v) in items {
        let s = v.as_str().ok_or_else(|| {
            Error::config(
                &key,
                v,
                "must be an IP address (or a list of one per family)",
            )
        })?;
        match s.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V4(a)) if v4.is_none() => v4 = Some(a),
            Ok(std::net::IpAddr::V6(a)) if v6.is_none() => v6 = Some(a),
            Ok(_) => {
                return Err(Error::config(
                    &key,
                    s,
                    "a second address of the same family",
                ))
            }
            Err(_) => return Err(Error::config(&key, s, "must be an IPv4 or IPv6 address")),
        }
    }
    Ok((v4, v6))
}

/// Default and bounds of `natMaxFlows` (entries of each NAT map).
pub const NAT_MAX_FLOWS_DEFAULT: u32 = 65_536;
const NAT_MAX_FLOWS_RANGE: std::ops::RangeInclusive<u32> = 1_024..=4_194_304;
/// Default `natPodShare`: one pod may hold half of the flow table, so the
/// other half stays open to the other pods whatever one pod does.
pub const NAT_POD_SHARE_DEFAULT: u32 = 50;

impl Default for MasqSettings {
    fn default() -> Self {
        Self {
            non_masq: None,
            address: None,
            address6: None,
            ports: None,
            max_flows: NAT_MAX_FLOWS_DEFAULT,
            pod_share: NAT_POD_SHARE_DEFAULT,
            timeouts: NatTimeouts::default(),
        }
    }
}

impl MasqSettings {
    fn parse(o: &json::Object) -> Result<Self, Error> {
        let non_masq = cidr_list(o, "nonMasqueradeCIDRs")?;
        let (address, address6) = masquerade_addresses(o)?;
        let ports = match string(o, "masqueradePorts", "")? {
            Some(s) => {
                Some(parse_port_range(&s).map_err(|r| Error::config("masqueradePorts", &s, r))?)
            }
            None => None,
        };
        let max_flows = uint(o, "natMaxFlows", "")?.unwrap_or(NAT_MAX_FLOWS_DEFAULT);
        if !NAT_MAX_FLOWS_RANGE.contains(&max_flows) {
            return Err(Error::config(
                "natMaxFlows",
                max_flows,
                format!(
                    "must be between {} and {}",
                    NAT_MAX_FLOWS_RANGE.start(),
                    NAT_MAX_FLOWS_RANGE.end()
                ),
            ));
        }
        let pod_share = uint(o, "natPodShare", "")?.unwrap_or(NAT_POD_SHARE_DEFAULT);
        if !(1..=100).contains(&pod_share) {
            return Err(Error::config(
                "natPodShare",
                pod_share,
                "must be a percentage of natMaxFlows between 1 and 100",
            ));
        }
        let mut timeouts = NatTimeouts::default();
        if let Some(t) = o.get("natTimeouts").filter(|v| !v.is_null()) {
            let to = object(t, "natTimeouts")?;
            for (k, slot) in [
                ("tcpSyn", &mut timeouts.tcp_syn),
                ("tcpEstablished", &mut timeouts.tcp_established),
                ("tcpClosing", &mut timeouts.tcp_closing),
                ("udp", &mut timeouts.udp),
                ("udpUnreplied", &mut timeouts.udp_unreplied),
                ("icmp", &mut timeouts.icmp),
            ] {
                if let Some(v) = uint(to, k, "natTimeouts")? {
                    if v == 0 || v > 7 * 86_400 {
                        return Err(Error::config(
                            format!("natTimeouts.{k}"),
                            v,
                            "must be between 1 and 604800 seconds",
                        ));
                    }
                    *slot = v;
                }
            }
        }
        Ok(Self {
            non_masq,
            address,
            address6,
            ports,
            max_flows,
            pod_share,
            timeouts,
        })
    }
}

/// A list of CIDRs under `key`; `None` when absent or null.
fn cidr_list(o: &json::Object, key: &str) -> Result<Option<Vec<ipnetwork::IpNetwork>>, Error> {
    if o.get(key).is_none_or(Value::is_null) {
        return Ok(None);
    }
    let mut v = Vec::new();
    for (i, c) in array(o, key, "")?.iter().enumerate() {
        let item = format!("{key}[{i}]");
        let s = c
            .as_str()
            .ok_or_else(|| Error::config(&item, c, "must be a string"))?;
        match super::parse_cidr(s) {
            Some(n) => v.push(n),
            None => return Err(Error::config(&item, s, "must be a CIDR")),
        }
    }
    Ok(Some(v))
}

/// `"61000-65535"` -> (61000, 65535); at least 1 port, at least 1024.
pub fn parse_port_range(s: &str) -> Result<(u16, u16), String> {
    let (a, b) = s
        .split_once('-')
        .ok_or_else(|| "must be a range like 61000-65535".to_string())?;
    let a: u16 = a
        .trim()
        .parse()
        .map_err(|_| format!("{a:?} is not a port"))?;
    let b: u16 = b
        .trim()
        .parse()
        .map_err(|_| format!("{b:?} is not a port"))?;
    if a < 1024 || a > b {
        return Err("must be low-high with 1024 <= low <= high".into());
    }
    Ok((a, b))
}

/// Another node's pods (config `nodes`): traffic to `pod_cidr` goes to `node_ip`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteNode {
    pub pod_cidr: ipnetwork::IpNetwork,
    pub node_ip: IpAddr,
}

/// Which IPAM serves this network.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IpamKind {
    /// `"type": "sluice"`: the built-in host-local-compatible allocator.
    Builtin,
    /// Any other type: a plugin executed from `CNI_PATH` (spec section 4).
    Delegate(String),
}

#[derive(Clone, Debug)]
pub struct IpamConf {
    pub kind: IpamKind,
    /// The whole `ipam` object, read by the built-in allocator.
    pub raw: Value,
}

/// A parsed, validated network configuration.
#[derive(Clone, Debug)]
pub struct NetConf {
    pub cni_version: Version,
    pub name: String,
    pub plugin_type: String,
    pub ipam: Option<IpamConf>,
    /// Config-level DNS, returned in the result when set.
    pub dns: Option<Dns>,
    /// MTU of both veth ends; `None`: the node uplink's MTU.
    pub mtu: Option<u32>,
    /// `ipMasq` (acted on by the masquerade datapath).
    pub ip_masq: bool,
    /// `debug`: the programs write aya-log debug lines (drops, new flows) that
    /// `sluicectl monitor` prints. Node-wide; every ADD writes it.
    pub debug: bool,
    /// Masquerade settings (used when `ip_masq`).
    pub masq: MasqSettings,
    /// bpffs directory of this network's datapath.
    pub pin_root: PathBuf,
    /// Directory of this network's attachment records.
    pub state_dir: PathBuf,
    pub runtime: RuntimeConfig,
    pub prev_result: Option<CniResult>,
    /// `args.cni.ips`.
    pub arg_ips: Vec<IpAddr>,
    /// Node uplink by name; `None`: the interface of the default route.
    pub uplink: Option<String>,
    /// Bandwidth limits: `runtimeConfig.bandwidth`, else the same keys
    /// (`ingressRate`, `ingressBurst`, `egressRate`, `egressBurst`) in the plugin
    /// config.
    pub bandwidth: Option<Bandwidth>,
    /// `hostPortCgroup`: the cgroup v2 directory the hostPort socket hooks attach
    /// to (default: the root of the v2 hierarchy, so every node process is
    /// served; `None` when the node has no cgroup v2 mounted).
    pub host_port_cgroup: Option<PathBuf>,
    pub xdp: XdpMode,
    pub pod_attach: PodAttach,
    pub pod_device: PodDeviceKind,
    /// Static routes to other nodes' pod ranges.
    pub nodes: Vec<RemoteNode>,
    /// `serviceCIDRs`: the Service ranges kube-proxy translates; pods' traffic
    /// to them goes to the node's stack (see `datapath::services`).
    pub service_cidrs: Vec<ipnetwork::IpNetwork>,
    /// GC: `cni.dev/valid-attachments`.
    pub valid_attachments: Option<Vec<AttachmentId>>,
    /// How strictly this config was read (DEL and GC tolerate bad ADD-only keys).
    pub strictness: Strictness,
    /// The bytes read from stdin, passed unchanged to delegated plugins.
    pub raw: Vec<u8>,
}

/// Reads `cniVersion` only, for errors and VERSION. Undecodable input gives `None`.
pub fn peek_version(bytes: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(bytes).ok()?;
    v.get("cniVersion")?.as_str().map(str::to_string)
}

/// A network name (spec section 1): alphanumeric first, then alphanumerics, `_`, `.`, `-`.
pub fn valid_network_name(name: &str) -> bool {
    let mut b = name.bytes();
    b.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && b.all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
        && name.len() <= 200
}

/// How much of the config a command must be able to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strictness {
    /// ADD, CHECK, STATUS: every key is validated; a bad value is an error.
    Full,
    /// DEL and GC: only what teardown uses is required to be valid (`cniVersion`,
    /// `name`, `type`, `pinRoot`, `stateDir`, `ipam`, GC's valid attachments). A key
    /// only ADD acts on (`runtimeConfig`, `args`, `prevResult`, `mtu`, masquerade,
    /// bandwidth, ...) that does not parse is reported on stderr and left at its
    /// default: a pod whose ADD failed on such a key must still be removable, or
    /// the runtime retries DEL forever and the pod never goes away.
    Teardown,
}

impl Strictness {
    /// What `command` needs.
    pub fn for_command(command: super::env::Command) -> Self {
        use super::env::Command;
        match command {
            Command::Del | Command::Gc => Self::Teardown,
            Command::Add | Command::Check | Command::Status | Command::Version => Self::Full,
        }
    }

    /// `parsed`, or in teardown the default `or` with a warning naming what was
    /// ignored.
    fn add_only<T>(self, parsed: Result<T, Error>, or: T) -> Result<T, Error> {
        match (self, parsed) {
            (_, Ok(v)) => Ok(v),
            (Self::Full, Err(e)) => Err(e),
            (Self::Teardown, Err(e)) => {
                eprintln!("sluice: ignoring a setting only ADD uses: {}", e.details());
                Ok(or)
            }
        }
    }
}

impl NetConf {
    /// Parses stdin, every key strictly. Undecodable JSON is code 6, an
    /// unsupported version code 1, a bad value code 7 naming the key.
    pub fn parse(bytes: &[u8]) -> Result<Self, Error> {
        Self::parse_for(bytes, Strictness::Full)
    }

    /// Parses stdin for a command that needs `strictness` (see [`Strictness`]).
    pub fn parse_for(bytes: &[u8], strictness: Strictness) -> Result<Self, Error> {
        let v: Value = serde_json::from_slice(bytes).map_err(|e| Error::Decode {
            what: "network config from stdin".into(),
            reason: e.to_string(),
        })?;
        let o = v.as_object().ok_or_else(|| Error::Decode {
            what: "network config from stdin".into(),
            reason: "expected a JSON object".into(),
        })?;

        let ver_s = match o.get("cniVersion") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(Error::Decode {
                    what: "cniVersion".into(),
                    reason: format!("{other} is not a string"),
                })
            }
        };
        let cni_version = version::require_supported(&ver_s)?;

        let name = string(o, "name", "")?.unwrap_or_default();
        if !valid_network_name(&name) {
            return Err(Error::config(
                "name",
                &name,
                "must start with an alphanumeric character, continue with alphanumerics, '_', '.' or '-', and be at most 200 characters",
            ));
        }
        let plugin_type = string(o, "type", "")?.unwrap_or_default();
        let ipam = parse_ipam(o)?;
        let pin_root = match string(o, "pinRoot", "")? {
            Some(p) => {
                let path = absolute_path("pinRoot", &p)?;
                if p.contains('.') {
                    return Err(Error::config(
                        "pinRoot",
                        &p,
                        "bpffs does not allow '.' in names",
                    ));
                }
                path
            }
            None => sluice_common::user::default_pin_root(&name),
        };
        let state_dir = match string(o, "stateDir", "")? {
            Some(p) => absolute_path("stateDir", &p)?,
            None => PathBuf::from(sluice_common::DEFAULT_STATE_DIR),
        }
        .join(&name);
        // libcni sends both spellings (containernetworking/cni#1101).
        let valid_attachments = match ["cni.dev/valid-attachments", "cni.dev/attachments"]
            .iter()
            .find(|k| o.get(**k).is_some_and(|v| !v.is_null()))
        {
            Some(k) => Some(parse_attachments(o, k)?),
            None => None,
        };

        // From here on: keys only ADD (and CHECK) act on.
        let st = strictness;
        let dns = st.add_only(
            match o.get("dns").filter(|v| !v.is_null()) {
                Some(d) => Dns::from_json(d, "dns").map(|d| Some(d).filter(|d| !d.is_empty())),
                None => Ok(None),
            },
            None,
        )?;
        let mtu = st.add_only(parse_mtu(o), None)?;
        let ip_masq = st.add_only(boolean(o, "ipMasq", "").map(|b| b.unwrap_or(false)), false)?;
        let debug = st.add_only(boolean(o, "debug", "").map(|b| b.unwrap_or(false)), false)?;
        let masq = st.add_only(MasqSettings::parse(o), MasqSettings::default())?;
        let host_port_cgroup = st.add_only(
            match string(o, "hostPortCgroup", "") {
                Ok(Some(p)) => absolute_path("hostPortCgroup", &p).map(Some),
                Ok(None) => Ok(sluice_common::user::cgroup2_mount()),
                Err(e) => Err(e),
            },
            None,
        )?;
        let static_bw =
            st.add_only(Bandwidth::parse(&v, "", Match::Exact), Bandwidth::default())?;
        let runtime = st.add_only(
            match o.get("runtimeConfig").filter(|v| !v.is_null()) {
                Some(rc) => RuntimeConfig::parse(rc),
                None => Ok(RuntimeConfig::default()),
            },
            RuntimeConfig::default(),
        )?;
        let bandwidth = runtime
            .bandwidth
            .or((!static_bw.is_empty()).then_some(static_bw))
            .filter(|b| !b.is_empty());
        let prev_result = st.add_only(
            match o.get("prevResult").filter(|v| !v.is_null()) {
                Some(p) => CniResult::from_json(p, "prevResult").map(Some),
                None => Ok(None),
            },
            None,
        )?;
        let arg_ips = st.add_only(parse_arg_ips(o), Vec::new())?;
        let uplink = st.add_only(parse_uplink(o), None)?;
        let xdp = st.add_only(parse_xdp(o), XdpMode::Auto)?;
        let pod_attach = st.add_only(parse_pod_attach(o), PodAttach::Tc)?;
        let pod_device = st.add_only(parse_pod_device(o), PodDeviceKind::Veth)?;
        let nodes = st.add_only(parse_nodes(o), Vec::new())?;
        let service_cidrs = st.add_only(
            cidr_list(o, "serviceCIDRs").map(Option::unwrap_or_default),
            Vec::new(),
        )?;

        Ok(Self {
            cni_version,
            name,
            plugin_type,
            ipam,
            dns,
            mtu,
            ip_masq,
            debug,
            masq,
            pin_root,
            state_dir,
            runtime,
            prev_result,
            arg_ips,
            uplink,
            host_port_cgroup,
            bandwidth,
            xdp,
            pod_attach,
            pod_device,
            nodes,
            service_cidrs,
            valid_attachments,
            strictness,
            raw: bytes.to_vec(),
        })
    }

    /// Addresses requested for this attachment, from every source the conventions
    /// define: `CNI_ARGS IP=`, `args.cni.ips` and the `ips` capability.
    pub fn requested_ips(&self, cni_args_ips: &[IpAddr]) -> Vec<IpAddr> {
        let mut out: Vec<IpAddr> = Vec::new();
        for ip in self
            .runtime
            .ips
            .iter()
            .chain(&self.arg_ips)
            .chain(cni_args_ips)
        {
            if !out.contains(ip) {
                out.push(*ip);
            }
        }
        out
    }
}

fn absolute_path(key: &str, p: &str) -> Result<PathBuf, Error> {
    let path = PathBuf::from(p);
    if !path.is_absolute() || path.components().any(|c| c.as_os_str() == "..") {
        return Err(Error::config(
            key,
            p,
            "must be an absolute path without '..'",
        ));
    }
    Ok(path)
}

fn parse_ipam(o: &json::Object) -> Result<Option<IpamConf>, Error> {
    let Some(raw) = o.get("ipam").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let io = object(raw, "ipam")?;
    let t = string(io, "type", "ipam")?.unwrap_or_default();
    if t.is_empty() {
        return Err(Error::config("ipam.type", "\"\"", "is required"));
    }
    if t.contains('/') || t == "." || t == ".." {
        return Err(Error::config(
            "ipam.type",
            &t,
            "must be a plugin file name, not a path",
        ));
    }
    let kind = if t == "sluice" {
        IpamKind::Builtin
    } else {
        IpamKind::Delegate(t)
    };
    Ok(Some(IpamConf {
        kind,
        raw: raw.clone(),
    }))
}

fn parse_mtu(o: &json::Object) -> Result<Option<u32>, Error> {
    let mtu = uint(o, "mtu", "")?;
    if let Some(m) = mtu {
        // 68 is the IPv4 minimum (RFC 791); veth accepts up to 65535.
        if !(68..=65535).contains(&m) {
            return Err(Error::config("mtu", m, "must be between 68 and 65535"));
        }
    }
    Ok(mtu)
}

/// `args.cni.ips` (CNI conventions). `args` is filled by the runtime: keys
/// match as Go does ([`super::keys`]).
fn parse_arg_ips(o: &json::Object) -> Result<Vec<IpAddr>, Error> {
    let Some(args) = o.get("args").filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let Some(cni) = Fields::of(args, "args", Match::Go)?.get("cni")? else {
        return Ok(Vec::new());
    };
    match Fields::of(cni.value, &cni.path, Match::Go)?.get("ips")? {
        Some(ips) => parse_ip_list(ips.value, &ips.path),
        None => Ok(Vec::new()),
    }
}

fn parse_uplink(o: &json::Object) -> Result<Option<String>, Error> {
    let Some(u) = string(o, "uplink", "")? else {
        return Ok(None);
    };
    crate::cni::env::validate_ifname(&u).map_err(|r| Error::config("uplink", &u, r))?;
    Ok(Some(u))
}

fn parse_xdp(o: &json::Object) -> Result<XdpMode, Error> {
    Ok(match string(o, "xdp", "")?.as_deref() {
        None | Some("auto") => XdpMode::Auto,
        Some("native") => XdpMode::Native,
        Some("generic") => XdpMode::Generic,
        Some("off") => XdpMode::Off,
        Some(other) => {
            return Err(Error::config(
                "xdp",
                other,
                "must be auto, native, generic or off",
            ))
        }
    })
}

fn parse_pod_attach(o: &json::Object) -> Result<PodAttach, Error> {
    match string(o, "podAttach", "")?.as_deref() {
        None | Some("tc") => Ok(PodAttach::Tc),
        Some("tcx") => Ok(PodAttach::Tcx),
        Some(other) => Err(Error::config("podAttach", other, "must be tc or tcx")),
    }
}

fn parse_pod_device(o: &json::Object) -> Result<PodDeviceKind, Error> {
    match string(o, "podDevice", "")?.as_deref() {
        None | Some("veth") => Ok(PodDeviceKind::Veth),
        Some("netkit") => Ok(PodDeviceKind::Netkit),
        Some("auto") => Ok(PodDeviceKind::Auto),
        Some(other) => Err(Error::config(
            "podDevice",
            other,
            "must be veth, netkit or auto",
        )),
    }
}

fn parse_nodes(o: &json::Object) -> Result<Vec<RemoteNode>, Error> {
    let mut out = Vec::new();
    for (i, n) in array(o, "nodes", "")?.iter().enumerate() {
        let what = format!("nodes[{i}]");
        let no = object(n, &what)?;
        let cidr_s = string(no, "podCIDR", &what)?.unwrap_or_default();
        let pod_cidr = super::parse_cidr(&cidr_s)
            .ok_or_else(|| Error::config(format!("{what}.podCIDR"), &cidr_s, "must be a CIDR"))?;
        let ip_s = string(no, "nodeIP", &what)?.unwrap_or_default();
        let node_ip: IpAddr = ip_s
            .parse()
            .map_err(|_| Error::config(format!("{what}.nodeIP"), &ip_s, "must be an IP address"))?;
        if node_ip.is_ipv4() != pod_cidr.is_ipv4() {
            return Err(Error::config(
                format!("{what}.nodeIP"),
                &ip_s,
                "address family differs from podCIDR",
            ));
        }
        out.push(RemoteNode { pod_cidr, node_ip });
    }
    Ok(out)
}

fn parse_attachments(o: &json::Object, key: &str) -> Result<Vec<AttachmentId>, Error> {
    let mut out = Vec::new();
    for (i, a) in array(o, key, "")?.iter().enumerate() {
        let what = format!("{key}[{i}]");
        let ao = object(a, &what)?;
        let container_id = string(ao, "containerID", &what)?.unwrap_or_default();
        let ifname = string(ao, "ifname", &what)?.unwrap_or_default();
        if container_id.is_empty() || ifname.is_empty() {
            return Err(Error::config(&what, a, "needs containerID and ifname"));
        }
        out.push(AttachmentId {
            container_id,
            ifname,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[expect(clippy::needless_pass_by_value, reason = "called with json! literals")]
    fn parse(v: Value) -> Result<NetConf, Error> {
        NetConf::parse(v.to_string().as_bytes())
    }

    fn base() -> Value {
        json!({
            "cniVersion": "1.0.0",
            "name": "slnet",
            "type": "sluice",
            "ipam": {"type": "sluice", "subnet": "10.22.0.0/24"}
        })
    }

    fn with(k: &str, v: Value) -> Value {
        let mut b = base();
        b[k] = v;
        b
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = parse(base()).unwrap();
        assert_eq!(c.cni_version, Version::V1_0_0);
        assert_eq!(c.name, "slnet");
        assert_eq!(c.ipam.unwrap().kind, IpamKind::Builtin);
        assert_eq!(c.pin_root, PathBuf::from("/sys/fs/bpf/sluice/slnet"));
        assert_eq!(c.state_dir, PathBuf::from("/var/lib/cni/sluice/slnet"));
        assert_eq!(c.mtu, None);
        assert!(!c.ip_masq);
        assert!(!c.debug);
        assert_eq!(c.xdp, XdpMode::Auto);
        assert_eq!(c.pod_attach, PodAttach::Tc);
        assert_eq!(c.pod_device, PodDeviceKind::Veth);
        assert!(c.nodes.is_empty() && c.uplink.is_none());
    }

    #[test]
    fn every_field_is_read() {
        let c = parse(json!({
            "cniVersion": "1.1.0",
            "name": "net.a_b-c",
            "type": "sluice",
            "mtu": 1400,
            "ipMasq": true,
            "pinRoot": "/sys/fs/bpf/test-x",
            "stateDir": "/tmp/state-x",
            "dns": {"nameservers": ["10.0.0.10"]},
            "ipam": {"type": "host-local", "subnet": "10.22.0.0/24"},
            "runtimeConfig": {"mac": "02:00:00:00:00:01", "ips": ["10.22.0.9"]},
            "args": {"cni": {"ips": ["10.22.0.10/24"], "labels": [{"key": "a", "value": "b"}]}},
            "prevResult": {"cniVersion": "1.1.0", "ips": [{"address": "10.9.0.2/24"}]},
            "cni.dev/valid-attachments": [{"containerID": "c1", "ifname": "eth0"}],
            "uplink": "eth1",
            "nonMasqueradeCIDRs": ["10.0.0.0/8", "fd00:10::/64"],
            "masqueradeAddress": ["192.0.2.9", "2001:db8::9"],
            "masqueradePorts": "62000-62999",
            "natMaxFlows": 4096,
            "natTimeouts": {"udp": 5, "tcpEstablished": 100, "udpUnreplied": 3},
            "natPodShare": 10,
            "xdp": "generic",
            "nodes": [{"podCIDR": "10.23.0.0/24", "nodeIP": "192.0.2.2"}],
            "debug": true,
            "someUnknownKey": [1, 2, 3]
        }))
        .unwrap();
        assert_eq!(c.mtu, Some(1400));
        assert!(c.ip_masq);
        assert!(c.debug);
        assert_eq!(c.pin_root, PathBuf::from("/sys/fs/bpf/test-x"));
        assert_eq!(c.state_dir, PathBuf::from("/tmp/state-x/net.a_b-c"));
        assert_eq!(c.dns.unwrap().nameservers, vec!["10.0.0.10"]);
        assert_eq!(
            c.ipam.unwrap().kind,
            IpamKind::Delegate("host-local".into())
        );
        assert_eq!(c.prev_result.unwrap().ips.len(), 1);
        assert_eq!(c.uplink.as_deref(), Some("eth1"));
        assert_eq!(
            c.masq.non_masq.as_ref().unwrap()[0].to_string(),
            "10.0.0.0/8"
        );
        assert_eq!(c.masq.address.unwrap().to_string(), "192.0.2.9");
        assert_eq!(c.masq.address6.unwrap().to_string(), "2001:db8::9");
        assert_eq!(
            c.masq.non_masq.as_ref().unwrap()[1].to_string(),
            "fd00:10::/64"
        );
        assert_eq!(c.masq.ports, Some((62000, 62999)));
        assert_eq!(c.masq.max_flows, 4096);
        assert_eq!(c.masq.timeouts.udp, 5);
        assert_eq!(c.masq.timeouts.udp_unreplied, 3);
        assert_eq!(c.masq.pod_share, 10);
        assert_eq!(c.masq.timeouts.tcp_established, 100);
        assert_eq!(c.masq.timeouts.icmp, 30);
        assert_eq!(c.xdp, XdpMode::Generic);
        assert_eq!(c.nodes[0].node_ip, "192.0.2.2".parse::<IpAddr>().unwrap());
        assert_eq!(c.valid_attachments.unwrap()[0].container_id, "c1");
        let args_ip: IpAddr = "10.22.0.11".parse().unwrap();
        let req = NetConf::parse(&c.raw).unwrap().requested_ips(&[args_ip]);
        assert_eq!(req.len(), 3);
    }

    #[test]
    fn pod_device_takes_veth_netkit_or_auto() {
        for (v, want) in [
            ("veth", PodDeviceKind::Veth),
            ("netkit", PodDeviceKind::Netkit),
            ("auto", PodDeviceKind::Auto),
        ] {
            assert_eq!(parse(with("podDevice", json!(v))).unwrap().pod_device, want);
        }
    }

    #[test]
    fn teardown_ignores_bad_add_only_keys_and_full_does_not() {
        let bad: [(&str, Value); 17] = [
            (
                "runtimeConfig",
                json!({"portMappings": [{"HostPort": "x"}]}),
            ),
            ("runtimeConfig", json!({"bandwidth": {"egressRate": -1}})),
            ("runtimeConfig", json!("not an object")),
            ("args", json!({"cni": {"ips": ["x"]}})),
            ("prevResult", json!({"ips": [{"address": "x"}]})),
            ("dns", json!({"nameservers": ["x"]})),
            ("mtu", json!(1)),
            ("ipMasq", json!("yes")),
            ("debug", json!(3)),
            ("natMaxFlows", json!(1)),
            ("hostPortCgroup", json!("relative")),
            ("ingressRate", json!("fast")),
            ("uplink", json!("way-too-long-ifname")),
            ("xdp", json!("offload")),
            ("podAttach", json!("netkit")),
            ("podDevice", json!("macvlan")),
            ("nodes", json!([{"podCIDR": "x"}])),
        ];
        for (k, v) in bad {
            let conf = with(k, v.clone());
            let full = parse(conf.clone()).unwrap_err();
            assert_eq!(full.code(), 7, "{k}={v}: {full}");
            let c = NetConf::parse_for(conf.to_string().as_bytes(), Strictness::Teardown)
                .unwrap_or_else(|e| panic!("{k}={v}: {e}"));
            assert_eq!(c.strictness, Strictness::Teardown);
            assert_eq!(c.runtime, RuntimeConfig::default(), "{k}");
            assert_eq!(c.name, "slnet");
        }
    }

    #[test]
    fn teardown_still_needs_what_it_uses() {
        for (k, v) in [
            ("pinRoot", json!("relative")),
            ("stateDir", json!(3)),
            ("name", json!("-bad")),
            ("ipam", json!({"type": "../x"})),
            ("cni.dev/valid-attachments", json!([{"ifname": "eth0"}])),
        ] {
            let e = NetConf::parse_for(with(k, v).to_string().as_bytes(), Strictness::Teardown)
                .unwrap_err();
            assert_eq!(e.code(), 7, "{k}: {e}");
        }
        let mut b = base();
        b["cniVersion"] = json!("9.9.9");
        let e = NetConf::parse_for(b.to_string().as_bytes(), Strictness::Teardown).unwrap_err();
        assert_eq!(e.code(), 1);
    }

    #[test]
    fn teardown_is_for_del_and_gc_only() {
        use crate::cni::env::Command;
        assert_eq!(Strictness::for_command(Command::Del), Strictness::Teardown);
        assert_eq!(Strictness::for_command(Command::Gc), Strictness::Teardown);
        for c in [
            Command::Add,
            Command::Check,
            Command::Status,
            Command::Version,
        ] {
            assert_eq!(Strictness::for_command(c), Strictness::Full, "{c}");
        }
    }

    #[test]
    fn args_keys_match_like_go() {
        let c = parse(with("args", json!({"CNI": {"IPs": ["10.22.0.5"]}}))).unwrap();
        assert_eq!(c.arg_ips, vec!["10.22.0.5".parse::<IpAddr>().unwrap()]);
        let e = parse(with("args", json!({"Cni": {"Ips": ["x"]}}))).unwrap_err();
        assert!(e.to_string().contains("args.Cni.Ips"), "{e}");
    }

    #[test]
    fn legacy_gc_key_is_read() {
        let c = parse(with(
            "cni.dev/attachments",
            json!([{"containerID": "c2", "ifname": "net1"}]),
        ))
        .unwrap();
        assert_eq!(c.valid_attachments.unwrap()[0].ifname, "net1");
    }

    #[test]
    fn decode_errors_are_code_6() {
        for raw in ["", "{", "[1,2]", "nul", "{\"cniVersion\": 1}"] {
            let e = NetConf::parse(raw.as_bytes()).unwrap_err();
            assert_eq!(e.code(), 6, "{raw}");
        }
    }

    #[test]
    fn version_errors_are_code_1() {
        for v in ["0.2.0", "2.0.0", "0.1.0"] {
            let e = parse(with("cniVersion", json!(v))).unwrap_err();
            assert_eq!(e.code(), 1, "{v}");
            assert!(e.to_string().contains(v));
        }
        let mut b = base();
        b.as_object_mut().unwrap().remove("cniVersion");
        assert_eq!(parse(b).unwrap_err().code(), 1);
    }

    #[test]
    fn bad_values_are_code_7_naming_key_and_value() {
        let cases = [
            (with("name", json!("-bad")), "name", "-bad"),
            (with("name", json!("a/b")), "name", "a/b"),
            (with("name", json!(7)), "name", "7"),
            (with("mtu", json!(40)), "mtu", "40"),
            (with("mtu", json!("1500")), "mtu", "1500"),
            (with("mtu", json!(70000)), "mtu", "70000"),
            (with("ipMasq", json!("yes")), "ipMasq", "yes"),
            (with("debug", json!(1)), "debug", "1"),
            (with("pinRoot", json!("relative")), "pinRoot", "relative"),
            (
                with("pinRoot", json!("/sys/fs/bpf/../x")),
                "pinRoot",
                "/sys/fs/bpf/../x",
            ),
            (with("stateDir", json!(3)), "stateDir", "3"),
            (with("ipam", json!([])), "ipam", "[]"),
            (with("ipam", json!({})), "ipam.type", "\"\""),
            (with("ipam", json!({"type": "../x"})), "ipam.type", "../x"),
            (
                with("dns", json!({"nameservers": ["nope"]})),
                "dns.nameservers",
                "nope",
            ),
            (
                with("runtimeConfig", json!({"mac": "x"})),
                "runtimeConfig.mac",
                "x",
            ),
            (
                with("args", json!({"cni": {"ips": ["x"]}})),
                "args.cni.ips",
                "x",
            ),
            (
                with("prevResult", json!({"ips": [{"address": "x"}]})),
                "prevResult.ips[0].address",
                "x",
            ),
            (
                with("cni.dev/valid-attachments", json!([{"ifname": "eth0"}])),
                "cni.dev/valid-attachments[0]",
                "eth0",
            ),
            (
                with("uplink", json!("way-too-long-ifname")),
                "uplink",
                "way-too-long-ifname",
            ),
            (with("xdp", json!("offload")), "xdp", "offload"),
            (with("podAttach", json!("netkit")), "podAttach", "netkit"),
            (with("podDevice", json!("tap")), "podDevice", "tap"),
            (
                with("nonMasqueradeCIDRs", json!(["10.0.0.0"])),
                "nonMasqueradeCIDRs[0]",
                "10.0.0.0",
            ),
            (
                with("masqueradeAddress", json!("fd00::1::2")),
                "masqueradeAddress",
                "fd00::1::2",
            ),
            (
                with("masqueradeAddress", json!(["fd00::1", "fd00::2"])),
                "masqueradeAddress[1]",
                "fd00::2",
            ),
            (
                with("masqueradePorts", json!("100-200")),
                "masqueradePorts",
                "100-200",
            ),
            (
                with("masqueradePorts", json!("65000-64000")),
                "masqueradePorts",
                "65000-64000",
            ),
            (with("natMaxFlows", json!(10)), "natMaxFlows", "10"),
            (
                with("natTimeouts", json!({"udpUnreplied": 0})),
                "natTimeouts.udpUnreplied",
                "0",
            ),
            (with("natPodShare", json!(0)), "natPodShare", "0"),
            (with("natPodShare", json!(101)), "natPodShare", "101"),
            (
                with("natTimeouts", json!({"udp": 0})),
                "natTimeouts.udp",
                "0",
            ),
            (
                with(
                    "nodes",
                    json!([{"podCIDR": "10.2.0.0", "nodeIP": "192.0.2.1"}]),
                ),
                "nodes[0].podCIDR",
                "10.2.0.0",
            ),
            (
                with("nodes", json!([{"podCIDR": "10.2.0.0/24", "nodeIP": "x"}])),
                "nodes[0].nodeIP",
                "x",
            ),
            (
                with(
                    "nodes",
                    json!([{"podCIDR": "10.2.0.0/24", "nodeIP": "fd00::1"}]),
                ),
                "nodes[0].nodeIP",
                "fd00::1",
            ),
        ];
        for (v, key, val) in cases {
            let e = parse(v.clone()).unwrap_err();
            assert_eq!(e.code(), 7, "{v}: {e}");
            let s = e.to_string();
            assert!(
                s.contains(key) && s.contains(val),
                "{s} should name {key} and {val}"
            );
        }
    }

    #[test]
    fn dotted_network_names_get_dot_free_distinct_pin_dirs() {
        use sluice_common::user::pin_dir_name;
        assert_eq!(pin_dir_name("k8s-pods"), "k8s-pods");
        let a = pin_dir_name("a.b");
        assert!(!a.contains('.'));
        assert_ne!(a, pin_dir_name("a_b"));
        assert_ne!(a, pin_dir_name("a.c"));
        let c = parse(with("name", json!("net.one"))).unwrap();
        assert!(!c.pin_root.to_string_lossy().contains('.'));
    }

    #[test]
    fn peek_version_tolerates_garbage() {
        assert_eq!(
            peek_version(b"{\"cniVersion\":\"0.4.0\"}").as_deref(),
            Some("0.4.0")
        );
        assert_eq!(peek_version(b"garbage"), None);
    }
}
