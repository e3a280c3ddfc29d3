//! Interface addresses.
use std::net::IpAddr;

use futures::TryStreamExt;
use ipnetwork::IpNetwork;
use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags};

use super::{errno, nl_err, Netlink};
use crate::error::Error;

impl Netlink {
    /// Adds `addr/prefix` to link `index`. `no_prefix_route` keeps the kernel from
    /// adding the subnet route (`IFA_F_NOPREFIXROUTE)`: pods route their subnet via
    /// the gateway. IPv6 addresses skip DAD (`IFA_F_NODAD)`: the address is ours alone
    /// on a point-to-point veth and must be usable at once.
    pub async fn add_address(
        &self,
        index: u32,
        addr: IpAddr,
        prefix: u8,
        no_prefix_route: bool,
    ) -> Result<(), Error> {
        let mut req = self.handle.address().add(index, addr, prefix);
        let mut flags = AddressFlags::empty();
        if no_prefix_route {
            flags |= AddressFlags::Noprefixroute;
        }
        if addr.is_ipv6() {
            flags |= AddressFlags::Nodad;
        }
        if !flags.is_empty() {
            req.message_mut()
                .attributes
                .push(AddressAttribute::Flags(flags));
        }
        match req.execute().await {
            Ok(()) => Ok(()),
            Err(e) if errno(&e) == Some(libc::EEXIST) => Ok(()),
            Err(e) => Err(nl_err(
                format!("add address {addr}/{prefix} to link #{index}"),
                e,
            )),
        }
    }

    /// The addresses on link `index`.
    pub async fn addresses(&self, index: u32) -> Result<Vec<IpNetwork>, Error> {
        let mut req = self.handle.address().get().set_link_index_filter(index);
        // Filtered by the kernel too (strict checking, see `Netlink::open`): one
        // interface's addresses, not every pod veth's.
        req.message_mut().header.index = index;
        let mut s = req.execute();
        let mut out = Vec::new();
        while let Some(m) = s
            .try_next()
            .await
            .map_err(|e| nl_err(format!("list addresses of link #{index}"), e))?
        {
            let prefix = m.header.prefix_len;
            for a in &m.attributes {
                if let AddressAttribute::Address(ip) = a {
                    if let Ok(n) = IpNetwork::new(*ip, prefix) {
                        out.push(n);
                    }
                }
            }
        }
        Ok(out)
    }

    /// The addresses of this namespace that hostPorts match (what iptables
    /// calls `--dst-type LOCAL`, which the reference portmap matches),
    /// deduplicated: every IPv4 address but loopback ones, every IPv6 address
    /// but `::1` and link-local ones (each pod veth has one).
    pub async fn local_addrs(&self) -> Result<NodeAddrs, Error> {
        let mut s = self.handle.address().get().execute();
        let mut out = NodeAddrs::default();
        while let Some(m) = s
            .try_next()
            .await
            .map_err(|e| nl_err("list the node's addresses", e))?
        {
            for a in &m.attributes {
                match a {
                    AddressAttribute::Address(std::net::IpAddr::V4(v4))
                        if !v4.is_loopback() && !out.v4.contains(&v4.octets()) =>
                    {
                        out.v4.push(v4.octets());
                    }
                    AddressAttribute::Address(std::net::IpAddr::V6(v6)) => {
                        let link_local = v6.segments()[0] & 0xffc0 == 0xfe80;
                        let a = sluice_common::Addr6(v6.octets());
                        if !v6.is_loopback() && !link_local && !out.v6.contains(&a) {
                            out.v6.push(a);
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(out)
    }
}

/// The node's addresses per family (see [`Netlink::local_addrs`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeAddrs {
    pub v4: Vec<[u8; 4]>,
    pub v6: Vec<sluice_common::Addr6>,
}
