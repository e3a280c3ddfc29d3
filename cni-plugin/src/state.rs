//! Attachment records: what an ADD made, kept on disk so that DEL (which may come
//! without prevResult or netns), CHECK and GC can find and undo it.
//!
//! One JSON file per attachment in `<stateDir>/<network>/attachments/`, written
//! atomically (temp file + rename), readable by root only. A removed record's
//! file moves to `.spare/`, emptied, for the next record ([`crate::spare`]).
use std::{
    fs,
    net::IpAddr,
    path::{Path, PathBuf},
};

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};

use crate::{
    cni::{
        runtime_config::{Bandwidth, PortMapping},
        AttachmentId,
    },
    datapath::bpffs::create_dirs,
    error::Error,
    overwrite::overwrite,
    spare::Spares,
};

/// Prefix of every host-side veth Sluice creates.
pub const HOST_VETH_PREFIX: &str = "sl";

/// The host-side veth name of an attachment: `sl` + 12 hex digits of a hash of
/// (network, container id, ifname). Stable, so DEL finds it without any record, and
/// 14 characters, under the kernel's 15.
pub fn host_veth_name(network: &str, id: &AttachmentId) -> String {
    let key = format!("{network}\0{}\0{}", id.container_id, id.ifname);
    let h = sluice_common::fnv1a64(key.as_bytes());
    format!("{HOST_VETH_PREFIX}{:012x}", h & 0xffff_ffff_ffff)
}

/// What one ADD created.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentRecord {
    pub container_id: String,
    pub ifname: String,
    #[serde(default)]
    pub netns: Option<String>,
    pub host_ifname: String,
    /// Known once the veth exists.
    #[serde(default)]
    pub host_ifindex: Option<u32>,
    /// Addresses given to the pod, with their prefix lengths.
    #[serde(default)]
    pub ips: Vec<IpNetwork>,
    /// Gateways put on the host veth.
    #[serde(default)]
    pub gateways: Vec<IpAddr>,
    /// `sluice` (built-in) or the delegated IPAM plugin's type.
    pub ipam: String,
    #[serde(default)]
    pub port_mappings: Vec<PortMapping>,
    #[serde(default)]
    pub bandwidth: Option<Bandwidth>,
    pub created_unix: u64,
    /// False until ADD finished; a record left at false is a crashed ADD.
    #[serde(default)]
    pub complete: bool,
    /// The Kubernetes pod, when the runtime named it in `CNI_ARGS`
    /// (`sluicectl metrics` labels its series with it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
}

/// A pod as `CNI_ARGS` names it (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`: what
/// containerd and CRI-O send).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
}

impl PodRef {
    /// The pod `CNI_ARGS` names, if it names one.
    pub fn from_args(args: &crate::cni::args::CniArgs) -> Option<Self> {
        let name = args.get("K8S_POD_NAME").filter(|n| !n.is_empty())?;
        Some(Self {
            namespace: args
                .get("K8S_POD_NAMESPACE")
                .unwrap_or_default()
                .to_string(),
            name: name.to_string(),
        })
    }
}

impl AttachmentRecord {
    pub fn id(&self) -> AttachmentId {
        AttachmentId {
            container_id: self.container_id.clone(),
            ifname: self.ifname.clone(),
        }
    }

    /// The record's addresses, without their prefix lengths.
    pub fn addrs(&self) -> Vec<IpAddr> {
        self.ips.iter().map(IpNetwork::ip).collect()
    }
}

/// The records of one network.
pub struct StateStore {
    dir: PathBuf,
}

/// Removes `p` if it is a copy half-written by an ADD that died
/// (`<name>.tmp<pid>`, its pid gone).
fn remove_if_dead_copy(p: &Path) {
    if let Some(pid) = p
        .extension()
        .and_then(|e| e.to_str())
        .and_then(|e| e.strip_prefix("tmp"))
        .and_then(|n| n.parse::<u32>().ok())
    {
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = fs::remove_file(p);
        }
    }
}

impl StateStore {
    /// Records under `state_dir` (already `<stateDir>/<network>`).
    pub fn new(state_dir: &Path) -> Self {
        Self {
            dir: state_dir.join("attachments"),
        }
    }

    fn path(&self, id: &AttachmentId) -> PathBuf {
        // Both parts are validated (no '/', not '.' or '..'); a very long container
        // id is replaced by its hash to stay under NAME_MAX.
        let name = format!("{}.{}.json", id.container_id, id.ifname);
        if name.len() <= 200 {
            self.dir.join(name)
        } else {
            let h = sluice_common::fnv1a64(id.container_id.as_bytes());
            self.dir.join(format!("h{h:016x}.{}.json", id.ifname))
        }
    }

    /// Where records are written before they are renamed into place: a
    /// directory of its own, so what a killed ADD left is found without
    /// listing every record.
    fn tmp_dir(&self) -> PathBuf {
        self.dir.join(".tmp")
    }

    /// Removed records' files, for the next `save` ([`Spares`]).
    fn spares(&self) -> Spares {
        Spares::new(self.dir.join(".spare"))
    }

    /// Writes (or replaces) a record atomically.
    pub fn save(&self, rec: &AttachmentRecord) -> Result<(), Error> {
        let tmp_dir = self.tmp_dir();
        create_dirs(&tmp_dir)?;
        let path = self.path(&rec.id());
        let tmp = tmp_dir.join(format!(
            "{}.tmp{}",
            path.file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("record"),
            std::process::id()
        ));
        let body = Self::encode(rec)?;
        let write = || -> std::io::Result<()> {
            // A retired record's inode when there is one. Atomic through the
            // rename; no fsync (see ipam::store::write_temp).
            self.spares().create(&tmp, &body)?;
            fs::rename(&tmp, &path)
        };
        write().map_err(|e| {
            let _ = fs::remove_file(&tmp);
            Error::io(format!("writing {}", path.display()), e)
        })
    }

    /// Rewrites the record `save` wrote, in the same file ([`overwrite`]):
    /// ADD's second write (the veth's index, `complete`). Not temp file +
    /// rename like `save`, which frees an inode per ADD. A killed ADD leaves
    /// the first record or this one (a record over 4 KiB, hundreds of port
    /// mappings, may be cut at a page by the kill); a torn record does not
    /// parse, and DEL treats it as none (it finds the veth by its derived name
    /// and the addresses by owner). Falls back to `save` when the file is gone.
    pub fn rewrite(&self, rec: &AttachmentRecord) -> Result<(), Error> {
        let path = self.path(&rec.id());
        let body = Self::encode(rec)?;
        match overwrite(&path, &body, false) {
            Ok(true) => Ok(()),
            Ok(false) => self.save(rec),
            Err(e) => Err(Error::io(format!("writing {}", path.display()), e)),
        }
    }

    fn encode(rec: &AttachmentRecord) -> Result<Vec<u8>, Error> {
        serde_json::to_vec_pretty(rec).map_err(|e| Error::Decode {
            what: "attachment record".into(),
            reason: e.to_string(),
        })
    }

    /// The record of `id`, if any. A record that cannot be parsed is reported.
    pub fn load(&self, id: &AttachmentId) -> Result<Option<AttachmentRecord>, Error> {
        let path = self.path(id);
        match fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| Error::Decode {
                    what: format!("attachment record {}", path.display()),
                    reason: e.to_string(),
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("reading {}", path.display()), e)),
        }
    }

    /// Removes the record of `id`, and any half-written copy of it an ADD killed
    /// between write and rename left (`.tmp/<name>.tmp<pid>`); a missing one is
    /// fine. Reads `.tmp`, which is empty but for such copies.
    pub fn remove(&self, id: &AttachmentId) -> Result<(), Error> {
        let path = self.path(id);
        if let (Some(stem), Ok(rd)) = (
            path.file_stem().and_then(|s| s.to_str()),
            fs::read_dir(self.tmp_dir()),
        ) {
            let prefix = format!("{stem}.tmp");
            for e in rd.filter_map(Result::ok) {
                if e.file_name()
                    .to_str()
                    .is_some_and(|n| n.starts_with(&prefix))
                {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
        // To the spares, not freed: the next ADD's record takes the inode.
        self.spares()
            .retire(&path)
            .map(drop)
            .map_err(|e| Error::io(format!("removing {}", path.display()), e))
    }

    /// Every readable record (GC). Unreadable files are skipped with a log line.
    pub fn list(&self) -> Result<Vec<AttachmentRecord>, Error> {
        let rd = match fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io(format!("listing {}", self.dir.display()), e)),
        };
        let mut out = Vec::new();
        if let Ok(tmp) = fs::read_dir(self.tmp_dir()) {
            for entry in tmp.filter_map(Result::ok) {
                remove_if_dead_copy(&entry.path());
            }
        }
        for entry in rd.filter_map(Result::ok) {
            let p = entry.path();
            if p.extension().and_then(|e| e.to_str()) != Some("json") {
                // Where versions before `.tmp` wrote their copies.
                remove_if_dead_copy(&p);
                continue;
            }
            match fs::read(&p)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
            {
                Ok(r) => out.push(r),
                Err(e) => eprintln!("sluice: skipping unreadable record {}: {e}", p.display()),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn id(c: &str, i: &str) -> AttachmentId {
        AttachmentId {
            container_id: c.into(),
            ifname: i.into(),
        }
    }

    #[test]
    fn veth_names_are_stable_short_and_distinct() {
        let a = host_veth_name("net", &id("abc", "eth0"));
        assert_eq!(a, host_veth_name("net", &id("abc", "eth0")));
        assert_eq!(a.len(), 14);
        assert!(a.starts_with("sl"));
        assert_ne!(a, host_veth_name("net", &id("abc", "eth1")));
        assert_ne!(a, host_veth_name("net2", &id("abc", "eth0")));
    }

    fn record(c: &str) -> AttachmentRecord {
        AttachmentRecord {
            pod: None,
            container_id: c.into(),
            ifname: "eth0".into(),
            netns: Some("/run/netns/x".into()),
            host_ifname: "sl000000000001".into(),
            host_ifindex: Some(7),
            ips: vec!["10.1.0.2/24".parse().unwrap()],
            gateways: vec!["10.1.0.1".parse().unwrap()],
            ipam: "sluice".into(),
            port_mappings: vec![],
            bandwidth: None,
            created_unix: 1,
            complete: true,
        }
    }

    /// ADD's second write keeps the file (no inode freed) and leaves exactly
    /// the new record, also when it is shorter than the first.
    #[test]
    fn rewrite_keeps_the_file_and_replaces_the_whole_record() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let s = StateStore::new(dir.path());
        let mut rec = record("c1");
        rec.port_mappings = vec![serde_json::from_str(
            r#"{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}"#,
        )
        .unwrap()];
        rec.complete = false;
        s.save(&rec).unwrap();
        let path = s.path(&rec.id());
        let ino = fs::metadata(&path).unwrap().ino();
        let done = record("c1");
        s.rewrite(&done).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().ino(), ino);
        assert_eq!(s.load(&done.id()).unwrap(), Some(done));
        // Gone meanwhile: written anew.
        s.remove(&id("c1", "eth0")).unwrap();
        s.rewrite(&record("c1")).unwrap();
        assert_eq!(s.load(&id("c1", "eth0")).unwrap(), Some(record("c1")));
    }

    #[test]
    fn save_load_list_remove() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateStore::new(dir.path());
        assert!(s.load(&id("c1", "eth0")).unwrap().is_none());
        s.save(&record("c1")).unwrap();
        s.save(&record("c2")).unwrap();
        assert_eq!(s.load(&id("c1", "eth0")).unwrap(), Some(record("c1")));
        assert_eq!(s.list().unwrap().len(), 2);
        s.remove(&id("c1", "eth0")).unwrap();
        s.remove(&id("c1", "eth0")).unwrap();
        assert_eq!(s.list().unwrap().len(), 1);
        let att = dir.path().join("attachments");
        let leftovers: Vec<_> = fs::read_dir(&att)
            .unwrap()
            .filter_map(Result::ok)
            .filter(|e| e.file_name() != ".tmp" && e.file_name() != ".spare")
            .filter(|e| e.path().extension().and_then(|x| x.to_str()) != Some("json"))
            .chain(
                fs::read_dir(att.join(".tmp"))
                    .unwrap()
                    .filter_map(Result::ok),
            )
            .collect();
        assert!(
            leftovers.is_empty(),
            "temp files left behind: {leftovers:?}"
        );
        // The removed record's file is a spare, emptied, and the next record
        // is written in it.
        let spares: Vec<_> = fs::read_dir(att.join(".spare"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(spares.len(), 1);
        assert_eq!(fs::metadata(&spares[0]).unwrap().len(), 0);
        let ino = fs::metadata(&spares[0]).unwrap().ino();
        s.save(&record("c3")).unwrap();
        assert_eq!(fs::metadata(att.join("c3.eth0.json")).unwrap().ino(), ino);
        assert_eq!(s.load(&id("c3", "eth0")).unwrap(), Some(record("c3")));
        assert_eq!(fs::read_dir(att.join(".spare")).unwrap().count(), 0);
    }

    /// What an ADD killed between write and rename leaves: DEL (remove) takes
    /// its attachment's copies, GC (list) those of dead processes only.
    #[test]
    fn half_written_records_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateStore::new(dir.path());
        s.save(&record("c1")).unwrap();
        let att = dir.path().join("attachments").join(".tmp");
        let dead = 0x7fff_fff0u32; // above pid_max: no such process
        let me = std::process::id();
        fs::write(att.join(format!("c1.eth0.tmp{dead}")), b"{").unwrap();
        fs::write(att.join(format!("c2.eth0.tmp{dead}")), b"{").unwrap();
        fs::write(att.join(format!("c3.eth0.tmp{me}")), b"{").unwrap();
        s.remove(&id("c1", "eth0")).unwrap();
        assert!(!att.join(format!("c1.eth0.tmp{dead}")).exists());
        assert!(att.join(format!("c2.eth0.tmp{dead}")).exists());
        assert!(s.list().unwrap().is_empty());
        assert!(
            !att.join(format!("c2.eth0.tmp{dead}")).exists(),
            "dead writer"
        );
        assert!(
            att.join(format!("c3.eth0.tmp{me}")).exists(),
            "a live ADD's"
        );
    }

    #[test]
    fn long_ids_get_hashed_names_that_stay_in_the_dir() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateStore::new(dir.path());
        let long = "a".repeat(300);
        let p = s.path(&id(&long, "eth0"));
        assert!(p.starts_with(dir.path()));
        assert!(p.file_name().unwrap().len() < 255);
    }

    #[test]
    fn the_pod_comes_from_cni_args_and_is_kept_only_when_named() {
        use crate::cni::args::CniArgs;
        let a =
            CniArgs::parse("IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0").unwrap();
        assert_eq!(
            PodRef::from_args(&a),
            Some(PodRef {
                namespace: "shop".into(),
                name: "web-0".into()
            })
        );
        assert_eq!(
            PodRef::from_args(&CniArgs::parse("K8S_POD_NAME=").unwrap()),
            None
        );
        assert_eq!(PodRef::from_args(&CniArgs::default()), None);
        // A record without a pod has no `pod` key, and old records still load.
        let v = serde_json::to_value(record("c1")).unwrap();
        assert!(v.get("pod").is_none(), "{v}");
        let back: AttachmentRecord = serde_json::from_value(v).unwrap();
        assert_eq!(back.pod, None);
    }
}
