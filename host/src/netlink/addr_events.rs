//! The kernel's notifications of addresses added and removed in this
//! namespace (`RTNLGRP_IPV4_IFADDR`, `RTNLGRP_IPV6_IFADDR`), for the node
//! agent that keeps the hostPort node addresses current.
use std::net::IpAddr;

use futures::{channel::mpsc::UnboundedReceiver, StreamExt};
use rtnetlink::{
    packet_core::{NetlinkMessage, NetlinkPayload},
    packet_route::{address::AddressAttribute, RouteNetlinkMessage},
    sys::SocketAddr,
    MulticastGroup,
};

use crate::Error;

/// An address added to or removed from one of the namespace's interfaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddrChange {
    pub addr: IpAddr,
    pub added: bool,
}

/// A subscription to the namespace's address changes.
pub struct AddrEvents {
    rx: UnboundedReceiver<(NetlinkMessage<RouteNetlinkMessage>, SocketAddr)>,
}

impl AddrEvents {
    /// Subscribes in the namespace this thread is in. Must be called inside a
    /// tokio runtime (the socket is driven by a spawned task).
    pub fn subscribe() -> Result<Self, Error> {
        let (conn, _handle, rx) = rtnetlink::new_multicast_connection(&[
            MulticastGroup::Ipv4Ifaddr,
            MulticastGroup::Ipv6Ifaddr,
        ])
        .map_err(|e| Error::io("subscribing to the kernel's address notifications", e))?;
        tokio::spawn(conn);
        Ok(Self { rx })
    }

    /// The next change; `None` when the socket is gone. Notifications of
    /// anything else are skipped.
    pub async fn next(&mut self) -> Option<AddrChange> {
        loop {
            let (msg, _) = self.rx.next().await?;
            let (m, added) = match msg.payload {
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewAddress(m)) => (m, true),
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelAddress(m)) => (m, false),
                _ => continue,
            };
            // IFA_LOCAL is the interface's own address (IFA_ADDRESS is the
            // peer's on a point-to-point link); IPv6 sends IFA_ADDRESS only.
            let local = m.attributes.iter().find_map(|a| match a {
                AddressAttribute::Local(ip) => Some(*ip),
                _ => None,
            });
            let addr = local.or_else(|| {
                m.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Address(ip) => Some(*ip),
                    _ => None,
                })
            });
            if let Some(addr) = addr {
                return Some(AddrChange { addr, added });
            }
        }
    }
}
