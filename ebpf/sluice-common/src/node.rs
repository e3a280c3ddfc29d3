//! Node-wide state: settings the programs read (`sl_config`), the loaded
//! datapath's identity (`sl_meta`) and the monitor switches (`sl_monitor`).

/// Node-wide settings the programs read, at index 0 of `sl_config`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NodeConfig {
    /// ifindex of the uplink (0: none attached).
    pub uplink_ifindex: u32,
    /// [`config_flags`].
    pub flags: u32,
    /// MAC of the uplink: XDP only takes frames addressed to it.
    pub uplink_mac: [u8; 6],
    /// MTU of the pods' veths. XDP redirects only frames that fit: a bigger one is a
    /// GRO'd skb seen by generic XDP, which the redirect would drop (EMSGSIZE).
    pub pod_mtu: u16,
}

pub mod config_flags {
    /// `uplink_xdp` runs in the driver.
    pub const XDP_NATIVE: u32 = 1 << 1;
    /// `uplink_xdp` runs in generic (skb) mode.
    pub const XDP_GENERIC: u32 = 1 << 2;
    /// The config asked for native XDP (`xdp` resolved: `auto` made concrete).
    pub const XDP_WANT_NATIVE: u32 = 1 << 3;
    /// The config asked for generic XDP.
    pub const XDP_WANT_GENERIC: u32 = 1 << 4;
    /// The uplink's tc programs are `cls_bpf` filters on a clsact qdisc (a kernel
    /// without tcx, before 6.6), not pinned tcx links.
    pub const UPLINK_TC_FILTERS: u32 = 1 << 5;
    /// The uplink is a veth (nested setups, test beds): XDP sends a packet
    /// back out of it by redirect, not `XDP_TX` (see `lb::uplink::xdp_send`).
    pub const UPLINK_VETH: u32 = 1 << 6;
}

/// Identity of the loaded datapath, at index 0 of the `sl_meta` array.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DatapathMeta {
    /// [`LAYOUT_VERSION`] of the maps.
    pub layout_version: u32,
    pub _pad: u32,
    /// Hash of the eBPF object the pinned programs were loaded from.
    pub object_hash: u64,
    /// Seconds since the epoch of that load.
    pub loaded_unix: u64,
}

/// Slots of the `sl_monitor` array (each written by one party, so writers never
/// race on a shared struct).
pub mod monitor_slot {
    /// `bpf_ktime_get_ns` until which events go to the ring buffer; a running
    /// `sluicectl monitor` pushes it forward every second, so a killed monitor
    /// stops the events within [`EVENTS_LEASE_NS`].
    pub const EVENTS_UNTIL_NS: u32 = 0;
    /// Non-zero: the programs write aya-log debug lines (config `"debug": true`,
    /// written by every ADD).
    pub const DEBUG: u32 = 1;
    /// Slots in the array.
    pub const MAX: u32 = 2;
    /// How far ahead a monitor sets [`EVENTS_UNTIL_NS`].
    pub const EVENTS_LEASE_NS: u64 = 3_000_000_000;
}

/// Kernel features the programs use only where the loader found them: bits of
/// the `SLUICE_KERNEL_FEATURES` global, written into the object's read-only
/// data at load. The verifier sees the value as a constant and never visits
/// the branch of a missing feature (dead code a privileged load removes), so
/// one object loads on every kernel.
pub mod kernel_features {
    /// Name of the global in the object.
    pub const GLOBAL: &str = "SLUICE_KERNEL_FEATURES";
    /// `bpf_check_mtu` (Linux 5.12).
    pub const CHECK_MTU: u32 = 1 << 0;
    /// `bpf_ktime_get_coarse_ns` (Linux 5.11).
    pub const KTIME_COARSE: u32 = 1 << 1;
    /// No NAT sweeper (before 5.15): flows are checked for their timeout when a
    /// packet or a new flow meets them, and the NAT maps are LRU maps, so dead
    /// flows make room for new ones.
    pub const LAZY_EXPIRY: u32 = 1 << 2;
    /// IPv6 masquerade: only with the sweeper. With lazy expiry its code made
    /// 5.10's verifier take over a minute (under emulation) for `uplink_out`.
    pub const MASQ6: u32 = 1 << 3;
}
