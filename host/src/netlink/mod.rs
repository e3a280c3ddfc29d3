//! Typed rtnetlink operations: links, addresses, routes and neighbours. Callers
//! never see raw netlink messages. A [`Netlink`] is bound to the namespace it was
//! opened in (see [`crate::netns`]).
mod addr;
mod addr_events;
mod blocking;
mod filter;
mod link;
mod link_events;
mod neigh;
pub mod netconf;
mod qdisc;
mod route;

use rtnetlink::Handle;

pub use addr::NodeAddrs;
pub use addr_events::{AddrChange, AddrEvents};
pub use blocking::Blocking;
pub use filter::BpfFilter;
pub use link::{LinkInfo, VethSpec};
pub use link_events::LinkEvents;
pub use qdisc::FQ;
pub use route::RouteSpec;

use crate::{netns::Netns, Error};

/// A netlink route socket in one network namespace.
pub struct Netlink {
    handle: Handle,
}

impl Netlink {
    /// Opens a socket in the namespace this thread is in. Must be called inside a
    /// tokio runtime (the socket is driven by a spawned task).
    pub fn open() -> Result<Self, Error> {
        let (mut conn, handle, _) = rtnetlink::new_connection()
            .map_err(|e| Error::io("opening a netlink route socket", e))?;
        // Strict checking (Linux 4.20) lets the kernel filter dumps (addresses
        // of one interface) instead of sending everything; an older kernel
        // refuses the option, and the filters then run here as well.
        let _ = rtnetlink::sys::AsyncSocket::socket_mut(conn.socket_mut())
            .set_netlink_get_strict_chk(true);
        tokio::spawn(conn);
        Ok(Self { handle })
    }

    /// Opens a socket inside `ns`; the thread returns to its namespace at once.
    pub fn open_in(ns: &Netns) -> Result<Self, Error> {
        ns.run(Self::open)?
    }
}

/// The errno of a failed request, if the kernel sent one.
fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
        _ => None,
    }
}

#[expect(
    clippy::needless_pass_by_value,
    reason = "used as map_err(|e| nl_err(.., e)), which owns the error"
)]
fn nl_err(op: impl Into<String>, e: rtnetlink::Error) -> Error {
    let source = match &e {
        // The kernel's errno, kept (callers and logs can tell EEXIST from EPERM).
        rtnetlink::Error::NetlinkError(m) => m.to_io(),
        other => std::io::Error::other(other.to_string()),
    };
    Error::Netlink {
        op: op.into(),
        source,
    }
}
