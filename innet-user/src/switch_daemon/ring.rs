//! The control rings as a daemon reads them: `CONTROL_EVENTS` (ports within their share)
//! first, `CONTROL_OVERFLOW` (ports past it) only while the first is empty, both registered
//! with tokio and drained one whole [`ControlEvent`] at a time. Shared by the switch and DPU
//! daemons.

use aya::maps::{MapData, RingBuf};
use innet_common::{
    control::ControlEvent,
    maps::{CONTROL_EVENTS, CONTROL_OVERFLOW},
};
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tracing::warn;

use crate::{
    error::{Error, Result},
    pins::PinLayout,
};

/// One pinned ring, readable as a tokio source.
type Ring = AsyncFd<RingBuf<MapData>>;

/// The two pinned control rings.
pub struct ControlRings {
    within_share: Ring,
    over_share: Ring,
    /// Until when the overflow ring is polled: a while after the last event of either.
    polling_until: Option<Instant>,
}

/// Events taken from the overflow ring before the first ring is looked at again: a port
/// within its share waits behind at most this many of a flood's frames.
const OVERFLOW_BATCH: usize = 8;
/// How often the overflow ring is read when nothing wakes the daemon: its frames are
/// submitted without a wake-up, so a flood costs the daemon no wake-up per frame.
pub const OVERFLOW_POLL: Duration = Duration::from_millis(5);
/// Events one call hands on at most, so a sustained flood within the shares still lets the
/// daemon's tick (idle collection, counters) run.
const DRAIN_MOST: usize = 4096;
/// How long the overflow ring is polled after the last event. A port's frames go there
/// only once it has handed up its share in the same 10 ms, which woke the daemon: a quiet
/// fabric costs no polling, and no frame waits for one.
const POLL_AFTER_EVENTS: Duration = Duration::from_secs(1);

/// Opens the pinned control rings for reading.
///
/// # Errors
/// No pinned ring, or tokio cannot watch it.
pub fn open(pins: &PinLayout) -> Result<ControlRings> {
    Ok(ControlRings {
        within_share: open_one(pins, CONTROL_EVENTS)?,
        over_share: open_one(pins, CONTROL_OVERFLOW)?,
        polling_until: None,
    })
}

fn open_one(pins: &PinLayout, name: &'static str) -> Result<Ring> {
    let ring: RingBuf<MapData> = pins.open_typed(name)?;
    // SAFETY: the RingBuf owns its map fd and keeps it open, unchanged, for as long as the
    // AsyncFd owns the RingBuf.
    unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
        .map_err(|e| ring_error(name, e.into_parts().1))
}

/// Waits until the first ring has events (or, for a while after the last ones,
/// [`OVERFLOW_POLL`] passed), then hands each to `handle`: every event of the first ring,
/// then up to [`OVERFLOW_BATCH`] of the overflow ring, again until both are empty or
/// [`DRAIN_MOST`] were handed on.
///
/// # Errors
/// A ring cannot be waited on.
pub async fn drain(rings: &mut ControlRings, mut handle: impl FnMut(&ControlEvent)) -> Result<()> {
    let ControlRings {
        within_share,
        over_share,
        polling_until,
    } = rings;
    let polling = polling_until.is_some_and(|t| Instant::now() < t);
    // Clear the readiness that woke us before draining, so a record committed after the
    // last read wakes us again; a ring whose readiness stays set is drained below anyway
    // and wakes us once more for nothing.
    tokio::select! {
        biased;
        ready = within_share.readable_mut() => ready.map_err(|e| ring_error(CONTROL_EVENTS, e))?.clear_ready(),
        ready = over_share.readable_mut() => ready.map_err(|e| ring_error(CONTROL_OVERFLOW, e))?.clear_ready(),
        () = tokio::time::sleep(OVERFLOW_POLL), if polling => {}
    }
    let mut taken = 0;
    while taken < DRAIN_MOST {
        let first = take(within_share.get_mut(), DRAIN_MOST, &mut handle);
        let overflow = take(over_share.get_mut(), OVERFLOW_BATCH, &mut handle);
        if first == 0 && overflow == 0 {
            return Ok(());
        }
        taken += first + overflow;
        *polling_until = Some(Instant::now() + POLL_AFTER_EVENTS);
    }
    // Back to the daemon's other work; what is left is read at the next poll (armed above).
    Ok(())
}

fn ring_error(name: &str, source: std::io::Error) -> Error {
    Error::Io {
        path: format!("{name} ring").into(),
        source,
    }
}

/// Hands up to `most` events of `ring` to `handle`; how many it took.
fn take(ring: &mut RingBuf<MapData>, most: usize, handle: &mut impl FnMut(&ControlEvent)) -> usize {
    let mut taken = 0;
    while taken < most
        && let Some(item) = ring.next()
    {
        taken += 1;
        if item.len() < size_of::<ControlEvent>() {
            warn!(len = item.len(), "short control event");
            continue;
        }
        // SAFETY: the kernel wrote a whole ControlEvent (length checked above).
        let ev: ControlEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
        drop(item);
        handle(&ev);
    }
    taken
}
