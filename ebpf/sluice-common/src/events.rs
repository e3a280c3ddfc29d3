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
}

/// One datapath event in the `sl_events` ring buffer. Addresses are IPv4 in the
/// first four bytes when `family` is 4; ports in host byte order.
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
    /// Translated address and port (NAT and hostPort events).
    pub nat_addr: [u8; 4],
    pub nat_port: u16,
    pub _pad2: u16,
    pub _pad3: u32,
}

/// Value of `sl_scratch`: what the drop site leaves for the program's exit.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DropNote {
    pub reason: u32,
    pub ifindex: u32,
}
