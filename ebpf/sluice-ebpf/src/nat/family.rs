//! The two flow tables, IPv4 (`sl_nat_fwd`/`sl_nat_rev`) and IPv6
//! (`sl_nat6_fwd`/`sl_nat6_rev`), behind one trait so that ports, states,
//! timeouts and expiry (`flow`, `sweep`) are written once for both.
use aya_ebpf::maps::{Array, HashMap};
use sluice_common::{event_kind, nat_cursor, Addr6, NatEntryOf, NatKeyOf, NatRevOf};

use crate::{
    events,
    maps::{NAT6_FWD, NAT6_REV, NAT6_RING, NAT_FWD, NAT_REV, NAT_RING},
};

/// An address family's flow table.
pub(super) trait Family {
    type Addr: Copy + PartialEq + 'static;
    /// The entry's padding (see `NatEntryOf`).
    type Pad: Copy + 'static;
    const PAD: Self::Pad;
    /// Whether a new flow's port is claimed in a call of its own (a call in
    /// the 32-try loop makes old verifiers walk every try: 6.1 took over a
    /// minute). Off for both since the IPv6 addresses are 4-byte aligned and
    /// the inlined loop fits the stack.
    const CLAIM_CALL: bool;

    fn fwd() -> &'static HashMap<FlowKey<Self>, Entry<Self>>;
    fn rev() -> &'static HashMap<FlowKey<Self>, Rev<Self>>;
    /// The ring of recent flows (see `evict`).
    fn ring() -> &'static Array<FlowKey<Self>>;
    /// The ring's slots in `sl_nat_cursor` ([`nat_cursor`]).
    const WRITTEN: u32;
    const HAND: u32;
    /// The table's count of flows in `sl_nat_cursor`.
    const FLOWS: u32;
    /// Whether the flow function makes room for a new flow, records it and
    /// reclaims an idle holder's port itself (calls of `evict`). IPv6: its
    /// flow function is a call with a 328-byte frame at the end of a chain
    /// that leaves no room for one more call on 6.1 (512 bytes in all), so
    /// `v6::snat6` makes room before it and records the flow after it, and a
    /// port is not reclaimed.
    const ROOM_IN_FLOW: bool;
    /// 32 bits of an address for the port choice's hash.
    fn fold(a: &Self::Addr) -> u32;
    /// A flow event for `sluicectl monitor`.
    fn event(kind: u8, k: &FlowKey<Self>, nat_addr: Self::Addr, nat_port: u16, ifindex: u32);
    /// The event of a flow that just claimed its port, sent where the port is
    /// claimed (IPv4) or by the caller (IPv6, see `v6::snat6`: one call less
    /// deep, for the stack).
    fn claimed(k: &FlowKey<Self>, nat_addr: Self::Addr, nat_port: u16, ifindex: u32);
}

pub(super) struct V4;
pub(super) struct V6;

pub(super) type FlowKey<F> = NatKeyOf<<F as Family>::Addr>;
pub(super) type Entry<F> = NatEntryOf<<F as Family>::Addr, <F as Family>::Pad>;
pub(super) type Rev<F> = NatRevOf<<F as Family>::Addr>;

impl Family for V4 {
    type Addr = [u8; 4];
    type Pad = u32;
    const PAD: u32 = 0;
    const CLAIM_CALL: bool = false;
    const WRITTEN: u32 = nat_cursor::WRITTEN_V4;
    const HAND: u32 = nat_cursor::HAND_V4;
    const FLOWS: u32 = nat_cursor::FLOWS_V4;
    const ROOM_IN_FLOW: bool = true;

    #[inline(always)]
    fn fwd() -> &'static HashMap<FlowKey<Self>, Entry<Self>> {
        &NAT_FWD
    }
    #[inline(always)]
    fn rev() -> &'static HashMap<FlowKey<Self>, Rev<Self>> {
        &NAT_REV
    }
    #[inline(always)]
    fn ring() -> &'static Array<FlowKey<Self>> {
        &NAT_RING
    }
    #[inline(always)]
    fn fold(a: &[u8; 4]) -> u32 {
        u32::from_ne_bytes(*a)
    }
    #[inline(always)]
    fn event(kind: u8, k: &FlowKey<Self>, nat_addr: [u8; 4], nat_port: u16, ifindex: u32) {
        events::flow(kind, k, nat_addr, nat_port, ifindex);
    }
    #[inline(always)]
    fn claimed(k: &FlowKey<Self>, nat_addr: [u8; 4], nat_port: u16, ifindex: u32) {
        events::flow(event_kind::NAT_NEW, k, nat_addr, nat_port, ifindex);
    }
}

impl Family for V6 {
    type Addr = Addr6;
    type Pad = ();
    const PAD: () = ();
    const CLAIM_CALL: bool = false;
    const WRITTEN: u32 = nat_cursor::WRITTEN_V6;
    const HAND: u32 = nat_cursor::HAND_V6;
    const FLOWS: u32 = nat_cursor::FLOWS_V6;
    const ROOM_IN_FLOW: bool = false;

    #[inline(always)]
    fn fwd() -> &'static HashMap<FlowKey<Self>, Entry<Self>> {
        &NAT6_FWD
    }
    #[inline(always)]
    fn rev() -> &'static HashMap<FlowKey<Self>, Rev<Self>> {
        &NAT6_REV
    }
    #[inline(always)]
    fn ring() -> &'static Array<FlowKey<Self>> {
        &NAT6_RING
    }
    #[inline(always)]
    fn fold(a: &Addr6) -> u32 {
        let w = |i: usize| u32::from_ne_bytes([a.0[i], a.0[i + 1], a.0[i + 2], a.0[i + 3]]);
        w(0) ^ w(4) ^ w(8) ^ w(12)
    }
    #[inline(always)]
    fn event(kind: u8, k: &FlowKey<Self>, nat_addr: Addr6, nat_port: u16, ifindex: u32) {
        // No translated address (inbound flows): none in the event, and no
        // copy of `::` on the stack for it to point to.
        let nat = (nat_addr != Addr6::default()).then_some(&nat_addr);
        events::flow6(kind, k, nat, nat_port, ifindex);
    }
    #[inline(always)]
    fn claimed(_k: &FlowKey<Self>, _nat_addr: Addr6, _nat_port: u16, _ifindex: u32) {}
}
