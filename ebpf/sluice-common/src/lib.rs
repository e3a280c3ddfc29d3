//! Map key and value types shared by the Sluice eBPF programs and userspace,
//! one module per feature, and the registries of maps ([`maps`]), programs
//! ([`programs`]) and counter reasons ([`reason`]).
//!
//! Every type here is `#[repr(C)]` with explicit padding so that both sides agree on
//! the byte layout. Changing a type, a map name or a map's key/value size is a layout
//! change: bump [`LAYOUT_VERSION`] so that the plugin and `sluicectl` notice a pinned
//! datapath of another layout instead of misreading it.
#![no_std]
// The eBPF programs call these helpers: there a call that is not inlined is a
// BPF-to-BPF call the verifier follows apart (see sluice-ebpf's nat/flow.rs).
#![expect(clippy::inline_always, reason = "shared with the eBPF programs")]

pub mod agent;
pub mod bandwidth;
pub mod endpoint;
pub mod events;
pub mod hostport;
pub mod kernel_nat;
pub mod lb;
pub mod maps;
pub mod nat;
pub mod node;
pub mod policy;
pub mod programs;
pub mod reason;
#[cfg(feature = "user")]
pub mod user;

// Everything at the root too: the programs and userspace name types by these paths.
pub use agent::*;
pub use bandwidth::*;
pub use endpoint::*;
pub use events::*;
pub use hostport::*;
pub use kernel_nat::*;
pub use lb::*;
pub use maps::{map_names, map_sizes};
pub use nat::*;
pub use node::*;
pub use policy::*;
pub use programs::prog_names;

/// Version of the map layout. Stored in the pinned `sl_meta` map.
pub const LAYOUT_VERSION: u32 = 1;

/// Default base of the pin roots: one directory per network below it.
pub const DEFAULT_PIN_BASE: &str = "/sys/fs/bpf/sluice";

/// Default base of the plugin's state (attachment records): one directory per
/// network below it, named as the network (config `stateDir` overrides it).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/cni/sluice";

/// Sub-directories of a network's pin root.
pub mod pin_dirs {
    /// Pinned maps (pinned by name by the loader).
    pub const MAPS: &str = "maps";
    /// Pinned programs, reused by every ADD after the first.
    pub const PROGS: &str = "progs";
    /// Pinned tcx/XDP links, one per attachment point.
    pub const LINKS: &str = "links";
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all types are repr(C), Copy, have no padding bytes and every bit
    // pattern is a valid value.
    unsafe impl aya::Pod for super::IpKey {}
    unsafe impl aya::Pod for super::PolicyConfig {}
    unsafe impl aya::Pod for super::PolicyPod {}
    unsafe impl aya::Pod for super::PolicyKey {}
    unsafe impl aya::Pod for super::PolicyRules {}
    unsafe impl aya::Pod for super::PolicyFlowKey {}
    unsafe impl aya::Pod for super::PolicyFlow {}
    unsafe impl aya::Pod for super::Endpoint {}
    unsafe impl aya::Pod for super::EndpointStats {}
    unsafe impl aya::Pod for super::SlotStats {}
    unsafe impl aya::Pod for super::EndpointInfo {}
    unsafe impl aya::Pod for super::DatapathMeta {}
    unsafe impl aya::Pod for super::NodeConfig {}
    unsafe impl<A: super::HpAddr> aya::Pod for super::NatKeyOf<A> {}
    unsafe impl aya::Pod for super::NatEntry {}
    unsafe impl aya::Pod for super::NatRev {}
    unsafe impl aya::Pod for super::MasqConfig {}
    unsafe impl aya::Pod for super::NatLimits {}
    unsafe impl aya::Pod for super::Nat6Entry {}
    unsafe impl aya::Pod for super::Nat6Rev {}
    unsafe impl aya::Pod for super::Masq6Config {}
    unsafe impl aya::Pod for super::FragKey {}
    unsafe impl aya::Pod for super::FragEntry {}
    unsafe impl aya::Pod for super::SockKey {}
    unsafe impl aya::Pod for super::HostPortConfig {}
    unsafe impl aya::Pod for super::Addr6 {}
    unsafe impl aya::Pod for super::SockKey6 {}
    // The generic hostPort structs with an `HpAddr` (IPv4 or IPv6 address) have
    // no implicit padding (`layouts_have_no_padding` checks both).
    unsafe impl<A: super::HpAddr> aya::Pod for super::PortKeyOf<A> {}
    unsafe impl<A: super::HpAddr> aya::Pod for super::PortTargetOf<A> {}
    unsafe impl<A: super::HpAddr> aya::Pod for super::HpFlowOf<A> {}
    unsafe impl<A: super::HpAddr> aya::Pod for super::SockOrigOf<A> {}
    unsafe impl aya::Pod for super::BwState {}
    unsafe impl aya::Pod for super::EdtSlot {}
    unsafe impl aya::Pod for super::Event {}
    unsafe impl aya::Pod for super::EpDropKey {}
    unsafe impl aya::Pod for super::DropNote {}
    unsafe impl aya::Pod for super::KernelFlowKey {}
    unsafe impl aya::Pod for super::KernelFlow {}
    unsafe impl aya::Pod for super::SvcKey {}
    unsafe impl aya::Pod for super::SvcValue {}
    unsafe impl aya::Pod for super::BackendKey {}
    unsafe impl aya::Pod for super::Backend {}
    unsafe impl aya::Pod for super::LbSockKey {}
    unsafe impl aya::Pod for super::LbSockOrig {}
    unsafe impl aya::Pod for super::AffinityKey {}
    unsafe impl aya::Pod for super::Affinity {}
    unsafe impl aya::Pod for super::LbConfig {}
}

/// FNV-1a, 64 bits: a small stable hash (object identity, host veth names).
pub const fn fnv1a64(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < data.len() {
        h ^= data[i] as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    h
}

/// Copies `s` into a NUL-padded buffer, cutting it at `N` bytes.
pub fn to_cbuf<const N: usize>(s: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let n = if s.len() < N { s.len() } else { N };
    out[..n].copy_from_slice(&s[..n]);
    out
}

/// The bytes of a NUL-padded buffer up to the first NUL.
pub fn from_cbuf(buf: &[u8]) -> &[u8] {
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    &buf[..end]
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn registry_sizes_match_the_types_and_names_are_unique() {
        for (i, m) in maps::ALL.iter().enumerate() {
            assert!(
                m.name.len() <= 15,
                "{} is longer than the kernel keeps",
                m.name
            );
            assert!(m.name.starts_with("sl_"), "{}", m.name);
            assert!(
                maps::ALL[..i].iter().all(|o| o.name != m.name),
                "{} twice",
                m.name
            );
            assert_eq!(maps::find(m.name), Some(m));
        }
        assert_eq!(maps::NON_MASQ.key_size, 8);
        assert_eq!(maps::ENDPOINTS.key_size, 16);
        assert_eq!(maps::BANDWIDTH.value_size, 112);
        for (i, p) in programs::ALL.iter().enumerate() {
            assert!(programs::ALL[..i].iter().all(|o| o.name != p.name));
        }
    }

    #[test]
    fn constructors_pack_like_the_wire() {
        let k = PortKey::new([192, 0, 2, 1], 8080, 6);
        assert_eq!(k.host_port.to_ne_bytes(), 8080u16.to_be_bytes());
        assert_eq!(k.port(), 8080);
        assert_eq!(k.any_address().host_ip, [0; 4]);
        let n = NatKey::new([10, 0, 0, 1], [8, 8, 8, 8], 1, 2, 17);
        let r = n.reverse([192, 0, 2, 1], 3);
        assert_eq!(r, NatKey::new([8, 8, 8, 8], [192, 0, 2, 1], 2, 3, 17));
    }

    #[test]
    fn ipv4_keys_are_mapped_ipv6() {
        let k = IpKey::v4([10, 1, 2, 3]);
        assert_eq!(
            k.addr,
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 1, 2, 3]
        );
        assert_eq!(k.as_v4(), Some([10, 1, 2, 3]));
        let mut v6 = [0u8; 16];
        v6[0] = 0xfd;
        v6[15] = 1;
        assert_eq!(IpKey::v6(v6).as_v4(), None);
    }

    #[test]
    fn layouts_have_no_padding() {
        use core::mem::size_of;
        assert_eq!(size_of::<IpKey>(), 16);
        assert_eq!(size_of::<Endpoint>(), 4 + 4 + 6 + 6);
        assert_eq!(size_of::<EndpointStats>(), 32);
        assert_eq!(size_of::<SlotStats>(), 4 + 4 + 32);
        assert_eq!(size_of::<EndpointInfo>(), 64 + 16 + 16 + 8 + 8);
        assert_eq!(size_of::<DatapathMeta>(), 24);
        assert_eq!(size_of::<NodeConfig>(), 16);
        assert_eq!(u32::try_from(reason::COUNT), Ok(reason::XDP_LB_SEND + 1));
        assert_eq!(size_of::<PolicyKey>(), 4 + 4 + 4 + 16);
        assert_eq!(size_of::<PortRange>(), 8);
        assert_eq!(size_of::<PolicyRules>(), 4 + 16 * 8);
        assert_eq!(size_of::<PolicyFlowKey>(), 16 + 16 + 2 + 2 + 1 + 1 + 2);
        assert_eq!(size_of::<PolicyFlow>(), 8);
        assert_eq!(size_of::<PolicyPod>(), 8);
        assert_eq!(size_of::<Event>(), 8 + 4 + 4 + 4 + 4 + 16 + 16 + 4 + 16 + 4);
        // Written and zeroed in 8-byte words; the ring keeps records 8-aligned.
        assert_eq!(size_of::<Event>() % 8, 0);
        assert_eq!(core::mem::align_of::<Event>(), 8);
        assert!(size_of::<Event>() > EVENT_V1_SIZE);
        assert_eq!(size_of::<EpDropKey>(), 8);
        assert_eq!(size_of::<DropNote>(), 8);
        assert_eq!(size_of::<Bucket>(), 56);
        assert_eq!(size_of::<BwState>(), 112);
        assert_eq!(size_of::<EdtSlot>(), 16);
        assert_eq!(size_of::<PortKey>(), 8);
        assert_eq!(size_of::<PortTarget>(), 12);
        assert_eq!(size_of::<HpFlow>(), 16);
        assert_eq!(size_of::<SockKey>(), 16);
        assert_eq!(size_of::<SockOrig>(), 8);
        // hostport_layouts: the IPv6 forms, field by field.
        assert_eq!(size_of::<PortKey6>(), 16 + 2 + 1 + 1);
        assert_eq!(size_of::<PortTarget6>(), 16 + 2 + 2 + 4);
        assert_eq!(size_of::<HpFlow6>(), 16 + 16 + 2 + 2 + 4);
        assert_eq!(size_of::<SockKey6>(), 8 + 16 + 2 + 2 + 4);
        assert_eq!(size_of::<SockOrig6>(), 16 + 2 + 2);
        assert_eq!(size_of::<HostPortConfig>(), 16);
        assert_eq!(size_of::<FragKey>(), 12);
        assert_eq!(size_of::<FragEntry>(), 16);
        assert_eq!(size_of::<NatKey>(), 16);
        assert_eq!(size_of::<NatEntry>(), 32);
        assert_eq!(size_of::<NatRev>(), 8);
        assert_eq!(size_of::<MasqConfig>(), 40);
        assert_eq!(size_of::<NatLimits>(), 16);
        assert_eq!(size_of::<Nat6Key>(), 16 + 16 + 2 + 2 + 1 + 3);
        assert_eq!(size_of::<Nat6Entry>(), 2 + 1 + 1 + 4 + 8 + 8 + 16);
        assert_eq!(size_of::<Nat6Rev>(), 20);
        assert_eq!(size_of::<Masq6Config>(), 36);
        assert_eq!(size_of::<KernelFlowKey>(), 16 + 16 + 2 + 2 + 1 + 1 + 2);
        assert_eq!(size_of::<KernelFlow>(), 8 + 4 + 1 + 1 + 2);
        assert_eq!(size_of::<SvcKey>(), 16 + 2 + 1 + 1);
        assert_eq!(size_of::<SvcValue>(), 16);
        assert_eq!(size_of::<BackendKey>(), 8);
        assert_eq!(size_of::<Backend>(), 16 + 2 + 2);
        assert_eq!(size_of::<LbSockKey>(), 8 + 16 + 2 + 2 + 4);
        assert_eq!(size_of::<LbSockOrig>(), 16 + 2 + 2);
        assert_eq!(size_of::<AffinityKey>(), 16);
        assert_eq!(size_of::<Affinity>(), 8 + 4 + 4 + 20 + 4);
    }

    #[test]
    fn event_fields_keep_their_offsets() {
        use core::mem::offset_of;
        // Up to `dport` the two layouts agree; a reader tells them apart by size.
        assert_eq!(offset_of!(Event, reason), 12);
        assert_eq!(offset_of!(Event, ifindex), 16);
        assert_eq!(offset_of!(Event, src), 24);
        assert_eq!(offset_of!(Event, dst), 40);
        assert_eq!(offset_of!(Event, dport), 58);
        assert_eq!(offset_of!(Event, nat_addr), 60);
        assert_eq!(offset_of!(Event, nat_port), 76);
    }

    #[test]
    fn an_older_event_record_reads_with_its_nat_address_and_port() {
        let mut b = [0u8; EVENT_V1_SIZE];
        b[..8].copy_from_slice(&7u64.to_ne_bytes());
        b[8] = event_kind::NAT_NEW;
        b[9] = 4;
        b[10] = 17;
        b[12..16].copy_from_slice(&reason::MASQ_NEW_FLOW.to_ne_bytes());
        b[16..20].copy_from_slice(&9u32.to_ne_bytes());
        b[24..28].copy_from_slice(&[10, 0, 0, 1]);
        b[40..44].copy_from_slice(&[192, 0, 2, 1]);
        b[56..58].copy_from_slice(&40000u16.to_ne_bytes());
        b[58..60].copy_from_slice(&53u16.to_ne_bytes());
        b[60..64].copy_from_slice(&[192, 168, 1, 1]);
        b[64..66].copy_from_slice(&61000u16.to_ne_bytes());
        let e = Event::from_v1(&b);
        let mut nat = [0u8; 16];
        nat[..4].copy_from_slice(&[192, 168, 1, 1]);
        let mut src = [0u8; 16];
        src[..4].copy_from_slice(&[10, 0, 0, 1]);
        let mut dst = [0u8; 16];
        dst[..4].copy_from_slice(&[192, 0, 2, 1]);
        assert_eq!(
            e,
            Event {
                ts_ns: 7,
                kind: event_kind::NAT_NEW,
                family: 4,
                proto: 17,
                reason: reason::MASQ_NEW_FLOW,
                ifindex: 9,
                src,
                dst,
                sport: 40000,
                dport: 53,
                nat_addr: nat,
                nat_port: 61000,
                ..Event::default()
            }
        );
    }

    #[test]
    fn drop_reasons_are_named_drop() {
        for (i, name) in reason::NAMES.iter().enumerate() {
            assert_eq!(
                reason::is_drop(u32::try_from(i).unwrap()),
                name.starts_with("drop_"),
                "{name}"
            );
        }
    }

    #[test]
    fn fnv_matches_reference_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn cbuf_roundtrip_and_cut() {
        let b: [u8; 4] = to_cbuf(b"ab");
        assert_eq!(b, [b'a', b'b', 0, 0]);
        assert_eq!(from_cbuf(&b), b"ab");
        let cut: [u8; 2] = to_cbuf(b"abc");
        assert_eq!(from_cbuf(&cut), b"ab");
    }
}
