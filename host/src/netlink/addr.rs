//! Interface addresses.
use std::net::IpAddr;

use futures::TryStreamExt;
use ipnetwork::IpNetwork;
use rtnetlink::packet_route::{
    address::{AddressAttribute, AddressFlags, AddressMessage},
    route::{RouteAddress, RouteAttribute, RouteMessage, RouteType},
    AddressFamily,
};

use super::{errno, nl_err, Netlink};
use crate::Error;

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
    /// every IPv6 address but `::1` and link-local ones.
    ///
    /// Read from the `local` routing table, where the kernel puts a host route
    /// of type `local` for each of them (what `--dst-type LOCAL` looks up),
    /// and not from an address dump: that walks every device of the
    /// namespace, one host veth per pod, so it grew with the pods on the node
    /// (30 -> 260 µs per ADD with a hostPort, 20 -> 1,000 pods). The table
    /// dump is filtered in the kernel (strict checking, `ip_valid_fib_dump_req`)
    /// and holds the node's addresses, not its pods.
    pub async fn local_addrs(&self, v6: bool) -> Result<NodeAddrs, Error> {
        let mut out = NodeAddrs {
            v4: Vec::new(),
            v6: v6.then(Vec::new),
        };
        for a in self.local_routes(false).await? {
            if let IpAddr::V4(a) = a {
                if NodeAddrs::counts(a.into()) && !out.v4.contains(&a.octets()) {
                    out.v4.push(a.octets());
                }
            }
        }
        if let Some(list) = out.v6.as_mut() {
            for a in self.local_routes(true).await? {
                if let IpAddr::V6(a) = a {
                    let a6 = a.octets();
                    if NodeAddrs::counts(a.into()) && !list.contains(&a6) {
                        list.push(a6);
                    }
                }
            }
        }
        Ok(out)
    }

    /// The destinations of the `local` table's host routes of type `local`.
    async fn local_routes(&self, v6: bool) -> Result<Vec<IpAddr>, Error> {
        let mut q = RouteMessage::default();
        q.header.address_family = if v6 {
            AddressFamily::Inet6
        } else {
            AddressFamily::Inet
        };
        // Dump filters the kernel applies (`ip_valid_fib_dump_req`): one table,
        // one route type. Scope and prefix lengths must stay 0 in a dump request.
        q.header.table = RT_TABLE_LOCAL;
        q.header.kind = RouteType::Local;
        let mut s = self.handle.route().get(q).execute();
        let full = if v6 { 128 } else { 32 };
        let mut out = Vec::new();
        while let Some(m) = s
            .try_next()
            .await
            .map_err(|e| nl_err("list the node's local addresses (table local)", e))?
        {
            // An older kernel may answer with more than was asked.
            if !super::route::in_table(&m, u32::from(RT_TABLE_LOCAL))
                || m.header.kind != RouteType::Local
                || m.header.destination_prefix_length != full
            {
                continue;
            }
            out.extend(m.attributes.iter().find_map(|a| match a {
                RouteAttribute::Destination(RouteAddress::Inet(a)) => Some(IpAddr::V4(*a)),
                RouteAttribute::Destination(RouteAddress::Inet6(a)) => Some(IpAddr::V6(*a)),
                _ => None,
            }));
        }
        Ok(out)
    }
}

/// The kernel's `local` routing table (`RT_TABLE_LOCAL`).
const RT_TABLE_LOCAL: u8 = 255;

/// The node's addresses per family (see [`Netlink::local_addrs`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeAddrs {
    pub v4: Vec<[u8; 4]>,
    /// `None`: not dumped (the pod has no IPv6 mappings); the map is left as it is.
    pub v6: Option<Vec<[u8; 16]>>,
}

impl NodeAddrs {
    /// Whether hostPorts answer on `addr` when the node has it: every address
    /// but loopback ones and IPv6 link-local ones.
    pub fn counts(addr: IpAddr) -> bool {
        match addr {
            IpAddr::V4(a) => !a.is_loopback(),
            IpAddr::V6(a) => !a.is_loopback() && a.segments()[0] & 0xffc0 != 0xfe80,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ports_answer_on_every_address_but_loopback_and_ipv6_link_local() {
        for (a, counts) in [
            ("192.168.1.5", true),
            ("10.88.0.1", true),
            ("127.0.0.1", false),
            ("127.3.4.5", false),
            ("169.254.1.1", true),
            ("2001:db8::1", true),
            ("fd00::1", true),
            ("::1", false),
            ("fe80::1", false),
            ("febf::1", false),
            ("fec0::1", true),
        ] {
            assert_eq!(NodeAddrs::counts(a.parse().unwrap()), counts, "{a}");
        }
    }
}
