//! A plain, blocking netlink route socket: one request, one acknowledgement,
//! on the calling thread and in its namespace, with no async runtime. For
//! requests the kernel serves slowly inside `sendmsg` (a link deletion waits
//! for `rcu_barrier()` in `netdev_run_todo`, `net/core/dev.c`), which must run
//! on a thread of their own rather than stall the runtime's one thread, and
//! for the tc requests the datapath makes the way aya's own tc calls do.
use std::io;

use rtnetlink::{
    packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_REQUEST},
    packet_route::{link::LinkMessage, RouteNetlinkMessage},
    sys::{constants::NETLINK_ROUTE, Socket, SocketAddr},
};

/// The most messages read while waiting for one request's acknowledgement.
const MAX_READS: usize = 16;

/// A netlink route socket in the calling thread's namespace.
pub struct Blocking {
    socket: Socket,
    seq: u32,
}

impl Blocking {
    pub fn open() -> io::Result<Self> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        Ok(Self { socket, seq: 0 })
    }

    /// Sends one request and waits for its acknowledgement; the kernel's
    /// refusal comes back as its errno.
    pub fn request(&mut self, msg: RouteNetlinkMessage, flags: u16) -> io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let mut req = NetlinkMessage::from(msg);
        req.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        req.header.sequence_number = self.seq;
        req.finalize();
        let mut buf = vec![0u8; req.buffer_len()];
        req.serialize(&mut buf);
        self.socket.send(&buf, 0)?;
        let mut answer = vec![0u8; 8192];
        // The socket joins no multicast group: what it reads are answers, and
        // NLM_F_ACK makes the kernel answer every request. Bounded all the same.
        for _ in 0..MAX_READS {
            let n = self.socket.recv(&mut &mut answer[..], 0)?;
            let m =
                NetlinkMessage::<RouteNetlinkMessage>::deserialize(&answer[..n.min(answer.len())])
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            if m.header.sequence_number != self.seq {
                continue;
            }
            if let NetlinkPayload::Error(e) = m.payload {
                return match e.code {
                    None => Ok(()),
                    Some(c) => Err(io::Error::from_raw_os_error(-c.get())),
                };
            }
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no acknowledgement among {MAX_READS} netlink messages"),
        ))
    }

    /// Deletes link `index` (`ip link del`). A link already gone (`ENODEV`:
    /// its peer's deletion took it, or a concurrent DEL) counts as deleted.
    pub fn delete_link(&mut self, index: u32) -> io::Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        match self.request(RouteNetlinkMessage::DelLink(msg), 0) {
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(()),
            r => r,
        }
    }
}
