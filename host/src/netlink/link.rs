//! Links: veth and netkit pairs, up/down, lookup, delete.
use std::os::fd::AsRawFd;

use futures::TryStreamExt;
use rtnetlink::{
    packet_route::link::{
        AfSpecInet6, AfSpecUnspec, In6AddrGenMode, InfoData, InfoKind, InfoNetkit, InfoVeth,
        LinkAttribute, LinkFlags, LinkInfo as NlLinkInfo, LinkMessage, NetkitMode,
    },
    LinkMessageBuilder, LinkNetkit, LinkUnspec, LinkVeth,
};

use super::{errno, nl_err, Netlink};
use crate::{netns::Netns, Error};

/// What the plugin needs to know about a link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkInfo {
    pub index: u32,
    pub name: String,
    pub mac: Option<[u8; 6]>,
    pub mtu: u32,
    pub up: bool,
    /// `veth`, `bridge`, ... (`IFLA_INFO_KIND`), if any.
    pub kind: Option<String>,
    /// For a veth: ifindex of the peer (`IFLA_LINK`), in the peer's namespace.
    pub peer_index: Option<u32>,
}

impl LinkInfo {
    /// A netkit device (a pod pair made with `podDevice: netkit`).
    pub fn is_netkit(&self) -> bool {
        self.kind.as_deref() == Some("netkit")
    }
}

/// The peer's half of a pair's creation: its name, MTU, namespace and MAC.
fn peer_message(spec: &VethSpec<'_>) -> LinkMessage {
    let mut peer = LinkMessageBuilder::<LinkUnspec>::new()
        .name(spec.peer_name.to_string())
        .mtu(spec.mtu)
        .setns_by_fd(spec.peer_ns.fd().as_raw_fd());
    if let Some(mac) = spec.peer_mac {
        peer = peer.address(mac.to_vec());
    }
    peer.build()
}

/// `msg` (a netkit link) with `peer` as its peer's message: rtnetlink's
/// builder names the peer but cannot give it a namespace, MTU or address.
fn with_netkit_peer(mut msg: LinkMessage, peer: LinkMessage) -> LinkMessage {
    let mut peer = Some(peer);
    for a in &mut msg.attributes {
        if let LinkAttribute::LinkInfo(infos) = a {
            for i in infos.iter_mut() {
                if let NlLinkInfo::Data(InfoData::Netkit(data)) = i {
                    data.retain(|d| !matches!(d, InfoNetkit::Peer(_)));
                    data.extend(peer.take().map(InfoNetkit::Peer));
                }
            }
        }
    }
    msg
}

fn parse(msg: &LinkMessage) -> LinkInfo {
    let mut info = LinkInfo {
        index: msg.header.index,
        name: String::new(),
        mac: None,
        mtu: 0,
        up: msg.header.flags.contains(LinkFlags::Up),
        kind: None,
        peer_index: None,
    };
    for a in &msg.attributes {
        match a {
            LinkAttribute::IfName(n) => info.name.clone_from(n),
            LinkAttribute::Address(m) if m.len() == 6 => {
                let mut mac = [0u8; 6];
                mac.copy_from_slice(m);
                info.mac = Some(mac);
            }
            LinkAttribute::Mtu(m) => info.mtu = *m,
            LinkAttribute::Link(l) => info.peer_index = Some(*l),
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    if let NlLinkInfo::Kind(k) = i {
                        info.kind = Some(match k {
                            InfoKind::Veth => "veth".to_string(),
                            other => other.to_string(),
                        });
                    }
                }
            }
            _ => {}
        }
    }
    info
}

/// A new veth or netkit pair: the host end stays here, the peer is created directly in
/// `peer_ns` under its final name, so no temporary name ever exists on the node.
pub struct VethSpec<'a> {
    pub host_name: &'a str,
    pub peer_name: &'a str,
    pub peer_ns: &'a Netns,
    pub mtu: u32,
    pub peer_mac: Option<[u8; 6]>,
}

impl Netlink {
    /// The link called `name`, or `None`.
    pub async fn link_by_name(&self, name: &str) -> Result<Option<LinkInfo>, Error> {
        let mut s = self
            .handle
            .link()
            .get()
            .match_name(name.to_string())
            .execute();
        match s.try_next().await {
            Ok(m) => Ok(m.as_ref().map(parse)),
            Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(nl_err(format!("get link {name}"), e)),
        }
    }

    /// The link with ifindex `index`, or `None`.
    pub async fn link_by_index(&self, index: u32) -> Result<Option<LinkInfo>, Error> {
        let mut s = self.handle.link().get().match_index(index).execute();
        match s.try_next().await {
            Ok(m) => Ok(m.as_ref().map(parse)),
            Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(nl_err(format!("get link #{index}"), e)),
        }
    }

    /// Every link in this namespace.
    pub async fn links(&self) -> Result<Vec<LinkInfo>, Error> {
        let mut s = self.handle.link().get().execute();
        let mut out = Vec::new();
        while let Some(m) = s.try_next().await.map_err(|e| nl_err("list links", e))? {
            out.push(parse(&m));
        }
        Ok(out)
    }

    /// Creates a veth pair (`ip link add <host> mtu M type veth peer <peer> netns <ns>`).
    /// `EEXIST` is reported as such so the caller can name the clash.
    pub async fn create_veth(&self, spec: &VethSpec<'_>) -> Result<(), Error> {
        let msg = LinkVeth::new(spec.host_name, spec.peer_name)
            .mtu(spec.mtu)
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer_message(spec))))
            .build();
        self.handle.link().add(msg).execute().await.map_err(|e| {
            if errno(&e) == Some(libc::EEXIST) {
                Error::netlink(
                    format!("create veth {} / {}", spec.host_name, spec.peer_name),
                    "an interface of that name already exists",
                )
            } else {
                nl_err(
                    format!("create veth {} / {}", spec.host_name, spec.peer_name),
                    e,
                )
            }
        })
    }

    /// Creates a netkit pair in L2 mode (`ip link add <host> mtu M type netkit
    /// mode l2 peer name <peer> netns <ns>`): Ethernet addresses and neighbours
    /// as on a veth, so addressing and the programs' MAC rewrites are the same.
    /// The host end is netkit's primary device, whose hooks the programs attach
    /// to. Both default policies stay `pass`: without programs the kernel routes,
    /// as with a veth. `Ok(false)`: this kernel has no netkit (EOPNOTSUPP,
    /// rtnetlink's "unknown device type").
    pub async fn create_netkit(&self, spec: &VethSpec<'_>) -> Result<bool, Error> {
        let msg = LinkNetkit::new(spec.host_name, spec.peer_name, NetkitMode::L2)
            .mtu(spec.mtu)
            .build();
        let msg = with_netkit_peer(msg, peer_message(spec));
        let what = || format!("create netkit {} / {}", spec.host_name, spec.peer_name);
        match self.handle.link().add(msg).execute().await {
            Ok(()) => Ok(true),
            Err(e) if errno(&e) == Some(libc::EOPNOTSUPP) => Ok(false),
            Err(e) if errno(&e) == Some(libc::EEXIST) => Err(Error::netlink(
                what(),
                "an interface of that name already exists",
            )),
            Err(e) => Err(nl_err(what(), e)),
        }
    }

    /// Turns off link `index`'s automatic IPv6 link-local address
    /// (`ip link set X addrgenmode none`); must come before the link goes up,
    /// when the kernel would make it. `Ok(false)`: no IPv6 on this link (the
    /// kernel runs without it, EAFNOSUPPORT).
    pub async fn no_link_local(&self, index: u32) -> Result<bool, Error> {
        let mut msg = LinkUnspec::new_with_index(index).build();
        msg.attributes
            .push(LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet6(
                vec![AfSpecInet6::AddrGenMode(In6AddrGenMode::None)],
            )]));
        match self.handle.link().set(msg).execute().await {
            Ok(()) => Ok(true),
            Err(e) if errno(&e) == Some(libc::EAFNOSUPPORT) => Ok(false),
            Err(e) => Err(nl_err(
                format!("turn off the IPv6 link-local address of link #{index}"),
                e,
            )),
        }
    }

    /// Sets a link up.
    pub async fn set_up(&self, index: u32) -> Result<(), Error> {
        let msg = LinkUnspec::new_with_index(index).up().build();
        self.handle
            .link()
            .set(msg)
            .execute()
            .await
            .map_err(|e| nl_err(format!("set link #{index} up"), e))
    }
}
