//! Reading a whole hash map in a few system calls (`BPF_MAP_LOOKUP_BATCH`,
//! Linux 5.6), not two per entry as aya's iterator does (`get_next_key`, then
//! a lookup): the node agent's sweeper reads the 65,536-entry flow tables
//! every second. aya 0.14 has no batch call, so this module makes it.
use std::{
    mem::size_of,
    os::fd::{AsFd, AsRawFd},
};

use aya::{maps::MapData, Pod};
use sluice_common::maps::MapSpec;

use crate::{Error, PinRoot, Result};

/// `BPF_MAP_LOOKUP_BATCH` (`enum bpf_cmd`).
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// The `batch` member of `union bpf_attr` (include/uapi/linux/bpf.h).
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Entries asked for per call. A hash map's batch returns whole buckets and
/// fails with `ENOSPC` when one bucket holds more than fit; then the buffer
/// doubles.
const CHUNK: u32 = 4096;

/// Every (key, value) of hash map `spec` (a non-per-CPU hash or LRU hash).
/// Entries added or removed meanwhile may be missed or seen, as with any walk
/// of a live map.
pub(crate) fn lookup_all<K: Pod, V: Pod>(root: &PinRoot, spec: &MapSpec) -> Result<Vec<(K, V)>> {
    let path = root.map_path(spec);
    let data = MapData::from_pin(&path)
        .map_err(|e| Error::map(format!("open {}", path.display()), spec.name, e))?;
    let fd = data.fd().as_fd().as_raw_fd();
    let map_fd = u32::try_from(fd).map_err(|_| {
        Error::io(
            format!("open {}", path.display()),
            std::io::Error::other(format!("negative fd {fd}")),
        )
    })?;
    let (ks, vs) = (size_of::<K>(), size_of::<V>());
    let mut out = Vec::new();
    let mut chunk = CHUNK;
    let (mut keys, mut values) = (
        vec![0u8; CHUNK as usize * ks],
        vec![0u8; CHUNK as usize * vs],
    );
    // The hash map's position is its bucket index, a u32 (`htab_map_lookup_batch`).
    let (mut in_batch, mut out_batch) = (0u32, 0u32);
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                std::ptr::from_mut(&mut in_batch) as u64
            },
            out_batch: std::ptr::from_mut(&mut out_batch) as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk,
            map_fd,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` describes buffers of `chunk` keys and values that
        // live across the call; the kernel writes at most `count` of each.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                std::ptr::from_mut(&mut attr),
                size_of::<BatchAttr>(),
            )
        };
        let err = (rc < 0).then(std::io::Error::last_os_error);
        let errno = err.as_ref().and_then(std::io::Error::raw_os_error);
        if errno == Some(libc::ENOSPC) && chunk < (1 << 20) {
            chunk *= 2;
            keys.resize(chunk as usize * ks, 0);
            values.resize(chunk as usize * vs, 0);
            continue;
        }
        if let Some(e) = err.filter(|_| errno != Some(libc::ENOENT)) {
            return Err(Error::io(
                format!("read {} (BPF_MAP_LOOKUP_BATCH)", path.display()),
                e,
            ));
        }
        let n = attr.count.min(chunk) as usize;
        for i in 0..n {
            // SAFETY: the kernel wrote `n` keys of `ks` and values of `vs`
            // bytes; K and V are plain data of those sizes (`Pod`).
            let (k, v) = unsafe {
                (
                    keys.as_ptr().add(i * ks).cast::<K>().read_unaligned(),
                    values.as_ptr().add(i * vs).cast::<V>().read_unaligned(),
                )
            };
            out.push((k, v));
        }
        // ENOENT: the walk reached the last bucket.
        if errno == Some(libc::ENOENT) {
            return Ok(out);
        }
        // Each call returns at least one bucket's entries; one returning none
        // would repeat forever.
        if n == 0 {
            return Err(Error::io(
                format!("read {} (BPF_MAP_LOOKUP_BATCH)", path.display()),
                std::io::Error::other("the kernel returned no entries and no end"),
            ));
        }
        in_batch = out_batch;
        first = false;
    }
}
