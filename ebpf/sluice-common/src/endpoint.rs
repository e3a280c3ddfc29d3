//! Pods on this node: addresses (`sl_endpoints`), owners (`sl_ep_info`),
//! counters (`sl_ep_stats`) and drops by reason (`sl_ep_drops`).

/// An IP address as a map key: IPv6 as is, IPv4 as an IPv4-mapped IPv6 address
/// (`::ffff:a.b.c.d`), so one map serves both families. Aligned to 4 (the
/// size stays 16): the programs then build an IPv4 key with word stores, not
/// with a call to bpf-linker's byte-at-a-time `memset` for the ten zeros.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct IpKey {
    pub addr: [u8; 16],
}

impl IpKey {
    /// Key of an IPv4 address given in network byte order as four bytes.
    /// Built from four 4-byte words: from the byte literal, LLVM merged the
    /// ten zero bytes into a call to bpf-linker's byte-at-a-time `memset` on
    /// every packet of the programs.
    #[inline(always)]
    pub const fn v4(octets: [u8; 4]) -> Self {
        let words = [
            0,
            0,
            u32::from_ne_bytes([0, 0, 0xff, 0xff]),
            u32::from_ne_bytes(octets),
        ];
        // SAFETY: `IpKey` is `repr(C, align(4))` around 16 bytes, so it has
        // the size and alignment of `[u32; 4]`, and any 16 bytes are a valid
        // `IpKey`.
        unsafe { core::mem::transmute::<[u32; 4], Self>(words) }
    }

    /// Key of an IPv6 address.
    #[inline(always)]
    pub const fn v6(octets: [u8; 16]) -> Self {
        Self { addr: octets }
    }

    /// The IPv4 address if this key holds one.
    pub fn as_v4(&self) -> Option<[u8; 4]> {
        let a = &self.addr;
        if a[..10].iter().all(|b| *b == 0) && a[10] == 0xff && a[11] == 0xff {
            Some([a[12], a[13], a[14], a[15]])
        } else {
            None
        }
    }
}

/// Where a pod address lives: the host side of its veth and the MACs on the wire.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Endpoint {
    /// ifindex of the host-side veth (node namespace).
    pub ifindex: u32,
    /// [`endpoint_flags`].
    pub flags: u32,
    /// MAC of the pod's interface.
    pub pod_mac: [u8; 6],
    /// MAC of the host-side veth.
    pub host_mac: [u8; 6],
}

pub mod endpoint_flags {
    /// The endpoint's address is IPv6.
    pub const IPV6: u32 = 1 << 0;
    /// The pod end of the veth can take XDP frames (GRO on, so veth NAPI runs):
    /// the uplink's XDP program may redirect into it.
    pub const XDP_READY: u32 = 1 << 1;
    /// The pod has bandwidth limits (an entry in `sl_bw` under `ifindex`): only
    /// then do the programs look its token buckets up, so pods without limits
    /// cost no lookup per packet. Userspace keeps it in step with `sl_bw` (ADD,
    /// `sluicectl bandwidth set`, and every datapath load, which marks the
    /// endpoints an older datapath wrote without it).
    pub const LIMITED: u32 = 1 << 2;
    /// Bits 16-31: the endpoint's slot in `sl_ep_slots` plus one; 0 for none
    /// (an endpoint an older plugin wrote, or no slot was free), whose
    /// packets the programs count in `sl_ep_stats` by ifindex. Userspace
    /// keeps these bits when it changes the others.
    pub const SLOT_SHIFT: u32 = 16;

    /// The slot in `flags`, if any.
    #[inline(always)]
    pub const fn slot(flags: u32) -> Option<u32> {
        match flags >> SLOT_SHIFT {
            0 => None,
            s => Some(s - 1),
        }
    }

    /// `flags` with slot `slot` (which must be below `0xffff`).
    #[inline(always)]
    pub const fn with_slot(flags: u32, slot: u32) -> u32 {
        (flags & ((1 << SLOT_SHIFT) - 1)) | ((slot + 1) << SLOT_SHIFT)
    }
}

/// One entry of `sl_ep_slots` (per CPU): the counters of the endpoint whose
/// host veth is `owner` (0: free). A slot is an array index, so the programs
/// find a pod's counters without hashing; `sl_ep_stats` keeps the packets
/// counted before the endpoint is known (unchecked sources, the kernel's
/// deliveries into the pod), and readers add the two.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SlotStats {
    /// Host veth ifindex of the endpoint that holds the slot (userspace
    /// writes it into every CPU's copy; the programs never look at it).
    pub owner: u32,
    pub _pad: u32,
    pub stats: EndpointStats,
}

/// Packet and byte counters of one endpoint, per CPU. Userspace sums over CPUs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct EndpointStats {
    /// Packets the pod sent (seen on host veth ingress).
    pub from_pod_packets: u64,
    pub from_pod_bytes: u64,
    /// Packets sent to the pod (seen on host veth egress).
    pub to_pod_packets: u64,
    pub to_pod_bytes: u64,
}

impl core::ops::Add for EndpointStats {
    type Output = Self;

    /// Sum of two per-CPU values.
    fn add(self, o: Self) -> Self {
        Self {
            from_pod_packets: self.from_pod_packets.wrapping_add(o.from_pod_packets),
            from_pod_bytes: self.from_pod_bytes.wrapping_add(o.from_pod_bytes),
            to_pod_packets: self.to_pod_packets.wrapping_add(o.to_pod_packets),
            to_pod_bytes: self.to_pod_bytes.wrapping_add(o.to_pod_bytes),
        }
    }
}

/// Length of the container id kept in [`EndpointInfo`] (longer ids are cut).
pub const CONTAINER_ID_LEN: usize = 64;
/// Length of an interface name buffer (IFNAMSIZ).
pub const IFNAME_LEN: usize = 16;

/// Who owns an endpoint. Written by the plugin, read by `sluicectl`; the programs
/// never look at it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointInfo {
    /// `CNI_CONTAINERID`, NUL-padded (cut at [`CONTAINER_ID_LEN`]).
    pub container_id: [u8; CONTAINER_ID_LEN],
    /// `CNI_IFNAME`, NUL-padded.
    pub ifname: [u8; IFNAME_LEN],
    /// Host-side veth name, NUL-padded.
    pub host_ifname: [u8; IFNAME_LEN],
    /// Inode of the pod's network namespace (0 if unknown).
    pub netns_ino: u64,
    /// Seconds since the epoch when ADD created the endpoint.
    pub created_unix: u64,
}

impl Default for EndpointInfo {
    fn default() -> Self {
        Self {
            container_id: [0; CONTAINER_ID_LEN],
            ifname: [0; IFNAME_LEN],
            host_ifname: [0; IFNAME_LEN],
            netns_ino: 0,
            created_unix: 0,
        }
    }
}

/// Key of `sl_ep_drops`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct EpDropKey {
    pub ifindex: u32,
    pub reason: u32,
}
