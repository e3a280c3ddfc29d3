//! Output: aligned tables for people, JSON for scripts.
use std::fmt::Write;

/// Renders rows under a header with columns padded to their widest cell.
pub(crate) fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: &mut dyn Iterator<Item = &str>| {
        let mut first = true;
        for (c, w) in cells.zip(&widths) {
            if !first {
                out.push_str("  ");
            }
            first = false;
            let _ = write!(out, "{c:<w$}");
        }
        let trimmed = out.trim_end().len();
        out.truncate(trimmed);
        out.push('\n');
    };
    line(&mut out, &mut header.iter().copied());
    for r in rows {
        line(&mut out, &mut r.iter().map(String::as_str));
    }
    out
}

pub(crate) fn mac(m: [u8; 6]) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
}

pub(crate) fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(sluice_common::from_cbuf(b)).into_owned()
}

/// An IP protocol number as the CLI names it (`--proto` values, JSON).
pub(crate) fn proto_name(p: u8) -> &'static str {
    match p {
        1 => "icmp",
        6 => "tcp",
        17 => "udp",
        58 => "icmpv6",
        132 => "sctp",
        _ => "?",
    }
}

/// A container id as tables show it (12 characters, like `docker ps`).
pub(crate) fn short_id(id: &str) -> String {
    id.chars().take(12).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pads_columns() {
        let t = render(&["A", "LONGER"], &[vec!["xxx".into(), "y".into()]]);
        assert_eq!(t, "A    LONGER\nxxx  y\n");
    }
}
