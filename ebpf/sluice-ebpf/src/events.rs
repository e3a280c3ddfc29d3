//! What `sluicectl monitor` and `sluicectl counters` see of drops and new flows.
//!
//! A drop site calls [`note_drop`] (node counter + a per-CPU note of reason and
//! endpoint); the program's exit sees its own drop verdict and calls
//! [`dropped`], which counts the drop per endpoint (`sl_ep_drops`) and, only
//! while a monitor runs or debug logging is on, describes the packet in the
//! `sl_events` ring buffer and as an aya-log debug line. The forwarding fast
//! path pays nothing for this: one compare of its verdict.
use aya_ebpf::{bindings::BPF_NOEXIST, helpers::bpf_ktime_get_ns, maps::ring_buf::RingBufEntry};
use aya_log_ebpf::debug;
use network_types::ip::{Ipv4Hdr, Ipv6Hdr};
use sluice_common::{
    event_kind, monitor_slot, reason, Backend, DropNote, EpDropKey, Event, IpKey, NatKey, NatKeyOf,
    SvcKey,
};

use crate::{
    counters::count,
    l3::{ETH_P_IP, ETH_P_IPV6},
    maps::{EP_DROPS, EVENTS, EVICT_NOTE, MONITOR, SCRATCH},
    packet::{ptr_at, Packet},
    proto::{PROTO_TCP, PROTO_UDP},
};

/// Counts a drop and leaves its reason and pod (0: the program's own
/// interface, when that is a pod's) for [`dropped`] at the program's exit.
#[inline(always)]
pub fn note_drop(r: u32, ifindex: u32) {
    count(r);
    if let Some(n) = SCRATCH.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, only this CPU's running program writes it.
        unsafe { *n = DropNote { reason: r, ifindex } };
    }
}

/// Events go to the ring buffer while a monitor holds its lease.
#[inline(always)]
fn monitor_on(now: u64) -> bool {
    MONITOR
        .get(monitor_slot::EVENTS_UNTIL_NS)
        .is_some_and(|until| now < *until)
}

/// The time and a reserved ring slot for an event, while a monitor runs
/// (a full ring is counted: `events_lost`).
#[inline(always)]
fn ring_slot() -> Option<(u64, RingBufEntry<Event>)> {
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    if !monitor_on(now) {
        return None;
    }
    match EVENTS.reserve::<Event>(0) {
        Some(slot) => Some((now, slot)),
        None => {
            count(reason::EVENTS_LOST);
            None
        }
    }
}

#[inline(always)]
fn debug_on() -> bool {
    MONITOR.get(monitor_slot::DEBUG).is_some_and(|d| *d != 0)
}

/// At the exit of a program that returned a drop verdict: per-endpoint count,
/// event, debug line. `own_ifindex` is the program's interface when it is a
/// pod's host veth, else 0.
#[inline(never)]
pub fn dropped<P: Packet>(p: &P, own_ifindex: u32) {
    let Some(n) = SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU slot (see note_drop); taken, so a stale note never
    // labels a later drop.
    let note = unsafe { core::ptr::replace(n, DropNote::default()) };
    if !reason::is_drop(note.reason) {
        return;
    }
    let ifindex = if note.ifindex != 0 {
        note.ifindex
    } else {
        own_ifindex
    };
    if ifindex != 0 {
        count_endpoint(ifindex, note.reason);
    }
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    let events = monitor_on(now);
    let dbg = debug_on();
    if !events && !dbg {
        return;
    }
    let mut slot = core::mem::MaybeUninit::<Event>::uninit();
    // SAFETY: a local of the right size and alignment, zeroed before use.
    let ev = unsafe {
        crate::mem::zero_words(slot.as_mut_ptr());
        &mut *slot.as_mut_ptr()
    };
    ev.ts_ns = now;
    ev.kind = event_kind::DROP;
    ev.reason = note.reason;
    ev.ifindex = ifindex;
    ev.len = p.frame_len() as u32;
    describe(p, ev);
    if events {
        emit(ev);
    }
    if dbg {
        debug!(
            &(),
            "drop reason={} ifindex={} len={} proto={} {:i}:{} -> {:i}:{}",
            ev.reason,
            ev.ifindex,
            ev.len,
            ev.proto,
            v4(&ev.src),
            ev.sport,
            v4(&ev.dst),
            ev.dport
        );
    }
}

/// A new masquerade or hostPort flow. `key` is the pod-side (masquerade) or
/// outside (hostPort) tuple, ports in network byte order.
#[inline(never)]
pub fn flow(kind: u8, key: &NatKey, nat_addr: [u8; 4], nat_port: u16, ifindex: u32) {
    // (At most five arguments: BPF calls pass no more in registers.)
    let r = kind_reason(kind);
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    if monitor_on(now) {
        // Written in place in the ring: an event on the stack took 88 bytes of
        // the 512 a chain of calls may use (masquerade calls this from a call).
        match EVENTS.reserve::<Event>(0) {
            Some(mut slot) => {
                // Field by field: a whole `Event` written or zeroed at once became
                // a memcpy/memset call at opt-level 2, one call deeper.
                let e = slot.as_mut_ptr();
                let words = |a: [u8; 4]| [u32::from_ne_bytes(a), 0, 0, 0];
                // SAFETY: a reserved ring slot of one `Event`, 8-byte aligned;
                // every field is written before it is submitted.
                unsafe {
                    flow_head(e, now, kind, 4, key.proto, r, ifindex);
                    let (src, dst, nat) = (words(key.src_ip), words(key.dst_ip), words(nat_addr));
                    let (ps, pd, pn) = addr_words(e);
                    let mut i = 0;
                    while i < 4 {
                        ps.add(i).write(src[i]);
                        pd.add(i).write(dst[i]);
                        pn.add(i).write(nat[i]);
                        i += 1;
                    }
                    flow_ports(e, key.src_port, key.dst_port, nat_port);
                }
                slot.submit(0);
            }
            None => count(reason::EVENTS_LOST),
        }
    }
    if debug_on() {
        debug!(
            &(),
            "flow kind={} proto={} {:i}:{} -> {:i}:{} as {:i}:{} ifindex={}",
            kind,
            key.proto,
            key.src_ip,
            u16::from_be(key.src_port),
            key.dst_ip,
            u16::from_be(key.dst_port),
            nat_addr,
            u16::from_be(nat_port),
            ifindex
        );
    }
}

/// The counter a new flow's event reports.
#[inline(always)]
fn kind_reason(kind: u8) -> u32 {
    match kind {
        event_kind::NAT_NEW => reason::MASQ_NEW_FLOW,
        event_kind::NAT_INBOUND => reason::MASQ_INBOUND_FLOW,
        event_kind::SERVICE_FLOW => reason::LB_UPLINK_NEW,
        _ => reason::HOSTPORT_DNAT,
    }
}

/// A new IPv6 masquerade flow (`key` the pod-side tuple, `nat_addr` the
/// translated address, `None` for an inbound flow), written in place in the
/// ring as [`flow`] writes IPv4 flows: an `Event` on the stack of this call,
/// made from `snat6`, would pass the 512 bytes the chain may use.
#[inline(never)]
pub fn flow6(
    kind: u8,
    key: &sluice_common::Nat6Key,
    nat_addr: Option<&sluice_common::Addr6>,
    nat_port: u16,
    ifindex: u32,
) {
    let Some((now, mut slot)) = ring_slot() else {
        return;
    };
    let r = kind_reason(kind);
    let e = slot.as_mut_ptr();
    // 4-byte words: `Addr6` is 4-byte aligned, and so are the event's
    // addresses (offsets 24, 40 and 60 of an 8-byte aligned slot).
    let words = |a: &sluice_common::Addr6| core::ptr::from_ref(a).cast::<u32>();
    // SAFETY: a reserved ring slot of one `Event`, 8-byte aligned; every field
    // is written before it is submitted; the key's addresses are 16 bytes.
    unsafe {
        flow_head(e, now, kind, 6, key.proto, r, ifindex);
        let (src, dst) = (words(&key.src_ip), words(&key.dst_ip));
        let (ps, pd, pn) = addr_words(e);
        let mut i = 0;
        while i < 4 {
            ps.add(i).write(src.add(i).read());
            pd.add(i).write(dst.add(i).read());
            pn.add(i).write(match nat_addr {
                Some(a) => words(a).add(i).read(),
                None => 0,
            });
            i += 1;
        }
        flow_ports(e, key.src_port, key.dst_port, nat_port);
    }
    slot.submit(0);
}

/// A flow NetworkPolicy's audit mode let through (`r` its reason, `k` the
/// flow as the packet carries it, `ifindex` the pod whose policy it is),
/// written in place in the ring as [`flow6`] writes its event.
#[inline(always)]
pub fn policy_audit(k: &sluice_common::PolicyFlowKey, r: u32, ifindex: u32) {
    let Some((now, mut slot)) = ring_slot() else {
        return;
    };
    let e = slot.as_mut_ptr();
    let v4 = k.src.as_v4().is_some();
    let words = |a: &sluice_common::IpKey| core::ptr::from_ref(a).cast::<u32>();
    // SAFETY: a reserved ring slot of one `Event`, 8-byte aligned; every
    // field is written before it is submitted; `IpKey` is 16 bytes, 4-byte
    // aligned.
    unsafe {
        flow_head(
            e,
            now,
            sluice_common::event_kind::POLICY_AUDIT,
            if v4 { 4 } else { 6 },
            k.proto,
            r,
            ifindex,
        );
        let (src, dst) = (words(&k.src), words(&k.dst));
        let (ps, pd, pn) = addr_words(e);
        let mut i = 0;
        while i < 4 {
            // IPv4 in the first word, as the event's readers expect.
            let j = if v4 { (i + 3) & 3 } else { i };
            ps.add(i)
                .write(if v4 && i > 0 { 0 } else { src.add(j).read() });
            pd.add(i)
                .write(if v4 && i > 0 { 0 } else { dst.add(j).read() });
            pn.add(i).write(0);
            i += 1;
        }
        flow_ports(e, k.sport.to_be(), k.dport.to_be(), 0);
    }
    slot.submit(0);
}

/// Keeps the event of an evicted flow (`key` the pod-side tuple, of addresses
/// `A`: 4 or 16 bytes; `r` the eviction's reason) in a per-CPU note
/// (`sl_evict_note`) for [`report_eviction`] to send: the eviction runs deep
/// in the IPv6 masquerade chain, where a call to write the event would pass
/// the 512 bytes of stack the chain may use. One per packet: a second
/// eviction of the same packet replaces the first's note (both are counted).
#[inline(always)]
pub fn note_eviction<A>(key: &NatKeyOf<A>, nat_addr: &A, nat_port: u16, ifindex: u32, r: u32) {
    let Some(e) = EVICT_NOTE.get_ptr_mut(0) else {
        return;
    };
    let words = size_of::<A>() / 4;
    let family = if words == 1 { 4 } else { 6 };
    let addr = |a: &A, i: usize| {
        if i < words {
            // SAFETY: `i` words fit in `A` (4 or 16 bytes), read unaligned.
            unsafe { core::ptr::from_ref(a).cast::<u32>().add(i).read_unaligned() }
        } else {
            0
        }
    };
    // SAFETY: this CPU's note, written field by field.
    unsafe {
        flow_head(e, 0, event_kind::NAT_EVICT, family, key.proto, r, ifindex);
        let (ps, pd, pn) = addr_words(e);
        let mut i = 0;
        while i < 4 {
            ps.add(i).write(addr(&key.src_ip, i));
            pd.add(i).write(addr(&key.dst_ip, i));
            pn.add(i).write(addr(nat_addr, i));
            i += 1;
        }
        flow_ports(e, key.src_port, key.dst_port, nat_port);
    }
}

/// Sends the event an eviction left in this CPU's note, if any, while a
/// monitor runs (called where the masquerade path is shallow: `nat::snat`).
#[inline(never)]
pub fn report_eviction() {
    let Some(e) = EVICT_NOTE.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's note.
    if unsafe { (*e).kind } != event_kind::NAT_EVICT {
        return;
    }
    // SAFETY: as above.
    unsafe { (*e).kind = 0 };
    let Some((now, mut slot)) = ring_slot() else {
        return;
    };
    let to = slot.as_mut_ptr().cast::<u64>();
    let from = e.cast::<u64>();
    // SAFETY: both are one 8-byte aligned `Event` of 10 words; copied word by
    // word (a whole-struct copy became a memcpy call).
    unsafe {
        let mut i = 0;
        while i < size_of::<Event>() / 8 {
            to.add(i).write(from.add(i).read());
            i += 1;
        }
        (*slot.as_mut_ptr()).ts_ns = now;
        (*slot.as_mut_ptr()).kind = event_kind::NAT_EVICT;
    }
    slot.submit(0);
}

/// The fields of a flow event before its addresses.
///
/// # Safety
/// `e` points to a writable `Event`.
#[inline(always)]
unsafe fn flow_head(
    e: *mut Event,
    now: u64,
    kind: u8,
    family: u8,
    proto: u8,
    r: u32,
    ifindex: u32,
) {
    // SAFETY: the caller's contract.
    unsafe {
        (*e).ts_ns = now;
        (*e).kind = kind;
        (*e).family = family;
        (*e).proto = proto;
        (*e)._pad = 0;
        (*e).reason = r;
        (*e).ifindex = ifindex;
        (*e).len = 0;
    }
}

/// The source, destination and NAT addresses of the event at `e` as 4-byte
/// words (offsets 24, 40 and 60: 4-byte aligned in an 8-byte aligned event).
///
/// # Safety
/// `e` points to a writable `Event`.
#[inline(always)]
unsafe fn addr_words(e: *mut Event) -> (*mut u32, *mut u32, *mut u32) {
    // SAFETY: the caller's contract; raw pointers to fields, nothing read.
    unsafe {
        (
            (&raw mut (*e).src).cast::<u32>(),
            (&raw mut (*e).dst).cast::<u32>(),
            (&raw mut (*e).nat_addr).cast::<u32>(),
        )
    }
}

/// The ports of a flow event (given in network byte order) and its padding.
///
/// # Safety
/// `e` points to a writable `Event`.
#[inline(always)]
unsafe fn flow_ports(e: *mut Event, sport: u16, dport: u16, nat_port: u16) {
    // SAFETY: the caller's contract.
    unsafe {
        (*e).sport = u16::from_be(sport);
        (*e).dport = u16::from_be(dport);
        (*e).nat_port = u16::from_be(nat_port);
        (*e)._pad2 = 0;
    }
}

#[inline(always)]
fn v4(a: &[u8; 16]) -> [u8; 4] {
    [a[0], a[1], a[2], a[3]]
}

#[inline(always)]
fn emit(ev: &Event) {
    // A full ring (the monitor reads too slowly) costs the event, never the packet.
    if EVENTS.output::<Event>(ev, 0).is_err() {
        count(reason::EVENTS_LOST);
    }
}

/// `sl_ep_drops[(ifindex, reason)] += 1` on this CPU (inserted on first use).
#[inline(always)]
fn count_endpoint(ifindex: u32, r: u32) {
    let k = EpDropKey { ifindex, reason: r };
    match EP_DROPS.get_ptr_mut(k) {
        // SAFETY: per-CPU value, only this CPU writes it.
        Some(c) => unsafe { *c += 1 },
        None => {
            let _ = EP_DROPS.insert(k, 1, u64::from(BPF_NOEXIST));
        }
    }
}

/// Copies 16 bytes as two 8-byte words (a whole-array copy became a memmove
/// call at opt-level 2, see [`crate::mem::zero_words`]).
#[inline(always)]
fn copy16(to: &mut [u8; 16], from: &[u8; 16]) {
    // SAFETY: both are 16 bytes; unaligned 8-byte reads and writes.
    unsafe {
        let (f, t) = (from.as_ptr().cast::<u64>(), to.as_mut_ptr().cast::<u64>());
        t.write_unaligned(f.read_unaligned());
        t.add(1).write_unaligned(f.add(1).read_unaligned());
    }
}

/// Addresses and ports of the frame, as far as its linear part holds them.
#[inline(always)]
fn describe<P: Packet>(p: &P, ev: &mut Event) {
    let Some(eth) = ptr_at::<[u8; 14]>(p, 0) else {
        return;
    };
    // SAFETY: bounds checked by ptr_at.
    let et = unsafe { u16::from_be_bytes([(*eth)[12], (*eth)[13]]) };
    let l4_off = if et == ETH_P_IP {
        let Some(ip) = ptr_at::<Ipv4Hdr>(p, 14) else {
            return;
        };
        // SAFETY: bounds checked by ptr_at.
        unsafe {
            ev.family = 4;
            ev.proto = (*ip).proto;
            ev.src[..4].copy_from_slice(&(*ip).src_addr);
            ev.dst[..4].copy_from_slice(&(*ip).dst_addr);
            // Later fragments carry no L4 header.
            if u16::from_be_bytes((*ip).frags) & 0x1fff != 0 {
                return;
            }
            14 + usize::from((*ip).vihl & 0x0f) * 4
        }
    } else if et == ETH_P_IPV6 {
        let Some(ip) = ptr_at::<Ipv6Hdr>(p, 14) else {
            return;
        };
        // SAFETY: bounds checked by ptr_at.
        unsafe {
            ev.family = 6;
            ev.proto = (*ip).next_hdr;
            copy16(&mut ev.src, &(*ip).src_addr);
            copy16(&mut ev.dst, &(*ip).dst_addr);
        }
        14 + Ipv6Hdr::LEN
    } else {
        return;
    };
    if ev.proto == PROTO_TCP || ev.proto == PROTO_UDP {
        if let Some(ports) = ptr_at::<[u8; 4]>(p, l4_off) {
            // SAFETY: bounds checked by ptr_at.
            let b = unsafe { *ports };
            ev.sport = u16::from_be_bytes([b[0], b[1]]);
            ev.dport = u16::from_be_bytes([b[2], b[3]]);
        }
    }
}

/// A socket's connect (or datagram) to the Service `svc` while a monitor
/// runs: the backend picked, or none (refused; `r` says why). Called from
/// the socket hooks, whose calls are shallow.
#[inline(never)]
pub fn service(svc: &SvcKey, backend: Option<&Backend>, r: u32) {
    let Some((now, mut slot)) = ring_slot() else {
        return;
    };
    let e = slot.as_mut_ptr();
    let v4 = svc.addr.as_v4().is_some();
    // An IPv4 key is IPv4-mapped IPv6; the event's IPv4 is its first word.
    let word = |a: &IpKey, i: usize| {
        let at = if v4 { 12 + i * 4 } else { i * 4 };
        if v4 && i > 0 {
            0
        } else {
            u32::from_ne_bytes([a.addr[at], a.addr[at + 1], a.addr[at + 2], a.addr[at + 3]])
        }
    };
    let none = IpKey::v6([0; 16]);
    let (b, port) = match backend {
        Some(b) => (&b.addr, b.port),
        None => (&none, 0),
    };
    // SAFETY: a reserved ring slot of one `Event`, 8-byte aligned; every
    // field is written before it is submitted.
    unsafe {
        flow_head(
            e,
            now,
            event_kind::SERVICE,
            if v4 { 4 } else { 6 },
            svc.proto,
            r,
            0,
        );
        let (ps, pd, pn) = addr_words(e);
        let mut i = 0;
        while i < 4 {
            ps.add(i).write(0);
            pd.add(i).write(word(&svc.addr, i));
            pn.add(i)
                .write(if backend.is_some() { word(b, i) } else { 0 });
            i += 1;
        }
        flow_ports(e, 0, svc.port, port);
    }
    slot.submit(0);
}
