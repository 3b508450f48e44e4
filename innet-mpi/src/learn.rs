//! The cutover that learns: without a cutover table, each communicator measures both ways
//! (innet and MPI) on its first calls of every collective and size class, keeps the faster,
//! and measures again now and then.
//!
//! Every rank runs the same schedule, because MPI makes every rank of a communicator call
//! its collectives in the same order with the same sizes: call `k` of a class takes the
//! same way on every rank. Only the decision needs agreement, and it comes from one rank:
//! after the last trial call the shim broadcasts rank 0's [`Learner::proposal`]
//! (`PMPI_Bcast`) and every rank [`Learner::decide`]s it.
//!
//! A trial alternates the ways, network first: [`WARM_UP`] untimed pairs (caches, the
//! first packet's ARP, MPI's connection set-up), then [`SAMPLES`] timed pairs; each way's
//! time is the median of its samples, as seen by the rank that times it.

use serde::{Deserialize, Serialize};

/// Untimed pairs at the start of a trial.
pub const WARM_UP: u32 = 1;
/// Timed pairs per trial.
pub const SAMPLES: u32 = 4;
/// Calls of a trial.
pub const TRIAL_CALLS: u32 = 2 * (WARM_UP + SAMPLES);
/// Calls after the first decision until the first re-check; each re-check doubles it up to
/// [`RECHECK_MAX`] (a lost trial of the slower way costs under 2 % of the calls then).
pub const RECHECK_FIRST: u64 = 500;
pub const RECHECK_MAX: u64 = 32_000;
/// Size classes: class `c` holds messages of `2^(c-1) + 1 ..= 2^c` bytes.
pub const CLASSES: usize = usize::BITS as usize + 1;
/// Decisions a rank keeps for its report (the oldest go first beyond it).
pub const REPORTED_DECISIONS: usize = 1024;

/// The collective's way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Way {
    Network,
    Mpi,
}

/// Where a call goes, and whether it is part of a trial (the shim times it and calls
/// [`Learner::took`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    pub way: Way,
    pub trial: bool,
}

/// The size class of a message of `bytes`.
#[must_use]
pub fn class_of(bytes: usize) -> usize {
    (usize::BITS - bytes.saturating_sub(1).leading_zeros()) as usize
}

/// The largest message of size class `class`.
#[must_use]
pub fn class_max_bytes(class: usize) -> u64 {
    1u64.checked_shl(class as u32).unwrap_or(u64::MAX)
}

/// One decision, and the measurements behind it, for the rank report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// The communicator (the order this rank joined them in, from 0).
    pub communicator: u64,
    /// `allreduce`, `reduce`, `bcast` or `barrier`.
    pub collective: String,
    /// The size class: messages up to this many bytes (and over half of it).
    pub max_bytes: u64,
    /// The way every rank takes: the faster on the ranks' mean of their medians.
    pub way: Way,
    /// This rank's median µs per way in the trial (rank 0's decided).
    pub network_us: f64,
    pub mpi_us: f64,
    /// This rank's proposal from its own measurements.
    pub proposed: Way,
    /// Calls of this class before the trial (0: the first decision).
    pub after_calls: u64,
    /// The ranks' mean of their median µs, network then MPI: what decided.
    #[serde(default)]
    pub ranks_us: Option<[f64; 2]>,
}

#[derive(Clone, Debug, Default)]
struct Class {
    /// Calls of this class so far.
    calls: u64,
    /// Some(step) while a trial runs.
    step: Option<u32>,
    network_ns: Vec<u64>,
    mpi_ns: Vec<u64>,
    /// The decided way, the call count of the next re-check, and the interval to it.
    decided: Option<(Way, u64, u64)>,
    trial_started_at: u64,
}

impl Class {
    fn trial_way(step: u32) -> Way {
        if step.is_multiple_of(2) {
            Way::Network
        } else {
            Way::Mpi
        }
    }
}

/// One communicator's learned cutover: a class state per (collective kind, size class).
#[derive(Debug)]
pub struct Learner {
    communicator: u64,
    kinds: Vec<&'static str>,
    classes: Vec<Class>,
}

fn median_us(samples: &mut [u64]) -> f64 {
    if samples.is_empty() {
        return f64::INFINITY;
    }
    samples.sort_unstable();
    samples[samples.len() / 2] as f64 / 1e3
}

impl Learner {
    /// A learner for communicator number `communicator`, whose collectives are `kinds`.
    #[must_use]
    pub fn new(communicator: u64, kinds: &[&'static str]) -> Self {
        Self {
            communicator,
            kinds: kinds.to_vec(),
            classes: vec![Class::default(); kinds.len() * CLASSES],
        }
    }

    fn class(&mut self, kind: usize, bytes: usize) -> &mut Class {
        let k = kind.min(self.kinds.len() - 1);
        &mut self.classes[k * CLASSES + class_of(bytes)]
    }

    /// The way of the next call of `kind` with `bytes`.
    pub fn route(&mut self, kind: usize, bytes: usize) -> Route {
        let c = self.class(kind, bytes);
        c.calls += 1;
        if c.step.is_none() {
            match c.decided {
                Some((way, next, _)) if c.calls <= next => return Route { way, trial: false },
                _ => {
                    c.step = Some(0);
                    c.trial_started_at = c.calls - 1;
                    c.network_ns.clear();
                    c.mpi_ns.clear();
                }
            }
        }
        Route {
            way: Class::trial_way(c.step.unwrap_or(0)),
            trial: true,
        }
    }

    /// The way last decided for `kind`/`bytes` (kept while a re-check runs), without
    /// counting a call: the non-blocking collectives follow their blocking kind's decision.
    #[must_use]
    pub fn decided(&self, kind: usize, bytes: usize) -> Option<Way> {
        let k = kind.min(self.kinds.len() - 1);
        self.classes[k * CLASSES + class_of(bytes)]
            .decided
            .map(|(way, ..)| way)
    }

    /// Records how long the trial call just routed took (`nanos`, on this rank); true when
    /// the trial is over and the ranks must agree on a decision now.
    pub fn took(&mut self, kind: usize, bytes: usize, nanos: u64) -> bool {
        let c = self.class(kind, bytes);
        let Some(step) = c.step else {
            return false;
        };
        if step >= 2 * WARM_UP {
            match Class::trial_way(step) {
                Way::Network => c.network_ns.push(nanos),
                Way::Mpi => c.mpi_ns.push(nanos),
            }
        }
        c.step = Some(step + 1);
        step + 1 >= TRIAL_CALLS
    }

    /// This rank's proposal: the faster way in the trial just ended (the network on a tie).
    pub fn proposal(&mut self, kind: usize, bytes: usize) -> Way {
        let c = self.class(kind, bytes);
        if median_us(&mut c.network_ns) <= median_us(&mut c.mpi_ns) {
            Way::Network
        } else {
            Way::Mpi
        }
    }

    /// This rank's median µs per way in the trial just ended: network, MPI.
    pub fn medians_us(&mut self, kind: usize, bytes: usize) -> [f64; 2] {
        let c = self.class(kind, bytes);
        [median_us(&mut c.network_ns), median_us(&mut c.mpi_ns)]
    }

    /// Decides the class on the ranks' mean medians (`means_us`: network, MPI; the same
    /// on every rank, from one allreduce): the way whose call the ranks see end sooner on
    /// average (the network on a tie). Rank 0 alone would choose for the rank that waits
    /// longest: a reduce-scatter's rank that gets the data, where MPI lets the others go.
    pub fn decide_on_means(&mut self, kind: usize, bytes: usize, means_us: [f64; 2]) -> Decision {
        let way = if means_us[0] <= means_us[1] {
            Way::Network
        } else {
            Way::Mpi
        };
        Decision {
            ranks_us: Some(means_us),
            ..self.decide(kind, bytes, way)
        }
    }

    /// Takes `way` for the class until the next re-check, and returns the decision for the
    /// report.
    pub fn decide(&mut self, kind: usize, bytes: usize, way: Way) -> Decision {
        let proposed = self.proposal(kind, bytes);
        let communicator = self.communicator;
        let name = self.kinds[kind.min(self.kinds.len() - 1)].to_owned();
        let c = self.class(kind, bytes);
        let interval = match c.decided {
            Some((_, _, i)) => (i * 2).min(RECHECK_MAX),
            None => RECHECK_FIRST,
        };
        c.decided = Some((way, c.calls + interval, interval));
        c.step = None;
        Decision {
            communicator,
            collective: name,
            max_bytes: class_max_bytes(class_of(bytes)),
            way,
            network_us: median_us(&mut c.network_ns),
            mpi_us: median_us(&mut c.mpi_ns),
            proposed,
            after_calls: c.trial_started_at,
            ranks_us: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [&str; 2] = ["allreduce", "bcast"];

    /// Runs one trial of `kind`/`bytes` on `l`, each way taking the given ns.
    fn trial(l: &mut Learner, bytes: usize, network_ns: u64, mpi_ns: u64) -> Way {
        for step in 0..TRIAL_CALLS {
            let r = l.route(0, bytes);
            assert!(r.trial);
            let ns = if r.way == Way::Network {
                network_ns
            } else {
                mpi_ns
            };
            let due = l.took(0, bytes, ns + u64::from(step));
            assert_eq!(due, step + 1 == TRIAL_CALLS);
        }
        l.proposal(0, bytes)
    }

    #[test]
    fn size_classes_are_powers_of_two() {
        assert_eq!(
            [0, 1, 2, 3, 4, 5, 8, 9, 1024, 1025].map(class_of),
            [0, 0, 1, 2, 2, 3, 3, 4, 10, 11]
        );
        assert_eq!(class_max_bytes(class_of(3000)), 4096);
    }

    #[test]
    fn a_trial_alternates_then_keeps_the_faster_way_until_the_recheck() {
        let mut l = Learner::new(0, &KINDS);
        assert_eq!(trial(&mut l, 256, 30_000, 90_000), Way::Network);
        let d = l.decide(0, 256, Way::Network);
        assert_eq!(
            (d.way, d.proposed, d.max_bytes, d.after_calls),
            (Way::Network, Way::Network, 256, 0)
        );
        assert!(d.network_us < d.mpi_us, "{d:?}");
        // Another size class and another collective learn on their own.
        assert!(l.route(0, 4096).trial);
        assert!(l.route(1, 256).trial);
        for _ in 0..RECHECK_FIRST {
            assert_eq!(
                l.route(0, 200),
                Route {
                    way: Way::Network,
                    trial: false
                }
            );
        }
        // The re-check: MPI got faster, so the class moves to MPI.
        assert_eq!(trial(&mut l, 256, 90_000, 30_000), Way::Mpi);
        let d = l.decide(0, 256, Way::Mpi);
        assert_eq!(d.after_calls, u64::from(TRIAL_CALLS) + RECHECK_FIRST);
        for _ in 0..2 * RECHECK_FIRST {
            assert_eq!(l.route(0, 256).way, Way::Mpi);
        }
        assert!(l.route(0, 256).trial, "the interval doubled");
    }

    /// Ranks that time differently still take the same way: rank 0's proposal, broadcast.
    #[test]
    fn the_decided_way_is_read_without_counting_a_call() {
        let mut l = Learner::new(0, &KINDS);
        assert_eq!(l.decided(0, 64), None);
        assert_eq!(trial(&mut l, 64, 90_000, 30_000), Way::Mpi);
        assert_eq!(l.decided(0, 64), None, "proposed, not decided yet");
        l.decide(0, 64, Way::Mpi);
        assert_eq!(l.decided(0, 64), Some(Way::Mpi));
        assert_eq!(l.decided(0, 256), None, "another class");
        assert_eq!(l.decided(1, 64), None, "another kind");
        // Reading it does not move the re-check: the next call is still routed as decided.
        for _ in 0..1000 {
            assert_eq!(l.decided(0, 64), Some(Way::Mpi));
        }
        assert_eq!(l.route(0, 64).way, Way::Mpi);
    }

    #[test]
    fn the_ranks_mean_decides_for_every_rank() {
        // Rank 0 waits for the data (MPI slower for it); MPI lets ranks 1–3 go early.
        let times = [
            (10_000, 20_000),
            (10_000, 2_000),
            (10_000, 2_000),
            (10_000, 2_000),
        ];
        let mut ranks: Vec<Learner> = (0..4).map(|_| Learner::new(3, &KINDS)).collect();
        let mut sums = [0.0; 2];
        for (l, &(n, m)) in ranks.iter_mut().zip(&times) {
            trial(l, 64, n, m);
            let [a, b] = l.medians_us(0, 64);
            (sums[0], sums[1]) = (sums[0] + a, sums[1] + b);
        }
        assert_eq!(ranks[0].proposal(0, 64), Way::Network, "rank 0 alone");
        let means = sums.map(|s| s / 4.0);
        for l in &mut ranks {
            let d = l.decide_on_means(0, 64, means);
            assert_eq!((d.way, d.ranks_us), (Way::Mpi, Some(means)), "{d:?}");
            assert!(!l.route(0, 64).trial);
        }
    }

    #[test]
    fn every_rank_takes_rank_0s_decision() {
        let mut ranks: Vec<Learner> = (0..4).map(|_| Learner::new(3, &KINDS)).collect();
        let proposals: Vec<Way> = ranks
            .iter_mut()
            .enumerate()
            .map(|(r, l)| {
                // Rank 2 saw MPI faster; the others the network.
                let (n, m) = if r == 2 {
                    (50_000, 10_000)
                } else {
                    (10_000, 50_000)
                };
                trial(l, 64, n, m)
            })
            .collect();
        assert_eq!(proposals[2], Way::Mpi);
        let root = proposals[0];
        for l in &mut ranks {
            l.decide(0, 64, root);
        }
        for _ in 0..100 {
            let ways: Vec<Route> = ranks.iter_mut().map(|l| l.route(0, 64)).collect();
            assert!(ways.iter().all(|w| *w
                == Route {
                    way: Way::Network,
                    trial: false
                }));
        }
    }

    #[test]
    fn an_untimed_call_outside_a_trial_changes_nothing() {
        let mut l = Learner::new(0, &KINDS);
        assert!(!l.took(0, 8, 1));
        assert!(l.route(0, 8).trial);
    }
}
