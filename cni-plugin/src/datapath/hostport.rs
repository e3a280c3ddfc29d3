//! hostPort on the plugin's side: a pod's `portMappings` as `sl_ports`
//! entries, and the cgroup the node-local socket hooks attach to. The map
//! rules (overlaps, conflicts, what goes with a pod) are in
//! `sluice_maps::hostport`; the attachment in [`super::links`].
use std::{
    fs,
    net::{IpAddr, Ipv4Addr},
    path::Path,
};

use sluice_common::{PortKey, PortTarget};

use crate::{cni::runtime_config::PortMapping, error::Error};

/// A pod's first IPv4 address: where its hostPorts lead.
pub fn first_v4(ips: &[IpAddr]) -> Option<Ipv4Addr> {
    ips.iter().find_map(|ip| match ip {
        IpAddr::V4(v4) => Some(*v4),
        IpAddr::V6(_) => None,
    })
}

/// The map entries for a pod's `mappings` (validated when the config was
/// parsed: IPv4 host addresses, SCTP keeping its port). `key` names the list in
/// the error a pod without an IPv4 address gets.
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
    Ok(mappings
        .iter()
        .map(|m| {
            let host_ip = match m.host_ip {
                Some(IpAddr::V4(a)) => a.octets(),
                // Refused by the config parser; never reached.
                Some(IpAddr::V6(_)) | None => [0; 4],
            };
            (
                PortKey::new(host_ip, m.host_port, m.protocol.number()),
                PortTarget {
                    pod_ip: pod_ip.octets(),
                    pod_port: m.container_port.to_be(),
                    flags: 0,
                    pod_ifindex,
                },
            )
        })
        .collect())
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
    }

    #[test]
    fn a_pod_without_ipv4_cannot_have_mappings() {
        let e = entries(&[pm(80, 80, Protocol::Tcp, None)], "pm", None, 1).unwrap_err();
        assert_eq!(e.code(), 2);
        assert!(entries(&[], "pm", None, 1).unwrap().is_empty());
    }
}
