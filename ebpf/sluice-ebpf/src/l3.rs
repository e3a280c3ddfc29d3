//! Network-layer parsing and the edits forwarding needs (TTL, MACs).
use core::ptr::copy_nonoverlapping;

use network_types::{
    eth::EthHdr,
    ip::{Ipv4Hdr, Ipv6Hdr},
};
use sluice_common::{reason, Addr6, IpKey};

use crate::{
    l4::ETH_LEN,
    packet::{ptr_at, Packet},
};

pub(crate) use crate::proto::{AF_INET, AF_INET6, ETH_P_IP, ETH_P_IPV6};

/// Whether two IPv6 addresses are equal, compared as four words (a derived
/// `==` on 16 bytes became an i128 comparison that crashed the BPF backend).
#[inline(always)]
pub(crate) fn same6(a: &Addr6, b: &Addr6) -> bool {
    let w = |x: &Addr6, i: usize| {
        u32::from_ne_bytes([x.0[i * 4], x.0[i * 4 + 1], x.0[i * 4 + 2], x.0[i * 4 + 3]])
    };
    w(a, 0) == w(b, 0) && w(a, 1) == w(b, 1) && w(a, 2) == w(b, 2) && w(a, 3) == w(b, 3)
}

/// The parsed headers of an IP packet.
pub struct Headers {
    pub eth: *mut EthHdr,
    pub l3: L3,
}

pub enum L3 {
    V4(*mut Ipv4Hdr),
    V6(*mut Ipv6Hdr),
}

/// Why parsing stopped: the counter to bump and whether to drop.
pub struct Verdict {
    pub reason: u32,
    pub drop: bool,
}

/// Parses Ethernet + IPv4/IPv6 headers. Non-IP frames are passed; frames too
/// short for the header they announce are dropped (the kernel would drop them too).
#[inline(always)]
pub fn parse(p: &impl Packet) -> Result<Headers, Verdict> {
    let eth: *mut EthHdr = ptr_at(p, 0).ok_or(Verdict {
        reason: reason::DROP_MALFORMED,
        drop: true,
    })?;
    // SAFETY: bounds checked by ptr_at.
    let proto = u16::from_be(unsafe { (*eth).ether_type });
    match proto {
        ETH_P_IP => {
            let ip: *mut Ipv4Hdr = ptr_at(p, EthHdr::LEN).ok_or(Verdict {
                reason: reason::DROP_MALFORMED,
                drop: true,
            })?;
            // SAFETY: bounds checked.
            let vihl = unsafe { (*ip).vihl };
            let total = u16::from_be_bytes(unsafe { (*ip).tot_len }) as usize;
            let ihl = ((vihl & 0x0f) as usize) * 4;
            let l3_bytes = p.frame_len().saturating_sub(EthHdr::LEN);
            // As the kernel's ip_rcv: the frame must hold the header the IHL
            // announces and the total length (padding after it is fine). A total
            // of 0 is IPv4 BIG TCP (a GSO packet over 64 KiB).
            let big_tcp = total == 0 && l3_bytes > 65_535;
            if vihl >> 4 != 4
                || ihl < Ipv4Hdr::LEN
                || ihl > l3_bytes
                || (!big_tcp && (total < ihl || total > l3_bytes))
            {
                return Err(Verdict {
                    reason: reason::DROP_MALFORMED,
                    drop: true,
                });
            }
            Ok(Headers {
                eth,
                l3: L3::V4(ip),
            })
        }
        ETH_P_IPV6 => {
            let ip: *mut Ipv6Hdr = ptr_at(p, EthHdr::LEN).ok_or(Verdict {
                reason: reason::DROP_MALFORMED,
                drop: true,
            })?;
            // SAFETY: bounds checked.
            let payload = usize::from(u16::from_be_bytes(unsafe { (*ip).payload_len }));
            let l3_bytes = p.frame_len().saturating_sub(EthHdr::LEN);
            // A payload length of 0 is a jumbogram / BIG TCP packet.
            if unsafe { (*ip).vcf[0] } >> 4 != 6
                || (payload != 0 && Ipv6Hdr::LEN + payload > l3_bytes)
            {
                return Err(Verdict {
                    reason: reason::DROP_MALFORMED,
                    drop: true,
                });
            }
            Ok(Headers {
                eth,
                l3: L3::V6(ip),
            })
        }
        _ => Err(Verdict {
            reason: reason::PASS_NOT_IP,
            drop: false,
        }),
    }
}

/// The IPv4 header fields the translation paths (masquerade, hostPort) read,
/// copied out of the packet.
#[derive(Clone, Copy)]
pub struct V4Fields {
    /// The header itself, for the rewrites.
    pub hdr: *mut Ipv4Hdr,
    pub src: [u8; 4],
    pub dst: [u8; 4],
    pub proto: u8,
    /// Version and header length, as in the header.
    pub vihl: u8,
    /// Flags and fragment offset, as in the header.
    pub frags: [u8; 2],
}

impl V4Fields {
    /// Offset of the L4 header from the frame's start (options included).
    #[inline(always)]
    pub fn l4_off(&self) -> usize {
        ETH_LEN + usize::from(self.vihl & 0x0f) * 4
    }

    /// A fragment (more-fragments set or an offset): no L4 header to read.
    #[inline(always)]
    pub fn fragment(&self) -> bool {
        u16::from_be_bytes(self.frags) & 0x3fff != 0
    }
}

impl Headers {
    /// The IPv4 fields of [`V4Fields`]; `None` for IPv6.
    #[inline(always)]
    pub fn v4_fields(&self) -> Option<V4Fields> {
        let L3::V4(ip) = self.l3 else {
            return None;
        };
        // SAFETY: bounds checked by `parse`.
        let (src, dst, proto, vihl, frags) = unsafe {
            (
                (*ip).src_addr,
                (*ip).dst_addr,
                (*ip).proto,
                (*ip).vihl,
                (*ip).frags,
            )
        };
        Some(V4Fields {
            hdr: ip,
            src,
            dst,
            proto,
            vihl,
            frags,
        })
    }

    /// An IPv6 packet's addresses and next header; `None` for IPv4.
    #[inline(always)]
    pub fn v6_fields(&self) -> Option<([u8; 16], [u8; 16], u8)> {
        let L3::V6(ip) = self.l3 else {
            return None;
        };
        // SAFETY: bounds checked by `parse`.
        Some(unsafe { ((*ip).src_addr, (*ip).dst_addr, (*ip).next_hdr) })
    }

    /// The source as a map key.
    #[inline(always)]
    pub fn src_key(&self) -> IpKey {
        // SAFETY: the pointers were bounds checked by `parse`.
        match self.l3 {
            L3::V4(ip) => IpKey::v4(unsafe { (*ip).src_addr }),
            L3::V6(ip) => IpKey::v6(unsafe { (*ip).src_addr }),
        }
    }

    /// The destination as a map key.
    #[inline(always)]
    pub fn dst_key(&self) -> IpKey {
        // SAFETY: the pointers were bounds checked by `parse`.
        match self.l3 {
            L3::V4(ip) => IpKey::v4(unsafe { (*ip).dst_addr }),
            L3::V6(ip) => IpKey::v6(unsafe { (*ip).dst_addr }),
        }
    }

    /// TTL or hop limit.
    #[inline(always)]
    pub fn ttl(&self) -> u8 {
        // SAFETY: bounds checked by `parse`.
        match self.l3 {
            L3::V4(ip) => unsafe { (*ip).ttl },
            L3::V6(ip) => unsafe { (*ip).hop_limit },
        }
    }

    /// IPv4 with options or a fragment (counted; routing does not need L4).
    #[inline(always)]
    pub fn v4_options_or_fragment(&self) -> bool {
        match self.l3 {
            // SAFETY: bounds checked by `parse`.
            L3::V4(ip) => unsafe {
                (*ip).vihl & 0x0f != 5 || u16::from_be_bytes((*ip).frags) & 0x3fff != 0
            },
            L3::V6(_) => false,
        }
    }

    /// Decrements the TTL (with the IPv4 checksum update of the kernel's
    /// `ip_decrease_ttl`) or the hop limit. Callers check `ttl() > 1` first.
    #[inline(always)]
    pub fn decrement_ttl(&self) {
        match self.l3 {
            // SAFETY: bounds checked by `parse`; the program may write the packet.
            L3::V4(ip) => unsafe {
                let mut check = u32::from(u16::from_ne_bytes((*ip).check));
                check += u32::from(0x0100u16.to_be());
                let folded = (check + u32::from(check >= 0xffff)) as u16;
                (*ip).check = folded.to_ne_bytes();
                (*ip).ttl -= 1;
            },
            L3::V6(ip) => unsafe { (*ip).hop_limit -= 1 },
        }
    }

    /// Sets the Ethernet addresses.
    #[inline(always)]
    pub fn set_macs(&self, dst: [u8; 6], src: [u8; 6]) {
        // SAFETY: bounds checked by `parse`; 6 bytes into 6-byte fields. A copy,
        // not an assignment, which became a `memmove` call (see
        // `forward::zero_words`).
        unsafe {
            copy_nonoverlapping(dst.as_ptr(), (*self.eth).dst_addr.as_mut_ptr(), 6);
            copy_nonoverlapping(src.as_ptr(), (*self.eth).src_addr.as_mut_ptr(), 6);
        }
    }

    /// Destination MAC of the frame.
    #[inline(always)]
    pub fn dst_mac(&self) -> [u8; 6] {
        // SAFETY: bounds checked by `parse`.
        unsafe { (*self.eth).dst_addr }
    }
}
