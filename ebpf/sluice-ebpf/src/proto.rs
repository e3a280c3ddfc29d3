//! Protocol numbers, address families and header offsets, defined once
//! (linux/if_ether.h, linux/in.h, linux/socket.h; RFC 791 for IPv4, RFC 8200
//! for IPv6, RFC 792 and RFC 4443 for ICMP). Offsets into a frame count the
//! Ethernet header; offsets into an IPv6 header (`IP6_*`) do not.

/// Ethernet header.
pub(crate) const ETH_LEN: usize = 14;
pub(crate) const ETH_P_IP: u16 = 0x0800;
pub(crate) const ETH_P_IPV6: u16 = 0x86DD;
/// The EtherTypes as `skb->protocol` holds them (network order).
pub(crate) const ETH_P_IP_BE: u16 = ETH_P_IP.to_be();
pub(crate) const ETH_P_IPV6_BE: u16 = ETH_P_IPV6.to_be();

/// Address families (`bpf_fib_lookup`, `bpf_sock_addr.user_family`).
pub(crate) const AF_INET: u8 = 2;
pub(crate) const AF_INET6: u8 = 10;

/// IPv4 header checksum, offset in the frame.
pub(crate) const IP_CSUM: usize = ETH_LEN + 10;

/// IPv6 header length and the offsets of its fields.
pub(crate) const IPV6_LEN: usize = 40;
pub(crate) const IP6_NEXT_HDR: usize = 6;
pub(crate) const IP6_SRC: usize = 8;
pub(crate) const IP6_DST: usize = 24;
/// Those offsets in a frame (an IPv6 header right after Ethernet).
pub(crate) const IP6_SRC_OFF: usize = ETH_LEN + IP6_SRC;
pub(crate) const IP6_DST_OFF: usize = ETH_LEN + IP6_DST;
pub(crate) const IP6_L4_OFF: usize = ETH_LEN + IPV6_LEN;
/// Ethernet and IPv6 headers: what a program pulls into the linear area
/// before parsing.
pub(crate) const HEADERS_LEN: usize = ETH_LEN + IPV6_LEN;

/// Next-header values of the IPv6 extension headers walked (RFC 8200 4.1).
pub(crate) const NH_HOP_BY_HOP: u8 = 0;
pub(crate) const NH_ROUTING: u8 = 43;
pub(crate) const NH_FRAGMENT: u8 = 44;
pub(crate) const NH_DEST_OPTS: u8 = 60;

/// IP protocol numbers.
pub(crate) const PROTO_ICMP: u8 = 1;
pub(crate) const PROTO_TCP: u8 = 6;
pub(crate) const PROTO_UDP: u8 = 17;
/// SCTP: its CRC32c covers the ports but no pseudo header (RFC 4960 6.8), so
/// addresses change without a checksum update; ports must not change.
pub(crate) const PROTO_SCTP: u8 = 132;
pub(crate) const PROTO_ICMPV6: u8 = 58;

/// ICMP types (RFC 792).
pub(crate) const ICMP_ECHO_REPLY: u8 = 0;
pub(crate) const ICMP_DEST_UNREACH: u8 = 3;
pub(crate) const ICMP_ECHO: u8 = 8;
pub(crate) const ICMP_TIME_EXCEEDED: u8 = 11;
/// ICMPv6 types (RFC 4443): errors are types below 128.
pub(crate) const ICMP6_DEST_UNREACH: u8 = 1;
pub(crate) const ICMP6_PARAM_PROBLEM: u8 = 4;
pub(crate) const ICMP6_ECHO: u8 = 128;
pub(crate) const ICMP6_ECHO_REPLY: u8 = 129;

/// TCP flags (RFC 793).
pub(crate) const TCP_FIN: u8 = 0x01;
pub(crate) const TCP_SYN: u8 = 0x02;
pub(crate) const TCP_RST: u8 = 0x04;
pub(crate) const TCP_ACK: u8 = 0x10;
