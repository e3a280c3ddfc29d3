//! hostPort on the plugin's side: a pod's `portMappings` as `sl_ports`
//! entries, and the cgroup the node-local socket hooks attach to. The map
//! rules (overlaps, conflicts, what goes with a pod) are in
//! `sluice_maps::hostport`. The socket hooks (`hp_*`) are attached here, with
//! `sluice_maps::sock_hooks`.
use std::{
    fs,
    net::IpAddr,
    os::fd::AsFd,
    path::{Path, PathBuf},
};

use aya::programs::{CgroupAttachMode, CgroupSockAddr};
use aya_obj::programs::CgroupSockAddrAttachType;
use sluice_common::{prog_names, programs};
use sluice_maps::PinRoot;

use sluice_maps::hostport::{V4, V6};

use super::{links::dp_err, Attachment, Gone, NodeSettings, PORT_MAPPINGS};

use sluice_common::{Addr6, PortKey, PortKey6, PortTarget, PortTargetOf};

use crate::{
    cni::runtime_config::PortMapping,
    error::{Error, Errors},
    netlink::NodeAddrs,
};

/// A pod's `sl_ports` and `sl_ports6` entries.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PodPorts {
    pub v4: Vec<(PortKey, PortTarget)>,
    pub v6: Vec<(PortKey6, sluice_common::PortTarget6)>,
}

impl PodPorts {
    pub fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }
}

/// Where a mapping of a pod (host veth `pod_ifindex`) at `pod_ip` goes.
fn target<A>(pod_ip: A, m: &PortMapping, pod_ifindex: u32) -> PortTargetOf<A> {
    PortTargetOf {
        pod_ip,
        pod_port: m.container_port.to_be(),
        flags: 0,
        pod_ifindex,
    }
}

/// The map entries for a pod's `mappings` (validated when the config was
/// parsed: SCTP keeping its port). As the reference portmap does, a mapping
/// without `hostIP` publishes the port on both families the pod has (each to
/// the pod's first address of the family), one with a `hostIP` on that
/// address's family only. `key` names the list in the error a pod without an
/// address of the needed family gets.
pub fn entries(
    mappings: &[PortMapping],
    key: &str,
    pod_ips: &[IpAddr],
    pod_ifindex: u32,
) -> Result<PodPorts, Error> {
    let mut out = PodPorts::default();
    if mappings.is_empty() {
        return Ok(out);
    }
    let v4 = pod_ips.iter().find_map(|ip| match ip {
        IpAddr::V4(a) => Some(a.octets()),
        IpAddr::V6(_) => None,
    });
    let v6 = pod_ips.iter().find_map(|ip| match ip {
        IpAddr::V6(a) => Some(Addr6(a.octets())),
        IpAddr::V4(_) => None,
    });
    let missing = |m: &PortMapping, family: &str| Error::UnsupportedField {
        key: key.into(),
        value: format!("hostIP {}", m.host_ip.map_or("*".into(), |a| a.to_string())),
        reason: format!("the pod has no {family} address for this mapping"),
    };
    for m in mappings {
        let proto = m.protocol.number();
        match m.host_ip {
            Some(IpAddr::V4(a)) => {
                let pod = v4.ok_or_else(|| missing(m, "IPv4"))?;
                out.v4.push((
                    PortKey::new(a.octets(), m.host_port, proto),
                    target(pod, m, pod_ifindex),
                ));
            }
            Some(IpAddr::V6(a)) => {
                let pod = v6.ok_or_else(|| missing(m, "IPv6"))?;
                out.v6.push((
                    PortKey6::new(Addr6(a.octets()), m.host_port, proto),
                    target(pod, m, pod_ifindex),
                ));
            }
            None => {
                if v4.is_none() && v6.is_none() {
                    return Err(missing(m, "IP"));
                }
                if let Some(pod) = v4 {
                    out.v4.push((
                        PortKey::new([0; 4], m.host_port, proto),
                        target(pod, m, pod_ifindex),
                    ));
                }
                if let Some(pod) = v6 {
                    out.v6.push((
                        PortKey6::new(Addr6::default(), m.host_port, proto),
                        target(pod, m, pod_ifindex),
                    ));
                }
            }
        }
    }
    Ok(out)
}

/// A pod's entries, from its spec.
pub(super) fn pod_ports(pod: &Attachment<'_>) -> Result<PodPorts, Error> {
    entries(
        &pod.port_mappings,
        PORT_MAPPINGS,
        &pod.ips,
        pod.host_ifindex,
    )
}

/// The node's addresses (what wildcard mappings match), when this ADD maps
/// ports: refreshed then.
pub(super) fn prepare(root: &PinRoot, settings: &NodeSettings) -> Result<(), Error> {
    match &settings.node_addrs {
        Some(addrs) => prepare_addrs(root, addrs),
        None => Ok(()),
    }
}

/// The node's addresses, what wildcard mappings match.
pub(super) fn prepare_addrs(root: &PinRoot, addrs: &NodeAddrs) -> Result<(), Error> {
    sluice_maps::hostport::set_node_addrs::<V4>(root, &addrs.v4)?;
    if let Some(v6) = &addrs.v6 {
        let v6: Vec<Addr6> = v6.iter().copied().map(Addr6).collect();
        sluice_maps::hostport::set_node_addrs::<V6>(root, &v6)?;
    }
    Ok(())
}

/// Publishes the pod's mappings, all or none: a conflict names the owner and
/// fails the ADD, whose rollback removes the rest.
pub(super) fn attach(root: &PinRoot, pod: &Attachment<'_>) -> Result<(), Error> {
    let ports = pod_ports(pod)?;
    if ports.is_empty() {
        return Ok(());
    }
    let cookie = match sluice_maps::hostport::node_netns_cookie(root)? {
        Some(c) => c,
        None => learn_netns_cookie(root)?,
    };
    sluice_maps::hostport::add_pod(root, &ports.v4, &ports.v6, cookie)?;
    Ok(())
}

/// Removes the mappings of a pod that is going (operator ones too) and the
/// flows through them.
pub(super) fn detach(root: &PinRoot, gone: &Gone<'_>, errors: &mut Errors) {
    errors.note(remove_mappings(root, gone));
    errors.note(sluice_maps::hostport::forget_pods::<V4>(root, &gone.v4));
    let v6: Vec<Addr6> = gone.v6.iter().copied().map(Addr6).collect();
    errors.note(sluice_maps::hostport::forget_pods::<V6>(root, &v6));
}

/// The mappings of the pods on `gone.ifindexes`: by key from what the record
/// says the pod was given, unless operator mappings may exist (they are in no
/// record); then, without a record, or with one whose mappings no longer make
/// keys, by a walk of every mapping.
fn remove_mappings(root: &PinRoot, gone: &Gone<'_>) -> Result<(), Error> {
    let by_key = gone
        .pod
        .filter(|_| !sluice_maps::hostport::operator_mappings_marked(root))
        .and_then(|p| entries(&p.port_mappings, PORT_MAPPINGS, &p.ips, p.host_ifindex).ok());
    if let Some(ports) = by_key {
        sluice_maps::hostport::remove_mappings::<V4>(root, &ports.v4)?;
        sluice_maps::hostport::remove_mappings::<V6>(root, &ports.v6)?;
        return Ok(());
    }
    sluice_maps::hostport::remove_of_pods::<V4>(root, &gone.ifindexes)?;
    sluice_maps::hostport::remove_of_pods::<V6>(root, &gone.ifindexes)?;
    Ok(())
}

/// CHECK: every mapping of the pod is published, to it.
pub(super) fn check(root: &PinRoot, pod: &Attachment<'_>) -> Result<(), Error> {
    let ports = pod_ports(pod)?;
    sluice_maps::hostport::check::<V4>(root, &ports.v4)?;
    sluice_maps::hostport::check::<V6>(root, &ports.v6)?;
    Ok(())
}

/// GC: mappings whose pod is gone (operator ones too); `live` are the host
/// devices of the endpoints that stay.
pub(super) fn collect(root: &PinRoot, live: &[u32], errors: &mut Errors) {
    errors.note(sluice_maps::hostport::remove_orphans::<V4>(root, live));
    errors.note(sluice_maps::hostport::remove_orphans::<V6>(root, live));
}

/// Whether `dir` is on a cgroup2 file system (statfs magic `CGROUP2_SUPER_MAGIC`).
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

/// Opens `hostPortCgroup`, refusing what is not a cgroup v2 directory (socket
/// hooks attach to v2 cgroups only).
pub fn open_cgroup(cgroup: &Path) -> Result<fs::File, Error> {
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
    Ok(dir)
}

// --- the socket hooks (the node's own connections to hostPorts) ---------------

/// Whether the socket hooks are attached (their link pins exist).
pub(super) fn hooks_attached(root: &PinRoot) -> bool {
    sluice_maps::sock_hooks::attached(root, &programs::SOCK_HOOKS)
}

/// Attaches the socket hooks to the cgroup v2 directory `cgroup` (opened) and
/// pins their links, so they outlive the plugin. Attached ones stay.
pub(super) fn attach_hooks(root: &PinRoot, cgroup: &fs::File, shown: &Path) -> Result<(), Error> {
    sluice_maps::sock_hooks::attach(root, &programs::SOCK_HOOKS, cgroup, shown)
        .map_err(|e| dp_err("attach the hostPort socket hooks", e))
}

/// The node namespace's cookie on a kernel without `SO_NETNS_COOKIE` (before
/// 5.14): `hp_learn4` is attached for a moment to this process's own cgroup
/// (v2), a UDP socket connects to `LEARN_ADDR` (no packet is sent), and the
/// program records the socket's netns cookie under the socket's cookie
/// (`SO_COOKIE`, 4.12). The program touches no other connect.
pub(super) fn learn_netns_cookie(root: &PinRoot) -> Result<u64, Error> {
    let op = "learn the node namespace's cookie (no SO_NETNS_COOKIE before Linux 5.14)";
    let own = own_cgroup2().ok_or_else(|| dp_err(op, "this process is in no cgroup v2"))?;
    let dir =
        fs::File::open(&own).map_err(|e| dp_err(format!("{op}: open {}", own.display()), e))?;
    let mut prog = CgroupSockAddr::from_pin(
        root.progs_dir().join(prog_names::HP_LEARN4),
        CgroupSockAddrAttachType::Connect4,
    )
    .map_err(|e| dp_err(op, e))?;
    let id = prog
        // A bpf_link: other programs on the cgroup stay (links are multi-attach).
        .attach(dir.as_fd(), CgroupAttachMode::Single)
        .map_err(|e| dp_err(format!("{op}: attach to {}", own.display()), e))?;
    let learned = (|| -> std::io::Result<u64> {
        let (ip, port) = programs::LEARN_ADDR;
        let s = std::net::UdpSocket::bind("127.0.0.1:0")?;
        s.connect((std::net::Ipv4Addr::from(ip), port))?;
        socket_cookie(&s)
    })();
    // Detached whatever happened (dropping the program would detach it too).
    let _ = prog.detach(id);
    let sock = learned.map_err(|e| dp_err(op, e))?;
    sluice_maps::hostport::take_learned_cookie(root, sock)?
        .ok_or_else(|| dp_err(op, "hp_learn4 recorded nothing"))
}

/// `SO_COOKIE` of a socket.
fn socket_cookie(s: &std::net::UdpSocket) -> std::io::Result<u64> {
    const SO_COOKIE: libc::c_int = 57;
    sluice_common::user::sockopt_u64(s, SO_COOKIE)
}

/// This process's cgroup v2 directory (`0::<path>` of /proc/self/cgroup under
/// the v2 mount).
fn own_cgroup2() -> Option<PathBuf> {
    let mount = sluice_common::user::cgroup2_mount()?;
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(mount.join(rel.trim_start_matches('/')))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::runtime_config::Protocol;

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
        let pod: IpAddr = "10.1.2.3".parse().unwrap();
        let e = entries(
            &[
                pm(8080, 80, Protocol::Tcp, None),
                pm(5353, 53, Protocol::Udp, Some("192.0.2.7")),
                pm(9999, 9999, Protocol::Sctp, None),
            ],
            "pm",
            &[pod],
            42,
        )
        .unwrap();
        assert!(e.v6.is_empty());
        let e = e.v4;
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
    }

    #[test]
    fn a_mapping_needs_an_address_of_its_family() {
        let e = entries(&[pm(80, 80, Protocol::Tcp, None)], "pm", &[], 1).unwrap_err();
        assert_eq!(e.code(), 2);
        assert!(entries(&[], "pm", &[], 1).unwrap().is_empty());
        let v4: IpAddr = "10.1.2.3".parse().unwrap();
        let e = entries(
            &[pm(80, 80, Protocol::Tcp, Some("fd00::1"))],
            "pm",
            &[v4],
            1,
        )
        .unwrap_err();
        assert_eq!(e.code(), 2);
        assert!(e.to_string().contains("IPv6"), "{e}");
    }

    #[test]
    fn dual_stack_pods_publish_wildcard_mappings_on_both_families() {
        let ips: Vec<IpAddr> = vec!["10.1.2.3".parse().unwrap(), "fd00:7a::3".parse().unwrap()];
        let e = entries(
            &[
                pm(8080, 80, Protocol::Tcp, None),
                pm(5353, 53, Protocol::Udp, Some("fd00:5a::1")),
                pm(9090, 90, Protocol::Tcp, Some("192.0.2.7")),
            ],
            "pm",
            &ips,
            7,
        )
        .unwrap();
        assert_eq!(e.v4.len(), 2);
        assert_eq!(e.v6.len(), 2);
        let (k, t) = e.v6[0];
        assert_eq!(k.host_ip, Addr6::default());
        assert_eq!(k.port(), 8080);
        assert_eq!(
            t.pod_ip.0,
            "fd00:7a::3".parse::<std::net::Ipv6Addr>().unwrap().octets()
        );
        assert_eq!(
            e.v6[1].0.host_ip.0,
            "fd00:5a::1".parse::<std::net::Ipv6Addr>().unwrap().octets()
        );
        assert_eq!(e.v4[1].0.host_ip, [192, 0, 2, 7]);
    }
}
