//! The `CONTROL_EVENTS` ring as a daemon reads it: registered with tokio, drained one
//! whole [`ControlEvent`] at a time. Shared by the switch and DPU daemons.

use aya::maps::{MapData, RingBuf};
use innet_common::{control::ControlEvent, maps::CONTROL_EVENTS};
use tokio::io::unix::AsyncFd;
use tracing::warn;

use crate::{
    error::{Error, Result},
    pins::PinLayout,
};

/// The pinned control ring, readable as a tokio source.
pub type ControlRing = AsyncFd<RingBuf<MapData>>;

/// Opens the pinned `CONTROL_EVENTS` ring for reading.
///
/// # Errors
/// No pinned ring, or tokio cannot watch it.
pub fn open(pins: &PinLayout) -> Result<ControlRing> {
    let ring: RingBuf<MapData> = pins.open_typed(CONTROL_EVENTS)?;
    // SAFETY: the RingBuf owns its map fd and keeps it open, unchanged, for as long as the
    // AsyncFd owns the RingBuf.
    unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }.map_err(|e| {
        Error::Io {
            path: "CONTROL_EVENTS ring".into(),
            source: e.into_parts().1,
        }
    })
}

/// Waits until the ring has events, then hands each to `handle`.
///
/// # Errors
/// The ring cannot be waited on.
pub async fn drain(ring: &mut ControlRing, mut handle: impl FnMut(&ControlEvent)) -> Result<()> {
    let mut guard = ring.readable_mut().await.map_err(|e| Error::Io {
        path: "CONTROL_EVENTS ring".into(),
        source: e,
    })?;
    // Clear readiness before draining, so a record committed after the last `next()` wakes
    // us again.
    guard.clear_ready();
    while let Some(item) = guard.get_inner_mut().next() {
        if item.len() < size_of::<ControlEvent>() {
            warn!(len = item.len(), "short control event");
            continue;
        }
        // SAFETY: the kernel wrote a whole ControlEvent (length checked above).
        let ev: ControlEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
        drop(item);
        handle(&ev);
    }
    Ok(())
}
