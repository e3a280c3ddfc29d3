//! CHECK (spec 0.4.0+), the CNI glue: the attachment is as ADD left it.
//! Interfaces, addresses and routes come from prevResult (spec: "must consult
//! prevResult"); the veth peer, the datapath attachment and map entries and
//! the record are checked against what Sluice keeps ([`pod::check`]), the
//! address reservation against IPAM.
use std::net::IpAddr;

use crate::{
    cni::{
        config::{NetConf, PodDeviceKind},
        env::Env,
        result::Interface,
        runtime_config::Mac,
    },
    error::Error,
    ipam::Ipam,
    netlink::{LinkInfo, Netlink},
    netns::Netns,
    pod,
    state::host_veth_name,
};

pub(super) async fn check(env: &Env, conf: &NetConf) -> Result<(), Error> {
    let id = env.attachment()?;
    let netns_path = env
        .netns
        .as_ref()
        .ok_or_else(|| Error::env("CNI_NETNS", "", "required for CHECK"))?;
    let prev = conf
        .prev_result
        .as_ref()
        .ok_or_else(|| Error::config("prevResult", "null", "is required for CHECK"))?;
    let pod_ns = Netns::open(netns_path)?;
    let host_nl = Netlink::open()?;
    let pod_nl = Netlink::open_in(&pod_ns)?;

    let (pod_idx, pod_if) = prev
        .interfaces
        .iter()
        .enumerate()
        .find(|(_, i)| i.name == id.ifname && i.sandbox.is_some())
        .ok_or_else(|| {
            Error::check(format!(
                "prevResult lists no interface {} in a sandbox",
                id.ifname
            ))
        })?;
    let pod_link = pod_nl.link_by_name(&id.ifname).await?.ok_or_else(|| {
        Error::check(format!(
            "{} is missing from {}",
            id.ifname,
            netns_path.display()
        ))
    })?;
    check_link(&pod_link, pod_if, kinds(conf.pod_device))?;

    let expected_ips: Vec<_> = prev
        .ips
        .iter()
        .filter(|i| i.interface == Some(pod_idx))
        .collect();
    let have = pod_nl.addresses(pod_link.index).await?;
    for ip in &expected_ips {
        if !have.contains(&ip.address) {
            return Err(Error::check(format!(
                "address {} is missing from {} (has {:?})",
                ip.address,
                id.ifname,
                have.iter().map(ToString::to_string).collect::<Vec<_>>()
            )));
        }
    }
    for r in &prev.routes {
        let routes = pod_nl.routes(r.dst.is_ipv6()).await?;
        let found = routes.iter().any(|x| {
            x.dst.network() == r.dst.network()
                && x.dst.prefix() == r.dst.prefix()
                && r.gw.is_none_or(|g| x.gw == Some(g))
        });
        if !found {
            return Err(Error::check(format!(
                "route {} is missing in the pod",
                r.dst
            )));
        }
    }

    let host_link = pod::check(conf, id, &host_nl, &pod_ns, &pod_nl, &pod_link).await?;
    let host_ifname = host_veth_name(&conf.name, id);
    if let Some(host_if) = prev.interfaces.iter().find(|i| i.name == host_ifname) {
        // Both ends of one pair: the kind the pod's end has.
        check_link(
            &host_link,
            host_if,
            &[pod_link.kind.as_deref().unwrap_or("none")],
        )?;
    }

    let expected: Vec<IpAddr> = expected_ips.iter().map(|i| i.address.ip()).collect();
    Ipam::new(conf, &env.path)?.check(conf, id, &expected)
}

/// The device kinds `podDevice` allows.
fn kinds(device: PodDeviceKind) -> &'static [&'static str] {
    match device {
        PodDeviceKind::Veth => &["veth"],
        PodDeviceKind::Netkit => &["netkit"],
        PodDeviceKind::Auto => &["netkit", "veth"],
    }
}

/// A link is of a kind in `kinds` (a veth, a netkit), up, with the MAC and MTU
/// the result names.
fn check_link(link: &LinkInfo, want: &Interface, kinds: &[&str]) -> Result<(), Error> {
    let kind = link.kind.as_deref().unwrap_or("none");
    if !kinds.contains(&kind) {
        return Err(Error::check(format!(
            "{} is a {kind} device, not {}",
            link.name,
            kinds.join(" or ")
        )));
    }
    if !link.up {
        return Err(Error::check(format!("{} is down", link.name)));
    }
    if let (Some(want_mac), Some(have)) = (&want.mac, link.mac) {
        let want_mac: Mac = want_mac
            .parse()
            .map_err(|r| Error::config("prevResult.interfaces.mac", want_mac, r))?;
        if want_mac.0 != have {
            return Err(Error::check(format!(
                "{} has MAC {} instead of {want_mac}",
                link.name,
                Mac(have)
            )));
        }
    }
    if let Some(mtu) = want.mtu {
        if mtu != link.mtu {
            return Err(Error::check(format!(
                "{} has MTU {} instead of {mtu}",
                link.name, link.mtu
            )));
        }
    }
    Ok(())
}
