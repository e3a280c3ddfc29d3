//! The `CNI_*` environment (spec section 2, "Parameters"), validated per command.
use std::{fmt, path::PathBuf, str::FromStr};

use super::{args::CniArgs, AttachmentId};
use crate::error::Error;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    /// Spec 1.1.0.
    Gc,
    /// Spec 1.1.0.
    Status,
}

impl FromStr for Command {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        Ok(match s {
            "ADD" => Self::Add,
            "DEL" => Self::Del,
            "CHECK" => Self::Check,
            "VERSION" => Self::Version,
            "GC" => Self::Gc,
            "STATUS" => Self::Status,
            _ => {
                return Err(Error::env(
                    "CNI_COMMAND",
                    s,
                    "must be one of ADD, DEL, CHECK, VERSION, GC, STATUS",
                ))
            }
        })
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Add => "ADD",
            Self::Del => "DEL",
            Self::Check => "CHECK",
            Self::Version => "VERSION",
            Self::Gc => "GC",
            Self::Status => "STATUS",
        })
    }
}

/// The validated environment of one invocation.
#[derive(Clone, Debug)]
pub struct Env {
    pub command: Command,
    /// Set for ADD, DEL and CHECK.
    pub attachment: Option<AttachmentId>,
    /// Required for ADD and CHECK, optional for DEL.
    pub netns: Option<PathBuf>,
    pub args: CniArgs,
    /// `CNI_PATH` split on `:`.
    pub path: Vec<PathBuf>,
}

impl Env {
    /// Reads the process environment.
    pub fn from_process() -> Result<Self, Error> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads and validates the environment through `get` (tests pass a map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, Error> {
        let cmd_s = get("CNI_COMMAND").unwrap_or_default();
        if cmd_s.is_empty() {
            return Err(Error::env("CNI_COMMAND", "", "is required"));
        }
        let command: Command = cmd_s.parse()?;

        let needs_attachment = matches!(command, Command::Add | Command::Del | Command::Check);
        let needs_netns = matches!(command, Command::Add | Command::Check);
        // Spec 1.1.0 lists CNI_PATH as required for GC and STATUS only.
        let needs_path = matches!(command, Command::Gc | Command::Status);

        let non_empty = |k: &str| get(k).filter(|v| !v.is_empty());
        let mut missing = Vec::new();
        if needs_attachment {
            for k in ["CNI_CONTAINERID", "CNI_IFNAME"] {
                if non_empty(k).is_none() {
                    missing.push(k);
                }
            }
        }
        if needs_netns && non_empty("CNI_NETNS").is_none() {
            missing.push("CNI_NETNS");
        }
        if needs_path && get("CNI_PATH").is_none() {
            missing.push("CNI_PATH");
        }
        if !missing.is_empty() {
            return Err(Error::env(
                missing.join(", "),
                "",
                format!("required for {command}"),
            ));
        }

        let attachment = if needs_attachment {
            let container_id = get("CNI_CONTAINERID").unwrap_or_default();
            validate_container_id(&container_id)?;
            let ifname = get("CNI_IFNAME").unwrap_or_default();
            validate_ifname(&ifname)
                .map_err(|reason| Error::env("CNI_IFNAME", ifname.clone(), reason))?;
            Some(AttachmentId {
                container_id,
                ifname,
            })
        } else {
            None
        };

        let netns = match non_empty("CNI_NETNS") {
            Some(p) if command != Command::Version => {
                if !p.starts_with('/') {
                    return Err(Error::env(
                        "CNI_NETNS",
                        p,
                        "must be an absolute path to a network namespace",
                    ));
                }
                Some(PathBuf::from(p))
            }
            _ => None,
        };

        let args = match get("CNI_ARGS") {
            // What Sluice reads from CNI_ARGS (IP=, MAC=) only matters to ADD: a
            // DEL must not fail on it (see `config::Strictness`).
            Some(raw) if command == Command::Del => CniArgs::parse(&raw).unwrap_or_else(|e| {
                eprintln!(
                    "sluice: ignoring CNI_ARGS, only ADD uses it: {}",
                    e.details()
                );
                CniArgs::default()
            }),
            Some(raw) if needs_attachment => CniArgs::parse(&raw)?,
            _ => CniArgs::default(),
        };
        let path = get("CNI_PATH")
            .unwrap_or_default()
            .split(':')
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .collect();
        Ok(Self {
            command,
            attachment,
            netns,
            args,
            path,
        })
    }

    /// The attachment; only `None` for VERSION, GC and STATUS.
    pub fn attachment(&self) -> Result<&AttachmentId, Error> {
        self.attachment
            .as_ref()
            .ok_or_else(|| Error::env("CNI_CONTAINERID", "", "is required"))
    }
}

/// `CNI_CONTAINERID`: must start with an alphanumeric character, then
/// alphanumerics, `_`, `.` or `-` (spec section 2).
pub fn validate_container_id(id: &str) -> Result<(), Error> {
    let mut bytes = id.bytes();
    let ok = bytes.next().is_some_and(|b| b.is_ascii_alphanumeric())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::env(
            "CNI_CONTAINERID",
            id,
            "must match ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$",
        ))
    }
}

/// A Linux interface name the kernel accepts (`dev_valid_name`): 1..=15 bytes,
/// not `.` or `..`, no `/`, `:` or whitespace.
pub fn validate_ifname(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("is empty".into());
    }
    if name.len() > 15 {
        return Err(format!("is {} bytes long, the limit is 15", name.len()));
    }
    if name == "." || name == ".." {
        return Err("cannot be . or ..".into());
    }
    if let Some(c) = name
        .chars()
        .find(|c| *c == '/' || *c == ':' || c.is_whitespace() || c.is_control())
    {
        return Err(format!("contains the character {c:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Result<Env, Error> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Env::from_lookup(|k| m.get(k).cloned())
    }

    const ADD: [(&str, &str); 5] = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "abc-123"),
        ("CNI_NETNS", "/run/netns/p1"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni"),
    ];

    #[test]
    fn add_env_is_read() {
        let e = env(&ADD).unwrap();
        assert_eq!(e.command, Command::Add);
        assert_eq!(e.attachment.unwrap().ifname, "eth0");
        assert_eq!(e.path.len(), 2);
    }

    #[test]
    fn cni_args_are_strict_for_add_and_ignored_when_bad_for_del() {
        let with_args = |cmd: &'static str| {
            let mut v: Vec<(&str, &str)> = ADD.to_vec();
            v[0].1 = cmd;
            v.push(("CNI_ARGS", "NOBODY_KNOWS=1;IP=10.0.0.5"));
            v
        };
        assert_eq!(env(&with_args("ADD")).unwrap_err().code(), 4);
        assert_eq!(env(&with_args("CHECK")).unwrap_err().code(), 4);
        let del = env(&with_args("DEL")).unwrap();
        assert_eq!(del.args, CniArgs::default());
    }

    #[test]
    fn missing_vars_are_all_named() {
        let e = env(&[("CNI_COMMAND", "ADD")]).unwrap_err();
        assert_eq!(e.code(), 4);
        let s = e.to_string();
        for k in ["CNI_CONTAINERID", "CNI_IFNAME", "CNI_NETNS"] {
            assert!(s.contains(k), "{s} lacks {k}");
        }
    }

    #[test]
    fn del_does_not_need_netns_and_check_does() {
        let del: Vec<_> = ADD
            .iter()
            .filter(|(k, _)| *k != "CNI_NETNS")
            .map(|(k, v)| {
                if *k == "CNI_COMMAND" {
                    (*k, "DEL")
                } else {
                    (*k, *v)
                }
            })
            .collect();
        assert!(env(&del).is_ok());
        let check: Vec<_> = del
            .iter()
            .map(|(k, v)| {
                if *k == "CNI_COMMAND" {
                    (*k, "CHECK")
                } else {
                    (*k, *v)
                }
            })
            .collect();
        assert!(env(&check).unwrap_err().to_string().contains("CNI_NETNS"));
    }

    #[test]
    fn gc_and_status_need_cni_path() {
        for c in ["GC", "STATUS"] {
            assert!(env(&[("CNI_COMMAND", c)])
                .unwrap_err()
                .to_string()
                .contains("CNI_PATH"));
            assert!(env(&[("CNI_COMMAND", c), ("CNI_PATH", "/x")]).is_ok());
        }
        assert!(env(&[("CNI_COMMAND", "VERSION")]).is_ok());
    }

    #[test]
    fn bad_values_name_the_variable() {
        let cases = [
            ("CNI_COMMAND", "JUMP"),
            ("CNI_CONTAINERID", "-leading-dash"),
            ("CNI_CONTAINERID", "has/slash"),
            ("CNI_CONTAINERID", "has space"),
            ("CNI_IFNAME", "a-very-long-interface"),
            ("CNI_IFNAME", "et/h0"),
            ("CNI_IFNAME", ".."),
            ("CNI_IFNAME", "eth 0"),
            ("CNI_IFNAME", "eth:0"),
            ("CNI_NETNS", "relative/path"),
            ("CNI_ARGS", "NOEQUALS"),
        ];
        for (k, v) in cases {
            let pairs: Vec<_> = ADD
                .iter()
                .filter(|(key, _)| *key != k)
                .copied()
                .chain([(k, v)])
                .collect();
            let e = env(&pairs).unwrap_err();
            assert_eq!(e.code(), 4, "{k}={v}");
            assert!(e.to_string().contains(k), "{e} should name {k}");
        }
    }

    #[test]
    fn ifname_rules() {
        assert!(validate_ifname("eth0").is_ok());
        assert!(validate_ifname("123456789012345").is_ok());
        assert!(validate_ifname("1234567890123456").is_err());
        assert!(validate_ifname(".").is_err());
        assert!(validate_ifname("").is_err());
    }
}
