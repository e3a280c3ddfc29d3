//! Embeds the eBPF object built by `cargo xtask build-ebpf` into the `sluice`
//! binary, so one file in the CNI bin dir is the whole install.
//!
//! The object is taken from `SLUICE_EBPF_OBJECT`, or from where `build-ebpf` puts
//! it. When it is missing (e.g. `cargo clippy` before any eBPF build) an empty
//! object is embedded and the binary refuses to load the datapath with an error
//! saying how to build it; `cargo xtask build` never produces such a binary.
use std::{env, fs, path::PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=SLUICE_EBPF_OBJECT");
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let default = manifest.join("../target/ebpf/bpfel-unknown-none/release/sluice-ebpf");
    let src = env::var_os("SLUICE_EBPF_OBJECT").map_or(default, PathBuf::from);
    println!("cargo:rerun-if-changed={}", src.display());
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap_or_default()).join("sluice-ebpf.o");
    let bytes = fs::read(&src).unwrap_or_else(|_| {
        println!(
            "cargo:warning=no eBPF object at {}; run `cargo xtask build-ebpf` (this sluice binary cannot load its datapath)",
            src.display()
        );
        Vec::new()
    });
    // A stable identity of the embedded object, compared with the one
    // recorded in the pinned `sl_meta` map to decide whether programs need reloading.
    let h = sluice_common::fnv1a64(&bytes);
    println!("cargo:rustc-env=SLUICE_EBPF_HASH={h:016x}");
    if let Err(e) = fs::write(&out, &bytes) {
        panic!("writing {}: {e}", out.display());
    }
}
