//! NetworkPolicy ports: what a rule's `ports` allow ([`PortSpec`]), named
//! ports resolved against a pod's container ports, and the range list of one
//! `sl_pol_rules` value ([`normalize`]: at most [`MAX_PORT_RANGES`]).
use std::collections::HashSet;

use k8s_openapi::{
    api::{core::v1::Pod, networking::v1::NetworkPolicyPort},
    apimachinery::pkg::util::intstr::IntOrString,
};
use sluice_common::{PortRange, MAX_PORT_RANGES};

pub(crate) const TCP: u8 = 6;
pub(crate) const UDP: u8 = 17;
pub(crate) const SCTP: u8 = 132;

/// The protocol number of a Kubernetes `protocol` field (absent: TCP).
pub(crate) fn proto_number(name: Option<&str>) -> Option<u8> {
    match name.unwrap_or("TCP") {
        "TCP" => Some(TCP),
        "UDP" => Some(UDP),
        "SCTP" => Some(SCTP),
        _ => None,
    }
}

/// Name of a protocol number (`any` for 0).
pub(crate) fn proto_name(proto: u8) -> &'static str {
    match proto {
        0 => "any",
        TCP => "TCP",
        UDP => "UDP",
        SCTP => "SCTP",
        _ => "?",
    }
}

/// One entry of a rule's `ports`, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PortSpec {
    /// The rule has no ports: every protocol and port.
    Any,
    /// `proto`, ports `first` to `last` (a protocol without `port`: 0-65535).
    Range { proto: u8, first: u16, last: u16 },
    /// A named port: the container ports of that name and protocol of the pod
    /// it is resolved against.
    Named { proto: u8, name: String },
}

impl PortSpec {
    /// Short text for the report: `TCP/80`, `TCP/8000-8080`, `UDP/dns
    /// (named)`, `TCP/any`, `any`.
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::Any => "any".to_owned(),
            Self::Range {
                proto,
                first: 0,
                last: u16::MAX,
            } => format!("{}/any", proto_name(*proto)),
            Self::Range { proto, first, last } if first == last => {
                format!("{}/{first}", proto_name(*proto))
            }
            Self::Range { proto, first, last } => {
                format!("{}/{first}-{last}", proto_name(*proto))
            }
            Self::Named { proto, name } => format!("{}/{name} (named)", proto_name(*proto)),
        }
    }
}

/// The entries of a rule's `ports` (absent or empty: [`PortSpec::Any`]).
/// An entry the API should have refused (unknown protocol, port out of
/// range, `endPort` below `port` or with a named or absent `port`) is left
/// out and described in `problems`: the rule then allows less, never more.
pub(crate) fn parse(
    ports: Option<&[NetworkPolicyPort]>,
    problems: &mut Vec<String>,
) -> Vec<PortSpec> {
    let Some(ports) = ports.filter(|p| !p.is_empty()) else {
        return vec![PortSpec::Any];
    };
    let mut specs = Vec::with_capacity(ports.len());
    for p in ports {
        let Some(proto) = proto_number(p.protocol.as_deref()) else {
            problems.push(format!(
                "unknown protocol {:?}: port entry ignored",
                p.protocol.as_deref().unwrap_or_default()
            ));
            continue;
        };
        let spec = match (&p.port, p.end_port) {
            (None, None) => PortSpec::Range {
                proto,
                first: 0,
                last: u16::MAX,
            },
            (None, Some(end)) => {
                problems.push(format!("endPort {end} without port: port entry ignored"));
                continue;
            }
            (Some(IntOrString::Int(port)), end) => {
                let Some(first) = u16::try_from(*port).ok().filter(|p| *p != 0) else {
                    problems.push(format!("port {port} out of range: port entry ignored"));
                    continue;
                };
                let last = match end {
                    None => first,
                    Some(end) => match u16::try_from(end) {
                        Ok(last) if last >= first => last,
                        _ => {
                            problems.push(format!(
                                "endPort {end} below port {port} (or out of range): port entry ignored"
                            ));
                            continue;
                        }
                    },
                };
                PortSpec::Range { proto, first, last }
            }
            (Some(IntOrString::String(name)), None) => PortSpec::Named {
                proto,
                name: name.clone(),
            },
            (Some(IntOrString::String(name)), Some(end)) => {
                problems.push(format!(
                    "endPort {end} with named port {name:?}: port entry ignored"
                ));
                continue;
            }
        };
        specs.push(spec);
    }
    specs
}

/// A container port a named port can resolve to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct NamedPort {
    pub(crate) name: String,
    pub(crate) proto: u8,
    pub(crate) port: u16,
}

/// The named container ports of `pod`: its containers' and its sidecars'
/// (init containers with `restartPolicy: Always`, which run along them),
/// sorted, without duplicates.
pub(crate) fn container_ports(pod: &Pod) -> Vec<NamedPort> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    let mut ports: Vec<NamedPort> = spec
        .containers
        .iter()
        .chain(sidecars)
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            Some(NamedPort {
                name: p.name.clone()?,
                proto: proto_number(p.protocol.as_deref())?,
                port: u16::try_from(p.container_port).ok().filter(|p| *p != 0)?,
            })
        })
        .collect();
    ports.sort();
    ports.dedup();
    ports
}

/// One allowed range and the rule that allows it; sorts by protocol, first
/// and last port (the order of a [`normalize`]d list).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Range {
    pub(crate) proto: u8,
    pub(crate) first: u16,
    pub(crate) last: u16,
    pub(crate) rule: u16,
}

impl Range {
    pub(crate) fn port_range(self) -> PortRange {
        PortRange {
            proto: self.proto,
            _pad: 0,
            rule: self.rule,
            first: self.first,
            last: self.last,
        }
    }
}

/// The ranges `specs` (of rule `rule`) allow, named ports resolved against
/// `ports` (`None`: there is no pod to resolve them against, an ipBlock peer
/// in egress, so they resolve to nothing). Also returns the named entries
/// that resolved to nothing, described.
pub(crate) fn resolve(
    specs: &[PortSpec],
    rule: u16,
    ports: Option<&[NamedPort]>,
) -> (Vec<Range>, Vec<String>) {
    let mut ranges = Vec::with_capacity(specs.len());
    let mut missed = Vec::new();
    for spec in specs {
        match spec {
            PortSpec::Any => ranges.push(Range {
                proto: 0,
                first: 0,
                last: u16::MAX,
                rule,
            }),
            PortSpec::Range { proto, first, last } => ranges.push(Range {
                proto: *proto,
                first: *first,
                last: *last,
                rule,
            }),
            PortSpec::Named { proto, name } => {
                let before = ranges.len();
                ranges.extend(
                    ports
                        .unwrap_or_default()
                        .iter()
                        .filter(|p| p.proto == *proto && p.name == *name)
                        .map(|p| Range {
                            proto: *proto,
                            first: p.port,
                            last: p.port,
                            rule,
                        }),
                );
                if ranges.len() == before {
                    missed.push(spec.describe());
                }
            }
        }
    }
    (ranges, missed)
}

/// The value list of one `sl_pol_rules` entry from the ranges that apply to
/// it, in rule order: identical (proto, first, last) once (with the first
/// one's rule); a protocol-0 range alone (it allows everything the others
/// do); over [`MAX_PORT_RANGES`], overlapping or adjacent ranges of a
/// protocol merged (with the rule of the first of them). Sorted by
/// protocol, first and last port. If still too many, the first
/// [`MAX_PORT_RANGES`] are kept (narrower, never more open) and the second
/// value is how many there were.
pub(crate) fn normalize(ranges: impl IntoIterator<Item = Range>) -> (Vec<Range>, Option<usize>) {
    let mut seen = HashSet::new();
    let mut list: Vec<Range> = ranges
        .into_iter()
        .filter(|r| seen.insert((r.proto, r.first, r.last)))
        .collect();
    if let Some(any) = list.iter().find(|r| r.proto == 0) {
        let any = Range {
            proto: 0,
            first: 0,
            last: u16::MAX,
            rule: any.rule,
        };
        return (vec![any], None);
    }
    if list.len() > MAX_PORT_RANGES {
        let mut ordered: Vec<(usize, Range)> = list.into_iter().enumerate().collect();
        ordered.sort_by_key(|(i, r)| (r.proto, r.first, r.last, *i));
        let mut merged: Vec<(usize, Range)> = Vec::new();
        for (i, r) in ordered {
            if let Some((mi, m)) = merged.last_mut() {
                if m.proto == r.proto && u32::from(r.first) <= u32::from(m.last) + 1 {
                    m.last = m.last.max(r.last);
                    if i < *mi {
                        *mi = i;
                        m.rule = r.rule;
                    }
                    continue;
                }
            }
            merged.push((i, r));
        }
        list = merged.into_iter().map(|(_, r)| r).collect();
    }
    list.sort();
    let overflow = (list.len() > MAX_PORT_RANGES).then_some(list.len());
    list.truncate(MAX_PORT_RANGES);
    (list, overflow)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ports(v: serde_json::Value) -> Vec<NetworkPolicyPort> {
        serde_json::from_value(v).unwrap()
    }

    fn r(proto: u8, first: u16, last: u16, rule: u16) -> Range {
        Range {
            proto,
            first,
            last,
            rule,
        }
    }

    #[test]
    fn parse_defaults_and_ranges() {
        let mut problems = Vec::new();
        assert_eq!(parse(None, &mut problems), vec![PortSpec::Any]);
        assert_eq!(parse(Some(&[]), &mut problems), vec![PortSpec::Any]);
        let p = ports(json!([
            {"port": 80},
            {"protocol": "UDP", "port": 53},
            {"protocol": "TCP", "port": 8000, "endPort": 8080},
            {"protocol": "SCTP"},
            {"port": "http"},
            {"port": 9000, "endPort": 8000},
            {"protocol": "ICMP", "port": 1},
            {"port": "x", "endPort": 9},
        ]));
        let specs = parse(Some(&p), &mut problems);
        assert_eq!(
            specs,
            vec![
                PortSpec::Range {
                    proto: TCP,
                    first: 80,
                    last: 80
                },
                PortSpec::Range {
                    proto: UDP,
                    first: 53,
                    last: 53
                },
                PortSpec::Range {
                    proto: TCP,
                    first: 8000,
                    last: 8080
                },
                PortSpec::Range {
                    proto: SCTP,
                    first: 0,
                    last: 65535
                },
                PortSpec::Named {
                    proto: TCP,
                    name: "http".into()
                },
            ]
        );
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].contains("endPort 8000 below port 9000"));
        assert!(problems[1].contains("ICMP"));
        let texts: Vec<String> = specs.iter().map(PortSpec::describe).collect();
        assert_eq!(
            texts,
            [
                "TCP/80",
                "UDP/53",
                "TCP/8000-8080",
                "SCTP/any",
                "TCP/http (named)"
            ]
        );
    }

    #[test]
    fn resolve_named() {
        let named = [
            NamedPort {
                name: "http".into(),
                proto: TCP,
                port: 8080,
            },
            NamedPort {
                name: "http".into(),
                proto: TCP,
                port: 9090,
            },
            NamedPort {
                name: "dns".into(),
                proto: UDP,
                port: 53,
            },
        ];
        let specs = [
            PortSpec::Named {
                proto: TCP,
                name: "http".into(),
            },
            PortSpec::Named {
                proto: TCP,
                name: "dns".into(),
            },
            PortSpec::Range {
                proto: UDP,
                first: 1,
                last: 2,
            },
        ];
        let (ranges, missed) = resolve(&specs, 7, Some(&named));
        assert_eq!(
            ranges,
            vec![
                r(TCP, 8080, 8080, 7),
                r(TCP, 9090, 9090, 7),
                r(UDP, 1, 2, 7)
            ]
        );
        assert_eq!(missed, ["TCP/dns (named)"]);
        let (ranges, missed) = resolve(&specs, 7, None);
        assert_eq!(ranges, vec![r(UDP, 1, 2, 7)]);
        assert_eq!(missed.len(), 2);
    }

    #[test]
    fn normalize_dedups_and_any_wins() {
        let (list, over) = normalize([r(TCP, 80, 80, 3), r(UDP, 53, 53, 1), r(TCP, 80, 80, 1)]);
        assert_eq!(list, vec![r(TCP, 80, 80, 3), r(UDP, 53, 53, 1)]);
        assert_eq!(over, None);
        let (list, _) = normalize([r(TCP, 80, 80, 3), r(0, 0, 65535, 4), r(0, 0, 65535, 5)]);
        assert_eq!(list, vec![r(0, 0, 65535, 4)]);
    }

    #[test]
    fn normalize_merges_over_sixteen() {
        // 20 TCP ports: 1000..=1009 adjacent, 2000, 2002, ..., 2018 apart.
        let mut input: Vec<Range> = (0..10).map(|i| r(TCP, 1000 + i, 1000 + i, 2)).collect();
        input.extend((0..10).map(|i| r(TCP, 2000 + 2 * i, 2000 + 2 * i, 5)));
        // Overlapping with the first block, from an earlier rule... listed last.
        input.push(r(TCP, 1005, 1020, 9));
        let (list, over) = normalize(input.clone());
        assert_eq!(over, None);
        assert_eq!(list.len(), 11);
        assert_eq!(
            list[0],
            r(TCP, 1000, 1020, 2),
            "rule of the first in rule order"
        );
        assert_eq!(list[1], r(TCP, 2000, 2000, 5));
        // Under 17 nothing merges.
        let (list, _) = normalize(input[..3].to_vec());
        assert_eq!(list.len(), 3);
        // Still over 16 after merging: the first 16 are kept.
        let apart: Vec<Range> = (0..20).map(|i| r(UDP, 10 * i + 1, 10 * i + 1, 1)).collect();
        let (list, over) = normalize(apart);
        assert_eq!(over, Some(20));
        assert_eq!(list.len(), MAX_PORT_RANGES);
        assert_eq!(list[15], r(UDP, 151, 151, 1));
    }
}
