//! One guest run: qemu boots a Debian kernel with the initramfs of
//! `initramfs.rs`; the guest sees this machine's file system read-only (9p,
//! under a tmpfs overlay) and writes what it has to say into a shared output
//! directory. The console is echoed with a prefix; a run that outlives its
//! deadline is killed.
use std::{
    fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use super::kernels::Kernel;

/// How qemu executes the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Accel {
    /// Hardware virtualisation (/dev/kvm opens read-write).
    Kvm,
    /// Software emulation: 10-20x slower, works everywhere.
    Tcg,
}

impl Accel {
    /// KVM when /dev/kvm opens and a probe boot of `kernel` under it reaches
    /// userspace within 20 s; emulation otherwise. (Nested KVM inside another
    /// hypervisor can hang in early boot or abort on an MSR: seen on
    /// Firecracker hosts.) `SLUICE_VM_NO_KVM=1` forces emulation.
    pub(crate) fn detect(kernel: &Kernel, initrd: &Path, out: &Path) -> Self {
        let kvm = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .is_ok();
        if !kvm || std::env::var_os("SLUICE_VM_NO_KVM").is_some() {
            return Self::Tcg;
        }
        let probe = Boot {
            kernel,
            initrd,
            job: "probe",
            out,
            accel: Self::Kvm,
            cpus: 1,
            memory_mib: 512,
            deadline: Duration::from_secs(20),
            prefix: "[kvm probe] ".to_string(),
        };
        match probe.run() {
            Ok(c) if c.booted() => Self::Kvm,
            _ => {
                println!("vm: KVM is there but a guest does not boot under it; emulating (TCG)");
                Self::Tcg
            }
        }
    }

    fn args(self) -> &'static [&'static str] {
        match self {
            // arch-capabilities: an MSR nested hypervisors refuse to set.
            Self::Kvm => &["-accel", "kvm", "-cpu", "host,-arch-capabilities"],
            Self::Tcg => &["-accel", "tcg,thread=multi", "-cpu", "max"],
        }
    }
}

/// One boot of `kernel`: `job` is `probe` or a script path in the host's file
/// system; `out` is shared read-write with the guest (9p tag `out`).
pub(super) struct Boot<'a> {
    pub kernel: &'a Kernel,
    pub initrd: &'a Path,
    pub job: &'a str,
    pub out: &'a Path,
    pub accel: Accel,
    pub cpus: u32,
    pub memory_mib: u32,
    pub deadline: Duration,
    /// Console lines are printed with this prefix (`[5.10] `).
    pub prefix: String,
}

/// What a boot printed, and whether it ended by itself.
pub(super) struct Console {
    pub timed_out: bool,
    pub took: Duration,
    /// When the guest's userspace said it started (`SLUICE-VM-BOOTED`):
    /// the kernel's boot under this accelerator.
    pub booted_in: Option<Duration>,
}

impl Console {
    pub(super) fn booted(&self) -> bool {
        self.booted_in.is_some()
    }
}

impl Boot<'_> {
    pub(super) fn command(&self) -> Command {
        let mut c = Command::new("qemu-system-x86_64");
        c.args(self.accel.args())
            .args(["-smp", &self.cpus.to_string()])
            .args(["-m", &self.memory_mib.to_string()])
            .args(["-nographic", "-no-reboot", "-nic", "none"])
            .arg("-kernel")
            .arg(&self.kernel.vmlinuz)
            .arg("-initrd")
            .arg(self.initrd)
            .args([
                "-virtfs",
                "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
            ])
            .arg("-virtfs")
            .arg(format!(
                "local,path={},mount_tag=out,security_model=none,multidevs=remap",
                self.out.display()
            ))
            .arg("-append")
            .arg(format!(
                "console=ttyS0 quiet loglevel=3 panic=-1 sluice.job={}",
                self.job
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Boots and waits for the guest to power off (or the deadline).
    pub(super) fn run(&self) -> Result<Console> {
        let mut cmd = self.command();
        let line = crate::cmd::describe(&cmd);
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .with_context(|| format!("could not start `{line}` (package qemu-system-x86)"))?;
        let (tx, rx) = mpsc::channel::<String>();
        let mut readers = Vec::new();
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let tx = tx.clone();
            readers.push(thread::spawn(move || {
                for l in BufReader::new(stream).split(b'\n').map_while(Result::ok) {
                    let text = String::from_utf8_lossy(&l)
                        .trim_end_matches('\r')
                        .to_string();
                    if tx.send(text).is_err() {
                        break;
                    }
                }
            }));
        }
        drop(tx);
        let mut lines = Vec::new();
        let mut timed_out = false;
        let mut booted_in = None;
        loop {
            let left = self.deadline.saturating_sub(started.elapsed());
            match rx.recv_timeout(left.min(Duration::from_secs(1))) {
                Ok(l) => {
                    if booted_in.is_none() && l.contains("SLUICE-VM-BOOTED") {
                        booted_in = Some(started.elapsed());
                    }
                    println!("{}{l}", self.prefix);
                    lines.push(l);
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if started.elapsed() >= self.deadline {
                        timed_out = true;
                        let _ = child.kill();
                        break;
                    }
                }
            }
        }
        let status = child.wait().context("waiting for qemu")?;
        for r in readers {
            let _ = r.join();
        }
        if !timed_out && !status.success() {
            bail!(
                "`{line}` failed ({}); last lines:\n{}",
                crate::cmd::status_text(status),
                lines[lines.len().saturating_sub(20)..].join("\n")
            );
        }
        Ok(Console {
            timed_out,
            took: started.elapsed(),
            booted_in,
        })
    }
}

/// A fresh, empty output directory for one guest.
pub(super) fn fresh_dir(path: &Path) -> Result<PathBuf> {
    if path.exists() {
        fs::remove_dir_all(path).with_context(|| format!("removing {}", path.display()))?;
    }
    fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))?;
    Ok(path.to_path_buf())
}
