//! What `sluicectl monitor` reads: the event ring buffer (`sl_events`) and the
//! programs' aya-log debug lines.
use std::os::fd::{AsRawFd, RawFd};

use aya::maps::{MapData, RingBuf};
use aya_log::EbpfLogger;
use sluice_common::{maps, Event, EVENT_V1_SIZE};

use crate::{Error, PinRoot, Result};

/// The event ring buffer; one reader at a time gets each event.
pub struct Events {
    ring: RingBuf<MapData>,
}

impl Events {
    /// Opens the ring. A datapath loaded by an older sluice may lack it.
    pub fn open(root: &PinRoot) -> Result<Self> {
        if !root.has(&maps::EVENTS) {
            return Err(Error::NotPinned {
                root: root.path().to_path_buf(),
                path: root.map_path(&maps::EVENTS),
            });
        }
        Ok(Self {
            ring: root.typed(&maps::EVENTS)?,
        })
    }

    /// The next event, if one is waiting (records that are not whole events
    /// are skipped).
    pub fn next_event(&mut self) -> Option<Event> {
        loop {
            let item = self.ring.next()?;
            if let Some(ev) = parse(&item) {
                return Some(ev);
            }
        }
    }

    /// Discards what is waiting.
    pub fn drain(&mut self) {
        while self.ring.next().is_some() {}
    }
}

impl AsRawFd for Events {
    fn as_raw_fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }
}

/// An [`Event`] from the bytes of a ring record: a record of the current
/// layout, or one of [`EVENT_V1_SIZE`] bytes that a datapath loaded by an
/// older sluice writes (its 4-byte NAT address and its port sit where the
/// current layout has the 16-byte address, so it is read field by field).
pub fn parse(bytes: &[u8]) -> Option<Event> {
    if bytes.len() >= std::mem::size_of::<Event>() {
        // SAFETY: `Event` is plain old data and the buffer holds at least one.
        return Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<Event>()) });
    }
    bytes
        .get(..EVENT_V1_SIZE)
        .and_then(|b| <&[u8; EVENT_V1_SIZE]>::try_from(b).ok())
        .map(Event::from_v1)
}

/// The aya-log lines of the program with kernel id `prog_id` (the programs
/// share one log ring), handed to `logger` on [`DebugLog::flush`].
pub struct DebugLog<T: log::Log> {
    inner: EbpfLogger<T>,
}

impl<T: log::Log> DebugLog<T> {
    pub fn open(prog_id: u32, logger: T) -> Result<Self> {
        EbpfLogger::init_from_id_with_logger(prog_id, logger)
            .map(|inner| Self { inner })
            .map_err(|e| {
                Error::io(
                    format!("opening the debug log ring of program {prog_id}"),
                    std::io::Error::other(e),
                )
            })
    }

    /// Hands every waiting line to the logger.
    pub fn flush(&mut self) {
        self.inner.flush();
    }
}

impl<T: log::Log> AsRawFd for DebugLog<T> {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
}
