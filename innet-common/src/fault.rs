//! Fault injection for test fabrics (the kernels here have no netem). A *wire* is a pair of
//! ports in a namespace of its own between two ends of a link; `innet_fault`, a tc program
//! on both wire ports' ingress, forwards every frame to the other port and, at given rates,
//! drops, duplicates or delays (and so reorders) the INC data packets it forwards. Delayed
//! frames go to userspace through `FAULT_DELAYED`, which re-sends them when they are due.
//! Other traffic is forwarded untouched.

use crate::stats::counters;

/// Rates are in parts per million of the matching packets.
pub const PPM: u32 = 1_000_000;
/// `FaultConfig::kinds`: INC data without the result bit (contributions, partials, host
/// algorithm messages).
pub const KIND_CONTRIBUTION: u32 = 1;
/// `FaultConfig::kinds`: INC data with the result bit (results, replies).
pub const KIND_RESULT: u32 = 2;
/// Largest frame a wire delays (Ethernet + 1500 B MTU, rounded up).
pub const DELAYED_FRAME_MAX: usize = 1536;
/// Ring of delayed frames: about 160 frames in flight; more are forwarded undelayed and
/// counted (`delay_overflow`).
pub const DELAY_RING_BYTES: usize = 256 * 1024;

/// What one wire port does with the frames entering it (`FAULT_CONFIG[ifindex]`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultConfig {
    /// The other port of the wire: every frame leaves through it.
    pub peer_ifindex: u32,
    /// Which INC packets the rates apply to (`KIND_*` bits; 0: none).
    pub kinds: u32,
    /// Rates in parts per million; their sum is at most `PPM`.
    pub drop_ppm: u32,
    pub duplicate_ppm: u32,
    pub delay_ppm: u32,
    /// How long a delayed frame is held, in microseconds.
    pub delay_us: u32,
}

impl FaultConfig {
    /// A wire port that forwards everything to `peer_ifindex` untouched.
    #[must_use]
    pub const fn forward(peer_ifindex: u32) -> Self {
        Self {
            peer_ifindex,
            kinds: 0,
            drop_ppm: 0,
            duplicate_ppm: 0,
            delay_ppm: 0,
            delay_us: 0,
        }
    }
}

/// A frame held back by a wire (`FAULT_DELAYED` ring record).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DelayedFrame {
    /// Port to send it out of (the wire's other port).
    pub ifindex: u32,
    /// Bytes of `frame` that are valid.
    pub len: u32,
    /// `CLOCK_MONOTONIC` time (ns) it is due.
    pub due_ns: u64,
    pub frame: [u8; DELAYED_FRAME_MAX],
}

counters! {
    /// What a wire port saw and did (`FAULT_STATS[ifindex]`, per CPU).
    pub struct FaultStats {
        /// Every frame that entered the port.
        frames,
        /// INC data packets without / with the result bit.
        contributions,
        results,
        /// INC packets dropped, sent twice, held back.
        dropped,
        duplicated,
        delayed,
        /// Delays not done because the ring was full (the frame went on undelayed).
        delay_overflow,
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: repr(C) structs of integers without padding.
    unsafe impl aya::Pod for super::FaultConfig {}
    unsafe impl aya::Pod for super::FaultStats {}
}
