//! How many control frames a TOR's daemon processes per host port: a token bucket each.
//! Attack: a host floods queries under fresh wire ids; each one the TOR processes is sent on
//! up every uplink, and every switch above processes it too, so one host's flood would keep
//! every daemon of the fabric busy (at 40,000 queries a second, a three-level lab fabric's
//! jobs ran 50× slower). Past its rate a port's frames are dropped before they are parsed,
//! counted as `control_shed`; the data path has already queued them behind every port within
//! its share (`control_over_share`), so they delay no other port's set-up either.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

/// Control frames a host port may have processed per second, sustained: a host setting up
/// communicators sends a query or a climb per rank and communicator, and a notify and a
/// kill per group it leads, so 1,000 a second is two hundred communicators a second for a
/// node of four ranks (`daemon_e2e`'s thousand create-and-kill cycles run at about that).
pub const FRAMES_PER_SECOND: u32 = 1000;
/// Frames a host port may have processed at once after a quiet spell: a node's ranks
/// creating hundreds of communicators together.
pub const BURST: u32 = 1024;
/// How often a port that keeps being shed is named in the log: once per spell, not per frame.
pub const WARN_EVERY: Duration = Duration::from_secs(10);

/// When something was last named in the log, so it is named at most once per
/// [`WARN_EVERY`] while it goes on.
#[derive(Debug, Default)]
pub struct WarnEvery(Option<Instant>);

impl WarnEvery {
    /// Whether it may be named at `now`; if so, it counts as named then.
    pub fn due(&mut self, now: Instant) -> bool {
        let due = self
            .0
            .is_none_or(|t| now.saturating_duration_since(t) >= WARN_EVERY);
        if due {
            self.0 = Some(now);
        }
        due
    }
}

/// The buckets, one per host port (an attached port's ifindex: bounded by the ports).
#[derive(Debug, Default)]
pub struct PortRates {
    buckets: HashMap<u32, Bucket>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
    /// Frames shed since the port was last named in the log.
    shed: u64,
    /// When it was last named.
    warned: WarnEvery,
}

impl PortRates {
    /// Whether port `ifindex` may have one more control frame processed at `now` (and takes
    /// its token).
    pub fn admit(&mut self, ifindex: u32, now: Instant) -> bool {
        let b = self.buckets.entry(ifindex).or_insert(Bucket {
            tokens: f64::from(BURST),
            at: now,
            shed: 0,
            warned: WarnEvery::default(),
        });
        let refill =
            now.saturating_duration_since(b.at).as_secs_f64() * f64::from(FRAMES_PER_SECOND);
        b.tokens = (b.tokens + refill).min(f64::from(BURST));
        b.at = now;
        if b.tokens < 1.0 {
            b.shed += 1;
            return false;
        }
        b.tokens -= 1.0;
        true
    }

    /// The ports to name in the log at `now`, with the frames each had shed since it was
    /// last named: each port at most once per [`WARN_EVERY`].
    pub fn due_warnings(&mut self, now: Instant) -> Vec<(u32, u64)> {
        let mut due = vec![];
        for (&ifindex, b) in &mut self.buckets {
            if b.shed > 0 && b.warned.due(now) {
                due.push((ifindex, b.shed));
                b.shed = 0;
            }
        }
        due.sort_unstable();
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shed_port_is_named_once_per_spell_with_its_count() {
        let mut r = PortRates::default();
        let t0 = Instant::now();
        let over = 5;
        for _ in 0..BURST + over {
            r.admit(3, t0);
        }
        assert!(r.admit(4, t0), "a quiet port");
        assert_eq!(r.due_warnings(t0), vec![(3, u64::from(over))]);
        // Still flooding a second later: counted, not named again until WARN_EVERY passed.
        let t1 = t0 + Duration::from_secs(1);
        for _ in 0..2 * FRAMES_PER_SECOND {
            r.admit(3, t1);
        }
        assert!(r.due_warnings(t1).is_empty());
        let shed_at_t1 = u64::from(FRAMES_PER_SECOND);
        assert_eq!(r.due_warnings(t0 + WARN_EVERY), vec![(3, shed_at_t1)]);
        assert!(
            r.due_warnings(t0 + 3 * WARN_EVERY).is_empty(),
            "nothing shed since"
        );
    }

    #[test]
    fn a_port_gets_its_burst_then_its_rate_and_other_ports_theirs() {
        let mut r = PortRates::default();
        let t0 = Instant::now();
        let admitted = (0..2 * BURST).filter(|_| r.admit(7, t0)).count();
        assert_eq!(
            admitted,
            usize::try_from(BURST).unwrap(),
            "a burst, then nothing at the same instant"
        );
        assert!(r.admit(8, t0), "another port has its own bucket");
        // A quarter of a second later: a quarter of a second's worth more, no more.
        let t1 = t0 + Duration::from_millis(250);
        let admitted = (0..2 * BURST).filter(|_| r.admit(7, t1)).count();
        assert_eq!(admitted, usize::try_from(FRAMES_PER_SECOND / 4).unwrap());
    }

    #[test]
    fn a_quiet_port_refills_only_to_its_burst() {
        let mut r = PortRates::default();
        let t0 = Instant::now();
        assert!(r.admit(1, t0));
        let later = t0 + Duration::from_hours(1);
        let admitted = (0..2 * BURST).filter(|_| r.admit(1, later)).count();
        assert_eq!(admitted, usize::try_from(BURST).unwrap());
    }
}
