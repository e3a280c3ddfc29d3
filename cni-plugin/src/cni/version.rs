//! CNI spec versions: which ones Sluice speaks and how they compare.
use std::{cmp::Ordering, fmt, str::FromStr};

use crate::error::Error;

/// A CNI spec version (`major.minor.patch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Version {
    pub major: u16,
    pub minor: u16,
    pub patch: u16,
}

impl Version {
    pub const V0_3_0: Self = Self::new(0, 3, 0);
    pub const V0_3_1: Self = Self::new(0, 3, 1);
    pub const V0_4_0: Self = Self::new(0, 4, 0);
    pub const V1_0_0: Self = Self::new(1, 0, 0);
    pub const V1_1_0: Self = Self::new(1, 1, 0);

    /// Versions `sluice` accepts, oldest first (reported by VERSION).
    pub const SUPPORTED: [Self; 5] = [
        Self::V0_3_0,
        Self::V0_3_1,
        Self::V0_4_0,
        Self::V1_0_0,
        Self::V1_1_0,
    ];

    /// The newest supported version, used when the input names none we can read.
    pub const LATEST: Self = Self::V1_1_0;

    pub const fn new(major: u16, minor: u16, patch: u16) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }

    pub fn is_supported(self) -> bool {
        Self::SUPPORTED.contains(&self)
    }

    /// Results of 0.3.x and 0.4.0 carry `version` in each `ips` entry; 1.x does not.
    pub fn ips_have_version(self) -> bool {
        self < Self::V1_0_0
    }

    /// CHECK and DEL-with-prevResult exist from 0.4.0 (spec 0.4.0 changes).
    pub fn has_check(self) -> bool {
        self >= Self::V0_4_0
    }

    /// GC and STATUS exist from 1.1.0.
    pub fn has_gc_and_status(self) -> bool {
        self >= Self::V1_1_0
    }

    /// Interface `mtu`/`socketPath`/`pciID` and route `mtu`/`advmss`/`priority`/
    /// `table`/`scope` are result fields from 1.1.0.
    pub fn has_extended_result(self) -> bool {
        self >= Self::V1_1_0
    }
}

impl Ord for Version {
    fn cmp(&self, o: &Self) -> Ordering {
        (self.major, self.minor, self.patch).cmp(&(o.major, o.minor, o.patch))
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl FromStr for Version {
    type Err = Error;

    /// Parses `major.minor.patch`; an empty string is 0.1.0 as in libcni.
    fn from_str(s: &str) -> Result<Self, Error> {
        if s.is_empty() {
            return Ok(Self::new(0, 1, 0));
        }
        let bad = || Error::Decode {
            what: "cniVersion".into(),
            reason: format!("{s:?} is not a semantic version major.minor.patch"),
        };
        let mut parts = s.split('.');
        let mut next = || -> Result<u16, Error> {
            let p = parts.next().ok_or_else(bad)?;
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            p.parse().map_err(|_| bad())
        };
        let v = Self::new(next()?, next()?, next()?);
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(v)
    }
}

/// Parses a `cniVersion` and requires it to be one Sluice supports (code 1 otherwise).
pub fn require_supported(s: &str) -> Result<Version, Error> {
    let v: Version = s.parse()?;
    if !v.is_supported() {
        return Err(Error::IncompatibleVersion {
            version: s.to_string(),
            reason: format!(
                "supported versions are {}",
                Version::SUPPORTED.map(|v| v.to_string()).join(", ")
            ),
        });
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_orders() {
        let v: Version = "0.4.0".parse().unwrap_or(Version::LATEST);
        assert_eq!(v, Version::V0_4_0);
        assert!(Version::V0_3_1 < Version::V0_4_0);
        assert!(Version::V1_1_0 > Version::V1_0_0);
        assert_eq!(Version::V1_1_0.to_string(), "1.1.0");
    }

    #[test]
    fn rejects_garbage() {
        for s in ["1", "1.0", "1.0.0.0", "a.b.c", "1.-1.0", "1..0", " 1.0.0"] {
            assert!(s.parse::<Version>().is_err(), "{s}");
        }
    }

    #[test]
    fn unsupported_is_code_1() {
        for s in ["0.2.0", "0.1.0", "2.0.0", ""] {
            match require_supported(s) {
                Err(e) => assert_eq!(e.code(), 1, "{s}"),
                Ok(v) => panic!("{s} accepted as {v}"),
            }
        }
        assert!(require_supported("9.x").is_err_and(|e| e.code() == 6));
        for v in Version::SUPPORTED {
            assert!(require_supported(&v.to_string()).is_ok());
        }
    }

    #[test]
    fn version_features() {
        assert!(Version::V0_4_0.ips_have_version());
        assert!(!Version::V1_0_0.ips_have_version());
        assert!(!Version::V0_3_1.has_check());
        assert!(Version::V0_4_0.has_check());
        assert!(Version::V1_1_0.has_gc_and_status());
        assert!(!Version::V1_0_0.has_gc_and_status());
    }
}
