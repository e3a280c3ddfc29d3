//! Interface addresses.
use std::net::IpAddr;

use futures::TryStreamExt;
use ipnetwork::IpNetwork;
use rtnetlink::packet_route::{
    address::{AddressAttribute, AddressFlags, AddressMessage},
    AddressFamily,
};

use super::{errno, nl_err, Netlink};
use crate::error::Error;

impl Netlink {
    /// Adds `addr/prefix` to link `index`; `false` when the link had it already.
    /// `no_prefix_route` keeps the kernel from adding the subnet route
    /// (`IFA_F_NOPREFIXROUTE)`: pods route their subnet via the gateway. IPv6
    /// addresses skip DAD (`IFA_F_NODAD)`: the address is ours alone on a
    /// point-to-point veth and must be usable at once.
    pub async fn add_address(
        &self,
        index: u32,
        addr: IpAddr,
        prefix: u8,
        no_prefix_route: bool,
    ) -> Result<bool, Error> {
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
            Ok(()) => Ok(true),
            Err(e) if errno(&e) == Some(libc::EEXIST) => Ok(false),
            Err(e) => Err(nl_err(
                format!("add address {addr}/{prefix} to link #{index}"),
                e,
            )),
        }
    }

    /// Removes `addr/prefix` from link `index`; `false` when the link did not
    /// have it. One `RTM_DELADDR`, no dump: the kernel picks the address by
    /// `IFA_LOCAL` (IPv4) or `IFA_ADDRESS` (IPv6) and the prefix length.
    pub async fn del_address(&self, index: u32, addr: IpAddr, prefix: u8) -> Result<bool, Error> {
        let mut m = AddressMessage::default();
        m.header.family = match addr {
            IpAddr::V4(_) => AddressFamily::Inet,
            IpAddr::V6(_) => AddressFamily::Inet6,
        };
        m.header.prefix_len = prefix;
        m.header.index = index;
        m.attributes.push(AddressAttribute::Address(addr));
        if addr.is_ipv4() {
            m.attributes.push(AddressAttribute::Local(addr));
        }
        match self.handle.address().del(m).execute().await {
            Ok(()) => Ok(true),
            Err(e) if errno(&e) == Some(libc::EADDRNOTAVAIL) => Ok(false),
            Err(e) => Err(nl_err(
                format!("delete address {addr}/{prefix} from link #{index}"),
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
    /// deduplicated: every IPv4 address but loopback ones and, when `v6`,
    /// every IPv6 address but `::1` and link-local ones. Each dump is filtered
    /// by family in the kernel (strict checking, see `Netlink::open`): the IPv6
    /// one lists every pod veth's link-local address, so it grows with the
    /// pods on the node and is made only for a pod with IPv6 mappings.
    pub async fn local_addrs(&self, v6: bool) -> Result<NodeAddrs, Error> {
        let mut out = NodeAddrs {
            v4: Vec::new(),
            v6: v6.then(Vec::new),
        };
        for a in self.addrs_of(AddressFamily::Inet).await? {
            if let IpAddr::V4(a) = a {
                if !a.is_loopback() && !out.v4.contains(&a.octets()) {
                    out.v4.push(a.octets());
                }
            }
        }
        if let Some(list) = out.v6.as_mut() {
            for a in self.addrs_of(AddressFamily::Inet6).await? {
                if let IpAddr::V6(a) = a {
                    let link_local = a.segments()[0] & 0xffc0 == 0xfe80;
                    let a6 = sluice_common::Addr6(a.octets());
                    if !a.is_loopback() && !link_local && !list.contains(&a6) {
                        list.push(a6);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Every address of `family` in this namespace.
    async fn addrs_of(&self, family: AddressFamily) -> Result<Vec<IpAddr>, Error> {
        let mut req = self.handle.address().get();
        req.message_mut().header.family = family;
        let mut s = req.execute();
        let mut out = Vec::new();
        while let Some(m) = s
            .try_next()
            .await
            .map_err(|e| nl_err(format!("list the node's {family:?} addresses"), e))?
        {
            out.extend(m.attributes.iter().filter_map(|a| match a {
                AddressAttribute::Address(ip) => Some(*ip),
                _ => None,
            }));
        }
        Ok(out)
    }
}

/// The node's addresses per family (see [`Netlink::local_addrs`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeAddrs {
    pub v4: Vec<[u8; 4]>,
    /// `None`: not dumped (the pod has no IPv6 mappings); the map is left as it is.
    pub v6: Option<Vec<sluice_common::Addr6>>,
}
