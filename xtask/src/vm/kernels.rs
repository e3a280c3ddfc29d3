//! Debian's kernels, fetched with apt into a private state directory (never the
//! machine's own apt sources or its installed kernels), unpacked with `dpkg -x`,
//! and given a `modules.dep` (`depmod -b`) so that `modprobe` works in the guest.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};

use crate::cmd;

/// The suites whose kernels the matrix uses, and the kernel series each ships.
const SUITES: [&str; 4] = ["bullseye", "bookworm", "trixie", "sid"];

/// An unpacked kernel.
#[derive(Clone, Debug)]
pub(crate) struct Kernel {
    /// As asked for (`5.10`).
    pub name: String,
    /// `uname -r` of the kernel (`5.10.0-32-amd64`).
    pub release: String,
    pub vmlinuz: PathBuf,
    /// `lib/modules/<release>` of the unpacked package.
    pub modules: PathBuf,
}

/// The private apt state under `dir` (sources, lists, cache).
struct Apt {
    dir: PathBuf,
}

impl Apt {
    fn new(dir: &Path) -> Result<Self> {
        for sub in ["lists/partial", "cache/archives/partial"] {
            fs::create_dir_all(dir.join(sub))
                .with_context(|| format!("creating {}", dir.join(sub).display()))?;
        }
        let sources: String = SUITES
            .iter()
            .flat_map(|s| ["deb http://deb.debian.org/debian ", s, " main\n"])
            .collect();
        fs::write(dir.join("sources.list"), sources)?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    /// `apt-get`/`apt-cache` with every path pointing into the private state.
    fn command(&self, tool: &str) -> Command {
        let d = |p: &str| self.dir.join(p).display().to_string();
        let mut c = Command::new(tool);
        c.args([
            "-o",
            &format!("Dir::Etc::sourcelist={}", d("sources.list")),
            "-o",
            "Dir::Etc::sourceparts=-",
            "-o",
            &format!("Dir::State::Lists={}", d("lists")),
            "-o",
            &format!("Dir::Cache={}", d("cache")),
            "-o",
            "Debug::NoLocking=1",
        ]);
        c
    }

    /// The package lists, refreshed when older than a day.
    fn update(&self) -> Result<()> {
        let stamp = self.dir.join("updated");
        let fresh = fs::metadata(&stamp)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|e| e.as_secs() < 86_400));
        if !fresh {
            cmd::run(self.command("apt-get").arg("update"))?;
            fs::write(&stamp, b"")?;
        }
        Ok(())
    }

    /// Every `linux-image-<release>-amd64[-unsigned]` package name (newer
    /// suites ship only the signed image, which boots the same in qemu).
    fn kernel_packages(&self) -> Result<Vec<String>> {
        let out = cmd::stdout(self.command("apt-cache").args([
            "search",
            "--names-only",
            "^linux-image-[0-9].*-amd64(-unsigned)?$",
        ]))?;
        Ok(out
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_string)
            .collect())
    }
}

impl Apt {
    /// The packages that hold `package`'s kernel image and modules: itself, or
    /// (since Debian 14's split) `linux-binary-unsigned-<release>` and
    /// `linux-modules-<release>`, which the image package only depends on.
    fn parts_of(&self, package: &str, release: &str) -> Result<Vec<String>> {
        let quoted = release.replace('.', "\\.").replace('+', "\\+");
        let out = cmd::stdout(self.command("apt-cache").args([
            "search",
            "--names-only",
            &format!("^linux-(binary-unsigned|modules)-{quoted}$"),
        ]))?;
        let parts: Vec<String> = out
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_string)
            .collect();
        Ok(if parts.len() == 2 {
            parts
        } else {
            vec![package.to_string()]
        })
    }

    /// `apt-get download package` into `dir`; the .deb's path.
    fn download(&self, package: &str, dir: &Path) -> Result<PathBuf> {
        cmd::run(
            self.command("apt-get")
                .current_dir(dir)
                .args(["download", package]),
        )?;
        fs::read_dir(dir)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{package}_")))
            })
            .with_context(|| format!("apt-get download left no {package}_*.deb"))
    }
}

/// `linux-image-<release>[-unsigned]` -> `<release>` (`5.10.0-32-amd64`).
fn release_of(package: &str) -> Option<&str> {
    let rest = package.strip_prefix("linux-image-")?;
    Some(rest.strip_suffix("-unsigned").unwrap_or(rest))
}

/// Version numbers of a release for ordering (`6.12.117+deb13-amd64` ->
/// [6, 12, 117, 13]).
fn version_key(release: &str) -> Vec<u64> {
    release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// The package `name` means among `packages`: a full package name as is; a
/// series (`5.10`) its newest plain amd64 build; `sid` the newest of all.
pub(super) fn resolve(name: &str, packages: &[String]) -> Result<String> {
    if packages.iter().any(|p| p == name) {
        return Ok(name.to_string());
    }
    let plain = packages.iter().filter(|p| {
        release_of(p)
            .is_some_and(|r| r.ends_with("-amd64") && !r.contains("-cloud-") && !r.contains("-rt-"))
    });
    let candidates: Vec<&String> = if name == "sid" || name == "newest" {
        plain.collect()
    } else {
        let prefix = format!("{name}.");
        plain
            .filter(|p| release_of(p).is_some_and(|r| r.starts_with(&prefix)))
            .collect()
    };
    // The newest release; of its two packages the unsigned one.
    candidates
        .into_iter()
        .max_by_key(|p| {
            (
                version_key(release_of(p).unwrap_or_default()),
                p.ends_with("-unsigned"),
            )
        })
        .cloned()
        .with_context(|| {
            format!("no linux-image-*-amd64 package for kernel {name:?} in {SUITES:?}")
        })
}

/// Fetches and unpacks the kernels `names` under `dir`; what is there already is
/// reused.
pub(super) fn fetch(dir: &Path, names: &[String]) -> Result<Vec<Kernel>> {
    let apt = Apt::new(&dir.join("apt"))?;
    let mut known: Option<Vec<String>> = None;
    let mut out = Vec::new();
    for name in names {
        let packages = if let Some(p) = &known {
            p
        } else {
            apt.update()?;
            known.insert(apt.kernel_packages()?)
        };
        let package = resolve(name, packages)?;
        let release = release_of(&package)
            .context("not a kernel package")?
            .to_string();
        let root = dir.join("kernels").join(&release);
        let modules = root.join("lib/modules").join(&release);
        if !modules.join("modules.dep").exists() {
            let debs = dir.join("debs");
            fs::create_dir_all(&debs)?;
            fs::create_dir_all(&root)?;
            for part in apt.parts_of(&package, &release)? {
                let deb = apt.download(&part, &debs)?;
                cmd::run(Command::new("dpkg").arg("-x").arg(&deb).arg(&root))?;
                fs::remove_file(&deb)?;
            }
            // Since trixie the modules are under usr/lib (merged /usr); depmod -b
            // looks under lib/.
            let lib = root.join("lib");
            if !lib.exists() && root.join("usr/lib/modules").is_dir() {
                std::os::unix::fs::symlink("usr/lib", &lib)
                    .with_context(|| format!("linking {}", lib.display()))?;
            }
            cmd::run(Command::new("depmod").arg("-b").arg(&root).arg(&release))?;
        }
        // boot/ until Debian 13; next to the modules in the split packages.
        let vmlinuz = [
            root.join("boot").join(format!("vmlinuz-{release}")),
            modules.join("vmlinuz"),
            modules.join("vmlinuz.unsigned"),
        ]
        .into_iter()
        .find(|p| p.exists())
        .with_context(|| format!("{package} has no kernel image"))?;
        out.push(Kernel {
            name: name.clone(),
            release,
            vmlinuz,
            modules,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkgs() -> Vec<String> {
        [
            "linux-image-5.10.0-30-amd64-unsigned",
            "linux-image-5.10.0-32-amd64-unsigned",
            "linux-image-5.10.0-32-cloud-amd64-unsigned",
            "linux-image-6.1.0-50-amd64-unsigned",
            "linux-image-6.1.0-50-rt-amd64-unsigned",
            "linux-image-6.12.107+deb13-amd64-unsigned",
            "linux-image-6.12.117+deb13-amd64-unsigned",
            "linux-image-6.17.8+deb14-amd64-unsigned",
            "linux-image-7.2.13+deb14-amd64",
            "linux-image-7.2.13+deb14-cloud-amd64",
            "linux-image-6.12.117+deb13-amd64",
        ]
        .iter()
        .map(std::string::ToString::to_string)
        .collect()
    }

    #[test]
    fn series_resolve_to_their_newest_plain_build() {
        let p = pkgs();
        assert_eq!(
            resolve("5.10", &p).unwrap(),
            "linux-image-5.10.0-32-amd64-unsigned"
        );
        assert_eq!(
            resolve("6.1", &p).unwrap(),
            "linux-image-6.1.0-50-amd64-unsigned"
        );
        assert_eq!(
            resolve("6.12", &p).unwrap(),
            "linux-image-6.12.117+deb13-amd64-unsigned"
        );
        assert_eq!(
            resolve("sid", &p).unwrap(),
            "linux-image-7.2.13+deb14-amd64"
        );
        assert_eq!(
            release_of("linux-image-7.2.13+deb14-amd64"),
            Some("7.2.13+deb14-amd64")
        );
        assert_eq!(
            resolve("linux-image-5.10.0-30-amd64-unsigned", &p).unwrap(),
            "linux-image-5.10.0-30-amd64-unsigned"
        );
        assert!(resolve("4.19", &p).is_err());
        assert_eq!(
            release_of("linux-image-6.1.0-50-amd64-unsigned"),
            Some("6.1.0-50-amd64")
        );
    }
}
