//! Which way each call of a communicator takes (its [`Policy`](innet_client::policy::Policy):
//! the cutover table, or the learned cutover), and the learned cutover's agreements over the
//! communicator's out-of-band allgather.

use tracing::{info, warn};

use super::Session;
use innet_client::policy::{Decision, Route, Ticket, Way};

use crate::kind::Kind;

impl Session {
    /// The way of the next call of `kind` with `bytes`, and, when it is a timed trial call
    /// of a non-blocking kind, the ticket its start-to-completion time comes back with.
    /// `trials`: whether a non-blocking kind may run trials (not while another thread may
    /// use the session). Without a learner the cutover table decides.
    pub fn route(&mut self, kind: Kind, bytes: usize, trials: bool) -> (Route, Option<Ticket>) {
        let follows = kind.is_started().then(|| kind.blocking().index());
        self.policy.route(kind.index(), follows, bytes, trials)
    }

    /// A timed trial call took `nanos` on this rank (`ticket`: a non-blocking call's). At
    /// the end of a blocking trial's round the ranks sum their medians (collective: every
    /// rank is in the same call) and decide alike: the decision, when the trial ended.
    pub fn took(
        &mut self,
        kind: Kind,
        bytes: usize,
        ticket: Ticket,
        nanos: u64,
    ) -> Option<Decision> {
        let l = self.policy.learner()?;
        if kind.is_started() {
            l.took_started(kind.index(), bytes, ticket, nanos);
            return None;
        }
        if !l.took(kind.index(), bytes, nanos) {
            return None;
        }
        let medians = l.medians_us(kind.index(), bytes);
        let sums = match self.oob.sum(medians) {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "the learned cutover's agreement failed: the trial goes on");
                return None;
            }
        };
        let ranks = self.size.max(1) as f64;
        let d = l.decide_on_means(kind.index(), bytes, sums.map(|s| s / ranks))?;
        info!(?d, "learned cutover");
        Some(d)
    }

    /// At a point every rank of the communicator reaches (a blocking collective or
    /// barrier the application calls): the ranks agree on a non-blocking size class whose
    /// trial calls are all started, if any (see innet-client's `policy/learn/started.rs`).
    pub fn agree(&mut self) -> Option<Decision> {
        let l = self.policy.learner()?;
        let (kind, bytes) = l.due(&Kind::STARTED.map(Kind::index))?;
        let part = l.agreement(kind, bytes);
        let sums = match self.oob.sum(part) {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "the non-blocking cutover's agreement failed");
                return None;
            }
        };
        let blocking = Kind::ALL[kind].blocking().index();
        let fallback = l.decided(blocking, bytes).unwrap_or(Way::Network);
        let d = l.decide_started(kind, bytes, sums, fallback)?;
        info!(?d, "learned cutover");
        Some(d)
    }
}
