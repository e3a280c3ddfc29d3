//! `cargo xtask image`: the OCI image the DaemonSet runs
//! (`deploy/kubernetes/sluice.yaml`), built with Debian's buildah from an
//! empty base: the three binaries under `/usr/local/bin` and the shared
//! libraries `ldd` says they load (glibc, `libgcc_s`, the loader), nothing else.
//! buildah keeps its storage under `target/image` (vfs driver: works inside a
//! container, needs no fuse-overlayfs), not in `/var/lib/containers`; what it
//! still writes outside is its blob-info cache
//! (`/var/lib/containers/cache`) and an empty `/run/containers/networks`.
//! The result is an OCI archive, which `ctr images import`, `podman load` and
//! `skopeo copy` take.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::{build::Binaries, cli::ImageArgs, cmd, ebpf, ws::Workspace};

/// Where the binaries go in the image (the manifest's commands name them).
const BIN_DIR: &str = "usr/local/bin";

/// The image reference the manifest uses: `localhost/sluice:<version>`
/// (`<version><suffix>` for a test variant).
pub(crate) fn reference(suffix: &str) -> String {
    format!("localhost/sluice:{}{suffix}", env!("CARGO_PKG_VERSION"))
}

pub(crate) fn run(ws: &Workspace, args: &ImageArgs) -> Result<()> {
    let object = ebpf::build(ws)?;
    let bins = crate::build::build_bins(ws, &object, !args.debug)?;
    let out = build(ws, &bins, "")?;
    println!("image: {} (reference {})", out.display(), reference(""));
    Ok(())
}

/// Builds the image of `bins` and returns the OCI archive's path
/// (`target/image/sluice<suffix>.oci.tar`, reference [`reference`]`(suffix)`).
pub(crate) fn build(ws: &Workspace, bins: &Binaries, suffix: &str) -> Result<PathBuf> {
    let dir = ws.target.join("image");
    let rootfs = dir.join("rootfs");
    if rootfs.exists() {
        fs::remove_dir_all(&rootfs).with_context(|| format!("removing {}", rootfs.display()))?;
    }
    let bin_dir = rootfs.join(BIN_DIR);
    fs::create_dir_all(&bin_dir)?;
    let mut libs = Vec::new();
    for (name, path) in [
        ("sluice", &bins.sluice),
        ("sluicectl", &bins.sluicectl),
        ("sluice-node", &bins.node),
    ] {
        fs::copy(path, bin_dir.join(name))
            .with_context(|| format!("copying {} into the image", path.display()))?;
        for lib in shared_libraries(path)? {
            if !libs.contains(&lib) {
                libs.push(lib);
            }
        }
    }
    for lib in &libs {
        let to = rootfs.join(lib.strip_prefix("/").unwrap_or(lib));
        if let Some(parent) = to.parent() {
            fs::create_dir_all(parent)?;
        }
        // fs::copy follows symlinks: the loader's /lib64 name gets the file.
        fs::copy(lib, &to).with_context(|| format!("copying {} into the image", lib.display()))?;
    }
    fs::create_dir_all(rootfs.join("tmp"))?;

    let archive = dir.join(format!("sluice{suffix}.oci.tar"));
    let _ = fs::remove_file(&archive);
    let buildah = |args: &[&str]| -> Result<String> {
        let mut c = Command::new("buildah");
        c.arg("--root")
            .arg(dir.join("storage"))
            .arg("--runroot")
            .arg(dir.join("run"))
            .args(["--storage-driver", "vfs"])
            .args(args);
        cmd::stdout(&mut c)
    };
    let name = format!("sluice-build-{}", std::process::id());
    let ctr = buildah(&["from", "--name", &name, "scratch"])?;
    let ctr = ctr.trim();
    let built = (|| -> Result<()> {
        buildah(&["copy", ctr, &format!("{}/", rootfs.display()), "/"])?;
        buildah(&[
            "config",
            "--entrypoint",
            "[\"/usr/local/bin/sluice-node\"]",
            "--cmd",
            "route-sync",
            "--env",
            "PATH=/usr/local/bin",
            "--label",
            "org.opencontainers.image.title=sluice",
            "--label",
            &format!("org.opencontainers.image.version={}", env!("CARGO_PKG_VERSION")),
            "--label",
            "org.opencontainers.image.description=Sluice CNI plugin, sluicectl and the sluice-node agent",
            ctr,
        ])?;
        let reference = reference(suffix);
        buildah(&["commit", "--format", "oci", ctr, &reference])?;
        buildah(&[
            "push",
            &reference,
            &format!("oci-archive:{}:{reference}", archive.display()),
        ])?;
        Ok(())
    })();
    let _ = buildah(&["rm", ctr]);
    // The archive is the product; the local copy would only pile up.
    let _ = buildah(&["rmi", &reference(suffix)]);
    built?;
    Ok(archive)
}

/// The files `ldd` resolves for `bin` (the loader included).
fn shared_libraries(bin: &Path) -> Result<Vec<PathBuf>> {
    let out = cmd::stdout(Command::new("ldd").arg(bin))?;
    let mut libs = Vec::new();
    for line in out.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
        // "/lib64/ld-linux-x86-64.so.2 (0x...)"; the vDSO has no file.
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        } else if line.contains("not found") {
            bail!("{}: {line}", bin.display());
        }
    }
    Ok(libs)
}
