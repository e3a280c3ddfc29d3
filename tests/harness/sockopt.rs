//! `setsockopt` and `getsockopt` of plain values (integers, `timeval`,
//! `linger`, byte arrays, `tpacket_stats`), with errors that name the option.

use std::os::fd::AsRawFd;

use crate::{err, Result};

/// Sets option `name` at `level` of `s` to `value`; `what` names it in errors.
pub fn set<T>(s: &impl AsRawFd, level: i32, name: i32, value: &T, what: &str) -> Result<()> {
    // SAFETY: `value` is a live `T` of the size passed.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            name,
            std::ptr::from_ref(value).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(err!(
            "setsockopt {what}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Reads option `name` at `level` of `s` into `out`; `what` names it in errors.
pub fn get<T>(s: &impl AsRawFd, level: i32, name: i32, out: &mut T, what: &str) -> Result<()> {
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `out` and `len` are live, writable and of the sizes passed.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            level,
            name,
            std::ptr::from_mut(out).cast(),
            &raw mut len,
        )
    };
    if r < 0 {
        return Err(err!(
            "getsockopt {what}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}
