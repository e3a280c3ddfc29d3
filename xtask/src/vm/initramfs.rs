//! The guest's initramfs: a static busybox, the guest kernel's modules that
//! mounting the host's root needs (virtio, 9p, overlay, with what they depend
//! on), and `/init`, which mounts the host root read-only over 9p under a
//! tmpfs overlay and hands over to the job script named on the kernel command
//! line. Written as an uncompressed `newc` cpio archive (no cpio or gzip needed).
use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use super::kernels::Kernel;

/// Modules the root file system needs, in load order after their dependencies.
const ROOT_MODULES: [&str; 5] = [
    "virtio_pci",
    "9pnet_virtio",
    "9p",
    "overlay",
    "virtio_console",
];

/// The static busybox of Debian's busybox-static.
const BUSYBOX: &str = "/bin/busybox";

/// `/init`: mounts the host root (9p tag `hostroot`) read-only under a tmpfs
/// overlay, moves /proc, /sys, /dev there and runs `sluice.job=` (a path in the
/// host's file system) as PID 1's child; powers off when it ends. With
/// `sluice.job=probe` it only says it booted.
const INIT: &str = r#"#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /mods/order); do insmod /mods/$m.ko 2>/dev/null; done
job=
for w in $(cat /proc/cmdline); do case "$w" in sluice.job=*) job=${w#sluice.job=};; esac; done
if [ "$job" = probe ]; then echo SLUICE-VM-BOOTED; poweroff -f; fi
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000 hostroot /mnt/lower || { echo "SLUICE-VM-ERROR 9p"; poweroff -f; }
mount -t tmpfs -o size=2g tmpfs /mnt/rw
mkdir -p /mnt/rw/upper /mnt/rw/work
mount -t overlay overlay -o lowerdir=/mnt/lower,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work /mnt/root || { echo "SLUICE-VM-ERROR overlay"; poweroff -f; }
mount --move /proc /mnt/root/proc
mount --move /sys /mnt/root/sys
mount --move /dev /mnt/root/dev
exec switch_root /mnt/root /bin/sh -c "echo SLUICE-VM-BOOTED; /bin/sh $job; poweroff -f"
"#;

/// The modules `wanted` need, dependencies first, from `modules.dep`
/// (`kernel/a/b.ko: kernel/c.ko ...`): (module name, path relative to the
/// modules directory). Built-in ones (absent from modules.dep) are skipped.
pub(super) fn closure(modules_dep: &str, wanted: &[&str]) -> Vec<(String, String)> {
    let name_of = |path: &str| -> String {
        let file = path.rsplit('/').next().unwrap_or(path);
        let base = file.split(".ko").next().unwrap_or(file);
        base.replace('-', "_")
    };
    let deps: Vec<(String, String, Vec<String>)> = modules_dep
        .lines()
        .filter_map(|l| {
            let (m, d) = l.split_once(':')?;
            Some((
                name_of(m),
                m.trim().to_string(),
                d.split_whitespace().map(str::to_string).collect(),
            ))
        })
        .collect();
    let mut out: Vec<(String, String)> = Vec::new();
    let mut seen = BTreeSet::new();
    #[expect(clippy::items_after_statements, reason = "this function's own helper")]
    fn visit(
        name: &str,
        deps: &[(String, String, Vec<String>)],
        seen: &mut BTreeSet<String>,
        out: &mut Vec<(String, String)>,
        name_of: &dyn Fn(&str) -> String,
    ) {
        if !seen.insert(name.to_string()) {
            return;
        }
        let Some((_, path, ds)) = deps.iter().find(|(n, _, _)| n == name) else {
            return;
        };
        // modules.dep lists the full closure, most distant last.
        for d in ds.iter().rev() {
            visit(&name_of(d), deps, seen, out, name_of);
        }
        out.push((name.to_string(), path.clone()));
    }
    for w in wanted {
        visit(&w.replace('-', "_"), &deps, &mut seen, &mut out, &name_of);
    }
    out
}

/// One `newc` cpio archive being written.
struct Cpio {
    data: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn new() -> Self {
        Self {
            data: Vec::new(),
            ino: 1,
        }
    }

    fn entry(&mut self, name: &str, mode: u32, body: &[u8]) {
        let name_len = name.len() + 1;
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            body.len(),
            0,
            0,
            0,
            0,
            name_len,
            0
        );
        self.ino += 1;
        self.data.extend_from_slice(header.as_bytes());
        self.data.extend_from_slice(name.as_bytes());
        self.data.push(0);
        self.pad();
        self.data.extend_from_slice(body);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.data.len().is_multiple_of(4) {
            self.data.push(0);
        }
    }

    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040_755, b"");
    }

    fn file(&mut self, name: &str, mode: u32, body: &[u8]) {
        self.entry(name, 0o100_000 | mode, body);
    }

    fn symlink(&mut self, name: &str, target: &str) {
        self.entry(name, 0o120_777, target.as_bytes());
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, b"");
        self.data
    }
}

/// A module file's bytes, decompressed when the package ships it compressed
/// (busybox's insmod takes plain `.ko`).
fn module_bytes(path: &Path) -> Result<Vec<u8>> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    let tool = match ext {
        "ko" => return fs::read(path).with_context(|| format!("reading {}", path.display())),
        "xz" => "xz",
        "zst" => "zstd",
        "gz" => "gzip",
        other => bail!("{}: unknown module compression {other:?}", path.display()),
    };
    let out = Command::new(tool)
        .args(["-d", "-c"])
        .arg(path)
        .output()
        .with_context(|| format!("running {tool} -d on {}", path.display()))?;
    if !out.status.success() {
        bail!("{tool} -d {} failed", path.display());
    }
    Ok(out.stdout)
}

/// Writes the initramfs for `kernel` to `path`.
pub(super) fn build(kernel: &Kernel, path: &Path) -> Result<PathBuf> {
    let dep = fs::read_to_string(kernel.modules.join("modules.dep"))
        .with_context(|| format!("reading {}", kernel.modules.join("modules.dep").display()))?;
    let mods = closure(&dep, &ROOT_MODULES);
    let busybox =
        fs::read(BUSYBOX).with_context(|| format!("reading {BUSYBOX} (package busybox-static)"))?;
    let mut c = Cpio::new();
    for d in [
        "bin",
        "mods",
        "proc",
        "sys",
        "dev",
        "mnt",
        "mnt/lower",
        "mnt/rw",
        "mnt/root",
    ] {
        c.dir(d);
    }
    c.file("bin/busybox", 0o755, &busybox);
    for a in [
        "sh",
        "mount",
        "insmod",
        "mkdir",
        "switch_root",
        "echo",
        "cat",
        "poweroff",
    ] {
        c.symlink(&format!("bin/{a}"), "busybox");
    }
    let mut order = String::new();
    for (name, rel) in &mods {
        c.file(
            &format!("mods/{name}.ko"),
            0o644,
            &module_bytes(&kernel.modules.join(rel))?,
        );
        order.push_str(name);
        order.push('\n');
    }
    c.file("mods/order", 0o644, order.as_bytes());
    c.file("init", 0o755, INIT.as_bytes());
    fs::write(path, c.finish()).with_context(|| format!("writing {}", path.display()))?;
    Ok(path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dependencies_come_first_and_once() {
        let dep = "kernel/fs/9p/9p.ko.xz: kernel/net/9p/9pnet.ko.xz kernel/fs/netfs/netfs.ko.xz\n\
                   kernel/net/9p/9pnet.ko.xz:\n\
                   kernel/fs/netfs/netfs.ko.xz:\n\
                   kernel/net/9p/9pnet_virtio.ko.xz: kernel/net/9p/9pnet.ko.xz kernel/drivers/virtio/virtio_ring.ko.xz\n\
                   kernel/drivers/virtio/virtio_ring.ko.xz:\n\
                   kernel/fs/overlayfs/overlay.ko.xz:\n";
        let c = closure(dep, &["9pnet_virtio", "9p", "overlay", "virtio_pci"]);
        let names: Vec<&str> = c.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "virtio_ring",
                "9pnet",
                "9pnet_virtio",
                "netfs",
                "9p",
                "overlay"
            ]
        );
        assert_eq!(c[4].1, "kernel/fs/9p/9p.ko.xz");
    }

    #[test]
    fn cpio_entries_are_aligned_newc() {
        let mut c = Cpio::new();
        c.file("init", 0o755, b"#!/bin/sh\n");
        let data = c.finish();
        assert!(data.starts_with(b"070701"));
        assert!(data.len().is_multiple_of(4));
        assert!(data.windows(10).any(|w| w == b"TRAILER!!!"));
    }
}
