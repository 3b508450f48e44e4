//! Per-stage timestamps of a rank's collectives ([`Config::trace_calls`]), to find where a
//! collective's time goes. Stamps are `CLOCK_MONOTONIC` nanoseconds, one clock for every
//! thread and process of a host, so a benchmark can line up the ranks of one call.
//!
//! [`Config::trace_calls`]: super::Config::trace_calls

/// The points of a collective that get a stamp, in the order a leader passes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
#[non_exhaustive]
pub enum Stage {
    /// The rank entered `allreduce`.
    Entry,
    /// A leader holds its node's contributions; another rank has posted its part.
    Gathered,
    /// A leader's first packet is built and about to go to the kernel (socket or NIC).
    Framed,
    /// The kernel has taken that packet.
    Sent,
    /// The result of the leader's last packet is in.
    Result,
    /// `allreduce` returns.
    Returned,
}

/// Number of [`Stage`]s.
pub const STAGES: usize = 6;

impl Stage {
    pub const ALL: [Self; STAGES] = [
        Self::Entry,
        Self::Gathered,
        Self::Framed,
        Self::Sent,
        Self::Result,
        Self::Returned,
    ];
}

/// The stamps of one collective on one rank.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallStamps {
    /// `CLOCK_MONOTONIC` nanoseconds at each [`Stage`]; 0: the call did not pass it (a host
    /// path has no packets to frame, a non-leader sends none).
    pub at: [u64; STAGES],
    /// Times the rank blocked in the kernel waiting for a packet or a NIC result.
    pub blocked: u32,
    /// Whether stamps are taken at all (tracing off: every stamp is a no-op).
    on: bool,
}

impl CallStamps {
    /// Stamps of a call that records them when `on`.
    #[must_use]
    pub fn new(on: bool) -> Self {
        Self {
            on,
            ..Self::default()
        }
    }

    /// Records `stage` now, the first time only (a resend is not the first send).
    pub fn stamp(&mut self, stage: Stage) {
        if self.on && self.at[stage as usize] == 0 {
            self.at[stage as usize] = now_ns();
        }
    }

    /// The stamp of `stage`, if the call passed it.
    #[must_use]
    pub fn get(&self, stage: Stage) -> Option<u64> {
        Some(self.at[stage as usize]).filter(|&t| t != 0)
    }
}

/// The stamps of a rank's first `capacity` traced collectives.
#[derive(Debug, Default)]
pub struct StageLog {
    calls: Vec<CallStamps>,
    capacity: usize,
}

impl StageLog {
    /// A log of up to `capacity` calls (0: tracing off).
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        Self {
            calls: Vec::with_capacity(capacity),
            capacity,
        }
    }

    /// Stamps for the next call: recording while the log has room.
    #[must_use]
    pub fn start(&self) -> CallStamps {
        let mut stamps = CallStamps::new(self.calls.len() < self.capacity);
        stamps.stamp(Stage::Entry);
        stamps
    }

    /// Keeps a finished call's stamps.
    pub fn keep(&mut self, mut stamps: CallStamps) {
        if stamps.on {
            stamps.stamp(Stage::Returned);
            self.calls.push(stamps);
        }
    }

    /// Every kept call, oldest first.
    #[must_use]
    pub fn calls(&self) -> &[CallStamps] {
        &self.calls
    }

    /// Forgets the kept calls and records the next `capacity` ones.
    pub fn restart(&mut self, capacity: usize) {
        self.calls.clear();
        self.calls.reserve(capacity);
        self.capacity = capacity;
    }
}

/// `CLOCK_MONOTONIC` now, in nanoseconds (the clock BPF programs stamp with).
#[must_use]
pub fn now_ns() -> u64 {
    innet_common::clock::ktime_ns()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_are_taken_once_in_order_and_only_while_tracing() {
        let mut log = StageLog::new(2);
        for _ in 0..3 {
            let mut s = log.start();
            s.stamp(Stage::Sent);
            let first = s.get(Stage::Sent);
            s.stamp(Stage::Sent);
            assert_eq!(s.get(Stage::Sent), first, "a resend keeps the first stamp");
            log.keep(s);
        }
        assert_eq!(log.calls().len(), 2, "the log keeps its capacity's worth");
        let c = log.calls()[0];
        let (entry, sent, back) = (
            c.get(Stage::Entry).unwrap(),
            c.get(Stage::Sent).unwrap(),
            c.get(Stage::Returned).unwrap(),
        );
        assert!(entry <= sent && sent <= back);
        assert_eq!(
            c.get(Stage::Result),
            None,
            "a stage not passed has no stamp"
        );

        let mut off = StageLog::new(0).start();
        off.stamp(Stage::Sent);
        assert_eq!(off, CallStamps::default(), "tracing off records nothing");
        log.restart(1);
        assert!(log.calls().is_empty());
    }
}
