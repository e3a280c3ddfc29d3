//! The CNI protocol: environment, network config, `CNI_ARGS`, results and versions.
pub mod args;
pub mod config;
pub mod env;
#[cfg(test)]
mod fuzz;
pub mod json;
pub mod keys;
pub mod result;
pub mod runtime_config;
pub mod version;

/// One attachment of a container to this network (spec section 3): the
/// `(CNI_CONTAINERID, CNI_IFNAME)` pair.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AttachmentId {
    pub container_id: String,
    pub ifname: String,
}

/// Parses an address with an explicit prefix length (`10.1.0.5/16`, `fd00::5/64`).
/// `ipnetwork` alone would also take a bare address as a /32, which the spec's
/// "CIDR notation" excludes.
pub fn parse_cidr(s: &str) -> Option<ipnetwork::IpNetwork> {
    if !s.contains('/') {
        return None;
    }
    s.parse().ok()
}
