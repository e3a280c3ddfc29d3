//! `sluicectl monitor`'s events (`sl_events`) and the per-CPU note a drop site
//! leaves for its program's exit (`sl_scratch`).

/// Kinds of [`Event`].
pub mod event_kind {
    /// A packet was dropped; `reason` says why.
    pub const DROP: u8 = 1;
    /// A pod's flow to the outside got a NAT address and port.
    pub const NAT_NEW: u8 = 2;
    /// A connection from outside to a pod was tracked (replies leave untranslated).
    pub const NAT_INBOUND: u8 = 3;
    /// A new hostPort flow was translated to a pod.
    pub const HOSTPORT_NEW: u8 = 4;
    /// A masqueraded flow was evicted from a full table (or a pod's full
    /// share) for a new one; `reason` says which rule picked it.
    pub const NAT_EVICT: u8 = 5;
    /// A socket's connect (or datagram) to a Service: `dst`/`dport` the
    /// Service, `nat_addr`/`nat_port` the backend picked (all zero: none,
    /// refused; `reason` then says so). No source: the hooks run before
    /// the socket has one.
    pub const SERVICE: u8 = 6;
    /// A new flow from outside (the uplink) to a Service: `src`/`dst` the
    /// client and the address it sent to, `nat_addr`/`nat_port` the backend
    /// it was given (`reason` `lb_uplink_new`).
    pub const SERVICE_FLOW: u8 = 7;
    /// NetworkPolicy audit mode: a new flow policy would have dropped, let
    /// through (`reason` `policy_audit_ingress` or `policy_audit_egress`,
    /// `ifindex` the pod whose policy it is).
    pub const POLICY_AUDIT: u8 = 8;
}

/// One datapath event in the `sl_events` ring buffer. Addresses are IPv4 in the
/// first four bytes when `family` is 4; ports in host byte order.
///
/// 80 bytes since the translated address took 16 (IPv6 masquerade); the
/// datapaths before wrote [`EVENT_V1_SIZE`] bytes with a 4-byte `nat_addr`
/// (readers tell the two apart by the record's length).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Event {
    pub ts_ns: u64,
    /// [`event_kind`].
    pub kind: u8,
    /// 4, 6, or 0 when the packet could not be parsed.
    pub family: u8,
    pub proto: u8,
    pub _pad: u8,
    /// [`reason`] (drops) or the counter the event also bumped.
    pub reason: u32,
    /// The pod's host veth, 0 when not attributable to a pod.
    pub ifindex: u32,
    /// Frame length (drops).
    pub len: u32,
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub sport: u16,
    pub dport: u16,
    /// Translated address (NAT and hostPort events), as `src` and `dst`: IPv4
    /// in the first four bytes when `family` is 4; all zero: none.
    pub nat_addr: [u8; 16],
    /// Translated port (NAT and hostPort events).
    pub nat_port: u16,
    pub _pad2: u16,
}

/// Size of an [`Event`] as the datapaths before the 16-byte `nat_addr` wrote
/// it: the same fields up to `dport`, then `nat_addr: [u8; 4]`, `nat_port:
/// u16` and padding.
pub const EVENT_V1_SIZE: usize = 72;

impl Event {
    /// The event in a record of the older layout ([`EVENT_V1_SIZE`] bytes).
    pub fn from_v1(b: &[u8; EVENT_V1_SIZE]) -> Self {
        let u16_at = |o: usize| u16::from_ne_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_ne_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let a16 = |o: usize| {
            let mut a = [0u8; 16];
            a.copy_from_slice(&b[o..o + 16]);
            a
        };
        let mut nat_addr = [0u8; 16];
        nat_addr[..4].copy_from_slice(&b[60..64]);
        let mut ts = [0u8; 8];
        ts.copy_from_slice(&b[..8]);
        Self {
            ts_ns: u64::from_ne_bytes(ts),
            kind: b[8],
            family: b[9],
            proto: b[10],
            _pad: 0,
            reason: u32_at(12),
            ifindex: u32_at(16),
            len: u32_at(20),
            src: a16(24),
            dst: a16(40),
            sport: u16_at(56),
            dport: u16_at(58),
            nat_addr,
            nat_port: u16_at(64),
            _pad2: 0,
        }
    }
}

/// Value of `sl_scratch`: what the drop site leaves for the program's exit.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DropNote {
    pub reason: u32,
    pub ifindex: u32,
}
