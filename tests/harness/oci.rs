//! A container image built on the spot (no registry is reachable from CI): one
//! layer holding Debian's static busybox with its applets linked, a web root
//! whose CGI script answers who asked, written as an OCI image layout archive
//! that `ctr images import` takes. Digests come from `sha256sum`, archives from
//! `tar` (both in every Debian), so no image or hashing crate is needed.
use std::{
    fs,
    os::unix::fs::{symlink, PermissionsExt},
    path::{Path, PathBuf},
};

use serde_json::json;

use crate::{err, exec, Result};

/// Debian's busybox-static (statically linked: runs in an empty root).
pub const BUSYBOX: &str = "/bin/busybox";

/// Reference of the image in containerd (also the sandbox image).
pub const IMAGE: &str = "sluice.test/busybox:1";

/// Port the image's web server listens on when a container runs [`HTTPD`].
pub const WEB_PORT: u16 = 8080;

/// Command of a container serving the image's `/www` on [`WEB_PORT`].
pub const HTTPD: [&str; 6] = ["/bin/httpd", "-f", "-p", "8080", "-h", "/www"];

/// Path of the CGI script answering `pod <hostname> <client address>`.
pub const WHOAMI: &str = "/cgi-bin/whoami";

/// busybox applets the tests use inside containers.
const APPLETS: [&str; 10] = [
    "sh", "sleep", "httpd", "wget", "cat", "echo", "hostname", "ip", "true", "printf",
];

/// CGI script of the web root: who the server is and which address asked.
/// busybox httpd sets `REMOTE_ADDR` for CGI.
const WHOAMI_SCRIPT: &str = "#!/bin/sh\n\
printf 'Content-Type: text/plain\\r\\n\\r\\n'\n\
echo \"pod $(hostname) $REMOTE_ADDR\"\n";

/// Writes the image archive under `dir` and returns its path.
pub fn build(dir: &Path) -> Result<PathBuf> {
    let root = dir.join("rootfs");
    let layout = dir.join("layout");
    let blobs = layout.join("blobs/sha256");
    for d in ["bin", "etc", "tmp", "proc", "sys", "dev", "www/cgi-bin"] {
        mkdir(&root.join(d))?;
    }
    mkdir(&blobs)?;
    fs::copy(BUSYBOX, root.join("bin/busybox"))
        .map_err(|e| err!("copying {BUSYBOX} (package busybox-static): {e}"))?;
    for a in APPLETS {
        symlink("busybox", root.join("bin").join(a))
            .map_err(|e| err!("linking applet {a}: {e}"))?;
    }
    write(&root.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n")?;
    write(&root.join("etc/group"), "root:x:0:\n")?;
    write(&root.join("www/index.html"), "sluice\n")?;
    let cgi = root.join("www").join(WHOAMI.trim_start_matches('/'));
    write(&cgi, WHOAMI_SCRIPT)?;
    fs::set_permissions(&cgi, fs::Permissions::from_mode(0o755))
        .map_err(|e| err!("chmod {}: {e}", cgi.display()))?;

    // The layer: reproducible (sorted, owned by root, mtime 0), uncompressed.
    let layer = dir.join("layer.tar");
    tar(&root, &layer)?;
    let (layer_digest, layer_size) = blob(&layer, &blobs)?;

    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": ["PATH=/bin"],
            // The sandbox ("pause") container: containerd kills it with SIGKILL
            // on StopPodSandbox; the bound only matters if a test dies.
            "Entrypoint": ["/bin/sleep", "3600"],
        },
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
    });
    let (config_digest, config_size) = blob_json(&dir.join("config.json"), &config, &blobs)?;

    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": format!("sha256:{config_digest}"),
            "size": config_size,
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": format!("sha256:{layer_digest}"),
            "size": layer_size,
        }],
    });
    let (manifest_digest, manifest_size) =
        blob_json(&dir.join("manifest.json"), &manifest, &blobs)?;

    // containerd's importer names the image after `io.containerd.image.name`.
    let index = json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{manifest_digest}"),
            "size": manifest_size,
            "annotations": {
                "io.containerd.image.name": IMAGE,
                "org.opencontainers.image.ref.name": "1",
            },
        }],
    });
    write(&layout.join("index.json"), &index.to_string())?;
    write(
        &layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    let archive = dir.join("image.tar");
    tar(&layout, &archive)?;
    Ok(archive)
}

fn mkdir(p: &Path) -> Result<()> {
    fs::create_dir_all(p).map_err(|e| err!("creating {}: {e}", p.display()))
}

fn write(p: &Path, s: &str) -> Result<()> {
    fs::write(p, s).map_err(|e| err!("writing {}: {e}", p.display()))
}

fn tar(from: &Path, to: &Path) -> Result<()> {
    let (from_s, to_s) = (from.display().to_string(), to.display().to_string());
    exec::tool(
        None,
        "tar",
        &[
            "--sort=name",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--mtime=@0",
            "-C",
            &from_s,
            "-cf",
            &to_s,
            ".",
        ],
    )
    .map(drop)
}

/// Copies `file` into `blobs` under its digest: (hex digest, size).
fn blob(file: &Path, blobs: &Path) -> Result<(String, u64)> {
    let out = exec::tool(None, "sha256sum", &[&file.display().to_string()])?;
    let digest = out
        .split_whitespace()
        .next()
        .filter(|d| d.len() == 64)
        .ok_or_else(|| err!("sha256sum printed no digest: {out:?}"))?
        .to_string();
    let size = fs::metadata(file)
        .map_err(|e| err!("stat {}: {e}", file.display()))?
        .len();
    fs::copy(file, blobs.join(&digest)).map_err(|e| err!("copying {}: {e}", file.display()))?;
    Ok((digest, size))
}

fn blob_json(file: &Path, v: &serde_json::Value, blobs: &Path) -> Result<(String, u64)> {
    write(file, &v.to_string())?;
    blob(file, blobs)
}
