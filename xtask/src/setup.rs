//! `cargo xtask setup`: install what a fresh machine of this kind lacks.
//!
//! Every step first checks and only installs what is missing, so a second run is a
//! quick no-op. bpf-linker is built against the libLLVM shipped inside the nightly
//! toolchain (docs/development.md, "Toolchain"), so it always matches the nightly's LLVM.
use std::{
    fs, io,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{bail, ensure, Context, Result};

use crate::{
    cli::SetupArgs,
    cmd, elf,
    host::{self, fmt_duration},
};

/// What a command sets up for: `cargo xtask setup --for <purpose>`, and what
/// `demo`, `bench` (and `profile`) and `test` install before they start.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Purpose {
    /// `cargo xtask demo`: the datapath and iperf3 through it.
    Demo,
    /// `cargo xtask bench` and `profile`: the demo's, sockperf, the reference
    /// plugins, kube-proxy's iptables mode, perf.
    Bench,
    /// `cargo xtask test`, and the commands that set up nothing themselves
    /// (`vm-test`, `vm-bench`, `image`): every package. The default.
    #[default]
    Test,
}

/// One group of Debian packages and the purposes that need it.
struct Group {
    packages: &'static [&'static str],
    purposes: &'static [Purpose],
}

use Purpose::{Bench, Demo, Test};

/// What the commands need from Debian, installed without the packages these
/// recommend (`--no-install-recommends`): none of the recommends is used
/// (qemu-system-x86's GUI, qemu-utils, ovmf and block drivers: qemu runs
/// `-nographic` with direct kernel boot; runc's criu; buildah's fuse-overlayfs
/// and runtime: `image` builds with the vfs driver and never runs a container;
/// protobuf-compiler's libprotobuf-dev: the CRI protos import nothing;
/// iptables' nftables: the `iptables` commands are iptables-nft, which needs no
/// `nft`; ipset's iptables is in a group; iproute2's libatm1 and nftables'
/// netbase come with Debian's base system).
const GROUPS: &[Group] = &[
    // The demo's: namespaces, veths and routes (`ip`, `ss`), the attachments
    // (`bpftool net show`), traffic through the datapath (iperf3).
    // (`nsenter`, `timeout` and `taskset` are in Debian's essential set.)
    Group {
        packages: &["iproute2", "bpftool", "iperf3"],
        purposes: &[Demo, Bench, Test],
    },
    // The benchmarks' and the tests' round trips (sockperf), the reference
    // plugins (bridge, host-local, portmap, bandwidth) and their iptables rules,
    // which `iptables-save` reads back.
    Group {
        packages: &["sockperf", "containernetworking-plugins", "iptables"],
        purposes: &[Bench, Test],
    },
    // kube-proxy's rules on a node (testbed/src/kube_proxy), iptables mode (the
    // bench's ClusterIP table and the tests): `sysctl` for its sysctls, `nfacct`
    // for the counters its INVALID-drop rule counts with.
    Group {
        packages: &["procps", "nfacct"],
        purposes: &[Bench, Test],
    },
    // `cargo xtask profile` (its set is the bench's).
    Group {
        packages: &["linux-perf"],
        purposes: &[Bench, Test],
    },
    // kube-proxy's other modes in the tests: `nft` for nftables, `ipset` and
    // `ipvsadm` for IPVS.
    Group {
        packages: &["nftables", "ipset", "ipvsadm"],
        purposes: &[Test],
    },
    // Offloads in the tests (`ethtool -k/-K`); tcpdump to look at a test's
    // traffic by hand.
    Group {
        packages: &["ethtool", "tcpdump"],
        purposes: &[Test],
    },
    // The crash tests kill the plugin before a chosen system call
    // (`strace --inject=<call>:signal=KILL:when=<n>`).
    Group {
        packages: &["strace"],
        purposes: &[Test],
    },
    // The kernel matrix (the suite's matrix stage, `vm-test`, `vm-bench`):
    // qemu, the guest's first userspace, depmod for the unpacked kernels, their
    // compressed modules.
    Group {
        packages: &[
            "qemu-system-x86",
            "busybox-static",
            "kmod",
            "xz-utils",
            "zstd",
        ],
        purposes: &[Test],
    },
    // The containerd CRI end-to-end test (tests/cri.rs): the runtime, its OCI
    // runtime, and protoc for the CRI client's generated code (crate k8s-cri).
    Group {
        packages: &["containerd", "runc", "protobuf-compiler"],
        purposes: &[Test],
    },
    // `cargo xtask image` (and the image the CRI install test runs).
    Group {
        packages: &["buildah"],
        purposes: &[Test],
    },
];

/// The Debian packages `purpose` needs, in the order of [`GROUPS`].
pub(crate) fn packages(purpose: Purpose) -> Vec<&'static str> {
    GROUPS
        .iter()
        .filter(|g| g.purposes.contains(&purpose))
        .flat_map(|g| g.packages.iter().copied())
        .collect()
}

/// The toolchain the eBPF crate is built with (`cargo +nightly`).
pub(crate) const NIGHTLY: &str = "nightly";
/// rust-src for `-Z build-std=core`, clippy for `build-ebpf --check`.
const NIGHTLY_COMPONENTS: [&str; 2] = ["rust-src", "clippy"];
const BPFFS: &str = "/sys/fs/bpf";
const LINKER: &str = "bpf-linker";
/// Written next to a bpf-linker this setup built: what it was built against.
const MARKER_SUFFIX: &str = ".llvm";

/// What `purpose` needs, set up as `cargo xtask setup --for <purpose>` does
/// (how `demo`, `bench`, `profile` and `test` start).
pub(crate) fn run_for(purpose: Purpose) -> Result<()> {
    run(&SetupArgs {
        purpose,
        ..SetupArgs::default()
    })
}

pub(crate) fn run(args: &SetupArgs) -> Result<()> {
    let started = Instant::now();
    step("Debian packages", || debian_packages(args.purpose))?;
    step("nightly toolchain", nightly_toolchain)?;
    step("bpf-linker", || bpf_linker(args))?;
    step("bpffs", bpffs)?;
    eprintln!("setup: done in {}", fmt_duration(started.elapsed()));
    Ok(())
}

fn step(name: &str, f: impl FnOnce() -> Result<String>) -> Result<()> {
    let started = Instant::now();
    let outcome = f();
    let took = fmt_duration(started.elapsed());
    match outcome {
        Ok(what) => {
            eprintln!("setup: {name}: {what} ({took})");
            Ok(())
        }
        Err(e) => {
            eprintln!("setup: {name}: FAILED ({took})");
            Err(e.context(format!("setup step `{name}`")))
        }
    }
}

// ---- Debian packages -------------------------------------------------------

fn debian_packages(purpose: Purpose) -> Result<String> {
    let wanted = packages(purpose);
    let missing = missing_packages(&wanted)?;
    if missing.is_empty() {
        return Ok(format!("all {} present", wanted.len()));
    }
    let list = missing.join(" ");
    if !host::is_root()? {
        bail!(
            "missing Debian packages: {list}; run `cargo xtask setup{}` as root to install them",
            for_flag(purpose)
        );
    }
    let apt = |args: &[&str]| {
        let mut c = Command::new("apt-get");
        c.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        c
    };
    cmd::run(&mut apt(&["update"]))?;
    cmd::run(apt(&["install", "-y", "--no-install-recommends"]).args(&missing))?;
    let still = missing_packages(&wanted)?;
    ensure!(
        still.is_empty(),
        "still not installed after apt-get install: {}",
        still.join(" ")
    );
    Ok(format!("installed {list}"))
}

/// The `--for` flag that sets up for `purpose` (none for the default, everything).
const fn for_flag(purpose: Purpose) -> &'static str {
    match purpose {
        Purpose::Demo => " --for demo",
        Purpose::Bench => " --for bench",
        Purpose::Test => "",
    }
}

fn missing_packages(wanted: &[&'static str]) -> Result<Vec<&'static str>> {
    let mut missing = Vec::new();
    for &pkg in wanted {
        // Exits 1 ("no packages found matching") for packages dpkg never heard of.
        let out = cmd::capture(Command::new("dpkg-query").args(["-W", "-f=${Status}", pkg]))
            .context("setup installs Debian packages; is this a Debian machine?")?;
        if !(out.status.success() && is_installed(&String::from_utf8_lossy(&out.stdout))) {
            missing.push(pkg);
        }
    }
    Ok(missing)
}

/// dpkg status "install ok installed" (or "hold ok installed").
fn is_installed(status: &str) -> bool {
    let words: Vec<&str> = status.split_whitespace().collect();
    matches!(words.as_slice(), [_, "ok", "installed"])
}

// ---- nightly toolchain -----------------------------------------------------

fn nightly_toolchain() -> Result<String> {
    let mut did = Vec::new();
    let toolchains = cmd::stdout(Command::new("rustup").args(["toolchain", "list"]))?;
    if !has_nightly(&toolchains) {
        cmd::run(Command::new("rustup").args([
            "toolchain",
            "install",
            NIGHTLY,
            "--profile",
            "minimal",
        ]))?;
        did.push("installed nightly".to_owned());
    }
    let installed = cmd::stdout(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        NIGHTLY,
        "--installed",
    ]))?;
    let missing: Vec<&str> = NIGHTLY_COMPONENTS
        .into_iter()
        .filter(|c| !has_component(&installed, c))
        .collect();
    if !missing.is_empty() {
        cmd::run(
            Command::new("rustup")
                .args(["component", "add"])
                .args(&missing)
                .args(["--toolchain", NIGHTLY]),
        )?;
        did.push(format!("added {}", missing.join(", ")));
    }
    let version = cmd::stdout(Command::new("rustc").arg("+nightly").arg("--version"))?;
    if did.is_empty() {
        did.push(format!("present with {}", NIGHTLY_COMPONENTS.join(", ")));
    }
    Ok(format!("{}: {}", version.trim(), did.join("; ")))
}

/// The `nightly` channel toolchain (`nightly-<host>`), not a dated one.
fn has_nightly(toolchain_list: &str) -> bool {
    toolchain_list
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .any(|t| {
            t == NIGHTLY
                || t.strip_prefix("nightly-")
                    .is_some_and(|host| !host.starts_with(|c: char| c.is_ascii_digit()))
        })
}

/// `rust-src` or `clippy-x86_64-unknown-linux-gnu` in `rustup component list --installed`.
fn has_component(installed: &str, component: &str) -> bool {
    installed.lines().map(str::trim).any(|l| {
        l == component
            || l.strip_prefix(component)
                .is_some_and(|rest| rest.starts_with('-') && rest.contains("-unknown-"))
    })
}

// ---- bpf-linker ------------------------------------------------------------

/// The libLLVM inside the nightly toolchain.
struct NightlyLlvm {
    /// e.g. `<sysroot>/lib/libLLVM.so.22.1-rust-1.97.0-nightly`
    lib: PathBuf,
    major: u32,
    /// `LLVM version:` of `rustc +nightly -vV`, e.g. 22.1.4
    version: String,
}

impl NightlyLlvm {
    fn probe() -> Result<Self> {
        let sysroot = cmd::stdout(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))?;
        let lib_dir = Path::new(sysroot.trim()).join("lib");
        let mut libs = Vec::new();
        for entry in
            fs::read_dir(&lib_dir).with_context(|| format!("listing {}", lib_dir.display()))?
        {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if name.starts_with("libLLVM.so.") {
                if let Some(major) = elf::llvm_major_of(&name) {
                    libs.push((lib_dir.join(name), major));
                }
            }
        }
        let (lib, major) = match libs.as_slice() {
            [one] => one.clone(),
            [] => bail!("no libLLVM.so.<version> in {}", lib_dir.display()),
            many => bail!(
                "several libLLVM.so.<version> in {}: {:?}",
                lib_dir.display(),
                many.iter().map(|(p, _)| p).collect::<Vec<_>>()
            ),
        };
        let vv = cmd::stdout(Command::new("rustc").args(["+nightly", "-vV"]))?;
        let version = vv
            .lines()
            .find_map(|l| l.strip_prefix("LLVM version: "))
            .context("`rustc +nightly -vV` names no LLVM version")?
            .trim()
            .to_owned();
        ensure!(
            version.split('.').next() == Some(major.to_string().as_str()),
            "nightly rustc reports LLVM {version} but ships {}",
            lib.display()
        );
        Ok(Self {
            lib,
            major,
            version,
        })
    }
}

/// What is installed where we look for bpf-linker.
#[derive(Debug, PartialEq)]
enum Linker {
    Missing,
    /// Present but does not run, e.g. the libLLVM it links went away with a nightly update.
    Broken(String),
    Runs {
        version: String,
        /// LLVM major it links, and how we know.
        llvm: Option<(u32, &'static str)>,
    },
}

/// Why bpf-linker must be (re)built, or None when the installed one fits.
fn install_reason(linker: &Linker, nightly_major: u32) -> Option<String> {
    match linker {
        Linker::Missing => Some("not installed".to_owned()),
        Linker::Broken(why) => Some(format!("installed one does not run: {why}")),
        Linker::Runs { llvm: None, .. } => {
            Some("cannot tell which LLVM it was built with".to_owned())
        }
        Linker::Runs {
            llvm: Some((major, _)),
            ..
        } if *major != nightly_major => Some(format!(
            "built with LLVM {major}, the nightly uses LLVM {nightly_major}"
        )),
        Linker::Runs { .. } => None,
    }
}

/// The bpf-linker builds use: first on `$PATH`, else in `$CARGO_HOME/bin`.
pub(crate) fn find_bpf_linker() -> Result<Option<PathBuf>> {
    if let Some(found) = host::which(LINKER) {
        return Ok(Some(found));
    }
    let in_cargo_home = host::cargo_home()?.join("bin").join(LINKER);
    Ok(host::is_executable(&in_cargo_home).then_some(in_cargo_home))
}

fn bpf_linker(args: &SetupArgs) -> Result<String> {
    let nightly = NightlyLlvm::probe()?;
    let root = match &args.bpf_linker_root {
        Some(root) => root.clone(),
        None => host::cargo_home()?,
    };
    let bin = match (&args.bpf_linker_root, find_bpf_linker()?) {
        (None, Some(found)) => found,
        _ => root.join("bin").join(LINKER),
    };
    let current = inspect(&bin);
    let reason = if args.reinstall_bpf_linker {
        Some("--reinstall-bpf-linker".to_owned())
    } else {
        install_reason(&current, nightly.major)
    };
    let Some(reason) = reason else {
        let Linker::Runs {
            version,
            llvm: Some((major, how)),
        } = current
        else {
            bail!("unexpected bpf-linker state {current:?}");
        };
        return Ok(format!(
            "{version} at {} links LLVM {major} ({how}), as the nightly (LLVM {}): nothing to do",
            bin.display(),
            nightly.version
        ));
    };
    eprintln!(
        "setup: bpf-linker at {}: {reason}; building it against {}",
        bin.display(),
        nightly.lib.display()
    );
    let prefix = match &args.llvm_prefix {
        Some(prefix) => prefix.clone(),
        None => host::home()?.join(".local").join("llvm-rust-nightly"),
    };
    install(&root, &prefix, &nightly)?;

    let bin = root.join("bin").join(LINKER);
    match inspect(&bin) {
        Linker::Runs {
            llvm: Some((major, _)),
            ..
        } if major == nightly.major => {}
        other => bail!("after `cargo install`, {} is {other:?}", bin.display()),
    }
    write_marker(&bin, &nightly)?;
    if args.bpf_linker_root.is_none() {
        match host::which(LINKER) {
            Some(found) if same_file(&found, &bin) => {}
            Some(found) => bail!(
                "installed {}, but {} comes first on PATH; remove it",
                bin.display(),
                found.display()
            ),
            None => eprintln!(
                "setup: note: {} is not on PATH; `cargo xtask build-ebpf` finds it anyway",
                bin.display()
            ),
        }
    }
    Ok(format!(
        "installed {} for LLVM {} ({reason})",
        bin.display(),
        nightly.major
    ))
}

fn inspect(bin: &Path) -> Linker {
    if !bin.exists() {
        return Linker::Missing;
    }
    let out = match cmd::capture(Command::new(bin).arg("--version")) {
        Ok(out) => out,
        Err(e) => return Linker::Broken(format!("{e:#}")),
    };
    if !out.status.success() {
        return Linker::Broken(format!(
            "`{} --version` failed ({}): {}",
            bin.display(),
            cmd::status_text(out.status),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    Linker::Runs {
        version,
        llvm: linked_llvm_major(bin),
    }
}

/// From the libLLVM soname in its ELF NEEDED entries (a dynamically linked build,
/// like ours), else from the marker this setup wrote when it built it.
fn linked_llvm_major(bin: &Path) -> Option<(u32, &'static str)> {
    let needed = elf::needed_libs(bin).unwrap_or_default();
    if let Some(major) = needed.iter().find_map(|lib| elf::llvm_major_of(lib)) {
        return Some((major, "ELF NEEDED"));
    }
    read_marker(bin).map(|major| (major, "setup's marker"))
}

fn marker_path(bin: &Path) -> PathBuf {
    let mut name = bin.as_os_str().to_owned();
    name.push(MARKER_SUFFIX);
    PathBuf::from(name)
}

fn write_marker(bin: &Path, nightly: &NightlyLlvm) -> Result<()> {
    let path = marker_path(bin);
    let text = format!(
        "# written by `cargo xtask setup` after building {LINKER}\nllvm-major={}\nllvm-version={}\nlibllvm={}\n",
        nightly.major,
        nightly.version,
        nightly.lib.display()
    );
    fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}

/// The marker's LLVM major, if the marker is not older than the binary.
fn read_marker(bin: &Path) -> Option<u32> {
    let path = marker_path(bin);
    let marker_time = fs::metadata(&path).ok()?.modified().ok()?;
    let bin_time = fs::metadata(bin).ok()?.modified().ok()?;
    if marker_time < bin_time {
        return None;
    }
    fs::read_to_string(&path)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("llvm-major="))?
        .trim()
        .parse()
        .ok()
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (fs::canonicalize(a), fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Route B: symlink the nightly's libLLVM into `<prefix>/lib` (as `libLLVM.so` and
/// under its own name, which becomes the NEEDED entry, found through RUNPATH), then
/// `LLVM_PREFIX=<prefix> cargo install bpf-linker --features llvm-<major>`.
fn install(root: &Path, prefix: &Path, nightly: &NightlyLlvm) -> Result<()> {
    let lib_dir = prefix.join("lib");
    fs::create_dir_all(&lib_dir).with_context(|| format!("creating {}", lib_dir.display()))?;
    let name = nightly
        .lib
        .file_name()
        .context("libLLVM path without a file name")?;
    force_symlink(&nightly.lib, &lib_dir.join("libLLVM.so"))?;
    force_symlink(&nightly.lib, &lib_dir.join(name))?;
    let started = Instant::now();
    cmd::run(
        Command::new("cargo")
            // 0.13.0: the release verified against LLVM 22 (docs/development.md).
            .args([
                "install",
                LINKER,
                "--version",
                "0.13.0",
                "--no-default-features",
                "--features",
            ])
            .arg(format!("llvm-{}", nightly.major))
            .arg("--force")
            .arg("--root")
            .arg(root)
            .env("LLVM_PREFIX", prefix),
    )?;
    eprintln!(
        "setup: built {LINKER} in {}",
        fmt_duration(started.elapsed())
    );
    Ok(())
}

/// `ln -sf target link`, leaving a link that already points there alone.
fn force_symlink(target: &Path, link: &Path) -> Result<()> {
    match fs::read_link(link) {
        Ok(existing) if existing == target => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        // Another link, or a regular file in the way.
        Ok(_) | Err(_) => fs::remove_file(link),
    }
    .with_context(|| format!("removing {}", link.display()))?;
    symlink(target, link)
        .with_context(|| format!("symlinking {} -> {}", link.display(), target.display()))
}

// ---- bpffs -----------------------------------------------------------------

fn bpffs() -> Result<String> {
    if host::mounted_fs_type(BPFFS)?.as_deref() == Some("bpf") {
        return Ok(format!("mounted at {BPFFS}"));
    }
    ensure!(
        host::is_root()?,
        "{BPFFS} is not a bpffs mount and mounting it needs root; run `cargo xtask setup` as root"
    );
    cmd::run(Command::new("mount").args(["-t", "bpf", "bpf", BPFFS]))?;
    let now = host::mounted_fs_type(BPFFS)?;
    ensure!(
        now.as_deref() == Some("bpf"),
        "after mounting, {BPFFS} is {now:?}, not bpf"
    );
    Ok(format!("mounted bpffs on {BPFFS}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dpkg_status() {
        assert!(is_installed("install ok installed"));
        assert!(is_installed("hold ok installed"));
        assert!(!is_installed("deinstall ok config-files"));
        assert!(!is_installed("unknown ok not-installed"));
        assert!(!is_installed(""));
    }

    /// The list before purposes (issue 50): the suite still gets all of it.
    const BEFORE: [&str; 23] = [
        "bpftool",
        "iperf3",
        "sockperf",
        "iproute2",
        "iptables",
        "containernetworking-plugins",
        "ethtool",
        "tcpdump",
        "strace",
        "qemu-system-x86",
        "busybox-static",
        "kmod",
        "xz-utils",
        "zstd",
        "containerd",
        "runc",
        "protobuf-compiler",
        "buildah",
        "linux-perf",
        "nftables",
        "ipset",
        "ipvsadm",
        "nfacct",
    ];

    #[test]
    fn the_suite_gets_every_package_once() {
        let all = packages(Purpose::Test);
        let every: Vec<&str> = GROUPS
            .iter()
            .flat_map(|g| g.packages.iter().copied())
            .collect();
        assert_eq!(all, every);
        let mut unique = all.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), all.len(), "a package in two groups: {all:?}");
        for pkg in BEFORE {
            assert!(all.contains(&pkg), "{pkg} dropped from the suite's set");
        }
    }

    #[test]
    fn each_purpose_gets_a_part_of_the_suites_set() {
        let all = packages(Purpose::Test);
        for p in [Purpose::Demo, Purpose::Bench] {
            let set = packages(p);
            assert!(!set.is_empty());
            for pkg in &set {
                assert!(all.contains(pkg), "{p:?}: {pkg} is not in the full set");
            }
        }
        for pkg in packages(Purpose::Demo) {
            assert!(
                packages(Purpose::Bench).contains(&pkg),
                "bench lacks the demo's {pkg}"
            );
        }
    }

    #[test]
    fn the_demo_and_the_bench_get_no_vm_no_containers() {
        let demo = packages(Purpose::Demo);
        assert_eq!(demo, ["iproute2", "bpftool", "iperf3"]);
        let bench = packages(Purpose::Bench);
        for pkg in [
            "sockperf",
            "containernetworking-plugins",
            "iptables",
            "nfacct",
            "linux-perf",
        ] {
            assert!(bench.contains(&pkg), "bench lacks {pkg}");
        }
        for pkg in [
            "qemu-system-x86",
            "containerd",
            "runc",
            "buildah",
            "protobuf-compiler",
        ] {
            assert!(!demo.contains(&pkg), "the demo installs {pkg}");
            assert!(!bench.contains(&pkg), "the bench installs {pkg}");
        }
    }

    #[test]
    fn setup_for_a_command() {
        use clap::Parser;
        let parse = |args: &[&str]| {
            let cli = crate::cli::Cli::try_parse_from(args).unwrap();
            let crate::cli::Command::Setup(a) = cli.command else {
                panic!("parsed {:?}", cli.command)
            };
            a.purpose
        };
        assert_eq!(parse(&["xtask", "setup"]), Purpose::Test);
        assert_eq!(parse(&["xtask", "setup", "--for", "demo"]), Purpose::Demo);
        assert_eq!(parse(&["xtask", "setup", "--for", "bench"]), Purpose::Bench);
        assert_eq!(SetupArgs::default().purpose, Purpose::Test);
        // The hint in the error names the flag that installs the same set.
        for p in [Purpose::Demo, Purpose::Bench, Purpose::Test] {
            let mut args = vec!["xtask", "setup"];
            args.extend(for_flag(p).split_whitespace());
            assert_eq!(parse(&args), p);
        }
    }

    #[test]
    fn nightly_in_toolchain_list() {
        let list =
            "stable-x86_64-unknown-linux-gnu (active, default)\nnightly-x86_64-unknown-linux-gnu\n";
        assert!(has_nightly(list));
        assert!(!has_nightly(
            "stable-x86_64-unknown-linux-gnu (default)\nnightly-2026-05-19-x86_64-unknown-linux-gnu\n"
        ));
    }

    #[test]
    fn components() {
        let installed = "cargo-x86_64-unknown-linux-gnu\nclippy-x86_64-unknown-linux-gnu\nrust-src\nrust-std-x86_64-unknown-linux-gnu\n";
        assert!(has_component(installed, "rust-src"));
        assert!(has_component(installed, "clippy"));
        assert!(!has_component(installed, "rustfmt"));
        assert!(!has_component(
            "rust-std-x86_64-unknown-linux-gnu\n",
            "rust-src"
        ));
    }

    #[test]
    fn when_to_rebuild_bpf_linker() {
        let runs = |llvm| Linker::Runs {
            version: "bpf-linker 0.13.0".into(),
            llvm,
        };
        assert_eq!(install_reason(&runs(Some((22, "ELF NEEDED"))), 22), None);
        assert!(install_reason(&runs(Some((21, "ELF NEEDED"))), 22)
            .unwrap()
            .contains("LLVM 21"));
        assert!(install_reason(&runs(None), 22).is_some());
        assert!(install_reason(&Linker::Missing, 22).is_some());
        assert!(install_reason(&Linker::Broken("x".into()), 22).is_some());
    }

    #[test]
    fn inspects_a_missing_and_a_broken_linker() {
        assert_eq!(
            inspect(Path::new("/nonexistent/bpf-linker")),
            Linker::Missing
        );
        // Stands in for a bpf-linker whose libLLVM is gone: runs, exits non-zero.
        let Linker::Broken(why) = inspect(Path::new("/bin/false")) else {
            panic!("/bin/false not seen as broken")
        };
        assert!(why.contains("--version` failed (exit status 1)"), "{why}");
        let Linker::Broken(why) = inspect(Path::new("/")) else {
            panic!("/ not seen as broken")
        };
        assert!(why.starts_with("could not start"), "{why}");
    }

    #[test]
    fn marker_is_ignored_when_older_than_the_binary() {
        let dir = std::env::temp_dir().join(format!("xtask-marker-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let bin = dir.join("bpf-linker");
        fs::write(marker_path(&bin), "llvm-major=22\n").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        fs::write(&bin, "new binary").unwrap();
        assert_eq!(read_marker(&bin), None);
        fs::write(marker_path(&bin), "llvm-major=22\n").unwrap();
        assert_eq!(read_marker(&bin), Some(22));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn force_symlink_replaces() {
        let dir = std::env::temp_dir().join(format!("xtask-ln-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let link = dir.join("libLLVM.so");
        force_symlink(Path::new("/a"), &link).unwrap();
        force_symlink(Path::new("/a"), &link).unwrap();
        force_symlink(Path::new("/b"), &link).unwrap();
        assert_eq!(fs::read_link(&link).unwrap(), Path::new("/b"));
        fs::remove_dir_all(&dir).unwrap();
    }
}
