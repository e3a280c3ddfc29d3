//! hostPort mappings in the pinned maps, and the socket hooks that serve the
//! node's own connections to them (the aya calls of the hostPort feature).
use std::{
    fs,
    net::{IpAddr, Ipv4Addr},
    os::fd::AsFd,
    path::Path,
};

use aya::{
    maps::{Array, HashMap, MapData, MapError},
    programs::{links::FdLink, CgroupAttachMode, CgroupSockAddr},
};
use aya_obj::programs::CgroupSockAddrAttachType;
use sluice_common::{
    map_names, port_flags, prog_names, EndpointInfo, HostPortConfig, HpFlow, NatKey, PortKey,
    PortTarget, SockKey, SockOrig,
};

use super::bpf::{dp_err, open_map};
use crate::{
    cni::runtime_config::{PortMapping, Protocol},
    error::Error,
};

/// The socket hooks, their attach types, and their link pins (`links/cgroup-<prog>`).
pub const HOOKS: [(&str, CgroupSockAddrAttachType); 4] = [
    (prog_names::HP_CONNECT4, CgroupSockAddrAttachType::Connect4),
    (
        prog_names::HP_SENDMSG4,
        CgroupSockAddrAttachType::UDPSendMsg4,
    ),
    (
        prog_names::HP_RECVMSG4,
        CgroupSockAddrAttachType::UDPRecvMsg4,
    ),
    (
        prog_names::HP_GETPEERNAME4,
        CgroupSockAddrAttachType::GetPeerName4,
    ),
];

pub const HOOK_LINK_PREFIX: &str = "cgroup-";

const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_SCTP: u8 = 132;
const BPF_NOEXIST: u64 = 1;

pub fn proto_number(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => IPPROTO_TCP,
        Protocol::Udp => IPPROTO_UDP,
        Protocol::Sctp => IPPROTO_SCTP,
    }
}

fn proto_name(n: u8) -> &'static str {
    match n {
        IPPROTO_TCP => "tcp",
        IPPROTO_UDP => "udp",
        IPPROTO_SCTP => "sctp",
        _ => "?",
    }
}

/// `*:8080/tcp` or `192.168.1.5:8080/tcp`.
pub fn describe(k: &PortKey) -> String {
    let host = if k.host_ip == [0; 4] {
        "*".to_string()
    } else {
        Ipv4Addr::from(k.host_ip).to_string()
    };
    format!(
        "{host}:{}/{}",
        u16::from_be(k.host_port),
        proto_name(k.proto)
    )
}

fn describe_target(t: &PortTarget) -> String {
    format!("{}:{}", Ipv4Addr::from(t.pod_ip), u16::from_be(t.pod_port))
}

/// A pod's first IPv4 address: where its hostPorts lead.
pub fn first_v4(ips: &[IpAddr]) -> Option<Ipv4Addr> {
    ips.iter().find_map(|ip| match ip {
        IpAddr::V4(v4) => Some(*v4),
        IpAddr::V6(_) => None,
    })
}

/// The map entries for a pod's `portMappings` (`key` names the list in errors).
/// IPv4 only; SCTP keeps its port (its CRC32c covers the ports, RFC 4960 6.8,
/// and cannot be updated incrementally).
pub fn entries(
    mappings: &[PortMapping],
    key: &str,
    pod_ip: Option<Ipv4Addr>,
    pod_ifindex: u32,
) -> Result<Vec<(PortKey, PortTarget)>, Error> {
    if mappings.is_empty() {
        return Ok(Vec::new());
    }
    let pod_ip = pod_ip.ok_or_else(|| Error::UnsupportedField {
        key: key.into(),
        value: format!("{} mappings", mappings.len()),
        reason: "hostPort mappings need an IPv4 pod address".into(),
    })?;
    mappings
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let host_ip = match m.host_ip {
                None => [0; 4],
                Some(IpAddr::V4(a)) => a.octets(),
                Some(IpAddr::V6(a)) => {
                    return Err(Error::UnsupportedField {
                        key: format!("{key}[{i}].hostIP"),
                        value: a.to_string(),
                        reason: "hostPort mappings are IPv4 only".into(),
                    })
                }
            };
            if m.protocol == Protocol::Sctp && m.host_port != m.container_port {
                return Err(Error::config(
                    format!("{key}[{i}].containerPort"),
                    m.container_port,
                    format!(
                        "an sctp mapping must keep the port (hostPort {}): SCTP's CRC32c covers the ports",
                        m.host_port
                    ),
                ));
            }
            Ok((
                PortKey {
                    host_ip,
                    host_port: m.host_port.to_be(),
                    proto: proto_number(m.protocol),
                    _pad: 0,
                },
                PortTarget {
                    pod_ip: pod_ip.octets(),
                    pod_port: m.container_port.to_be(),
                    flags: 0,
                    pod_ifindex,
                },
            ))
        })
        .collect()
}

fn ports_map(maps_dir: &Path) -> Result<HashMap<MapData, PortKey, PortTarget>, Error> {
    HashMap::try_from(open_map(maps_dir, map_names::PORTS)?).map_err(|e| dp_err("open sl_ports", e))
}

/// Who owns a mapping: the container id (and interface) of its pod, from
/// `sl_ep_info`, or "an operator".
fn owner(maps_dir: &Path, t: &PortTarget) -> String {
    let text = |b: &[u8]| String::from_utf8_lossy(sluice_common::from_cbuf(b)).into_owned();
    let who = open_map(maps_dir, map_names::ENDPOINT_INFO)
        .ok()
        .and_then(|m| HashMap::<MapData, u32, EndpointInfo>::try_from(m).ok())
        .and_then(|m| m.get(&t.pod_ifindex, 0).ok())
        .map(|i| format!("container {} ({})", text(&i.container_id), text(&i.ifname)));
    let who = who.unwrap_or_else(|| format!("the pod on ifindex {}", t.pod_ifindex));
    if t.flags & port_flags::OPERATOR != 0 {
        format!("an operator (sluicectl ports add, to {who})")
    } else {
        who
    }
}

fn conflict(maps_dir: &Path, k: &PortKey, t: &PortTarget) -> Error {
    Error::PortConflict {
        port: describe(k),
        target: describe_target(t),
        owner: owner(maps_dir, t),
    }
}

/// Keys that would overlap `k`: a wildcard mapping overlaps the same port on each
/// node address, and the other way round.
fn overlapping(k: &PortKey, node_addrs: &[[u8; 4]]) -> Vec<PortKey> {
    if k.host_ip == [0; 4] {
        node_addrs
            .iter()
            .map(|a| PortKey { host_ip: *a, ..*k })
            .collect()
    } else {
        vec![PortKey {
            host_ip: [0; 4],
            ..*k
        }]
    }
}

/// Publishes `entries`, all or none: each key is taken with BPF_NOEXIST, so two
/// ADDs racing for one port cannot both win. A key the same pod holds already
/// (a repeated ADD) is fine. Conflicts name the port and the owner.
pub fn add(maps_dir: &Path, entries: &[(PortKey, PortTarget)]) -> Result<(), Error> {
    if entries.is_empty() {
        return Ok(());
    }
    let mut map = ports_map(maps_dir)?;
    let node_addrs = node_addrs(maps_dir)?;
    let mut taken: Vec<PortKey> = Vec::new();
    let mut result = Ok(());
    for (k, t) in entries {
        for o in overlapping(k, &node_addrs) {
            if let Ok(other) = map.get(&o, 0) {
                if other.pod_ifindex != t.pod_ifindex {
                    result = Err(conflict(maps_dir, &o, &other));
                    break;
                }
            }
        }
        if result.is_err() {
            break;
        }
        match map.insert(k, t, BPF_NOEXIST) {
            Ok(()) => taken.push(*k),
            Err(e) if is_eexist(&e) => match map.get(k, 0) {
                Ok(other) if other == *t => {}
                Ok(other) => {
                    result = Err(conflict(maps_dir, k, &other));
                    break;
                }
                Err(e) => {
                    result = Err(dp_err(format!("read sl_ports {}", describe(k)), e));
                    break;
                }
            },
            Err(e) => {
                result = Err(dp_err(format!("add sl_ports {}", describe(k)), e));
                break;
            }
        }
    }
    if result.is_err() {
        for k in &taken {
            let _ = map.remove(k);
        }
        return result;
    }
    activate(maps_dir)
}

fn is_eexist(e: &MapError) -> bool {
    matches!(e, MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(libc::EEXIST))
}

/// Removes the mappings at `keys` that belong to the pod on `pod_ifindex`
/// (a mapping another pod took meanwhile stays). Returns how many went.
pub fn remove(maps_dir: &Path, keys: &[PortKey], pod_ifindex: u32) -> Result<usize, Error> {
    if keys.is_empty() || !maps_dir.join(map_names::PORTS).exists() {
        return Ok(0);
    }
    let mut map = ports_map(maps_dir)?;
    let mut n = 0;
    for k in keys {
        if map.get(k, 0).is_ok_and(|t| t.pod_ifindex == pod_ifindex) && map.remove(k).is_ok() {
            n += 1;
        }
    }
    Ok(n)
}

/// Removes every mapping whose pod is on one of `ifindexes` (operator mappings
/// included). Walks the whole map: for DEL without a record, and GC.
pub fn remove_of_pods(maps_dir: &Path, ifindexes: &[u32]) -> Result<usize, Error> {
    if ifindexes.is_empty() || !maps_dir.join(map_names::PORTS).exists() {
        return Ok(0);
    }
    let mut map = ports_map(maps_dir)?;
    let doomed: Vec<PortKey> = map
        .iter()
        .filter_map(Result::ok)
        .filter(|(_, t)| ifindexes.contains(&t.pod_ifindex))
        .map(|(k, _)| k)
        .collect();
    for k in &doomed {
        let _ = map.remove(k);
    }
    Ok(doomed.len())
}

/// Forgets the translated flows and socket rewrites of pod addresses `ips`, so
/// a later pod with a reused address inherits none.
pub fn flush_flows(maps_dir: &Path, ips: &[[u8; 4]]) -> Result<(), Error> {
    if ips.is_empty() || !maps_dir.join(map_names::HP_CT).exists() {
        return Ok(());
    }
    let mut ct: HashMap<MapData, NatKey, HpFlow> =
        HashMap::try_from(open_map(maps_dir, map_names::HP_CT)?)
            .map_err(|e| dp_err("open sl_hp_ct", e))?;
    let doomed: Vec<NatKey> = ct
        .iter()
        .filter_map(Result::ok)
        .filter(|(k, f)| ips.contains(&k.src_ip) || ips.contains(&f.dst_ip))
        .map(|(k, _)| k)
        .collect();
    for k in &doomed {
        let _ = ct.remove(k);
    }
    let mut socks: HashMap<MapData, SockKey, SockOrig> =
        HashMap::try_from(open_map(maps_dir, map_names::HP_SOCK)?)
            .map_err(|e| dp_err("open sl_hp_sock", e))?;
    let doomed: Vec<SockKey> = socks
        .keys()
        .filter_map(Result::ok)
        .filter(|k| ips.contains(&k.pod_ip))
        .collect();
    for k in &doomed {
        let _ = socks.remove(k);
    }
    Ok(())
}

/// Every mapping whose pod is not one of `live` (host veth ifindexes).
pub fn remove_orphans(maps_dir: &Path, live: &[u32]) -> Result<usize, Error> {
    if !maps_dir.join(map_names::PORTS).exists() {
        return Ok(0);
    }
    let map = ports_map(maps_dir)?;
    let orphans: Vec<u32> = map
        .iter()
        .filter_map(Result::ok)
        .map(|(_, t)| t.pod_ifindex)
        .filter(|i| !live.contains(i))
        .collect();
    drop(map);
    remove_of_pods(maps_dir, &orphans)
}

/// CHECK: each entry is in place, for this pod.
pub fn check(maps_dir: &Path, entries: &[(PortKey, PortTarget)]) -> Result<(), Error> {
    if entries.is_empty() {
        return Ok(());
    }
    let map = ports_map(maps_dir)
        .map_err(|e| Error::check(format!("hostPort mappings unreadable: {e}")))?;
    for (k, t) in entries {
        match map.get(k, 0) {
            Ok(found) if found == *t => {}
            Ok(found) => {
                return Err(Error::check(format!(
                    "hostPort {} goes to {} (ifindex {}), not {} (ifindex {})",
                    describe(k),
                    describe_target(&found),
                    found.pod_ifindex,
                    describe_target(t),
                    t.pod_ifindex
                )))
            }
            Err(_) => {
                return Err(Error::check(format!(
                    "hostPort mapping {} -> {} is missing",
                    describe(k),
                    describe_target(t)
                )))
            }
        }
    }
    Ok(())
}

fn node_addrs_map(maps_dir: &Path) -> Result<HashMap<MapData, [u8; 4], u8>, Error> {
    HashMap::try_from(open_map(maps_dir, map_names::NODE_ADDRS)?)
        .map_err(|e| dp_err("open sl_node_addrs", e))
}

/// The node addresses in `sl_node_addrs`.
pub fn node_addrs(maps_dir: &Path) -> Result<Vec<[u8; 4]>, Error> {
    Ok(node_addrs_map(maps_dir)?
        .keys()
        .filter_map(Result::ok)
        .collect())
}

/// Makes `sl_node_addrs` hold exactly `addrs` (the node's IPv4 addresses now).
pub fn set_node_addrs(maps_dir: &Path, addrs: &[[u8; 4]]) -> Result<(), Error> {
    let mut map = node_addrs_map(maps_dir)?;
    let old: Vec<[u8; 4]> = map.keys().filter_map(Result::ok).collect();
    for a in addrs {
        if !old.contains(a) {
            map.insert(a, 1, 0)
                .map_err(|e| dp_err(format!("add node address {}", Ipv4Addr::from(*a)), e))?;
        }
    }
    for a in old.iter().filter(|a| !addrs.contains(a)) {
        let _ = map.remove(a);
    }
    Ok(())
}

/// Turns the pod programs' flow lookup on and records the node namespace.
fn activate(maps_dir: &Path) -> Result<(), Error> {
    let mut arr: Array<MapData, HostPortConfig> =
        Array::try_from(open_map(maps_dir, map_names::HP_CONFIG)?)
            .map_err(|e| dp_err("open sl_hp_config", e))?;
    let cfg = HostPortConfig {
        netns_cookie: sluice_common::user::netns_cookie()
            .map_err(|e| Error::io("reading the node's SO_NETNS_COOKIE", e))?,
        active: 1,
        _pad: 0,
    };
    if arr.get(&0, 0).ok() != Some(cfg) {
        arr.set(0, cfg, 0)
            .map_err(|e| dp_err("write sl_hp_config", e))?;
    }
    Ok(())
}

/// Whether `dir` is on a cgroup2 file system (statfs magic CGROUP2_SUPER_MAGIC).
// `f_type`'s integer type differs between architectures.
#[allow(clippy::useless_conversion)]
fn is_cgroup2(dir: &fs::File) -> bool {
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    // SAFETY: a zeroed statfs buffer and a valid fd.
    unsafe {
        let mut s: libc::statfs = std::mem::zeroed();
        libc::fstatfs(std::os::fd::AsRawFd::as_raw_fd(dir), &raw mut s) == 0
            && i64::from(s.f_type) == CGROUP2_SUPER_MAGIC
    }
}

/// Whether the socket hooks are attached (their link pins exist).
pub fn hooks_attached(links_dir: &Path) -> bool {
    HOOKS
        .iter()
        .all(|(name, _)| links_dir.join(format!("{HOOK_LINK_PREFIX}{name}")).exists())
}

/// Attaches the socket hooks to the cgroup v2 directory `cgroup` and pins their
/// links, so they outlive the plugin. Runs under the datapath's exclusive lock.
pub fn attach_hooks(progs_dir: &Path, links_dir: &Path, cgroup: &Path) -> Result<(), Error> {
    let dir = fs::File::open(cgroup).map_err(|e| {
        Error::config(
            "hostPortCgroup",
            cgroup.display(),
            format!("cannot open the cgroup directory: {e}"),
        )
    })?;
    if !is_cgroup2(&dir) {
        return Err(Error::config(
            "hostPortCgroup",
            cgroup.display(),
            format!(
                "not a cgroup v2 directory (socket hooks need one; the v2 hierarchy is mounted at {})",
                sluice_common::user::cgroup2_mount()
                    .map_or("no place on this node".into(), |p| p.display().to_string())
            ),
        ));
    }
    for (name, attach_type) in HOOKS {
        let lp = links_dir.join(format!("{HOOK_LINK_PREFIX}{name}"));
        if lp.exists() {
            continue;
        }
        let mut prog = CgroupSockAddr::from_pin(progs_dir.join(name), attach_type)
            .map_err(|e| dp_err(format!("open pinned program {name}"), e))?;
        let id = prog
            .attach(dir.as_fd(), CgroupAttachMode::Single)
            .map_err(|e| dp_err(format!("attach {name} to cgroup {}", cgroup.display()), e))?;
        let link: FdLink = prog
            .take_link(id)
            .map_err(|e| dp_err(format!("take {name} link"), e))?
            .try_into()
            .map_err(|e| dp_err(format!("{name} link is not a bpf_link"), e))?;
        link.pin(&lp)
            .map(drop)
            .map_err(|e| dp_err(format!("pin {}", lp.display()), e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pm(host: u16, cont: u16, proto: Protocol, ip: Option<&str>) -> PortMapping {
        PortMapping {
            host_port: host,
            container_port: cont,
            protocol: proto,
            host_ip: ip.map(|s| s.parse().unwrap()),
        }
    }

    #[test]
    fn entries_pack_ports_in_network_order() {
        let pod: Ipv4Addr = "10.1.2.3".parse().unwrap();
        let e = entries(
            &[
                pm(8080, 80, Protocol::Tcp, None),
                pm(5353, 53, Protocol::Udp, Some("192.0.2.7")),
                pm(9999, 9999, Protocol::Sctp, None),
            ],
            "pm",
            Some(pod),
            42,
        )
        .unwrap();
        assert_eq!(e.len(), 3);
        let (k, t) = e[0];
        assert_eq!(k.host_ip, [0; 4]);
        assert_eq!(k.host_port.to_ne_bytes(), 8080u16.to_be_bytes());
        assert_eq!(k.proto, 6);
        assert_eq!(t.pod_ip, [10, 1, 2, 3]);
        assert_eq!(t.pod_port.to_ne_bytes(), 80u16.to_be_bytes());
        assert_eq!(t.pod_ifindex, 42);
        assert_eq!(t.flags, 0);
        assert_eq!(e[1].0.host_ip, [192, 0, 2, 7]);
        assert_eq!(e[1].0.proto, 17);
        assert_eq!(e[2].0.proto, 132);
        assert_eq!(describe(&e[0].0), "*:8080/tcp");
        assert_eq!(describe(&e[1].0), "192.0.2.7:5353/udp");
    }

    #[test]
    fn entries_refuse_what_the_datapath_cannot_serve() {
        let pod = Some("10.1.2.3".parse().unwrap());
        let e = entries(&[pm(9999, 9998, Protocol::Sctp, None)], "pm", pod, 1).unwrap_err();
        assert_eq!(e.code(), 7);
        assert!(e.to_string().contains("pm[0].containerPort=9998"), "{e}");
        let e = entries(
            &[
                pm(80, 80, Protocol::Tcp, None),
                pm(81, 81, Protocol::Tcp, Some("fd00::1")),
            ],
            "pm",
            pod,
            1,
        )
        .unwrap_err();
        assert_eq!(e.code(), 2);
        assert!(e.to_string().contains("pm[1].hostIP=fd00::1"), "{e}");
        let e = entries(&[pm(80, 80, Protocol::Tcp, None)], "pm", None, 1).unwrap_err();
        assert_eq!(e.code(), 2);
        assert!(entries(&[], "pm", None, 1).unwrap().is_empty());
    }

    #[test]
    fn wildcard_and_specific_mappings_overlap() {
        let any = PortKey {
            host_ip: [0; 4],
            host_port: 80u16.to_be(),
            proto: 6,
            _pad: 0,
        };
        let addrs = [[192, 0, 2, 1], [10, 0, 0, 1]];
        let o = overlapping(&any, &addrs);
        assert_eq!(o.len(), 2);
        assert!(o
            .iter()
            .all(|k| k.host_port == any.host_port && k.proto == 6));
        assert_eq!(o[0].host_ip, [192, 0, 2, 1]);
        let one = PortKey {
            host_ip: [192, 0, 2, 1],
            ..any
        };
        assert_eq!(overlapping(&one, &addrs), vec![any]);
    }
}
