//! The built-in IPAM's configuration: the network config's `ipam` object in the shape
//! host-local reads (`subnet`/`rangeStart`/`rangeEnd`/`gateway`, `ranges`, `routes`,
//! `dataDir`, `resolvConf`), plus `runtimeConfig.ipRanges`, validated into range sets.
//! Every error is `InvalidConfig` naming the exact key path and the offending value.
use std::net::IpAddr;
use std::path::PathBuf;

use ipnetwork::IpNetwork;
use serde_json::{Map, Value};

use super::range::{same_family, to_u128, Range, RangeSet};
use crate::cni::keys::{Fields, Match};
use crate::cni::parse_cidr;
use crate::cni::result::{Dns, Route};
use crate::cni::runtime_config::IpRanges;
use crate::error::Error;

/// Where reservations live when `dataDir` is not set (host-local's default).
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

/// A validated built-in IPAM configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostLocalConfig {
    /// One address is allocated from each set; the index names `last_reserved_ip.<index>`.
    pub range_sets: Vec<RangeSet>,
    pub routes: Vec<Route>,
    pub data_dir: PathBuf,
    pub resolv_conf: Option<PathBuf>,
}

/// A parsed range and the key path that names it in errors.
struct Located {
    key: String,
    range: Range,
}

impl HostLocalConfig {
    /// Parses and validates `ipam` (the config's `ipam` object) and `ip_ranges`
    /// (`runtimeConfig.ipRanges`, same shape as `ranges`).
    pub fn parse(ipam: &Value, ip_ranges: Option<&IpRanges>) -> Result<Self, Error> {
        let obj = ipam
            .as_object()
            .ok_or_else(|| Error::config("ipam", ipam, "must be a JSON object"))?;

        let mut sets: Vec<Vec<Located>> = Vec::new();
        // host-local prepends runtime ranges to the configured ones rather than replacing them.
        // Filled by the runtime: keys match as Go does (`Subnet`, `RangeStart`, ...).
        if let Some(r) = ip_ranges.filter(|r| !r.value.is_null()) {
            sets.extend(parse_range_sets(&r.value, &r.path, Match::Go)?);
        }
        if obj.get("subnet").is_some_and(|v| !v.is_null()) {
            let mut legacy = parse_range(obj, "ipam", Match::Exact)?;
            legacy.key = "ipam.subnet".to_string();
            sets.push(vec![legacy]);
        } else {
            for k in ["rangeStart", "rangeEnd", "gateway"] {
                if let Some(v) = obj.get(k).filter(|v| !v.is_null()) {
                    return Err(Error::config(
                        format!("ipam.{k}"),
                        v,
                        "is only valid next to ipam.subnet",
                    ));
                }
            }
        }
        if let Some(v) = obj.get("ranges").filter(|v| !v.is_null()) {
            sets.extend(parse_range_sets(v, "ipam.ranges", Match::Exact)?);
        }
        if sets.is_empty() {
            let v = obj.get("ranges").unwrap_or(&Value::Null);
            return Err(Error::config(
                "ipam.ranges",
                v,
                "no IP ranges specified (set ipam.ranges or ipam.subnet)",
            ));
        }
        check_no_overlap(&sets)?;

        Ok(Self {
            range_sets: sets
                .into_iter()
                .map(|set| RangeSet::new(set.into_iter().map(|l| l.range).collect()))
                .collect(),
            routes: parse_routes(obj)?,
            data_dir: path_field(obj, "dataDir")?
                .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR)),
            resolv_conf: path_field(obj, "resolvConf")?,
        })
    }

    /// Only `dataDir`, for releasing reservations (DEL, GC): no range sets.
    pub fn for_release(ipam: &Value) -> Result<Self, Error> {
        let obj = ipam
            .as_object()
            .ok_or_else(|| Error::config("ipam", ipam, "must be a JSON object"))?;
        Ok(Self {
            range_sets: Vec::new(),
            routes: Vec::new(),
            data_dir: path_field(obj, "dataDir")?
                .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR)),
            resolv_conf: None,
        })
    }

    /// The DNS settings from `resolvConf`, empty when it is not set.
    pub fn dns(&self) -> Result<Dns, Error> {
        let Some(path) = &self.resolv_conf else {
            return Ok(Dns::default());
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::config(
                "ipam.resolvConf",
                path.display(),
                format!("cannot be read: {e}"),
            )
        })?;
        Ok(parse_resolv_conf(&text))
    }
}

/// Reads resolv.conf text like host-local: `nameserver` and `search`/`options` words
/// accumulate, the last `domain` wins, comments (`#`, `;`) and one-word lines are skipped.
pub fn parse_resolv_conf(text: &str) -> Dns {
    let mut dns = Dns::default();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let [key, first, rest @ ..] = words.as_slice() else {
            continue;
        };
        let all = || {
            std::iter::once(first)
                .chain(rest)
                .map(std::string::ToString::to_string)
        };
        match *key {
            "nameserver" => dns.nameservers.push(first.to_string()),
            "domain" => dns.domain = Some(first.to_string()),
            "search" => dns.search.extend(all()),
            "options" => dns.options.extend(all()),
            _ => {}
        }
    }
    dns
}

/// `[[range, ...], ...]` at `key`.
fn parse_range_sets(v: &Value, key: &str, matching: Match) -> Result<Vec<Vec<Located>>, Error> {
    let list = v
        .as_array()
        .ok_or_else(|| Error::config(key, v, "must be a list of range sets (lists of ranges)"))?;
    list.iter()
        .enumerate()
        .map(|(i, set)| parse_range_set(set, &format!("{key}[{i}]"), matching))
        .collect()
}

/// `[range, ...]` at `key`: non-empty, one address family.
fn parse_range_set(v: &Value, key: &str, matching: Match) -> Result<Vec<Located>, Error> {
    let list = v
        .as_array()
        .ok_or_else(|| Error::config(key, v, "must be a list of ranges"))?;
    if list.is_empty() {
        return Err(Error::config(key, v, "empty range set"));
    }
    let mut out: Vec<Located> = Vec::with_capacity(list.len());
    for (j, r) in list.iter().enumerate() {
        let rkey = format!("{key}[{j}]");
        let obj = r
            .as_object()
            .ok_or_else(|| Error::config(&rkey, r, "must be an object"))?;
        let located = parse_range(obj, &rkey, matching)?;
        if let Some(first) = out.first() {
            if first.range.subnet.is_ipv4() != located.range.subnet.is_ipv4() {
                return Err(Error::config(
                    format!("{rkey}.subnet"),
                    located.range.subnet,
                    format!(
                        "address family differs from {}.subnet {} (one family per range set)",
                        first.key, first.range.subnet
                    ),
                ));
            }
        }
        out.push(located);
    }
    Ok(out)
}

/// One range object at `key`, with host-local's defaults and checks.
fn parse_range(obj: &Map<String, Value>, key: &str, matching: Match) -> Result<Located, Error> {
    let f = Fields::new(obj, key, matching);
    let (skey, raw) = match f.get("subnet")? {
        Some(x) => (x.path, x.value),
        None => (f.join("subnet"), &Value::Null),
    };
    let text = raw
        .as_str()
        .ok_or_else(|| Error::config(&skey, raw, "is required and must be a CIDR string"))?;
    let given = parse_cidr(text)
        .ok_or_else(|| Error::config(&skey, raw, "not a subnet in CIDR notation"))?;
    let max_prefix = if given.is_ipv4() { 32 } else { 128 };
    if given.prefix() + 2 > max_prefix {
        return Err(Error::config(&skey, raw, "too small to allocate from"));
    }
    let subnet = IpNetwork::new(given.network(), given.prefix())
        .map_err(|e| Error::config(&skey, raw, e.to_string()))?;
    // Current host-local rejects host bits rather than masking them away.
    if given.ip() != subnet.network() {
        return Err(Error::config(
            &skey,
            raw,
            format!("has host bits set; the network address is {subnet}"),
        ));
    }

    let gateway = addr_field(&f, "gateway", &subnet)?;
    let start = addr_field(&f, "rangeStart", &subnet)?;
    let end = addr_field(&f, "rangeEnd", &subnet)?;
    let range_start = start.unwrap_or_else(|| Range::default_start(&subnet));
    let range_end = end.unwrap_or_else(|| Range::default_end(&subnet));
    if to_u128(range_start) > to_u128(range_end) {
        let (k, v, other) = match end {
            Some(e) => ("rangeEnd", e, format!("rangeStart {range_start}")),
            None => (
                "rangeStart",
                range_start,
                format!("the default rangeEnd {range_end}"),
            ),
        };
        let path = f.get(k)?.map_or_else(|| f.join(k), |x| x.path);
        return Err(Error::config(
            path,
            v,
            format!("range is empty: {k} {v} vs {other}"),
        ));
    }
    Ok(Located {
        key: key.to_string(),
        range: Range {
            subnet,
            range_start,
            range_end,
            gateway: gateway.unwrap_or_else(|| Range::default_start(&subnet)),
        },
    })
}

/// An optional address at `key.name` that must be inside `subnet`; `""` counts as absent
/// (as Go's `net.IP` decodes it).
fn addr_field(f: &Fields<'_>, name: &str, subnet: &IpNetwork) -> Result<Option<IpAddr>, Error> {
    let Some(x) = f.get(name)? else {
        return Ok(None);
    };
    let (fkey, raw) = (x.path, x.value);
    if raw.as_str() == Some("") {
        return Ok(None);
    }
    let ip = raw
        .as_str()
        .and_then(|s| s.parse::<IpAddr>().ok())
        .map(|ip| ip.to_canonical())
        .ok_or_else(|| Error::config(&fkey, raw, "not an IP address"))?;
    if !same_family(ip, subnet.network()) {
        return Err(Error::config(
            &fkey,
            raw,
            format!("address family differs from subnet {subnet}"),
        ));
    }
    if !subnet.contains(ip) {
        return Err(Error::config(&fkey, raw, format!("not in subnet {subnet}")));
    }
    Ok(Some(ip))
}

/// No two ranges anywhere in the config may share an address.
fn check_no_overlap(sets: &[Vec<Located>]) -> Result<(), Error> {
    let all: Vec<&Located> = sets.iter().flatten().collect();
    for (i, b) in all.iter().enumerate() {
        if let Some(a) = all[..i].iter().find(|a| a.range.overlaps(&b.range)) {
            return Err(Error::config(
                &b.key,
                &b.range,
                format!("overlaps {} {}", a.key, a.range),
            ));
        }
    }
    Ok(())
}

fn parse_routes(obj: &Map<String, Value>) -> Result<Vec<Route>, Error> {
    match obj.get("routes") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, r)| Route::from_json(r, &format!("ipam.routes[{i}]")))
            .collect(),
        Some(other) => Err(Error::config("ipam.routes", other, "must be a list")),
    }
}

/// An optional non-empty path string at `ipam.name`.
fn path_field(obj: &Map<String, Value>, name: &str) -> Result<Option<PathBuf>, Error> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s.contains('\0') => Err(Error::config(
            format!("ipam.{name}"),
            s.escape_debug(),
            "contains a NUL byte",
        )),
        Some(Value::String(s)) => Ok(Some(PathBuf::from(s))),
        Some(other) => Err(Error::config(
            format!("ipam.{name}"),
            other,
            "must be a path string",
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::ipam::range::tests::ip;

    #[expect(clippy::needless_pass_by_value, reason = "called with json! literals")]
    fn parse(ipam: Value) -> Result<HostLocalConfig, Error> {
        HostLocalConfig::parse(&ipam, None)
    }

    /// Asserts a code-7 error naming `key` and `value`.
    fn assert_bad(result: Result<HostLocalConfig, Error>, key: &str, value: &str) {
        let e = result.expect_err("expected a config error");
        let msg = e.to_string();
        assert_eq!(e.code(), 7, "{msg}");
        assert!(
            msg.contains(&format!("{key}=")),
            "{msg:?} should name key {key}"
        );
        assert!(msg.contains(value), "{msg:?} should name value {value}");
    }

    #[test]
    fn legacy_single_range_with_defaults() {
        let c = parse(json!({"type": "sluice", "subnet": "10.1.0.0/16"})).unwrap();
        assert_eq!(c.range_sets.len(), 1);
        let r = &c.range_sets[0].ranges()[0];
        assert_eq!(r.subnet.to_string(), "10.1.0.0/16");
        assert_eq!(r.range_start, ip("10.1.0.1"));
        assert_eq!(r.range_end, ip("10.1.255.254"));
        assert_eq!(r.gateway, ip("10.1.0.1"));
        assert_eq!(c.data_dir, PathBuf::from("/var/lib/cni/networks"));
        assert!(c.routes.is_empty());
        assert_eq!(c.resolv_conf, None);
    }

    #[test]
    fn all_fields() {
        let c = parse(json!({
            "type": "host-local",
            "subnet": "10.1.0.0/24",
            "rangeStart": "10.1.0.10",
            "rangeEnd": "10.1.0.20",
            "gateway": "10.1.0.254",
            "ranges": [
                [{"subnet": "10.2.0.0/24"}, {"subnet": "10.3.0.0/24", "gateway": "10.3.0.9"}],
                [{"subnet": "fd00:1::/64", "rangeStart": "fd00:1::10", "rangeEnd": "fd00:1::20"}]
            ],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.1.0.254"}],
            "dataDir": "/run/sluice/ipam",
            "resolvConf": "/etc/resolv.conf"
        }))
        .unwrap();
        assert_eq!(c.range_sets.len(), 3);
        let legacy = &c.range_sets[0].ranges()[0];
        assert_eq!(
            (legacy.range_start, legacy.range_end, legacy.gateway),
            (ip("10.1.0.10"), ip("10.1.0.20"), ip("10.1.0.254"))
        );
        assert_eq!(c.range_sets[1].ranges().len(), 2);
        assert_eq!(c.range_sets[1].ranges()[1].gateway, ip("10.3.0.9"));
        let v6 = &c.range_sets[2].ranges()[0];
        assert!(!c.range_sets[2].is_ipv4());
        assert_eq!(
            (v6.range_start, v6.range_end),
            (ip("fd00:1::10"), ip("fd00:1::20"))
        );
        assert_eq!(v6.gateway, ip("fd00:1::1"));
        assert_eq!(c.routes.len(), 2);
        assert_eq!(c.routes[1].gw, Some(ip("10.1.0.254")));
        assert_eq!(c.data_dir, PathBuf::from("/run/sluice/ipam"));
        assert_eq!(c.resolv_conf, Some(PathBuf::from("/etc/resolv.conf")));
    }

    #[test]
    fn ipv6_defaults_use_the_last_address() {
        let c = parse(json!({"ranges": [[{"subnet": "2001:db8:1::/64"}]]})).unwrap();
        let r = &c.range_sets[0].ranges()[0];
        assert_eq!(r.range_start, ip("2001:db8:1::1"));
        assert_eq!(r.range_end, ip("2001:db8:1::ffff:ffff:ffff:ffff"));
    }

    #[test]
    fn empty_strings_count_as_absent() {
        let c = parse(
            json!({"ranges": [[{"subnet": "10.0.0.0/24", "rangeStart": "", "gateway": ""}]],
                             "dataDir": ""}),
        )
        .unwrap();
        let r = &c.range_sets[0].ranges()[0];
        assert_eq!((r.range_start, r.gateway), (ip("10.0.0.1"), ip("10.0.0.1")));
        assert_eq!(c.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
    }

    #[test]
    fn runtime_ip_ranges_come_first() {
        let ipam = json!({"ranges": [[{"subnet": "10.0.0.0/24"}]]});
        let rt = json!([[{"subnet": "10.9.0.0/24"}], [{"subnet": "fd09::/64"}]]);
        let c = HostLocalConfig::parse(&ipam, Some(&IpRanges::new(rt.clone()))).unwrap();
        let subnets: Vec<String> = c
            .range_sets
            .iter()
            .map(|s| s.ranges()[0].subnet.to_string())
            .collect();
        assert_eq!(subnets, ["10.9.0.0/24", "fd09::/64", "10.0.0.0/24"]);
        // Runtime ranges alone are enough.
        let c = HostLocalConfig::parse(&json!({}), Some(&IpRanges::new(rt.clone()))).unwrap();
        assert_eq!(c.range_sets.len(), 2);
        // An empty or null ipRanges changes nothing.
        for rt in [json!([]), Value::Null] {
            let c = HostLocalConfig::parse(&ipam, Some(&IpRanges::new(rt.clone()))).unwrap();
            assert_eq!(c.range_sets.len(), 1);
        }
    }

    #[test]
    fn runtime_ip_ranges_errors_name_their_path() {
        let ipam = json!({"ranges": [[{"subnet": "10.0.0.0/24"}]]});
        let bad = json!([[{"subnet": "10.9.0.0/24", "rangeEnd": "10.8.0.1"}]]);
        assert_bad(
            HostLocalConfig::parse(&ipam, Some(&IpRanges::new(bad.clone()))),
            "runtimeConfig.ipRanges[0][0].rangeEnd",
            "10.8.0.1",
        );
        let overlapping = json!([[{"subnet": "10.0.0.0/16"}]]);
        assert_bad(
            HostLocalConfig::parse(&ipam, Some(&IpRanges::new(overlapping.clone()))),
            "ipam.ranges[0][0]",
            "10.0.0.1-10.0.0.254",
        );
        assert_bad(
            HostLocalConfig::parse(&ipam, Some(&IpRanges::new(json!({"subnet": "10.0.0.0/8"})))),
            "runtimeConfig.ipRanges",
            "10.0.0.0/8",
        );
    }

    #[test]
    fn host_bits_in_subnet_are_rejected_like_host_local() {
        assert_bad(
            parse(json!({"subnet": "192.0.2.12/24"})),
            "ipam.subnet",
            "192.0.2.12/24",
        );
        let e = parse(json!({"subnet": "192.168.127.0/23"})).unwrap_err();
        assert!(e.to_string().contains("192.168.126.0/23"), "{e}");
        assert_bad(
            parse(json!({"ranges": [[{"subnet": "2001:db8:24:19ff::/63"}]]})),
            "ipam.ranges[0][0].subnet",
            "2001:db8:24:19ff::/63",
        );
    }

    #[test]
    fn bad_values_name_key_and_value() {
        let r = |extra: Value| {
            let mut o = json!({"subnet": "10.0.0.0/24"});
            for (k, v) in extra.as_object().unwrap() {
                o[k] = v.clone();
            }
            json!({"ranges": [[{"subnet": "10.5.0.0/24"}], [o]]})
        };
        let cases: Vec<(Value, &str, &str)> = vec![
            (json!("nope"), "ipam", "nope"),
            (json!({}), "ipam.ranges", "null"),
            (json!({"ranges": []}), "ipam.ranges", "[]"),
            (json!({"ranges": [[]]}), "ipam.ranges[0]", "[]"),
            (
                json!({"ranges": {"subnet": "10.0.0.0/24"}}),
                "ipam.ranges",
                "10.0.0.0/24",
            ),
            (
                json!({"ranges": [{"subnet": "10.0.0.0/24"}]}),
                "ipam.ranges[0]",
                "10.0.0.0/24",
            ),
            (
                json!({"ranges": [["10.0.0.0/24"]]}),
                "ipam.ranges[0][0]",
                "10.0.0.0/24",
            ),
            (
                json!({"ranges": [[{"gateway": "10.0.0.1"}]]}),
                "ipam.ranges[0][0].subnet",
                "null",
            ),
            (
                json!({"subnet": "10.0.0.0/33"}),
                "ipam.subnet",
                "10.0.0.0/33",
            ),
            (json!({"subnet": "10.0.0.0"}), "ipam.subnet", "10.0.0.0"),
            (json!({"subnet": 10}), "ipam.subnet", "10"),
            (json!({"subnet": ""}), "ipam.subnet", "\"\""),
            (
                json!({"subnet": "10.0.0.0/31"}),
                "ipam.subnet",
                "10.0.0.0/31",
            ),
            (
                json!({"subnet": "10.0.0.4/32"}),
                "ipam.subnet",
                "10.0.0.4/32",
            ),
            (json!({"subnet": "fd00::/127"}), "ipam.subnet", "fd00::/127"),
            (
                json!({"rangeStart": "10.0.0.5"}),
                "ipam.rangeStart",
                "10.0.0.5",
            ),
            (json!({"gateway": "10.0.0.1"}), "ipam.gateway", "10.0.0.1"),
            (
                r(json!({"rangeStart": "10.0.1.5"})),
                "ipam.ranges[1][0].rangeStart",
                "10.0.1.5",
            ),
            (
                r(json!({"rangeStart": "x"})),
                "ipam.ranges[1][0].rangeStart",
                "x",
            ),
            (
                r(json!({"rangeStart": 5})),
                "ipam.ranges[1][0].rangeStart",
                "5",
            ),
            (
                r(json!({"rangeStart": "10.0.0.5/24"})),
                "ipam.ranges[1][0].rangeStart",
                "10.0.0.5/24",
            ),
            (
                r(json!({"rangeStart": "fd00::5"})),
                "ipam.ranges[1][0].rangeStart",
                "fd00::5",
            ),
            (
                r(json!({"rangeEnd": "10.0.1.0"})),
                "ipam.ranges[1][0].rangeEnd",
                "10.0.1.0",
            ),
            (
                r(json!({"gateway": "10.1.0.1"})),
                "ipam.ranges[1][0].gateway",
                "10.1.0.1",
            ),
            (
                r(json!({"rangeStart": "10.0.0.50", "rangeEnd": "10.0.0.40"})),
                "ipam.ranges[1][0].rangeEnd",
                "10.0.0.40",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.255"}),
                "ipam.rangeStart",
                "10.0.0.255",
            ),
            (
                json!({"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "fd00::/64"}]]}),
                "ipam.ranges[0][1].subnet",
                "fd00::/64",
            ),
            (
                json!({"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "10.0.0.0/25"}]]}),
                "ipam.ranges[0][1]",
                "10.0.0.1-10.0.0.126",
            ),
            (
                json!({"subnet": "10.0.0.0/16", "ranges": [[{"subnet": "10.0.3.0/24"}]]}),
                "ipam.ranges[0][0]",
                "overlaps ipam.subnet 10.0.0.1-10.0.255.254",
            ),
            (
                json!({"ranges": [[{"subnet": "10.0.0.0/24", "rangeEnd": "10.0.0.100"}],
                                  [{"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.100"}]]}),
                "ipam.ranges[1][0]",
                "10.0.0.100-10.0.0.254",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "routes": {}}),
                "ipam.routes",
                "{}",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "routes": [{"dst": "10.0.0.1"}]}),
                "ipam.routes[0].dst",
                "10.0.0.1",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "routes": [{"dst": "0.0.0.0/0", "gw": "fd00::1"}]}),
                "ipam.routes[0].gw",
                "fd00::1",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "dataDir": 7}),
                "ipam.dataDir",
                "7",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "dataDir": "/a\u{0}b"}),
                "ipam.dataDir",
                "/a\\0b",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "resolvConf": ["x"]}),
                "ipam.resolvConf",
                "x",
            ),
        ];
        for (ipam, key, value) in cases {
            assert_bad(parse(ipam), key, value);
        }
    }

    #[test]
    fn non_overlapping_ranges_in_one_subnet_are_fine() {
        let c = parse(json!({"ranges": [
            [{"subnet": "10.0.0.0/24", "rangeEnd": "10.0.0.127"}],
            [{"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.128"}]
        ]}))
        .unwrap();
        assert_eq!(c.range_sets.len(), 2);
    }

    #[test]
    fn resolv_conf_parsed_like_host_local() {
        let text = "# comment\n; also comment\nnameserver 10.96.0.10\nnameserver fd00::a\n\
                    domain example.com\ndomain other.example\nsearch a.example b.example\n\
                    search c.example\noptions ndots:5 timeout:1\nnameserver\nsortlist 1.2.3.4\n";
        let dns = parse_resolv_conf(text);
        assert_eq!(dns.nameservers, ["10.96.0.10", "fd00::a"]);
        assert_eq!(dns.domain.as_deref(), Some("other.example"));
        assert_eq!(dns.search, ["a.example", "b.example", "c.example"]);
        assert_eq!(dns.options, ["ndots:5", "timeout:1"]);
    }

    #[test]
    fn dns_reads_the_file_or_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("resolv.conf");
        std::fs::write(&path, "nameserver 1.1.1.1\n").unwrap();
        let c = parse(json!({"subnet": "10.0.0.0/24", "resolvConf": path})).unwrap();
        assert_eq!(c.dns().unwrap().nameservers, ["1.1.1.1"]);

        let missing = dir.path().join("missing.conf");
        let c = parse(json!({"subnet": "10.0.0.0/24", "resolvConf": missing})).unwrap();
        let e = c.dns().unwrap_err();
        assert_eq!(e.code(), 7);
        assert!(e.to_string().contains("ipam.resolvConf"), "{e}");
        assert!(e.to_string().contains("missing.conf"), "{e}");

        let none = parse(json!({"subnet": "10.0.0.0/24"})).unwrap();
        assert!(none.dns().unwrap().is_empty());
    }
}
