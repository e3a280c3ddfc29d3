//! Layer 4 of an IPv4 frame in a tc program, for the programs that translate
//! addresses and ports (masquerade, hostPort), like Cilium's `bpf/lib/l4.h`:
//! where a packet's ports and checksum are ([`l4`]), and rewriting an address
//! and a port with the kernel's checksum helpers ([`rewrite`]:
//! `bpf_l3_csum_replace`, and `bpf_l4_csum_replace` with `BPF_F_PSEUDO_HDR`,
//! which handle partial checksum offload).
use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    programs::TcContext,
};
use network_types::ip::Ipv4Hdr;
use sluice_common::{reason, Addr6};

use crate::packet::read;

// The protocol constants live in `proto`; re-exported for the modules that
// reach them through `l4`.
pub(crate) use crate::proto::{
    ETH_LEN, ICMP6_DEST_UNREACH, ICMP6_ECHO, ICMP6_ECHO_REPLY, ICMP6_PARAM_PROBLEM,
    ICMP_DEST_UNREACH, ICMP_ECHO, ICMP_ECHO_REPLY, ICMP_TIME_EXCEEDED, IP_CSUM, PROTO_ICMP,
    PROTO_ICMPV6, PROTO_SCTP, PROTO_TCP, PROTO_UDP, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN,
};
use crate::proto::{ETH_P_IPV6_BE, ETH_P_IP_BE};

/// Where the ports and the L4 checksum of a packet are.
#[derive(Clone, Copy, Default)]
pub(crate) struct L4 {
    /// Source port (ICMP echo: identifier).
    pub sport_off: usize,
    pub sport: u16,
    /// Destination port (ICMP echo: none, 0).
    pub dport_off: Option<usize>,
    pub dport: u16,
    csum_off: usize,
    /// The checksum covers a pseudo header (TCP, UDP).
    pseudo: bool,
    /// UDP without a checksum (0): leave it alone.
    no_csum: bool,
    /// `BPF_F_MARK_MANGLED_0` for UDP: a checksum that becomes 0 is sent as 0xffff
    /// (0 means "no checksum").
    mangled: u64,
}

/// One address and one port to replace in a packet.
pub(crate) struct Rewrite {
    pub addr_off: usize,
    pub old_addr: [u8; 4],
    pub new_addr: [u8; 4],
    pub port_off: usize,
    pub old_port: u16,
    pub new_port: u16,
}

/// The IPv4 header of a frame, if it is IPv4.
#[inline(always)]
pub(crate) fn ipv4(ctx: &TcContext) -> Option<Ipv4Hdr> {
    if read::<u16>(ctx, 12).ok()? != ETH_P_IP_BE {
        return None;
    }
    read::<Ipv4Hdr>(ctx, ETH_LEN).ok()
}

/// Whether the frame is IPv6.
#[inline(always)]
pub(crate) fn is_ipv6(ctx: &TcContext) -> bool {
    read::<u16>(ctx, 12).is_ok_and(|t| t == ETH_P_IPV6_BE)
}

#[inline(always)]
pub(crate) fn is_fragment(ip: &Ipv4Hdr) -> bool {
    u16::from_be_bytes(ip.frags) & 0x3fff != 0
}

/// The flags of the TCP header at `l4` (0 if it is cut short), read with
/// the data offset byte before them (see [`read`]).
#[inline(always)]
pub(crate) fn tcp_flags(ctx: &TcContext, l4: usize) -> u8 {
    read::<[u8; 2]>(ctx, l4 + 12).map_or(0, |b| b[1])
}

/// TCP/UDP ports, or an ICMP echo request/reply identifier, at `l4`.
#[inline(always)]
pub(crate) fn l4(ctx: &TcContext, proto: u8, l4: usize, echo_type: u8) -> Result<L4, u32> {
    let bad = |_| reason::DROP_MASQ_MALFORMED;
    match proto {
        PROTO_TCP | PROTO_UDP => {
            let csum_off = if proto == PROTO_TCP { l4 + 16 } else { l4 + 6 };
            let csum: u16 = read(ctx, csum_off).map_err(bad)?;
            Ok(L4 {
                sport_off: l4,
                sport: read(ctx, l4).map_err(bad)?,
                dport_off: Some(l4 + 2),
                dport: read(ctx, l4 + 2).map_err(bad)?,
                csum_off,
                pseudo: true,
                no_csum: proto == PROTO_UDP && csum == 0,
                mangled: if proto == PROTO_UDP {
                    u64::from(BPF_F_MARK_MANGLED_0)
                } else {
                    0
                },
            })
        }
        // ICMPv6's checksum covers a pseudo header (RFC 4443 2.3), ICMP's not.
        PROTO_ICMP | PROTO_ICMPV6 => {
            let t: u8 = ctx.load(l4).map_err(bad)?;
            if t != echo_type {
                return Err(reason::DROP_MASQ_PROTO);
            }
            Ok(L4 {
                sport_off: l4 + 4,
                sport: read(ctx, l4 + 4).map_err(bad)?,
                dport_off: None,
                dport: 0,
                csum_off: l4 + 2,
                pseudo: proto == PROTO_ICMPV6,
                no_csum: false,
                mangled: 0,
            })
        }
        PROTO_SCTP => Ok(L4 {
            sport_off: l4,
            sport: ctx.load(l4).map_err(bad)?,
            dport_off: Some(l4 + 2),
            dport: ctx.load(l4 + 2).map_err(bad)?,
            csum_off: l4 + 8,
            pseudo: false,
            no_csum: true,
            mangled: 0,
        }),
        _ => Err(reason::DROP_MASQ_PROTO),
    }
}

/// Rewrites an address and a port with their checksums.
#[inline(always)]
pub(crate) fn rewrite(ctx: &TcContext, l4: &L4, r: &Rewrite) -> Result<(), ()> {
    let (oa, na) = (
        u64::from(u32::from_ne_bytes(r.old_addr)),
        u64::from(u32::from_ne_bytes(r.new_addr)),
    );
    let (op, np) = (u64::from(r.old_port), u64::from(r.new_port));
    if !l4.no_csum {
        if l4.pseudo {
            ctx.l4_csum_replace(
                l4.csum_off,
                oa,
                na,
                u64::from(BPF_F_PSEUDO_HDR) | l4.mangled | 4,
            )
            .map_err(|_| ())?;
        }
        ctx.l4_csum_replace(l4.csum_off, op, np, l4.mangled | 2)
            .map_err(|_| ())?;
    }
    ctx.l3_csum_replace(IP_CSUM, oa, na, 4).map_err(|_| ())?;
    ctx.store(r.addr_off, &r.new_addr, 0).map_err(|_| ())?;
    ctx.store(r.port_off, &r.new_port, 0).map_err(|_| ())
}

/// One IPv6 address and one port to replace in a packet. The addresses by
/// reference: copies of them took 32 bytes of the callers' frames (the
/// checksum helper and the store read them where they are, stack or map value).
pub(crate) struct Rewrite6<'a> {
    pub addr_off: usize,
    pub old_addr: &'a Addr6,
    pub new_addr: &'a Addr6,
    pub port_off: usize,
    pub old_port: u16,
    pub new_port: u16,
}

/// What `bpf_csum_diff(old, 16, new, 16, 0)` returns, computed here (one
/// helper call less per translated packet): the 32-bit one's complement sum of
/// `new`'s words and of `old`'s complemented. Equal to the helper's modulo
/// 0xffff, which is all its users (`bpf_l4_csum_replace` with size 0 folds it)
/// look at.
#[inline(always)]
fn csum_diff6(old: &Addr6, new: &Addr6) -> u32 {
    let w = |a: &Addr6, i: usize| {
        u64::from(u32::from_ne_bytes([
            a.0[i * 4],
            a.0[i * 4 + 1],
            a.0[i * 4 + 2],
            a.0[i * 4 + 3],
        ]))
    };
    let mut sum: u64 = 0;
    let mut i = 0;
    while i < 4 {
        sum += (!w(old, i) & 0xffff_ffff) + w(new, i);
        i += 1;
    }
    // At most 8 x (2^32 - 1): two folds bring it under 2^32.
    sum = (sum & 0xffff_ffff) + (sum >> 32);
    sum = (sum & 0xffff_ffff) + (sum >> 32);
    sum as u32
}

/// Rewrites an IPv6 address and a port with the L4 checksum (IPv6 has no header
/// checksum; the address is in the pseudo header of TCP, UDP and ICMPv6). The
/// address's difference ([`csum_diff6`]) goes to `bpf_l4_csum_replace` with
/// size 0 (a diff, include/uapi/linux/bpf.h).
#[inline(always)]
pub(crate) fn rewrite6(ctx: &TcContext, l4: &L4, r: &Rewrite6) -> Result<(), ()> {
    if !l4.no_csum {
        if l4.pseudo {
            ctx.l4_csum_replace(
                l4.csum_off,
                0,
                u64::from(csum_diff6(r.old_addr, r.new_addr)),
                u64::from(BPF_F_PSEUDO_HDR) | l4.mangled,
            )
            .map_err(|_| ())?;
        }
        ctx.l4_csum_replace(
            l4.csum_off,
            u64::from(r.old_port),
            u64::from(r.new_port),
            l4.mangled | 2,
        )
        .map_err(|_| ())?;
    }
    ctx.store(r.addr_off, r.new_addr, 0).map_err(|_| ())?;
    ctx.store(r.port_off, &r.new_port, 0).map_err(|_| ())
}
