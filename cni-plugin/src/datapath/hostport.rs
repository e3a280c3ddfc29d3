//! hostPort on the plugin's side: a pod's `portMappings` as `sl_ports`
//! entries, and the cgroup the node-local socket hooks attach to. The map
//! rules (overlaps, conflicts, what goes with a pod) are in
//! `sluice_maps::hostport`; the attachment in [`super::links`].
use std::{fs, net::IpAddr, path::Path};

use sluice_common::{Addr6, PortKey, PortKey6, PortTarget, PortTargetOf};

use crate::{cni::runtime_config::PortMapping, error::Error};

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
