//! Routes in the main table.
use std::net::IpAddr;

use futures::TryStreamExt;
use ipnetwork::IpNetwork;
use rtnetlink::{
    packet_route::{
        route::{
            RouteAddress, RouteAttribute, RouteFlags, RouteMessage, RouteProtocol, RouteScope,
        },
        AddressFamily,
    },
    RouteMessageBuilder,
};

use super::{errno, nl_err, Netlink};
use crate::Error;

/// A route to add or look for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteSpec {
    pub dst: IpNetwork,
    pub gw: Option<IpAddr>,
    /// Output interface.
    pub oif: Option<u32>,
    /// `scope link` (a directly connected destination, e.g. the gateway /32).
    pub link_scope: bool,
    /// `onlink`: the gateway is on this link even without a route to it.
    pub onlink: bool,
    pub mtu: Option<u32>,
    pub priority: Option<u32>,
    pub table: Option<u32>,
    /// `proto`: who made the route (`rtm_protocol`; the kernel's default for
    /// routes added by hand is `boot`).
    pub protocol: Option<u8>,
}

impl RouteSpec {
    pub fn new(dst: IpNetwork) -> Self {
        Self {
            dst,
            gw: None,
            oif: None,
            link_scope: false,
            onlink: false,
            mtu: None,
            priority: None,
            table: None,
            protocol: None,
        }
    }

    fn message(&self) -> Result<RouteMessage, Error> {
        let mut b = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(self.dst.network(), self.dst.prefix())
            .map_err(|e| Error::netlink(format!("route {}", self.dst), e))?;
        if let Some(gw) = self.gw {
            b = b
                .gateway(gw)
                .map_err(|e| Error::netlink(format!("route {}", self.dst), e))?;
        }
        if let Some(oif) = self.oif {
            b = b.output_interface(oif);
        }
        if self.link_scope {
            b = b.scope(RouteScope::Link);
        }
        if self.onlink {
            b = b.onlink();
        }
        if let Some(p) = self.priority {
            b = b.priority(p);
        }
        if let Some(t) = self.table {
            b = b.table_id(t);
        }
        if let Some(p) = self.protocol {
            b = b.protocol(RouteProtocol::from(p));
        }
        let mut msg = b.build();
        if let Some(mtu) = self.mtu {
            use rtnetlink::packet_route::route::RouteMetric;
            msg.attributes
                .push(RouteAttribute::Metrics(vec![RouteMetric::Mtu(mtu)]));
        }
        Ok(msg)
    }
}

impl Netlink {
    /// Adds a route; an identical existing route is fine.
    pub async fn add_route(&self, r: &RouteSpec) -> Result<(), Error> {
        match self.handle.route().add(r.message()?).execute().await {
            Ok(()) => Ok(()),
            Err(e) if errno(&e) == Some(libc::EEXIST) => Ok(()),
            Err(e) => Err(nl_err(
                format!(
                    "add route {}{}",
                    r.dst,
                    r.gw.map(|g| format!(" via {g}")).unwrap_or_default()
                ),
                e,
            )),
        }
    }

    /// Deletes a route; a missing one is fine.
    pub async fn del_route(&self, r: &RouteSpec) -> Result<(), Error> {
        match self.handle.route().del(r.message()?).execute().await {
            Ok(()) => Ok(()),
            Err(e) if errno(&e) == Some(libc::ESRCH) => Ok(()),
            Err(e) => Err(nl_err(format!("delete route {}", r.dst), e)),
        }
    }

    /// The routes of the main table of one family: (dst, gateway, oif).
    pub async fn routes(&self, v6: bool) -> Result<Vec<RouteSpec>, Error> {
        let mut q = if v6 {
            RouteMessageBuilder::<std::net::Ipv6Addr>::new().build()
        } else {
            RouteMessageBuilder::<std::net::Ipv4Addr>::new().build()
        };
        // With strict checking the kernel filters a dump by the request's
        // protocol (`ip_valid_fib_dump_req`), and the builder's default is
        // `boot`: unspecified lists routes of every origin.
        q.header.protocol = RouteProtocol::Unspec;
        let mut s = self.handle.route().get(q).execute();
        let mut out = Vec::new();
        while let Some(m) = s.try_next().await.map_err(|e| nl_err("list routes", e))? {
            if !in_table(&m, 254) {
                continue;
            }
            let plen = m.header.destination_prefix_length;
            let mut dst: Option<IpAddr> = None;
            let mut r = RouteSpec::new(
                IpNetwork::new(
                    if v6 {
                        IpAddr::from([0u16; 8])
                    } else {
                        IpAddr::from([0u8; 4])
                    },
                    0,
                )
                .map_err(|e| Error::netlink("list routes", e))?,
            );
            for a in &m.attributes {
                match a {
                    RouteAttribute::Destination(d) => dst = addr(d),
                    RouteAttribute::Gateway(g) => r.gw = addr(g),
                    RouteAttribute::Oif(i) => r.oif = Some(*i),
                    RouteAttribute::Priority(p) => r.priority = Some(*p),
                    _ => {}
                }
            }
            if let Some(d) = dst {
                if let Ok(n) = IpNetwork::new(d, plen) {
                    r.dst = n;
                }
            }
            r.link_scope = m.header.scope == RouteScope::Link;
            r.protocol = Some(u8::from(m.header.protocol));
            out.push(r);
        }
        Ok(out)
    }

    /// The output interface of the IPv4 default route (the node's uplink), if any.
    ///
    /// First a FIB lookup that returns the matching route itself
    /// (`RTM_F_FIB_MATCH`) for an address only a default route covers in
    /// practice (TEST-NET-3, RFC 5737): one answer however many routes the node
    /// has (each pod adds a /32). Only a prefix-0 route of the main table counts;
    /// anything else (a route covering the probe, policy routing) falls back to
    /// reading every route.
    pub async fn default_route_oif(&self) -> Result<Option<u32>, Error> {
        const PROBE: std::net::Ipv4Addr = std::net::Ipv4Addr::new(203, 0, 113, 1);
        // A bare header: with strict checking (see `Netlink::open`) the kernel
        // refuses a lookup naming a table, protocol or type.
        let mut q = RouteMessage::default();
        q.header.address_family = AddressFamily::Inet;
        q.header.destination_prefix_length = 32;
        q.header.flags = RouteFlags::FibMatch;
        q.attributes
            .push(RouteAttribute::Destination(RouteAddress::Inet(PROBE)));
        let mut s = self.handle.route().get(q).execute();
        match s.try_next().await {
            Ok(Some(m)) if m.header.destination_prefix_length == 0 && in_table(&m, 254) => {
                if let Some(oif) = m.attributes.iter().find_map(|a| match a {
                    RouteAttribute::Oif(i) => Some(*i),
                    _ => None,
                }) {
                    return Ok(Some(oif));
                }
            }
            // No route at all for the probe: no default route.
            Err(e) if errno(&e) == Some(libc::ENETUNREACH) => return Ok(None),
            _ => {}
        }
        Ok(self
            .routes(false)
            .await?
            .into_iter()
            .find(|r| r.dst.prefix() == 0)
            .and_then(|r| r.oif))
    }
}

fn addr(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

/// Whether route message `m` is of table `table` (in the header, or in
/// `RTA_TABLE` for tables above 255).
pub(super) fn in_table(m: &RouteMessage, table: u32) -> bool {
    u32::from(m.header.table) == table
        || m.attributes
            .iter()
            .any(|a| matches!(a, RouteAttribute::Table(t) if *t == table))
}
