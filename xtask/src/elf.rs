//! Just enough ELF to list a binary's `DT_NEEDED` libraries (what `readelf -d` shows
//! as NEEDED), so setup can tell which libLLVM an installed bpf-linker links.
use std::{fs, path::Path};

use anyhow::{bail, ensure, Context, Result};

const SHT_DYNAMIC: u32 = 6;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;

/// Sonames a 64-bit little-endian ELF file needs; empty when statically linked.
pub(crate) fn needed_libs(path: &Path) -> Result<Vec<String>> {
    let data = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    parse_needed(&data)
        .with_context(|| format!("reading ELF dynamic section of {}", path.display()))
}

fn parse_needed(d: &[u8]) -> Result<Vec<String>> {
    ensure!(d.get(..4) == Some(b"\x7fELF"), "not an ELF file");
    ensure!(
        d.get(4) == Some(&2) && d.get(5) == Some(&1),
        "not a 64-bit little-endian ELF file"
    );
    let shoff = u64_at(d, 0x28)?;
    let shentsize = u64::from(u16_at(d, 0x3a)?);
    let shnum = u64::from(u16_at(d, 0x3c)?);
    let section = |index: u64| -> Result<Section> {
        let base = shoff + index * shentsize;
        Ok(Section {
            kind: u32_at(d, base + 4)?,
            data: slice(d, u64_at(d, base + 0x18)?, u64_at(d, base + 0x20)?)?,
            link: u64::from(u32_at(d, base + 0x28)?),
        })
    };
    for index in 0..shnum {
        let dynamic = section(index)?;
        if dynamic.kind != SHT_DYNAMIC {
            continue;
        }
        let strtab = section(dynamic.link)?.data;
        let mut needed = Vec::new();
        for entry in dynamic.data.chunks_exact(16) {
            match (u64_at(entry, 0)?, u64_at(entry, 8)?) {
                (DT_NULL, _) => break,
                (DT_NEEDED, offset) => needed.push(c_str(strtab, offset)?),
                _ => {}
            }
        }
        return Ok(needed);
    }
    Ok(Vec::new())
}

struct Section<'a> {
    kind: u32,
    data: &'a [u8],
    link: u64,
}

fn slice(d: &[u8], offset: u64, len: u64) -> Result<&[u8]> {
    let start = usize::try_from(offset)?;
    let end = start.checked_add(usize::try_from(len)?);
    match end.and_then(|end| d.get(start..end)) {
        Some(s) => Ok(s),
        None => bail!("truncated ELF file (wanted {len} bytes at offset {offset})"),
    }
}

fn bytes<const N: usize>(d: &[u8], offset: u64) -> Result<[u8; N]> {
    Ok(slice(d, offset, N as u64)?.try_into()?)
}

fn u16_at(d: &[u8], offset: u64) -> Result<u16> {
    Ok(u16::from_le_bytes(bytes(d, offset)?))
}

fn u32_at(d: &[u8], offset: u64) -> Result<u32> {
    Ok(u32::from_le_bytes(bytes(d, offset)?))
}

fn u64_at(d: &[u8], offset: u64) -> Result<u64> {
    Ok(u64::from_le_bytes(bytes(d, offset)?))
}

fn c_str(strtab: &[u8], offset: u64) -> Result<String> {
    let rest = strtab
        .get(usize::try_from(offset)?..)
        .context("string offset past the string table")?;
    let end = rest
        .iter()
        .position(|&b| b == 0)
        .context("unterminated string")?;
    Ok(String::from_utf8_lossy(rest.get(..end).unwrap_or_default()).into_owned())
}

/// LLVM major version in a libLLVM file name or soname:
/// `libLLVM.so.22.1-rust-1.97.0-nightly`, `libLLVM.so.22.1`, `libLLVM-22.so` -> 22.
pub(crate) fn llvm_major_of(lib_name: &str) -> Option<u32> {
    let rest = lib_name.strip_prefix("libLLVM")?;
    let rest = rest
        .strip_prefix(".so.")
        .or_else(|| rest.strip_prefix('-'))?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_needed_of_this_test_binary() {
        let needed = needed_libs(Path::new("/proc/self/exe")).unwrap();
        assert!(
            needed.iter().any(|n| n.starts_with("libc.so")),
            "{needed:?}"
        );
    }

    #[test]
    fn rejects_non_elf_and_truncated() {
        assert!(parse_needed(b"#!/bin/sh\n").is_err());
        let mut header = b"\x7fELF\x02\x01\x01".to_vec();
        assert!(parse_needed(&header).is_err());
        header.resize(64, 0);
        header[0x28] = 0xff; // section headers beyond the end
        header[0x3c] = 1;
        assert!(parse_needed(&header).is_err());
    }

    #[test]
    fn llvm_majors() {
        assert_eq!(
            llvm_major_of("libLLVM.so.22.1-rust-1.97.0-nightly"),
            Some(22)
        );
        assert_eq!(llvm_major_of("libLLVM.so.21.1"), Some(21));
        assert_eq!(llvm_major_of("libLLVM-22.so"), Some(22));
        assert_eq!(llvm_major_of("libLLVM-22-rust-1.97.0-nightly.so"), Some(22));
        assert_eq!(llvm_major_of("libLLVM.so"), None);
        assert_eq!(llvm_major_of("libc.so.6"), None);
    }
}
