//! Network or not: the one answer for every call a communicator's user routes. A
//! [`Policy`] is a cutover table's limit or the learned cutover ([`Learner`]: trials of
//! both ways per collective and size class, decided alike on every rank), for blocking
//! calls and for started (non-blocking) ones, which follow their blocking kind until they
//! have learned their own way. The communicator's own `auto` mode and its early sends ask
//! the table's rule through [`table_limit`] (`Config::cutover_limit`).

pub mod learn;

pub use learn::{
    BLOCK_CALLS, BLOCK_WARM_UP, CLASSES, CLEAR_AFTER, Decision, Learner, MARGIN, RECHECK_EVERY,
    RECHECK_FIRST, REPORTED_DECISIONS, ROUND_CALLS, ROUNDS, Route, TRIAL_CALLS, Ticket, Way,
    class_max_bytes, class_of,
};

/// The table's rule: `Some(limit)` when a message of `bytes` is longer than the table's
/// limit for the network (`None`: no limit, or within it).
#[must_use]
pub fn table_limit(network_max_bytes: Option<usize>, bytes: usize) -> Option<usize> {
    network_max_bytes.filter(|&max| bytes > max)
}

/// How a communicator's calls choose their way.
#[derive(Debug)]
pub enum Policy {
    /// A cutover table: messages up to the limit take the network (`None`: every size).
    Table { network_max_bytes: Option<usize> },
    /// The learned cutover.
    Learned(Learner),
}

impl Policy {
    /// The way of the next call of collective `kind` with `bytes`, and, when it is a timed
    /// trial call of a started kind, the ticket its start-to-completion time comes back
    /// with. `follows`: for a started kind, the blocking kind whose decision it takes
    /// before it has its own (`None`: a blocking kind). `trials`: whether a started kind
    /// may run trials now (not while another thread may route on this policy).
    pub fn route(
        &mut self,
        kind: usize,
        follows: Option<usize>,
        bytes: usize,
        trials: bool,
    ) -> (Route, Option<Ticket>) {
        match self {
            Self::Table { network_max_bytes } => {
                let way = if table_limit(*network_max_bytes, bytes).is_some() {
                    Way::Mpi
                } else {
                    Way::Network
                };
                (Route { way, trial: false }, None)
            }
            Self::Learned(l) => match follows {
                None => (l.route(kind, bytes), None),
                Some(blocking) => {
                    let fallback = l.decided(blocking, bytes).unwrap_or(Way::Network);
                    l.route_started(kind, bytes, trials, fallback)
                }
            },
        }
    }

    /// The learner, when the policy learns.
    pub fn learner(&mut self) -> Option<&mut Learner> {
        match self {
            Self::Learned(l) => Some(l),
            Self::Table { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_hands_longer_messages_over_and_never_trials() {
        let mut p = Policy::Table {
            network_max_bytes: Some(1024),
        };
        assert_eq!(p.route(0, None, 1024, true).0.way, Way::Network);
        assert_eq!(p.route(0, None, 1025, true).0.way, Way::Mpi);
        assert!(!p.route(1, Some(0), 8, true).0.trial);
        assert!(p.learner().is_none());
        assert_eq!(table_limit(None, usize::MAX), None);
    }

    #[test]
    fn a_started_kind_follows_its_blocking_kind_until_it_learns() {
        let mut l = Learner::new(0, &["allreduce", "iallreduce"]);
        l.seed((0..2 * CLASSES).map(|c| (c == class_of(64)).then_some(Way::Mpi)));
        let mut p = Policy::Learned(l);
        let (r, ticket) = p.route(1, Some(0), 64, false);
        assert_eq!((r.way, r.trial, ticket), (Way::Mpi, false, None));
        let (r, _) = p.route(0, None, 64, true);
        assert_eq!(
            (r.way, r.trial),
            (Way::Mpi, false),
            "seeded: no trial before the re-check"
        );
    }
}
