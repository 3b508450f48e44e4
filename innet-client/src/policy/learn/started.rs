//! The non-blocking collectives' own decisions: a call's time is its start to its
//! completion as the application sees it (the `MPI_Wait`/`MPI_Test` that finds it done), so
//! a way whose collective progresses during the application's computation wins when it
//! does, not the way that is faster blocking.
//!
//! The blocking trials' rule cannot be used as it is. Starts and completions interleave
//! (a program may start eight calls, then wait for them all), and the ranks see completions
//! at different times, so:
//! - a call's way depends only on how many calls of its class were *started* (every rank
//!   starts the same calls in the same order): a trial's calls take the ways of the
//!   blocking schedule ([`Class::trial_way`]) by their start number, and each carries a
//!   [`Ticket`] naming its trial and step, under which its time comes back later;
//! - once a trial's calls are all started, the class is *due*: it keeps its previous way
//!   (or the caller's fallback) until the ranks agree, and they agree only where every
//!   rank is anyway and waiting cannot deadlock: in a blocking collective the application
//!   calls on the communicator (the shim asks [`Learner::due`] there). Nothing waits for a
//!   missing sample: each rank sums the medians of what it has, with a count per way.
//!
//! A trial with no sample of one way on any rank (the application never waited where the
//! shim sees it) decides for the fallback until the next re-check.

use super::{Class, Decision, Learner, RECHECK_EVERY, Route, TRIAL_CALLS, Way, median_us};

/// A timed trial call: the trial's number (low 24 bits) and its step, for
/// [`Learner::took_started`].
pub type Ticket = u32;

const STEP_BITS: u32 = 8;
const _: () = assert!(TRIAL_CALLS < 1 << STEP_BITS);

impl Learner {
    /// The way of the next non-blocking call of `kind` with `bytes`, and the ticket its time
    /// comes back with when it is a timed trial call. `trials`: whether this class may run
    /// trials (not while another thread may use the learner); `fallback`: the way while
    /// the class has no decision of its own (its blocking kind's).
    pub fn route_started(
        &mut self,
        kind: usize,
        bytes: usize,
        trials: bool,
        fallback: Way,
    ) -> (Route, Option<Ticket>) {
        self.routing(kind, bytes);
        let c = self.class(kind, bytes);
        c.calls += 1;
        let settled = |c: &Class| Route {
            way: c.decided.map_or(fallback, |(w, _)| w),
            trial: false,
        };
        if c.step.is_none() {
            let recheck_due = c.decided.is_none_or(|(_, next)| c.calls > next);
            if c.due || !trials || !recheck_due {
                return (settled(c), None);
            }
            c.step = Some(0);
            c.trials = c.trials.wrapping_add(1);
            c.trial_started_at = c.calls - 1;
            c.network_ns.clear();
            c.mpi_ns.clear();
        }
        let step = c.step.unwrap_or(0);
        let all_started = step + 1 == TRIAL_CALLS;
        if all_started {
            c.step = None;
            c.due = true;
        } else {
            c.step = Some(step + 1);
        }
        let ticket = Class::timed(step).then_some((c.trials << STEP_BITS) | step);
        self.due += usize::from(all_started);
        self.count_trial(kind);
        (
            Route {
                way: Class::trial_way(step),
                trial: true,
            },
            ticket,
        )
    }

    /// Records the start-to-completion time of the call `ticket` names; a ticket of a trial
    /// already agreed on (or never started) is ignored.
    pub fn took_started(&mut self, kind: usize, bytes: usize, ticket: Ticket, nanos: u64) {
        let c = self.class(kind, bytes);
        let (trial, step) = (ticket >> STEP_BITS, ticket & ((1 << STEP_BITS) - 1));
        let open = c.due || c.step.is_some();
        if !open || trial != c.trials & (u32::MAX >> STEP_BITS) || step >= TRIAL_CALLS {
            return;
        }
        match Class::trial_way(step) {
            Way::Network => c.network_ns.push(nanos),
            Way::Mpi => c.mpi_ns.push(nanos),
        }
    }

    /// The first class of the `started` kinds whose trial calls are all started and whose
    /// ranks must agree now: (kind, a size of its class). The same on every rank at the
    /// same blocking collective.
    #[must_use]
    pub fn due(&self, started: &[usize]) -> Option<(usize, usize)> {
        if self.due == 0 {
            return None;
        }
        started.iter().find_map(|&kind| {
            let k = kind.min(self.kinds.len() - 1);
            let base = k * super::CLASSES;
            (0..super::CLASSES)
                .find(|&class| self.classes[base + class].due)
                .map(|class| (kind, super::class_max_bytes(class) as usize))
        })
    }

    /// This rank's part of the agreement on a due class: the median µs and whether there
    /// is one, per way: `[network, has, mpi, has]` (summed over the ranks).
    pub fn agreement(&mut self, kind: usize, bytes: usize) -> [f64; 4] {
        let c = self.class(kind, bytes);
        let part = |s: &mut Vec<u64>| {
            if s.is_empty() {
                (0.0, 0.0)
            } else {
                (median_us(s), 1.0)
            }
        };
        let (n, has_n) = part(&mut c.network_ns);
        let (m, has_m) = part(&mut c.mpi_ns);
        [n, has_n, m, has_m]
    }

    /// Decides a due class on the ranks' sums of [`Self::agreement`] (the same on every
    /// rank): the way whose mean median is lower (a re-check moves only when the other way
    /// is clearly faster), or `fallback` until the next re-check when a way has no sample.
    pub fn decide_started(
        &mut self,
        kind: usize,
        bytes: usize,
        sums: [f64; 4],
        fallback: Way,
    ) -> Option<Decision> {
        let c = self.class(kind, bytes);
        if !c.due {
            return None;
        }
        c.due = false;
        self.due -= 1;
        let c = self.class(kind, bytes);
        let [n, has_n, m, has_m] = sums;
        if has_n < 1.0 || has_m < 1.0 {
            c.decided = Some((
                c.decided.map_or(fallback, |(w, _)| w),
                c.calls + RECHECK_EVERY,
            ));
            return None;
        }
        // The last round of a blocking trial: the rule then always decides.
        c.step = Some(TRIAL_CALLS);
        self.decide_on_means(kind, bytes, [n / has_n, m / has_m])
    }
}

#[cfg(test)]
mod tests {
    use super::super::{BLOCK_CALLS, BLOCK_WARM_UP, ROUNDS};
    use super::*;

    const KINDS: [&str; 2] = ["iallreduce", "ibcast"];

    /// Starts a whole trial of kind 0 at `bytes`; the routes and tickets.
    fn start_trial(l: &mut Learner, bytes: usize) -> Vec<(Route, Option<Ticket>)> {
        (0..TRIAL_CALLS)
            .map(|_| l.route_started(0, bytes, true, Way::Network))
            .collect()
    }

    #[test]
    fn ways_follow_starts_and_the_class_waits_for_agreement() {
        let mut l = Learner::new(0, &KINDS);
        assert_eq!(l.due(&[0, 1]), None);
        let started = start_trial(&mut l, 64);
        let ways: Vec<Way> = started.iter().map(|(r, _)| r.way).collect();
        let want: Vec<Way> = (0..TRIAL_CALLS).map(Class::trial_way).collect();
        assert_eq!(ways, want, "the blocking schedule, by start");
        let timed = started.iter().filter(|(_, t)| t.is_some()).count() as u32;
        assert_eq!(timed, ROUNDS * 2 * (BLOCK_CALLS - BLOCK_WARM_UP));
        // Due: no trial, the fallback, until the ranks agree.
        assert_eq!(l.due(&[0, 1]), Some((0, 64)));
        let (r, t) = l.route_started(0, 64, true, Way::Mpi);
        assert_eq!((r.way, r.trial, t), (Way::Mpi, false, None));
    }

    #[test]
    fn late_completions_decide_and_stale_tickets_are_ignored() {
        let mut l = Learner::new(0, &KINDS);
        let started = start_trial(&mut l, 8);
        // Completions come back in any order: the network's take 20 µs, MPI's 60.
        for (r, t) in started.iter().rev() {
            if let Some(t) = t {
                let ns = if r.way == Way::Network {
                    20_000
                } else {
                    60_000
                };
                l.took_started(0, 8, *t, ns);
            }
        }
        let part = l.agreement(0, 8);
        let near = |a: [f64; 4], b: [f64; 4]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9);
        assert!(near(part, [20.0, 1.0, 60.0, 1.0]), "{part:?}");
        // Two ranks' sums.
        let sums = [part[0] * 2.0, 2.0, part[2] * 2.0, 2.0];
        let d = l.decide_started(0, 8, sums, Way::Mpi).expect("decides");
        assert_eq!((d.way, d.collective.as_str()), (Way::Network, "iallreduce"));
        assert_eq!(l.due(&[0]), None);
        // A ticket of the agreed trial changes nothing now.
        let (_, t) = started[5];
        l.took_started(0, 8, t.expect("timed"), 1);
        assert!(near(l.agreement(0, 8), [20.0, 1.0, 60.0, 1.0]));
        let (r, t) = l.route_started(0, 8, true, Way::Mpi);
        assert_eq!((r.way, r.trial, t), (Way::Network, false, None));
    }

    #[test]
    fn no_samples_of_a_way_keeps_the_fallback_until_the_next_recheck() {
        let mut l = Learner::new(0, &KINDS);
        start_trial(&mut l, 4);
        assert_eq!(l.decide_started(0, 4, [0.0; 4], Way::Mpi), None);
        assert_eq!(l.due(&[0]), None);
        for _ in 0..RECHECK_EVERY {
            let (r, t) = l.route_started(0, 4, true, Way::Network);
            assert_eq!((r.way, r.trial, t), (Way::Mpi, false, None));
        }
        assert!(
            l.route_started(0, 4, true, Way::Network).0.trial,
            "re-checks"
        );
    }

    #[test]
    fn without_trials_the_class_follows_the_fallback() {
        let mut l = Learner::new(0, &KINDS);
        for _ in 0..100 {
            let (r, t) = l.route_started(1, 16, false, Way::Mpi);
            assert_eq!((r.way, r.trial, t), (Way::Mpi, false, None));
        }
        assert_eq!(l.due(&[0, 1]), None);
    }
}
