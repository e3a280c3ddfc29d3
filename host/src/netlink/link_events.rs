//! The kernel's notifications of links removed in this namespace
//! (`RTNLGRP_LINK`), for DEL: a link's `RTM_DELLINK` goes out while the
//! deletion still holds the rtnl lock (`unregister_netdevice_many_notify`,
//! `net/core/dev.c`), after the link has left the namespace's name and index
//! lists and lost its routes, qdiscs and filters, and before the deleting
//! request waits in `netdev_run_todo` for `rcu_barrier()`. What is left of the
//! deletion then is the kernel's own.
use futures::{channel::mpsc::UnboundedReceiver, StreamExt};
use rtnetlink::{
    packet_core::{NetlinkMessage, NetlinkPayload},
    packet_route::{AddressFamily, RouteNetlinkMessage},
    sys::SocketAddr,
    MulticastGroup,
};

use crate::Error;

/// A subscription to the namespace's link removals.
pub struct LinkEvents {
    rx: UnboundedReceiver<(NetlinkMessage<RouteNetlinkMessage>, SocketAddr)>,
}

impl LinkEvents {
    /// Subscribes in the namespace this thread is in; removals from then on
    /// are seen. Must be called inside a tokio runtime (the socket is driven
    /// by a spawned task).
    pub fn subscribe() -> Result<Self, Error> {
        let (conn, _handle, rx) = rtnetlink::new_multicast_connection(&[MulticastGroup::Link])
            .map_err(|e| Error::io("subscribing to the kernel's link notifications", e))?;
        tokio::spawn(conn);
        Ok(Self { rx })
    }

    /// Waits until link `index` is unregistered: `true`, or `false` if the
    /// subscription ended first (its socket failed). Other links'
    /// notifications are skipped, and so are a bridge's `AF_BRIDGE` ones about
    /// its ports, which are not the link going away.
    pub async fn removed(&mut self, index: u32) -> bool {
        while let Some((msg, _)) = self.rx.next().await {
            if let NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(m)) = msg.payload {
                if m.header.index == index && m.header.interface_family == AddressFamily::Unspec {
                    return true;
                }
            }
        }
        false
    }
}
