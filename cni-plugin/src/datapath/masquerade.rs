//! Masquerade on the plugin's side: what it needs from the node and the config,
//! worked out at ADD (the address, the NAT ports, the prefixes never
//! masqueraded). The maps and their rules are `sluice_maps::nat`.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnetwork::IpNetwork;
use sluice_common::{masq_flags, Addr6, Masq6Config, MasqConfig};
use sluice_maps::nat::{trie_prefixes, Prefix4, Prefix6};

use sluice_maps::{nat::non_masq_owner, PinRoot};

use super::{Gone, NodeSettings, Uplink};
use crate::{
    cni::{config::NetConf, result::IpConfig},
    error::{Error, Errors},
    ipam::Ipam,
    netlink::Netlink,
};

/// Masquerade as the programs see it: the config entries and the prefixes never
/// masqueraded, per family (IPv6 off without an address to leave with).
#[derive(Clone, Debug)]
pub struct MasqSpec {
    pub config: MasqConfig,
    pub non_masq: Vec<Prefix4>,
    pub config6: Masq6Config,
    pub non_masq6: Vec<Prefix6>,
    /// `natTimeouts.udpUnreplied` and `natPodShare` (`sl_nat_limits`).
    pub udp_unreplied_secs: u32,
    pub pod_share: u32,
}

const PORT_RANGE_FILE: &str = "/proc/sys/net/ipv4/ip_local_port_range";
/// Fewest NAT ports worth running with.
const MIN_PORTS: u32 = 1024;

/// The masquerade spec for this network, `None` without `ipMasq`.
pub async fn spec(
    conf: &NetConf,
    host_nl: &Netlink,
    uplink: Option<&Uplink>,
    ipam: &Ipam,
    ips: &[IpConfig],
) -> Result<Option<MasqSpec>, Error> {
    if !conf.ip_masq {
        return Ok(None);
    }
    let (uplink_v4, uplink_v6) = uplink_addresses(host_nl, uplink).await?;
    let Some(addr) = conf.masq.address.or(uplink_v4) else {
        return Err(Error::config(
            "masqueradeAddress",
            "null",
            match uplink {
                Some(u) => format!("the uplink {} has no IPv4 address; set it", u.ifname),
                None => "there is no uplink (no default route and no `uplink`) to take the address from; set it".into(),
            },
        ));
    };
    // IPv6 masquerade needs the sweeper's kernels (kernel_features::MASQ6).
    let ipv6_kernel = super::features::get().sweeper;
    let addr6 = conf.masq.address6.or(uplink_v6).filter(|_| ipv6_kernel);
    let node_range = node_port_range()?;
    let [(port_min, port_max), (port2_min, port2_max)] = nat_ports(conf.masq.ports, node_range)?;
    let t = conf.masq.timeouts;
    let config = MasqConfig {
        addr: addr.octets(),
        flags: masq_flags::ENABLED,
        port_min,
        port_max,
        port2_min,
        port2_max,
        tcp_syn_secs: t.tcp_syn,
        tcp_established_secs: t.tcp_established,
        tcp_closing_secs: t.tcp_closing,
        udp_secs: t.udp,
        icmp_secs: t.icmp,
        // Kept from the map by sluice_maps::nat::write_config.
        prev_addr: [0; 4],
    };
    let config6 = Masq6Config {
        addr: Addr6(addr6.map_or([0; 16], |a| a.octets())),
        flags: if addr6.is_some() {
            masq_flags::ENABLED
        } else {
            0
        },
        prev_addr: Addr6::default(),
    };
    if addr6.is_none() && ips.iter().any(|ip| ip.address.is_ipv6()) {
        if ipv6_kernel {
            eprintln!(
                "sluice: IPv6 is not masqueraded: the uplink has no global IPv6 address and \
                 masqueradeAddress names none"
            );
        } else {
            eprintln!(
                "sluice: IPv6 is not masqueraded: this kernel lacks the NAT sweeper \
                 (bpf_for_each_map_elem, perf-event links: Linux 5.15) it needs"
            );
        }
    }
    let non_masq = non_masq(conf.masq.non_masq.as_deref(), &pod_ranges(conf, ipam, ips));
    let (v4, v6) = trie_prefixes(&non_masq);
    Ok(Some(MasqSpec {
        config,
        non_masq: v4,
        config6,
        non_masq6: v6,
        udp_unreplied_secs: t.udp_unreplied,
        pod_share: conf.masq.pod_share,
    }))
}

/// Writes the node's masquerade settings (off: zeroed). The prefixes first:
/// the cluster range must never be masqueraded.
pub(super) fn prepare(root: &PinRoot, settings: &NodeSettings) -> Result<(), Error> {
    if let Some(m) = &settings.masq {
        sluice_maps::nat::set_non_masq(root, non_masq_owner::CONFIG, &m.non_masq)?;
        sluice_maps::nat::set_non_masq6(root, non_masq_owner::CONFIG, &m.non_masq6)?;
        sluice_maps::nat::write_config(root, m.config)?;
        sluice_maps::nat::write_config6(root, m.config6)?;
        sluice_maps::nat_pressure::write_limits(root, m.udp_unreplied_secs, m.pod_share)?;
    } else {
        sluice_maps::nat::write_config(root, MasqConfig::default())?;
        sluice_maps::nat::write_config6(root, Masq6Config::default())?;
    }
    Ok(())
}

/// Forgets the masqueraded flows of a pod that is going, and with them its
/// flow count (the recount takes the maps directory's lock itself:
/// `sluice_maps::MapsLock`).
pub(super) fn detach(root: &PinRoot, gone: &Gone<'_>, errors: &mut Errors) {
    errors.note(sluice_maps::nat::forget_pods(root, &gone.v4, &gone.v6));
}

/// The prefixes never masqueraded: the configured ones, and for a family
/// the list leaves out, that family's defaults (so a list written for IPv4
/// never makes IPv6 traffic inside the cluster masqueraded).
fn non_masq(configured: Option<&[IpNetwork]>, defaults: &[IpNetwork]) -> Vec<IpNetwork> {
    let Some(c) = configured else {
        return defaults.to_vec();
    };
    let has = |v6: bool| c.iter().any(|n| n.is_ipv6() == v6);
    let mut out = c.to_vec();
    out.extend(defaults.iter().filter(|d| !has(d.is_ipv6())));
    out
}

/// The uplink's first IPv4 address and first global IPv6 address (not
/// link-local, RFC 4291 2.5.6).
async fn uplink_addresses(
    host_nl: &Netlink,
    uplink: Option<&Uplink>,
) -> Result<(Option<Ipv4Addr>, Option<Ipv6Addr>), Error> {
    let Some(u) = uplink else {
        return Ok((None, None));
    };
    let addrs = host_nl.addresses(u.ifindex).await?;
    let v4 = addrs.iter().find_map(|a| match a.ip() {
        IpAddr::V4(v4) => Some(v4),
        IpAddr::V6(_) => None,
    });
    let v6 = addrs.iter().find_map(|a| match a.ip() {
        IpAddr::V6(v6) if !v6.is_loopback() && (v6.segments()[0] & 0xffc0) != 0xfe80 => Some(v6),
        _ => None,
    });
    Ok((v4, v6))
}

/// The node's ephemeral port range (its own outgoing connections use these).
fn node_port_range() -> Result<(u16, u16), Error> {
    let s = std::fs::read_to_string(PORT_RANGE_FILE)
        .map_err(|e| Error::io(format!("reading {PORT_RANGE_FILE}"), e))?;
    parse_range(&s).ok_or_else(|| Error::Decode {
        what: PORT_RANGE_FILE.into(),
        reason: format!("{s:?} is not two port numbers"),
    })
}

fn parse_range(s: &str) -> Option<(u16, u16)> {
    let mut it = s.split_whitespace().map(str::parse::<u16>);
    Some((it.next()?.ok()?, it.next()?.ok()?))
}

/// No second range.
const NONE: (u16, u16) = (1, 0);

/// NAT ports: the configured range, or every port from 1024 up that lies outside
/// the node's ephemeral range (two ranges, e.g. 1024-32767 and 61000-65535). Either
/// way disjoint from the ephemeral range, so a masqueraded flow never takes the
/// tuple of a connection the node itself makes to the same server. (Ports below
/// 1024 are left alone: some clients bind them on purpose, e.g. NFS.)
fn nat_ports(configured: Option<(u16, u16)>, node: (u16, u16)) -> Result<[(u16, u16); 2], Error> {
    let (lo, hi) = node;
    if let Some((a, b)) = configured {
        if a <= hi && b >= lo {
            return Err(Error::config(
                "masqueradePorts",
                format!("{a}-{b}"),
                format!("overlaps the node's ip_local_port_range {lo}-{hi}"),
            ));
        }
        return Ok([(a, b), NONE]);
    }
    let below = (lo > 1024).then(|| (1024, lo - 1));
    let above = (hi < 65_535).then(|| (hi + 1, 65_535));
    let count = |r: Option<(u16, u16)>| r.map_or(0, |(a, b)| u32::from(b - a) + 1);
    if count(below) + count(above) < MIN_PORTS {
        return Err(Error::config(
            "masqueradePorts",
            "null",
            format!(
                "the node's ip_local_port_range {lo}-{hi} leaves fewer than {MIN_PORTS} ports from 1024 up; set masqueradePorts to a range outside it"
            ),
        ));
    }
    Ok(match (below, above) {
        (Some(a), Some(b)) => [a, b],
        (Some(a), None) | (None, Some(a)) => [a, NONE],
        (None, None) => [NONE, NONE],
    })
}

/// This network's pods, here and on the other nodes: the IPAM ranges, the pod's
/// own subnets, and `nodes`' pod CIDRs, both families (the default
/// non-masquerade prefixes; what Service ranges must not overlap).
pub(super) fn pod_ranges(conf: &NetConf, ipam: &Ipam, ips: &[IpConfig]) -> Vec<IpNetwork> {
    let mut out: Vec<IpNetwork> = Vec::new();
    let mut add = |n: IpNetwork| {
        if let Ok(net) = IpNetwork::new(n.network(), n.prefix()) {
            if !out.contains(&net) {
                out.push(net);
            }
        }
    };
    if let Ipam::Builtin(b) = ipam {
        for set in &b.config().range_sets {
            for r in set.ranges() {
                add(r.subnet);
            }
        }
    }
    for ip in ips {
        add(ip.address);
    }
    for n in &conf.nodes {
        add(n.pod_cidr);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nat_ports_stay_off_the_node_range() {
        assert_eq!(
            nat_ports(None, (32768, 60999)).unwrap(),
            [(1024, 32767), (61000, 65535)]
        );
        assert_eq!(
            nat_ports(None, (1024, 40000)).unwrap(),
            [(40001, 65535), NONE]
        );
        assert_eq!(
            nat_ports(None, (30000, 65535)).unwrap(),
            [(1024, 29999), NONE]
        );
        let e = nat_ports(None, (1024, 65000)).unwrap_err();
        assert_eq!(e.code(), 7);
        assert!(e.to_string().contains("1024-65000"));
        assert_eq!(
            nat_ports(Some((20000, 29999)), (32768, 60999)).unwrap(),
            [(20000, 29999), NONE]
        );
        let e = nat_ports(Some((60000, 62000)), (32768, 60999)).unwrap_err();
        assert!(e.to_string().contains("60000-62000"), "{e}");
    }

    #[test]
    fn a_family_missing_from_non_masquerade_cidrs_keeps_its_defaults() {
        let n = |s: &str| s.parse::<IpNetwork>().unwrap();
        let defaults = [n("10.22.0.0/16"), n("fd00:22::/64")];
        assert_eq!(non_masq(None, &defaults), defaults.to_vec());
        assert_eq!(
            non_masq(Some(&[n("10.0.0.0/8")]), &defaults),
            vec![n("10.0.0.0/8"), n("fd00:22::/64")]
        );
        assert_eq!(
            non_masq(Some(&[n("fd00::/8")]), &defaults),
            vec![n("fd00::/8"), n("10.22.0.0/16")]
        );
        let both = [n("10.0.0.0/8"), n("fd00::/8")];
        assert_eq!(non_masq(Some(&both), &defaults), both.to_vec());
    }

    #[test]
    fn reads_the_kernel_range_format() {
        assert_eq!(parse_range("32768\t60999\n"), Some((32768, 60999)));
        assert_eq!(parse_range("x"), None);
    }
}
