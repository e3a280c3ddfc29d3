//! kube-proxy's chain-name hashes: SHA-256 of a name, Base32 (RFC 4648 standard
//! alphabet, Go's `base32.StdEncoding`), cut to a prefix.
use sha2::{Digest, Sha256};

/// RFC 4648 section 6's alphabet.
const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/// The first `len` Base32 characters of SHA-256(`input`) (at most 52, the
/// unpadded length of a 32-byte digest).
pub(crate) fn sha256_base32(input: &str, len: usize) -> String {
    let digest = Sha256::digest(input.as_bytes());
    let mut out = String::with_capacity(len);
    let (mut acc, mut bits) = (0u32, 0u32);
    for byte in digest {
        if out.len() >= len {
            break;
        }
        // At most 4 bits are left over from the last byte: no overflow.
        acc = ((acc << 8) | u32::from(byte)) & 0xfff;
        bits += 8;
        while bits >= 5 && out.len() < len {
            bits -= 5;
            out.push(char::from(ALPHABET[((acc >> bits) & 31) as usize]));
        }
    }
    if bits > 0 && out.len() < len {
        out.push(char::from(ALPHABET[((acc << (5 - bits)) & 31) as usize]));
    }
    out
}

/// `portProtoHash` (pkg/proxy/iptables/proxier.go): 16 characters of the hash of
/// the service port name and the lower-case protocol, the suffix of the
/// KUBE-SVC-/KUBE-SVL-/KUBE-EXT-/KUBE-FW- chains.
pub(crate) fn port_proto_hash(service_port_name: &str, protocol: &str) -> String {
    sha256_base32(&format!("{service_port_name}{protocol}"), 16)
}

/// `servicePortEndpointChainName` (pkg/proxy/iptables/proxier.go): the
/// KUBE-SEP- chain of one endpoint (`endpoint` is `ip:port`, `[ip6]:port`).
pub(crate) fn endpoint_chain(service_port_name: &str, protocol: &str, endpoint: &str) -> String {
    format!(
        "KUBE-SEP-{}",
        sha256_base32(&format!("{service_port_name}{protocol}{endpoint}"), 16)
    )
}

/// nftables chain names are at most this long (`knftables.NameLengthMax`).
const NFT_NAME_MAX: usize = 256;
/// `chainNamePrefixLengthMax` (pkg/proxy/nftables/proxier.go).
const NFT_PREFIX_MAX: usize = 16;

/// `hashAndTruncate` (pkg/proxy/nftables/proxier.go): `HASH8-name`, cut to
/// `chainNameBaseLengthMax` with a `...` tail when longer.
pub(crate) fn nft_hash_and_truncate(name: &str) -> String {
    let max = NFT_NAME_MAX - NFT_PREFIX_MAX;
    let full = format!("{}-{name}", sha256_base32(name, 8));
    if full.len() > max {
        // Only ASCII goes into these names (validated by the model).
        format!("{}...", &full[..max - 3])
    } else {
        full
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_kube_proxy_test_expectations() {
        // Chain names from `pkg/proxy/iptables/proxier_test.go`
        // (TestOverallIPTablesRules) and `pkg/proxy/nftables/proxier_test.go`.
        assert_eq!(port_proto_hash("ns1/svc1:p80", "tcp"), "XPGD46QRK7WJZT7O");
        assert_eq!(port_proto_hash("ns2/svc2:p80", "tcp"), "GNZBNJ2PO5MGZ6GT");
        assert_eq!(
            endpoint_chain("ns1/svc1:p80", "tcp", "10.180.0.1:80"),
            "KUBE-SEP-SXIVWICOYRO3J4NJ"
        );
        assert_eq!(
            nft_hash_and_truncate("ns1/svc1/tcp/p80"),
            "ULMVA6XW-ns1/svc1/tcp/p80"
        );
        assert_eq!(
            nft_hash_and_truncate("ns1/svc1/tcp/p80__10.180.0.1/80"),
            "5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
        );
    }

    #[test]
    fn base32_of_known_digest() {
        // SHA-256("") = e3b0c442...; its Base32 (Go's StdEncoding) starts 4OYMIQUY7QOBJGX3.
        assert_eq!(sha256_base32("", 16), "4OYMIQUY7QOBJGX3");
        assert_eq!(sha256_base32("", 52).len(), 52);
    }
}
