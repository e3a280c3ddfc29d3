//! Loading the embedded eBPF object: maps pinned by name (reused when they are
//! pinned already), programs verified and pinned under `progs/`, and on an
//! upgrade every existing attachment pointed at the new programs in place.
use std::fs;

use aya::{
    programs::{CgroupSockAddr, PerfEvent, SchedClassifier, Xdp},
    EbpfLoader,
};
use sluice_common::{
    kernel_features, map_names,
    maps::{self, MapKind},
    programs::{self, ProgKind},
    DatapathMeta, LAYOUT_VERSION,
};
use sluice_maps::PinRoot;

use super::{bpffs::unpin, links, sweeper};
use crate::error::Error;

/// The eBPF object `cargo xtask build` embedded (see build.rs).
static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sluice-ebpf.o"));

/// FNV-1a hash of the embedded object, computed by build.rs.
pub fn object_hash() -> u64 {
    u64::from_str_radix(env!("SLUICE_EBPF_HASH"), 16).unwrap_or(0)
}

/// Whether this binary carries an eBPF object.
pub(super) fn has_object() -> bool {
    !OBJECT.is_empty()
}

/// The programs this kernel runs: all of them, but the NAT sweeper where the
/// kernel cannot keep it running and the netkit pod program where it has no
/// netkit (see [`super::features`]).
fn wanted() -> impl Iterator<Item = &'static programs::ProgSpec> {
    let sweeper = super::features::get().sweeper;
    let netkit = super::features::netkit();
    programs::ALL.iter().filter(move |p| match p.kind {
        ProgKind::PerfEvent => sweeper,
        ProgKind::PodNetkit | ProgKind::PodNetkitPrimary => netkit,
        _ => true,
    })
}

/// Whether every program this kernel runs is pinned.
pub(super) fn programs_pinned(root: &PinRoot) -> bool {
    wanted().all(|p| root.progs_dir().join(p.name).exists())
}

fn dp_err(op: impl Into<String>, e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Error {
    Error::datapath(op, e)
}

/// Loads the embedded object (reusing pinned maps), pins its programs, moves every
/// existing attachment to the new programs atomically (`bpf_link_update`, `cls_bpf`
/// filters replaced in place on `pod_ifnames`), and records the object's identity.
/// Runs under the datapath's exclusive lock.
pub(super) fn load_and_pin(
    root: &PinRoot,
    pod_ifnames: &[String],
    nat_flows: u32,
) -> Result<(), Error> {
    if OBJECT.is_empty() {
        return Err(dp_err(
            "load",
            "this sluice binary was built without its eBPF object; build it with `cargo xtask build`",
        ));
    }
    let mut steps = crate::timing::Steps::start();
    let features = super::features::get();
    steps.done("load: kernel features");
    let nat_kind = nat_map_kind(features.sweeper);
    root.check_shapes(&NAT_FLOW_MAPS.map(|m| (m, nat_kind)))?;
    let bits = features.program_bits();
    // Without the sweeper the flow maps are LRU maps (see kernel_features::
    // LAZY_EXPIRY): the object says HASH, the copy loaded says LRU_HASH.
    let object = if nat_kind == MapKind::LruHash {
        let mut o = OBJECT.to_vec();
        for m in NAT_FLOW_MAPS {
            set_map_kind(&mut o, m.name, nat_kind)?;
        }
        std::borrow::Cow::Owned(o)
    } else {
        std::borrow::Cow::Borrowed(OBJECT)
    };
    // Sizes only matter when the maps are created; pinned maps are reused as they are.
    let mut ebpf = EbpfLoader::new()
        .default_map_pin_directory(root.maps_dir())
        .map_max_entries(map_names::NAT_FWD, nat_flows)
        .map_max_entries(map_names::NAT_REV, nat_flows)
        .map_max_entries(map_names::NAT6_FWD, nat_flows)
        .map_max_entries(map_names::NAT6_REV, nat_flows)
        .map_max_entries(map_names::KFLOWS, nat_flows)
        // The rings of recent flows have a slot per flow (see nat::evict).
        .map_max_entries(map_names::NAT_RING, nat_flows)
        .map_max_entries(map_names::NAT6_RING, nat_flows)
        // Services' flows from outside (and per packet): two entries a flow,
        // LRU, so `natMaxFlows` flows of each family before the least
        // recently used one goes.
        .map_max_entries(map_names::LB_CT, nat_flows.saturating_mul(2))
        .map_max_entries(map_names::LB_CT6, nat_flows.saturating_mul(2))
        // Kernel features the programs may use (constant for the verifier).
        .override_global(kernel_features::GLOBAL, &bits, true)
        .load(&object)
        .map_err(|e| dp_err("load the eBPF object", e))?;
    // Parsing the object, creating (or opening) its maps, relocating.
    steps.done("load: object and maps");
    for (what, since) in features.missing() {
        eprintln!("sluice: this kernel lacks {what} (Linux {since}); using the fallback");
    }
    // Before the new programs take over: they look a pod's buckets up only
    // when its endpoint says it has limits, a mark an older datapath's ADDs
    // did not write (the old programs ignore it).
    sluice_maps::bandwidth::sync_limited(root, None)?;
    // The uplink's cls_bpf filters (kernels without tcx) are replaced in place
    // like the pods' ones.
    let uplink_filters: Vec<String> = sluice_maps::node::config(root)
        .ok()
        .filter(|c| c.flags & sluice_common::config_flags::UPLINK_TC_FILTERS != 0)
        .and_then(|c| links::ifname_of(c.uplink_ifindex))
        .into_iter()
        .collect();
    steps.done("load: bandwidth marks, uplink filters");
    let specs: Vec<&'static programs::ProgSpec> = wanted().collect();
    super::verify::verify_all(&mut ebpf, &specs)?;
    steps.done("load: verify");
    for spec in specs {
        let name = spec.name;
        let staged = root.progs_dir().join(format!("{name}-new"));
        unpin(&staged)?;
        let prog = ebpf
            .program_mut(name)
            .ok_or_else(|| dp_err("load", format!("program {name} missing from the object")))?;
        let loaded = |e| dp_err(format!("take loaded program {name}"), e);
        let pinned = |e| dp_err(format!("pin {}", staged.display()), e);
        match spec.kind {
            ProgKind::SockAddr(_) => {
                let prog: &mut CgroupSockAddr = prog.try_into().map_err(loaded)?;
                prog.pin(&staged).map_err(pinned)?;
                for lp in links::link_pins_of(root, name)? {
                    links::replace_cgroup_link(prog, &lp)?;
                }
            }
            ProgKind::PerfEvent => {
                let prog: &mut PerfEvent = prog.try_into().map_err(loaded)?;
                prog.pin(&staged).map_err(pinned)?;
                // Perf-event links cannot be updated in place: the new one replaces
                // the old (a second without sweeping at most).
                sweeper::attach_sweeper(root, prog)?;
            }
            ProgKind::UplinkXdp => {
                let prog: &mut Xdp = prog.try_into().map_err(loaded)?;
                prog.pin(&staged).map_err(pinned)?;
                for lp in links::link_pins_of(root, name)? {
                    links::replace_xdp_link(prog, &lp)?;
                }
            }
            ProgKind::PodIngress
            | ProgKind::PodEgress
            | ProgKind::PodNetkit
            | ProgKind::PodNetkitPrimary
            | ProgKind::PodDevice
            | ProgKind::UplinkIngress
            | ProgKind::UplinkEgress => {
                let prog: &mut SchedClassifier = prog.try_into().map_err(loaded)?;
                prog.pin(&staged).map_err(pinned)?;
                for lp in links::link_pins_of(root, name)? {
                    links::replace_tc_link(prog, &lp)?;
                }
                let filtered: &[String] = match spec.kind {
                    ProgKind::PodIngress | ProgKind::PodEgress => pod_ifnames,
                    // A pod device's `cls_bpf` filter lives in the pod's
                    // namespace; it keeps the program it was attached with
                    // (sharing the maps) until the pod goes. tcx links (6.6+)
                    // are replaced above like the others. docs/bandwidth.md.
                    ProgKind::PodDevice | ProgKind::PodNetkit | ProgKind::PodNetkitPrimary => &[],
                    _ => &uplink_filters,
                };
                for ifname in filtered {
                    links::replace_filter(prog, ifname, links::tc_hook(spec.kind));
                }
                if matches!(spec.kind, ProgKind::PodIngress | ProgKind::PodEgress) {
                    links::replace_block_filter(root, prog, name, links::tc_hook(spec.kind))?;
                }
            }
        }
        // Readers (`attach`) open progs/<name>; the rename swaps it in one step.
        let final_path = root.progs_dir().join(name);
        fs::rename(&staged, &final_path).map_err(|e| {
            Error::io(
                format!("renaming {} to {}", staged.display(), final_path.display()),
                e,
            )
        })?;
    }
    steps.done("load: pin and move links");
    sluice_maps::node::write_meta(
        root,
        DatapathMeta {
            layout_version: LAYOUT_VERSION,
            _pad: 0,
            object_hash: object_hash(),
            loaded_unix: super::now_unix(),
        },
    )?;
    Ok(())
}

/// The flow maps of both families: `natMaxFlows` entries each, HASH or LRU as
/// [`nat_map_kind`] says.
const NAT_FLOW_MAPS: [&maps::MapSpec; 4] = [
    &maps::NAT_FWD,
    &maps::NAT_REV,
    &maps::NAT6_FWD,
    &maps::NAT6_REV,
];

/// The map type of the NAT flow maps on this kernel: HASH with the sweeper
/// (a full table refuses new flows, existing ones are safe), `LRU_HASH` without
/// (no one else would ever remove a dead flow).
pub(super) fn nat_map_kind(sweeper: bool) -> MapKind {
    if sweeper {
        MapKind::Hash
    } else {
        MapKind::LruHash
    }
}

/// Changes the type of map `name` in an eBPF object (its `bpf_map_def` in the
/// `maps` section, whose first field is the type).
fn set_map_kind(obj: &mut [u8], name: &str, kind: MapKind) -> Result<(), Error> {
    use object::{Object, ObjectSection, ObjectSymbol};
    let op = || format!("set the type of map {name} in the eBPF object");
    let offset = {
        let file = object::File::parse(&*obj).map_err(|e| dp_err(op(), e))?;
        let sym = file
            .symbols()
            .find(|s| s.name() == Ok(name))
            .ok_or_else(|| dp_err(op(), "no such symbol"))?;
        let index = sym
            .section_index()
            .ok_or_else(|| dp_err(op(), "the symbol has no section"))?;
        let section = file.section_by_index(index).map_err(|e| dp_err(op(), e))?;
        if section.name() != Ok("maps") {
            return Err(dp_err(op(), "the symbol is not in the maps section"));
        }
        let (start, _) = section
            .file_range()
            .ok_or_else(|| dp_err(op(), "the maps section has no data"))?;
        usize::try_from(start + sym.address()).map_err(|e| dp_err(op(), e))?
    };
    let field = obj
        .get_mut(offset..offset + 4)
        .ok_or_else(|| dp_err(op(), "the symbol lies outside the object"))?;
    field.copy_from_slice(&kind.bpf_type().to_le_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The registry of maps in sluice-common is what the object defines: the
    /// names the programs' `#[map]` attributes spell, their kinds and sizes.
    #[test]
    fn the_object_defines_the_registered_maps() {
        if OBJECT.is_empty() {
            // Built without `cargo xtask build`: nothing to compare (the test
            // runs in `cargo xtask test`, which always embeds the object).
            return;
        }
        let obj = aya_obj::Object::parse(OBJECT).expect("the embedded object parses");
        let mut seen = 0;
        for (name, map) in &obj.maps {
            if name == map_names::SCRATCH
                || name == map_names::SCRATCH6
                || name == map_names::HP_SCRATCH6
                || name == map_names::KFLOW_KEY
                || name == map_names::EVICT_NOTE
                || name == map_names::LB_REJECT
                || name == map_names::LB_STEP
                || name == map_names::LB_FIB
                || name == map_names::POL_STEP
                || name.starts_with('.')
                || name == "AYA_LOGS"
            {
                continue;
            }
            let spec = sluice_common::maps::find(name)
                .unwrap_or_else(|| panic!("map {name} of the object is not in the registry"));
            assert_eq!(map.key_size() as usize, spec.key_size, "{name} key");
            assert_eq!(map.value_size() as usize, spec.value_size, "{name} value");
            assert_eq!(map.map_type(), spec.kind.bpf_type(), "{name} type");
            seen += 1;
        }
        assert_eq!(seen, sluice_common::maps::ALL.len());
        // Without the sweeper the NAT maps are loaded as LRU maps.
        let mut o = OBJECT.to_vec();
        set_map_kind(&mut o, maps::NAT_FWD.name, MapKind::LruHash).unwrap();
        let patched = aya_obj::Object::parse(&o).expect("the patched object parses");
        assert_eq!(
            patched.maps[maps::NAT_FWD.name].map_type(),
            MapKind::LruHash.bpf_type()
        );
        assert_eq!(
            patched.maps[maps::NAT_REV.name].map_type(),
            MapKind::Hash.bpf_type()
        );
        for p in programs::ALL {
            assert!(
                obj.programs.contains_key(p.name),
                "program {} missing from the object",
                p.name
            );
        }
    }
}
