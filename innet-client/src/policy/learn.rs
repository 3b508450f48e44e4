//! The cutover that learns: without a cutover table, each communicator measures both ways
//! (innet and MPI) on its first calls of every collective and size class, keeps the faster,
//! and measures again now and then.
//!
//! Every rank runs the same schedule, because MPI makes every rank of a communicator call
//! its collectives in the same order with the same sizes: call `k` of a class takes the
//! same way on every rank. Only the decision needs agreement: at the end of each trial
//! round the shim sums the ranks' medians (one `PMPI_Allreduce` of two doubles) and every
//! rank decides on the same means.
//!
//! A trial runs in rounds of two blocks, one per way ([`BLOCK_CALLS`] calls each; the
//! network's block first in odd rounds, MPI's in even ones, so a drift favours neither).
//! A block's first [`BLOCK_WARM_UP`] calls are not timed: a call after the other way's
//! finds its own path cold (its thread asleep, its socket's reader away), which says
//! nothing of how fast the way is when it is taken. Each way's time is the median of its
//! timed samples, as seen by the rank that times it; the ranks' mean of those medians
//! decides ([`Learner::decide_on_means`]).
//!
//! The rule. After round `r` the ranks agree on their means; the trial ends when the
//! slower way's mean is at least [`CLEAR_AFTER`]`[r - 1]` times the faster's (1.5 after 6
//! samples a way, 1.2 after 12) or after [`ROUNDS`] rounds (18 samples a way). A re-check
//! moves the class to the other way only when that way is [`MARGIN`] faster (hysteresis:
//! a class decided for the faster way stays when noise makes the other look a little
//! faster). Re-checks come [`RECHECK_FIRST`] calls after the first decision, then every
//! [`RECHECK_EVERY`]: a re-check's calls on the slower way (at most 24) cost at most 1 % of
//! a class's time when that way is up to 3× slower. Error rates under noise: see the tests
//! (`decisions_under_noise_are_stable`).

use serde::{Deserialize, Serialize};

mod started;
pub use started::Ticket;

/// Calls of one way in a row, in a trial.
pub const BLOCK_CALLS: u32 = 8;
/// Untimed calls at the start of each block.
pub const BLOCK_WARM_UP: u32 = 2;
/// Calls of a round: a block of each way.
pub const ROUND_CALLS: u32 = 2 * BLOCK_CALLS;
/// Rounds of a trial at most.
pub const ROUNDS: u32 = 3;
/// Calls of a whole trial.
pub const TRIAL_CALLS: u32 = ROUNDS * ROUND_CALLS;
/// After round `r`, the slower way's mean over the faster's that ends the trial.
pub const CLEAR_AFTER: [f64; ROUNDS as usize] = [1.5, 1.2, 1.0];
/// How much faster the other way must be for a re-check to move a class to it.
pub const MARGIN: f64 = 0.10;
/// Calls after the first decision until the first re-check (a trial is 2 % of them).
pub const RECHECK_FIRST: u64 = 2_400;
/// Calls between later re-checks (a trial is 1 % of them).
pub const RECHECK_EVERY: u64 = 4_800;
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
    /// The size class: messages up to this many bytes (and over half of it); the
    /// barrier's, of the call before it (see [`Learner::spanning`]).
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
    /// Timed samples per way behind this rank's medians.
    #[serde(default)]
    pub samples: u32,
    /// The communicator's shape: nodes and ranks per node (0: not known).
    #[serde(default)]
    pub nodes: usize,
    #[serde(default)]
    pub ppn: usize,
}

#[derive(Clone, Debug, Default)]
struct Class {
    /// Calls of this class so far.
    calls: u64,
    /// Some(step) while a trial runs.
    step: Option<u32>,
    network_ns: Vec<u64>,
    mpi_ns: Vec<u64>,
    /// The decided way, and the call count of the next re-check.
    decided: Option<(Way, u64)>,
    trial_started_at: u64,
    /// Trials started (a non-blocking call's ticket names its trial).
    trials: u32,
    /// A non-blocking class whose trial calls are all started: the ranks agree next.
    due: bool,
}

impl Class {
    /// The way of a trial's call `step`: blocks of each way, the network's first in odd
    /// rounds (counting from 1).
    fn trial_way(step: u32) -> Way {
        let block = step / BLOCK_CALLS;
        let round = block / 2;
        let first = block.is_multiple_of(2);
        if first == round.is_multiple_of(2) {
            Way::Network
        } else {
            Way::Mpi
        }
    }

    /// Whether call `step` of a trial is timed (not a block's warm-up).
    fn timed(step: u32) -> bool {
        step % BLOCK_CALLS >= BLOCK_WARM_UP
    }
}

/// One communicator's learned cutover: a class state per (collective kind, size class).
#[derive(Debug)]
pub struct Learner {
    communicator: u64,
    /// Nodes and ranks per node of the communicator, for saved decisions.
    shape: (usize, usize),
    kinds: Vec<&'static str>,
    classes: Vec<Class>,
    /// Non-blocking classes due for agreement (see `started`): none, and the check in
    /// every blocking collective is one comparison.
    due: usize,
    /// The kind whose trial call is timed until its next call (see [`Self::spanning`]).
    spanning: Option<usize>,
    /// Trial calls of every other kind routed so far, blocking or started.
    others_in_trial: u64,
    /// `others_in_trial` when the spanning kind's last trial call was routed.
    span_mark: u64,
    /// The bytes of the last call of another kind: the context the spanning kind's next
    /// call is classed by.
    context_bytes: usize,
    /// The context the spanning kind's last call was routed under: its sample, medians and
    /// decision are that class's.
    span_bytes: usize,
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
            shape: (0, 0),
            kinds: kinds.to_vec(),
            classes: vec![Class::default(); kinds.len() * CLASSES],
            due: 0,
            spanning: None,
            others_in_trial: 0,
            span_mark: 0,
            context_bytes: 0,
            span_bytes: 0,
        }
    }

    /// Times `kind`'s trial calls from one call to the next of the same kind (the shim
    /// ends the barrier's sample at the next barrier's entry): a barrier that releases the
    /// ranks at once onto shared CPUs makes the call after it slower, and that cost belongs
    /// to the barrier's way. A span in which a trial call of another kind ran is not kept
    /// (its way would weigh in the sample): the spanning kind's trial does not advance
    /// until the other kinds' trials are over, and every rank drops the same spans, since
    /// every rank routes the same calls of the communicator.
    ///
    /// The spanning kind is classed by the call before it (of another kind), not by its
    /// own bytes: what its release costs depends on what follows, and a loop repeats the
    /// same call around it (OSU's `MPI_Barrier` between calls of one size; a solver's
    /// barrier after its halo exchange). A barrier between calls MPI serves learns its
    /// way apart from one between calls innet serves.
    #[must_use]
    pub fn spanning(mut self, kind: usize) -> Self {
        self.spanning = Some(kind);
        self
    }

    /// The bytes `kind`'s call is classed by: the spanning kind's context (see
    /// [`Self::spanning`]), else its own.
    fn class_bytes(&self, kind: usize, bytes: usize) -> usize {
        if self.spanning == Some(kind) {
            self.span_bytes
        } else {
            bytes
        }
    }

    /// Notes a call of `kind` with `bytes` being routed: the context of the spanning
    /// kind's calls.
    fn routing(&mut self, kind: usize, bytes: usize) {
        if self.spanning == Some(kind) {
            self.span_bytes = self.context_bytes;
        } else {
            self.context_bytes = bytes;
        }
    }

    /// Counts a trial call of `kind` for the spanning kind's rule.
    fn count_trial(&mut self, kind: usize) {
        if self.spanning == Some(kind) {
            self.span_mark = self.others_in_trial;
        } else {
            self.others_in_trial += 1;
        }
    }

    /// The learner of a communicator of `nodes` × `ppn` (its decisions say so).
    #[must_use]
    pub fn with_shape(mut self, nodes: usize, ppn: usize) -> Self {
        self.shape = (nodes, ppn);
        self
    }

    /// Starts the classes `seeds` names (a way or none per kind and class, in this
    /// learner's order) as decided, to be re-checked [`RECHECK_FIRST`] calls later; how
    /// many.
    pub fn seed(&mut self, seeds: impl IntoIterator<Item = Option<Way>>) -> usize {
        let mut seeded = 0;
        for (c, seed) in self.classes.iter_mut().zip(seeds) {
            if let Some(way) = seed {
                c.decided = Some((way, c.calls + RECHECK_FIRST));
                seeded += 1;
            }
        }
        seeded
    }

    /// The state of `kind`'s class for a call of `bytes` (the spanning kind's: of its
    /// context).
    fn class(&mut self, kind: usize, bytes: usize) -> &mut Class {
        let k = kind.min(self.kinds.len() - 1);
        let class = class_of(self.class_bytes(kind, bytes));
        &mut self.classes[k * CLASSES + class]
    }

    /// The way of the next call of `kind` with `bytes`.
    pub fn route(&mut self, kind: usize, bytes: usize) -> Route {
        self.routing(kind, bytes);
        let c = self.class(kind, bytes);
        c.calls += 1;
        if c.step.is_none() {
            match c.decided {
                Some((way, next)) if c.calls <= next => return Route { way, trial: false },
                _ => {
                    c.step = Some(0);
                    c.trial_started_at = c.calls - 1;
                    c.network_ns.clear();
                    c.mpi_ns.clear();
                }
            }
        }
        let way = Class::trial_way(c.step.unwrap_or(0));
        self.count_trial(kind);
        Route { way, trial: true }
    }

    /// The way last decided for `kind`/`bytes` (kept while a re-check runs), without
    /// counting a call: the non-blocking collectives follow their blocking kind's decision.
    #[must_use]
    pub fn decided(&self, kind: usize, bytes: usize) -> Option<Way> {
        let k = kind.min(self.kinds.len() - 1);
        let bytes = if self.spanning == Some(kind) {
            self.context_bytes // the class the next call of the kind would be in
        } else {
            bytes
        };
        self.classes[k * CLASSES + class_of(bytes)]
            .decided
            .map(|(way, ..)| way)
    }

    /// Records how long the trial call just routed took (`nanos`, on this rank); true at
    /// the end of a round, when the ranks must agree on their means now (and the trial may
    /// end: [`Self::decide_on_means`]).
    pub fn took(&mut self, kind: usize, bytes: usize, nanos: u64) -> bool {
        if self.spanning == Some(kind) && self.others_in_trial != self.span_mark {
            return false; // another kind's trial ran in the span: the same call again
        }
        let c = self.class(kind, bytes);
        let Some(step) = c.step else {
            return false;
        };
        if Class::timed(step) {
            match Class::trial_way(step) {
                Way::Network => c.network_ns.push(nanos),
                Way::Mpi => c.mpi_ns.push(nanos),
            }
        }
        c.step = Some(step + 1);
        (step + 1).is_multiple_of(ROUND_CALLS)
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

    /// At the end of a trial's round, on the ranks' mean medians (`means_us`: network,
    /// MPI; the same on every rank, from one allreduce): the decision when the trial ends
    /// here (see the module's rule), `None` while it goes on. The way whose call the ranks
    /// see end sooner on average wins (the network on a tie). Rank 0 alone would choose for
    /// the rank that waits longest: a reduce-scatter's rank that gets the data, where MPI
    /// lets the others go.
    pub fn decide_on_means(
        &mut self,
        kind: usize,
        bytes: usize,
        means_us: [f64; 2],
    ) -> Option<Decision> {
        let c = self.class(kind, bytes);
        let round = (c.step? / ROUND_CALLS).clamp(1, ROUNDS);
        let [network, mpi] = means_us;
        let ratio = network.max(mpi) / network.min(mpi).max(f64::MIN_POSITIVE);
        let clear = ratio >= CLEAR_AFTER[round as usize - 1];
        if round < ROUNDS && !clear {
            return None;
        }
        let time = |w: Way| if w == Way::Network { network } else { mpi };
        let way = match c.decided.map(|(w, ..)| w) {
            // A re-check: the other way must be clearly faster to take over.
            Some(current) => {
                let other = if current == Way::Network {
                    Way::Mpi
                } else {
                    Way::Network
                };
                if time(other) < time(current) * (1.0 - MARGIN) {
                    other
                } else {
                    current
                }
            }
            None if network <= mpi => Way::Network,
            None => Way::Mpi,
        };
        Some(Decision {
            ranks_us: Some(means_us),
            ..self.decide(kind, bytes, way)
        })
    }

    /// Takes `way` for the class until the next re-check, and returns the decision for the
    /// report.
    pub fn decide(&mut self, kind: usize, bytes: usize, way: Way) -> Decision {
        let proposed = self.proposal(kind, bytes);
        let communicator = self.communicator;
        let (nodes, ppn) = self.shape;
        let name = self.kinds[kind.min(self.kinds.len() - 1)].to_owned();
        let max_bytes = class_max_bytes(class_of(self.class_bytes(kind, bytes)));
        let c = self.class(kind, bytes);
        let interval = match c.decided {
            Some(_) => RECHECK_EVERY,
            None => RECHECK_FIRST,
        };
        c.decided = Some((way, c.calls + interval));
        c.step = None;
        let samples = c.network_ns.len().min(c.mpi_ns.len()) as u32;
        Decision {
            samples,
            nodes,
            ppn,
            communicator,
            collective: name,
            max_bytes,
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
mod tests;
