//! Permanent neighbour entries: both ends of a pod's veth know each other's MAC,
//! so no ARP/ND is needed between pod and node.
use std::net::IpAddr;

use futures::TryStreamExt;
use rtnetlink::packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourState};

use super::{nl_err, Netlink};
use crate::Error;

impl Netlink {
    /// `ip neigh replace <ip> lladdr <mac> dev #index nud permanent`.
    pub async fn set_permanent_neighbour(
        &self,
        index: u32,
        ip: IpAddr,
        mac: [u8; 6],
    ) -> Result<(), Error> {
        self.handle
            .neighbours()
            .add(index, ip)
            .state(NeighbourState::Permanent)
            .link_layer_address(&mac)
            .replace()
            .execute()
            .await
            .map_err(|e| nl_err(format!("add neighbour {ip} on link #{index}"), e))
    }

    /// The permanent neighbour entries on link `index`: (address, MAC).
    pub async fn permanent_neighbours(&self, index: u32) -> Result<Vec<(IpAddr, [u8; 6])>, Error> {
        let mut s = self.handle.neighbours().get().execute();
        let mut out = Vec::new();
        while let Some(m) = s
            .try_next()
            .await
            .map_err(|e| nl_err("list neighbours", e))?
        {
            if m.header.ifindex != index || m.header.state != NeighbourState::Permanent {
                continue;
            }
            let mut ip = None;
            let mut mac = None;
            for a in &m.attributes {
                match a {
                    NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => {
                        ip = Some(IpAddr::V4(*v4));
                    }
                    NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => {
                        ip = Some(IpAddr::V6(*v6));
                    }
                    NeighbourAttribute::LinkLayerAddress(l) if l.len() == 6 => {
                        let mut b = [0u8; 6];
                        b.copy_from_slice(l);
                        mac = Some(b);
                    }
                    _ => {}
                }
            }
            if let (Some(ip), Some(mac)) = (ip, mac) {
                out.push((ip, mac));
            }
        }
        Ok(out)
    }
}
