//! The world around a node: its uplink to an "external" host. Every test, the
//! demo and the benchmarks build this shape (a node namespace where the plugin
//! runs, as a kubelet's host, and a host beyond its uplink) through [`Uplink`].
use crate::{netns, Result};

/// The node's end of an uplink: the interface the plugin finds as the uplink.
pub const NODE_IF: &str = "up0";

/// A node's uplink: the node's `node_if` and the external host's `ext_if` on
/// one subnet, wired by a veth pair.
#[derive(Clone, Debug)]
pub struct Uplink {
    pub node_if: String,
    pub node_ip: String,
    pub ext_if: String,
    pub ext_ip: String,
    pub prefix_len: u8,
}

impl Uplink {
    /// The node's `up0` at 192.168.`n`.1/24, the host's `ext_if` at
    /// 192.168.`n`.2/24. `n` numbers the uplinks of one run so none overlap.
    pub fn subnet(n: u8, ext_if: &str) -> Self {
        Self {
            node_if: NODE_IF.into(),
            node_ip: format!("192.168.{n}.1"),
            ext_if: ext_if.into(),
            ext_ip: format!("192.168.{n}.2"),
            prefix_len: 24,
        }
    }

    /// Wires namespace `node` to namespace `ext` and gives the node a default
    /// route via the host. With `pods` (a CIDR), the host routes that range via
    /// the node; without, the host answers a pod only when masquerade gave the
    /// packet the node's address. Done before the plugin's first ADD, so that it
    /// finds the uplink.
    pub fn connect(&self, node: &str, ext: &str, pods: Option<&str>) -> Result<()> {
        let len = self.prefix_len;
        netns::wire(
            node,
            &self.node_if,
            &format!("{}/{len}", self.node_ip),
            ext,
            &self.ext_if,
            &format!("{}/{len}", self.ext_ip),
        )?;
        netns::ip(node, &["route", "add", "default", "via", &self.ext_ip])?;
        if let Some(pods) = pods {
            netns::ip(ext, &["route", "add", pods, "via", &self.node_ip])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_numbered_uplink_puts_the_node_and_the_host_on_one_slash_24() {
        let u = Uplink::subnet(50, "ext0");
        assert_eq!(
            (
                u.node_if.as_str(),
                u.node_ip.as_str(),
                u.ext_if.as_str(),
                u.ext_ip.as_str()
            ),
            ("up0", "192.168.50.1", "ext0", "192.168.50.2")
        );
        assert_eq!(u.prefix_len, 24);
    }
}
