//! The built-in IPAM the plugin calls: host-local's behaviour for ADD, DEL, CHECK, GC
//! and STATUS over the disk store, each operation under the network's one lock.
use std::net::IpAddr;

use ipnetwork::IpNetwork;
use serde_json::Value;

use super::allocator::{self, Duplicates};
use super::config::HostLocalConfig;
use super::store::{check_network_name, DiskStore, Store};
use crate::cni::result::{CniResult, IpConfig};
use crate::cni::runtime_config::IpRanges;
use crate::cni::AttachmentId;
use crate::error::Error;

/// A validated built-in IPAM configuration for one network.
#[derive(Clone, Debug)]
pub struct BuiltinIpam {
    network: String,
    config: HostLocalConfig,
}

impl BuiltinIpam {
    /// `ipam`: the config's "ipam" object; `ip_ranges`: runtimeConfig.ipRanges if present.
    pub fn new(network: &str, ipam: &Value, ip_ranges: Option<&IpRanges>) -> Result<Self, Error> {
        check_network_name(network)?;
        Ok(Self {
            network: network.to_string(),
            config: HostLocalConfig::parse(ipam, ip_ranges)?,
        })
    }

    /// For DEL and GC, which only release reservations: needs `dataDir` alone, so
    /// ranges that no longer validate (or runtime ranges that never did) cannot
    /// keep a pod's addresses reserved forever.
    pub fn for_release(network: &str, ipam: &Value) -> Result<Self, Error> {
        check_network_name(network)?;
        Ok(Self {
            network: network.to_string(),
            config: HostLocalConfig::for_release(ipam)?,
        })
    }

    pub fn network(&self) -> &str {
        &self.network
    }

    pub fn config(&self) -> &HostLocalConfig {
        &self.config
    }

    fn store(&self) -> Result<DiskStore, Error> {
        DiskStore::open(&self.config.data_dir, &self.network)
    }

    /// Reserves one address per range set (or the requested ones) and returns an
    /// abbreviated result: `ips` (address with the subnet's prefix length, gateway of
    /// its range, interface None), `routes` from config, `dns` from resolvConf. On any
    /// error nothing stays reserved.
    pub fn add(
        &self,
        id: &AttachmentId,
        requested: &[IpAddr],
        duplicates: Duplicates,
    ) -> Result<CniResult, Error> {
        // Read before reserving, so a bad resolvConf leaves nothing to roll back.
        let dns = self.config.dns()?;
        let mut store = self.store()?;
        let _lock = store.lock()?;
        let allocations = allocator::allocate(
            &mut store,
            &self.config.range_sets,
            id,
            requested,
            duplicates,
        )?;
        Ok(CniResult {
            interfaces: Vec::new(),
            ips: allocations
                .into_iter()
                .map(|a| IpConfig {
                    address: a.address,
                    gateway: Some(a.gateway),
                    interface: None,
                })
                .collect(),
            routes: self.config.routes.clone(),
            dns,
        })
    }

    /// Releases every address of `id`; succeeds when there is none (DEL is
    /// idempotent). With `known`, the addresses the attachment record names,
    /// only those are looked at (one file each); without, every reservation is
    /// read to find the attachment's.
    pub fn del(&self, id: &AttachmentId, known: Option<&[IpAddr]>) -> Result<(), Error> {
        let mut store = self.store()?;
        let _lock = store.lock()?;
        match known {
            Some(ips) => store.release_held(id, ips)?,
            None => store.release_by_id(id)?,
        };
        Ok(())
    }

    /// CHECK: each of `expected` is reserved for `id` (one file read each).
    pub fn check_held(&self, id: &AttachmentId, expected: &[IpAddr]) -> Result<(), Error> {
        let store = self.store()?;
        let _lock = store.lock()?;
        for ip in expected {
            match store.owner_of(*ip)? {
                Some(r) if r.belongs_to(id) => {}
                Some(r) => {
                    return Err(Error::check(format!(
                        "{ip} is reserved for {r}, not {}/{}",
                        id.container_id, id.ifname
                    )))
                }
                None => {
                    return Err(Error::check(format!(
                        "{ip} is not reserved for {}/{} in {}",
                        id.container_id,
                        id.ifname,
                        store.dir().display()
                    )))
                }
            }
        }
        Ok(())
    }

    /// The addresses reserved for `id`; `Error::CheckFailed` if there are none.
    pub fn check(&self, id: &AttachmentId) -> Result<Vec<IpAddr>, Error> {
        let store = self.store()?;
        let _lock = store.lock()?;
        let ips = store.get_by_id(id)?;
        if ips.is_empty() {
            return Err(Error::check(format!(
                "no IP address is reserved for container {:?} interface {:?} in {}",
                id.container_id,
                id.ifname,
                store.dir().display()
            )));
        }
        Ok(ips)
    }

    /// Releases every reservation whose attachment is not in `valid`; returns what it
    /// released. An old-format reservation (container id only) is kept while any valid
    /// attachment has its container id. Keeps going past errors and returns the first.
    pub fn gc(&self, valid: &[AttachmentId]) -> Result<Vec<(AttachmentId, IpAddr)>, Error> {
        let mut store = self.store()?;
        let _lock = store.lock()?;
        let mut released = Vec::new();
        let mut first_err = None;
        for r in store.reservations()? {
            if valid.iter().any(|v| r.belongs_to(v)) {
                continue;
            }
            match store.release(r.ip) {
                Ok(true) => released.push((r.attachment(), r.ip)),
                Ok(false) => {}
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(released),
        }
    }

    /// `Err(Error::NotAvailable{..})` when some range set has no free address left (ADD would fail).
    pub fn status(&self) -> Result<(), Error> {
        let store = self.store()?;
        let _lock = store.lock()?;
        let full = allocator::exhausted_sets(&store, &self.config.range_sets)?;
        if full.is_empty() {
            return Ok(());
        }
        let described: Vec<String> = full
            .iter()
            .filter_map(|&i| {
                let set = self.config.range_sets.get(i)?;
                Some(format!("range set {i}: {set}"))
            })
            .collect();
        Err(Error::NotAvailable {
            reason: format!(
                "no free IP address left in network {:?}: {}",
                self.network,
                described.join("; ")
            ),
        })
    }

    /// The gateway and subnet of each configured range, each pair once (GC
    /// removes the gateways no pod uses from the node).
    pub fn gateways(&self) -> Vec<(IpAddr, IpNetwork)> {
        let mut out = Vec::new();
        for set in &self.config.range_sets {
            for r in set.ranges() {
                if !out.contains(&(r.gateway, r.subnet)) {
                    out.push((r.gateway, r.subnet));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::fs;
    use std::path::Path;
    use std::sync::Barrier;

    use serde_json::json;

    use super::*;
    use crate::ipam::range::tests::ip;
    use crate::ipam::store::tests::{att, names};

    #[expect(clippy::needless_pass_by_value, reason = "called with json! literals")]
    fn ipam(data_dir: &Path, extra: Value) -> BuiltinIpam {
        let mut cfg = json!({
            "type": "sluice",
            "ranges": [[{"subnet": "10.22.0.0/24"}], [{"subnet": "fd22::/64"}]],
            "dataDir": data_dir,
        });
        for (k, v) in extra.as_object().unwrap() {
            cfg[k] = v.clone();
        }
        BuiltinIpam::new("testnet", &cfg, None).unwrap()
    }

    #[test]
    fn add_returns_an_abbreviated_result_and_writes_host_local_files() {
        let tmp = tempfile::tempdir().unwrap();
        let resolv = tmp.path().join("resolv.conf");
        fs::write(&resolv, "nameserver 10.96.0.10\nsearch svc.cluster.local\n").unwrap();
        let ipam = ipam(
            tmp.path(),
            json!({"routes": [{"dst": "0.0.0.0/0"}], "resolvConf": resolv}),
        );
        let r = ipam
            .add(&att("ctr1", "eth0"), &[], Duplicates::Refuse)
            .unwrap();
        assert!(r.interfaces.is_empty());
        assert_eq!(
            r.ips,
            [
                IpConfig {
                    address: "10.22.0.2/24".parse().unwrap(),
                    gateway: Some(ip("10.22.0.1")),
                    interface: None,
                },
                IpConfig {
                    address: "fd22::2/64".parse().unwrap(),
                    gateway: Some(ip("fd22::1")),
                    interface: None,
                },
            ]
        );
        assert_eq!(r.routes.len(), 1);
        assert_eq!(r.routes[0].dst.to_string(), "0.0.0.0/0");
        assert_eq!(r.dns.nameservers, ["10.96.0.10"]);
        assert_eq!(r.dns.search, ["svc.cluster.local"]);

        let dir = tmp.path().join("testnet");
        assert_eq!(fs::read(dir.join("10.22.0.2")).unwrap(), b"ctr1\r\neth0");
        assert_eq!(fs::read(dir.join("fd22::2")).unwrap(), b"ctr1\r\neth0");
        assert_eq!(
            names(&dir),
            BTreeSet::from(
                [
                    "10.22.0.2",
                    "fd22::2",
                    "last_reserved_ip.0",
                    "last_reserved_ip.1",
                    "lock"
                ]
                .map(String::from)
            )
        );
    }

    #[test]
    fn add_twice_for_one_attachment_is_an_error_not_a_second_address() {
        let tmp = tempfile::tempdir().unwrap();
        let ipam = ipam(tmp.path(), json!({}));
        ipam.add(&att("c", "eth0"), &[], Duplicates::Refuse)
            .unwrap();
        let e = ipam
            .add(&att("c", "eth0"), &[], Duplicates::Refuse)
            .unwrap_err();
        assert_eq!(e.code(), 103, "{e}");
        assert!(e.to_string().contains("duplicate allocation"), "{e}");
        assert_eq!(ipam.check(&att("c", "eth0")).unwrap().len(), 2);
    }

    /// The plugin's path: no duplicate scan (its record check stands for it),
    /// DEL and CHECK by the record's addresses, one file each.
    #[test]
    fn known_addresses_are_released_and_checked_without_a_scan() {
        let tmp = tempfile::tempdir().unwrap();
        let ipam = ipam(tmp.path(), json!({}));
        let mine = att("mine", "eth0");
        let r = ipam.add(&mine, &[], Duplicates::CheckedByCaller).unwrap();
        let ips: Vec<IpAddr> = r.ips.iter().map(|i| i.address.ip()).collect();
        let other = ipam
            .add(&att("other", "eth0"), &[], Duplicates::CheckedByCaller)
            .unwrap();
        let others: Vec<IpAddr> = other.ips.iter().map(|i| i.address.ip()).collect();
        ipam.check_held(&mine, &ips).unwrap();
        // Someone else's address is not ours to check or release.
        assert_eq!(
            ipam.check_held(&mine, &others[..1]).unwrap_err().code(),
            105
        );
        let mut both = ips.clone();
        both.extend(&others);
        ipam.del(&mine, Some(&both)).unwrap();
        assert_eq!(ipam.check_held(&mine, &ips[..1]).unwrap_err().code(), 105);
        ipam.check_held(&att("other", "eth0"), &others).unwrap();
        // Idempotent.
        ipam.del(&mine, Some(&ips)).unwrap();
    }

    #[test]
    fn failed_add_leaves_nothing_reserved() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("no-resolv.conf");
        let bad_dns = ipam(tmp.path(), json!({"resolvConf": missing}));
        assert_eq!(
            bad_dns
                .add(&att("c", "eth0"), &[], Duplicates::Refuse)
                .unwrap_err()
                .code(),
            7
        );

        let tiny = ipam(
            tmp.path(),
            json!({"ranges": [[{"subnet": "10.22.0.0/24"}], [{"subnet": "fd22::/126"}]]}),
        );
        tiny.add(&att("a", "eth0"), &[], Duplicates::Refuse)
            .unwrap();
        tiny.add(&att("b", "eth0"), &[], Duplicates::Refuse)
            .unwrap();
        let e = tiny
            .add(&att("c", "eth0"), &[], Duplicates::Refuse)
            .unwrap_err();
        assert_eq!(e.code(), 102, "{e}");
        assert_eq!(tiny.check(&att("c", "eth0")).unwrap_err().code(), 105);
        let e = tiny
            .add(&att("d", "eth0"), &[ip("10.22.0.2")], Duplicates::Refuse)
            .unwrap_err();
        assert_eq!(e.code(), 103, "{e}");
        assert!(e.to_string().contains("\"a\""), "names the owner: {e}");
        assert_eq!(
            names(&tmp.path().join("testnet")).len(),
            4 + 3,
            "a, b, lock, last x2"
        );
    }

    #[test]
    fn del_is_idempotent_and_check_follows_it() {
        let tmp = tempfile::tempdir().unwrap();
        let ipam = ipam(tmp.path(), json!({}));
        let id = att("c", "eth0");
        ipam.add(&id, &[], Duplicates::Refuse).unwrap();
        assert_eq!(ipam.check(&id).unwrap(), [ip("10.22.0.2"), ip("fd22::2")]);
        ipam.del(&id, None).unwrap();
        let e = ipam.check(&id).unwrap_err();
        assert_eq!(e.code(), 105, "{e}");
        assert!(e.to_string().contains("\"c\""), "{e}");
        ipam.del(&id, None).unwrap();
        ipam.del(&att("never-added", "eth0"), None).unwrap();
        // The next ADD moves on rather than reusing the freed addresses.
        let r = ipam
            .add(&att("d", "eth0"), &[], Duplicates::Refuse)
            .unwrap();
        assert_eq!(r.ips[0].address.ip(), ip("10.22.0.3"));
    }

    #[test]
    fn requested_addresses_and_runtime_ranges() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = json!({"ranges": [[{"subnet": "10.22.0.0/24"}]], "dataDir": tmp.path()});
        let rt = json!([[{"subnet": "10.33.0.0/24", "gateway": "10.33.0.254"}]]);
        let ipam = BuiltinIpam::new("net2", &cfg, Some(&IpRanges::new(rt.clone()))).unwrap();
        let gws: Vec<IpAddr> = ipam.gateways().into_iter().map(|(g, _)| g).collect();
        assert_eq!(gws, [ip("10.33.0.254"), ip("10.22.0.1")]);
        assert_eq!(
            ipam.gateways()[0].1,
            "10.33.0.0/24".parse::<IpNetwork>().unwrap()
        );
        let r = ipam
            .add(&att("c", "eth0"), &[ip("10.22.0.77")], Duplicates::Refuse)
            .unwrap();
        let got: Vec<String> = r.ips.iter().map(|i| i.address.to_string()).collect();
        assert_eq!(got, ["10.33.0.1/24", "10.22.0.77/24"]);
        assert_eq!(r.ips[0].gateway, Some(ip("10.33.0.254")));
        let e = ipam
            .add(&att("d", "eth0"), &[ip("192.168.9.9")], Duplicates::Refuse)
            .unwrap_err();
        assert_eq!(e.code(), 103);
        assert!(e.to_string().contains("192.168.9.9"), "{e}");
    }

    #[test]
    fn gc_releases_what_no_valid_attachment_owns() {
        let tmp = tempfile::tempdir().unwrap();
        let ipam = ipam(
            tmp.path(),
            json!({"ranges": [[{"subnet": "10.22.0.0/24"}]]}),
        );
        ipam.add(&att("keep", "eth0"), &[], Duplicates::Refuse)
            .unwrap();
        ipam.add(&att("gone", "eth0"), &[], Duplicates::Refuse)
            .unwrap();
        ipam.add(&att("twoif", "eth0"), &[], Duplicates::Refuse)
            .unwrap();
        ipam.add(&att("twoif", "eth1"), &[], Duplicates::Refuse)
            .unwrap();
        let dir = tmp.path().join("testnet");
        fs::write(dir.join("10.22.0.100"), "legacy-live").unwrap();
        fs::write(dir.join("10.22.0.101"), "legacy-stale").unwrap();

        let valid = [
            att("keep", "eth0"),
            att("twoif", "eth0"),
            att("legacy-live", "eth0"),
        ];
        let mut released = ipam.gc(&valid).unwrap();
        released.sort();
        assert_eq!(
            released,
            [
                (att("gone", "eth0"), ip("10.22.0.3")),
                (att("legacy-stale", ""), ip("10.22.0.101")),
                (att("twoif", "eth1"), ip("10.22.0.5")),
            ]
        );
        assert_eq!(
            names(&dir),
            BTreeSet::from(
                [
                    "10.22.0.100",
                    "10.22.0.2",
                    "10.22.0.4",
                    "last_reserved_ip.0",
                    "lock"
                ]
                .map(String::from)
            )
        );
        assert!(
            ipam.gc(&valid).unwrap().is_empty(),
            "nothing left to collect"
        );
        assert_eq!(ipam.gc(&[]).unwrap().len(), 3);
        // Freed addresses can be handed out again.
        ipam.add(&att("new", "eth0"), &[ip("10.22.0.3")], Duplicates::Refuse)
            .unwrap();
    }

    #[test]
    fn status_reports_exhaustion() {
        let tmp = tempfile::tempdir().unwrap();
        let ipam = ipam(
            tmp.path(),
            json!({"ranges": [[{"subnet": "10.22.0.0/24"}], [{"subnet": "10.44.0.0/29", "rangeStart": "10.44.0.5"}]]}),
        );
        ipam.status().unwrap();
        ipam.add(&att("a", "eth0"), &[], Duplicates::Refuse)
            .unwrap();
        ipam.status().unwrap();
        ipam.add(&att("b", "eth0"), &[], Duplicates::Refuse)
            .unwrap();
        let e = ipam.status().unwrap_err();
        assert_eq!(e.code(), 50, "{e}");
        assert!(
            e.to_string().contains("range set 1: 10.44.0.5-10.44.0.6"),
            "{e}"
        );
        assert_eq!(
            ipam.add(&att("c", "eth0"), &[], Duplicates::Refuse)
                .unwrap_err()
                .code(),
            102
        );
        ipam.del(&att("a", "eth0"), None).unwrap();
        ipam.status().unwrap();
    }

    #[test]
    fn continues_after_host_local_state_in_the_same_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("testnet");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("10.22.0.9"), "hl-ctr\r\neth0").unwrap();
        fs::write(dir.join("10.22.0.10"), "hl-ctr2\r\neth0").unwrap();
        fs::write(dir.join("last_reserved_ip.0"), "10.22.0.8").unwrap();
        let ipam = ipam(
            tmp.path(),
            json!({"ranges": [[{"subnet": "10.22.0.0/24"}]]}),
        );
        let r = ipam
            .add(&att("c", "eth0"), &[], Duplicates::Refuse)
            .unwrap();
        assert_eq!(r.ips[0].address.ip(), ip("10.22.0.11"));
        assert_eq!(
            ipam.check(&att("hl-ctr", "eth0")).unwrap(),
            [ip("10.22.0.9")]
        );
    }

    #[test]
    fn new_rejects_bad_network_names_and_configs() {
        for name in ["", ".", "..", "a/b"] {
            let e = BuiltinIpam::new(name, &json!({"subnet": "10.0.0.0/24"}), None).unwrap_err();
            assert_eq!(e.code(), 7, "{name:?}");
        }
        let e = BuiltinIpam::new("n", &json!({"subnet": "10.0.0.0/33"}), None).unwrap_err();
        assert!(e.to_string().contains("ipam.subnet=\"10.0.0.0/33\""), "{e}");
    }

    #[test]
    fn concurrent_adds_of_one_attachment_give_it_one_address_per_set() {
        // Read-check-reserve is one critical section: without the lock several of
        // these would pass the duplicate check before any of them reserved.
        const THREADS: usize = 16;
        let tmp = tempfile::tempdir().unwrap();
        let barrier = Barrier::new(THREADS);
        let outcomes: Vec<Result<CniResult, Error>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|_| {
                    let (path, barrier) = (tmp.path(), &barrier);
                    s.spawn(move || {
                        let ipam = ipam(path, json!({}));
                        barrier.wait();
                        ipam.add(&att("same", "eth0"), &[], Duplicates::Refuse)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(outcomes.iter().filter(|o| o.is_ok()).count(), 1);
        for e in outcomes.iter().filter_map(|o| o.as_ref().err()) {
            assert!(e.to_string().contains("duplicate allocation"), "{e}");
        }
        let ipam = ipam(tmp.path(), json!({}));
        assert_eq!(ipam.check(&att("same", "eth0")).unwrap().len(), 2);
    }

    #[test]
    fn concurrent_allocations_in_separate_stores_are_distinct() {
        const THREADS: usize = 16;
        const EACH: usize = 4;
        let tmp = tempfile::tempdir().unwrap();
        let barrier = Barrier::new(THREADS);
        let results: Vec<Vec<IpAddr>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (path, barrier) = (tmp.path(), &barrier);
                    s.spawn(move || {
                        // Each thread has its own config, store and lock file descriptor,
                        // as separate plugin processes would.
                        let ipam = ipam(path, json!({}));
                        barrier.wait();
                        let mut got = Vec::new();
                        for i in 0..EACH {
                            let r = ipam
                                .add(
                                    &att(&format!("ctr-{t}-{i}"), "eth0"),
                                    &[],
                                    Duplicates::Refuse,
                                )
                                .unwrap();
                            got.extend(r.ips.iter().map(|c| c.address.ip()));
                        }
                        got
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let all: Vec<IpAddr> = results.into_iter().flatten().collect();
        let distinct: BTreeSet<IpAddr> = all.iter().copied().collect();
        assert_eq!(all.len(), THREADS * EACH * 2);
        assert_eq!(distinct.len(), all.len(), "every address handed out once");
        let on_disk = names(&tmp.path().join("testnet"))
            .iter()
            .filter(|n| n.parse::<IpAddr>().is_ok())
            .count();
        assert_eq!(on_disk, all.len());
        // Round robin without gaps: the v4 addresses are exactly .2 ..= .65.
        let v4: BTreeSet<IpAddr> = distinct.iter().copied().filter(IpAddr::is_ipv4).collect();
        let want: BTreeSet<IpAddr> = (2..2 + THREADS * EACH)
            .map(|i| ip(&format!("10.22.0.{i}")))
            .collect();
        assert_eq!(v4, want);
    }
}
