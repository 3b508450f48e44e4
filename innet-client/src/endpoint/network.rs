//! A collective through the network: the leader keeps the window of rounds full, takes
//! results from its socket (switches) or its NIC's completions (NIC tree), resends what
//! does not come back, and gives up (with the reason) when the network does not deliver.

use std::{
    net::Ipv4Addr,
    os::fd::RawFd,
    time::{Duration, Instant},
};

use innet_common::{
    group::completion_stamp,
    proto::{Dtype, MAX_PAYLOAD_BYTES, Op, element_bytes},
    validate::Verdict,
};

use crate::{
    frames::{Frame, MASK24, swap_order_into},
    nic::NicPort,
    stages::{CallStamps, Stage},
};

use super::{
    Endpoint, Incoming, POLL_SLICE,
    window::{PacketSender, Rounds, Sent},
};

/// Why the network did not deliver a collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetAbort {
    /// A packet's result did not come after this many sends.
    Timeout { tries: u32 },
    /// Another leader runs this collective on the hosts.
    PeerFellBack,
    /// A contribution came back unaggregated: the switches lost the group.
    Vanished,
    /// The other leaders set the group up again after an earlier collective: this leader
    /// must too, then send again.
    Regroup,
    /// The node's own stage failed (its [`NodeStage`] says why).
    Node,
}

/// The node-local gather a leader overlaps with the network's rounds, for a long message
/// on a node of several ranks: the ranks' contributions are folded in as they come while
/// the first rounds are in flight, instead of the rounds waiting for the whole gather.
pub trait NodeStage {
    /// Folds what the node's ranks sent so far into the contribution (`wire`); how many
    /// bytes of it are final (all of them once every rank's part is in).
    fn gather(&mut self, wire: &mut [u8]) -> usize;
    /// The socket the node's ranks write to, waited on with the INC socket.
    fn fd(&self) -> RawFd;
    /// When the ranks' parts must be in.
    fn deadline(&self) -> Instant;
    /// Whether the stage gave up (a rank's message is wrong, a socket failed, or the parts
    /// did not come by the deadline); the collective then ends with [`NetAbort::Node`].
    fn failed(&self) -> bool;
}

/// How a leader's data packets enter the network and their results come back.
#[derive(Clone, Copy)]
pub enum Carrier<'a> {
    /// Sent to this address (the ring successor, or the leader's DPU) through its port;
    /// results arrive on the INC socket.
    Switch { dst: Ipv4Addr },
    /// Posted into this host's NIC (a NIC tree); results land in its completion array.
    Nic(&'a NicPort),
}

/// What the network path needs to know about the group.
#[derive(Clone, Copy)]
pub struct NetPlan<'a> {
    pub wire_id: u32,
    pub carrier: Carrier<'a>,
    /// Payload bytes per packet.
    pub packet_bytes: usize,
    /// Rounds in flight at most ([`in_flight`](super::in_flight) of the group's window).
    pub in_flight: usize,
    /// Unanswered packets at most ([`Config::pipe`](crate::Config::pipe)): of the rounds
    /// the window lets in flight, the ones that may be in the network at once.
    pub pipe: usize,
    pub retry: Duration,
    pub max_tries: u32,
    /// Least time a packet waits for its result before the collective falls back.
    pub patience: Duration,
    /// Test hook: drop every n-th result this leader receives (0: none).
    pub drop_every: u32,
    /// Hand the result over in native order (converted as it is copied out: one pass over
    /// a long message less); the result kept for late peers stays in wire order.
    pub native_result: bool,
}

impl NetPlan<'_> {
    /// How far past the oldest unanswered round a leader may send, and how many unanswered
    /// packets it may have in the network.
    pub(super) fn window(&self) -> (usize, usize) {
        (self.in_flight, self.pipe.clamp(1, self.in_flight.max(1)))
    }
}

impl Endpoint {
    /// Reduces `buf` (wire order) through the network: one packet per round, at most
    /// [`in_flight`](super::in_flight) rounds ahead of the oldest unanswered one, each
    /// resent until its result comes, and keeps the result for peers that may still ask
    /// ([`keep_final`](Self::keep_final)). Returns the number of retransmissions.
    ///
    /// # Errors
    /// [`NetAbort`] when the network does not deliver; `buf` then holds the contribution
    /// (with a `stage`, the node's parts folded in so far).
    pub fn network_allreduce(
        &mut self,
        seq: u32,
        (op, dtype): (Op, Dtype),
        plan: &NetPlan<'_>,
        (buf, stage): (&mut [u8], Option<&mut dyn NodeStage>),
        stamps: &mut CallStamps,
    ) -> Result<u32, NetAbort> {
        self.shared.note_seq(seq);
        let blocked_before = self.inbox.blocked();
        let mut rounds = std::mem::take(&mut self.rounds);
        let outcome =
            self.network_rounds(seq, (op, dtype), plan, (buf, stage), &mut rounds, stamps);
        self.rounds = rounds;
        stamps.blocked += self.inbox.blocked().wrapping_sub(blocked_before);
        outcome
    }

    /// [`network_allreduce`](Self::network_allreduce)'s rounds.
    fn network_rounds(
        &mut self,
        seq: u32,
        (op, dtype): (Op, Dtype),
        plan: &NetPlan<'_>,
        (buf, mut stage): (&mut [u8], Option<&mut dyn NodeStage>),
        rounds: &mut Rounds,
        stamps: &mut CallStamps,
    ) -> Result<u32, NetAbort> {
        let seq = seq & MASK24;
        self.start_rounds(seq, (op, dtype), plan, (buf.len(), stage.is_some()), rounds)?;
        let wire = self.wire.clone();
        let dst = match plan.carrier {
            Carrier::Switch { dst } => dst,
            Carrier::Nic(_) => self.peers.ip,
        };
        let (me, ip) = (self.peers.me, self.peers.ip);
        let mut retransmissions = 0u32;
        let mut due = Vec::with_capacity(plan.in_flight);
        // NIC results land in memory: poll them, yielding for the inbox's spin budget
        // after the last progress, then in short sleeps.
        let mut spin_until = Instant::now() + self.inbox.spin();
        loop {
            let gathering = gather_step(stage.as_deref_mut(), rounds, buf)?;
            let sender = PacketSender {
                wire: &*wire,
                me,
                ip,
                dst,
                plan,
                id: (op, dtype),
                contribution: buf,
            };
            if let Carrier::Nic(port) = plan.carrier
                && self.take_landed(port, plan, rounds)
            {
                spin_until = Instant::now() + self.inbox.spin();
            }
            // Results already received are taken first, so the rounds they free leave
            // together.
            if !self.inbox.has_received() {
                rounds.send_new(&sender, &mut due, stamps);
            }
            if rounds.finished() {
                stamps.stamp(Stage::Result);
                self.deliver(seq, (op, dtype), rounds, (buf, plan.native_result));
                return Ok(retransmissions);
            }
            let mut deadline = rounds.deadline(plan, self.proven);
            if let Some((_, until)) = gathering
                && !rounds.awaiting()
            {
                // Nothing in flight: wait for the node's ranks (or the call's end).
                deadline = until;
            }
            let wait_until = match plan.carrier {
                Carrier::Switch { .. } => deadline,
                Carrier::Nic(_) => {
                    let now = Instant::now();
                    if now < spin_until {
                        std::thread::yield_now();
                        now
                    } else {
                        (now + POLL_SLICE).min(deadline)
                    }
                }
            };
            match self.next_or(wait_until, gathering.map(|(fd, _)| fd)) {
                None if Instant::now() < deadline => {}
                // A NIC tree's results land in memory, never on the socket.
                Some(Incoming::Result(_)) if matches!(plan.carrier, Carrier::Nic(_)) => {}
                Some(Incoming::Result(f)) => {
                    if let Some(p) = self.take_result(&f, plan, (op, dtype), rounds) {
                        retransmissions += rounds.resend_overtaken(p, &sender, stamps);
                    }
                }
                Some(Incoming::Host(f)) => {
                    let mine = f.deth.src_qp() == seq;
                    self.keep_host_packet(f, seq, Some(buf.len()));
                    if mine {
                        return Err(NetAbort::PeerFellBack);
                    }
                }
                Some(Incoming::Bye(_)) => {}
                Some(Incoming::Stray { wire_id }) => {
                    let switched = matches!(plan.carrier, Carrier::Switch { .. });
                    if switched && self.proven && wire_id == plan.wire_id {
                        return Err(NetAbort::Vanished);
                    }
                }
                Some(Incoming::Regroup) => {
                    if let Some(abort) = self.abort_for_gone_group(seq) {
                        return Err(abort);
                    }
                }
                None => match rounds.resend_due(&sender, self.proven, stamps) {
                    Ok(resent) => retransmissions += resent,
                    Err((round, tries)) => {
                        self.log_missing(plan, round as u8);
                        return Err(NetAbort::Timeout { tries });
                    }
                },
            }
        }
    }

    /// Sets the rounds of collective `seq` (`len` bytes; `staged`: the node's ranks' parts
    /// still coming) up, unless the non-blocking start sent them ahead; the abort if the
    /// collective already runs elsewhere.
    fn start_rounds(
        &mut self,
        seq: u32,
        id: (Op, Dtype),
        plan: &NetPlan<'_>,
        (len, staged): (usize, bool),
        rounds: &mut Rounds,
    ) -> Result<(), NetAbort> {
        // A window sent ahead by the non-blocking start stays as it is (not sent twice).
        let ahead = Some((seq, id, plan.wire_id, self.next_round, len));
        if self.pre_sent.take() != ahead {
            rounds.reset(self.next_round, plan.packet_bytes, len, plan.window());
        }
        if staged {
            // Packets leave as the node's ranks' parts come in.
            rounds.ready = 0;
        }
        // Every leader advances by the same count whatever happens below.
        self.next_round = self.next_round.wrapping_add(rounds.count() as u32);
        if self.peer_fell_back(seq) {
            return Err(NetAbort::PeerFellBack);
        }
        self.abort_for_gone_group(seq).map_or(Ok(()), Err)
    }

    /// Hands a finished collective's result to the caller (`buf`) and keeps it for late
    /// peers by moving it; the buffer of an older result that goes takes its place.
    fn deliver(
        &mut self,
        seq: u32,
        id: (Op, Dtype),
        rounds: &mut Rounds,
        (buf, native): (&mut [u8], bool),
    ) {
        if native {
            swap_order_into(id.0, id.1, &rounds.result, buf);
        } else {
            buf.copy_from_slice(&rounds.result);
        }
        self.proven = true;
        let result = std::mem::take(&mut rounds.result);
        rounds.result = self.keep_final_owned(seq, id, result).unwrap_or_default();
    }

    /// Sends the first window of collective `seq` (`buf` in wire order) ahead of
    /// [`network_allreduce`](Self::network_allreduce), which then waits for those packets'
    /// results instead of sending them again (when it runs with the same group and length).
    /// The non-blocking start calls it on the application's thread, so the packets leave
    /// at once, not when the progress thread gets a CPU. `None` when it sent nothing, else
    /// whether that was every packet (then the network finishes the collective without this
    /// host until the results come back).
    pub fn pre_send(
        &mut self,
        seq: u32,
        id: (Op, Dtype),
        plan: &NetPlan<'_>,
        buf: &[u8],
    ) -> Option<bool> {
        let Carrier::Switch { dst } = plan.carrier else {
            return None;
        };
        let seq = seq & MASK24;
        let wire = self.wire.clone();
        let sender = PacketSender {
            wire: &*wire,
            me: self.peers.me,
            ip: self.peers.ip,
            dst,
            plan,
            id,
            contribution: buf,
        };
        let mut rounds = std::mem::take(&mut self.rounds);
        rounds.reset(self.next_round, plan.packet_bytes, buf.len(), plan.window());
        let mut due = Vec::with_capacity(plan.in_flight);
        rounds.send_new(&sender, &mut due, &mut CallStamps::default());
        self.rounds = rounds;
        self.pre_sent = Some((seq, id, plan.wire_id, self.next_round, buf.len()));
        Some(self.rounds.all_sent())
    }

    /// Whether the test hook drops the result this leader just received.
    fn drops_this_result(&mut self, plan: &NetPlan<'_>) -> bool {
        self.results_seen += 1;
        plan.drop_every > 0 && self.results_seen.is_multiple_of(u64::from(plan.drop_every))
    }

    /// NIC tree: takes the results that have landed in the completion array; whether any.
    fn take_landed(&mut self, port: &NicPort, plan: &NetPlan<'_>, rounds: &mut Rounds) -> bool {
        let mut landed = [0u8; MAX_PAYLOAD_BYTES];
        let mut any = false;
        for p in rounds.in_flight() {
            let Some(Sent { tries, .. }) = rounds.sent[p] else {
                continue;
            };
            if rounds.done[p] || rounds.dropped_at[p] >= tries {
                continue;
            }
            let want = rounds.bytes(p).len();
            match port.landed(rounds.round(p) as u8, &mut landed) {
                Some(n) if n == want => {}
                Some(n) => {
                    tracing::debug!(
                        round = rounds.round(p),
                        n,
                        want,
                        "NIC result of another length"
                    );
                    continue;
                }
                None => continue,
            }
            if self.drops_this_result(plan) {
                // Taken again only after the next post has written it anew.
                rounds.dropped_at[p] = tries;
                continue;
            }
            rounds.complete(p, &landed[..want]);
            any = true;
        }
        any
    }

    /// Switches: takes a result packet if it answers one of this collective's rounds; the
    /// packet it answered.
    fn take_result(
        &mut self,
        f: &Frame,
        plan: &NetPlan<'_>,
        (op, dtype): (Op, Dtype),
        rounds: &mut Rounds,
    ) -> Option<usize> {
        if self.drops_this_result(plan) {
            return None;
        }
        let p = (f.bth.psn().wrapping_sub(rounds.base) & MASK24) as usize;
        if p >= rounds.count() || rounds.done[p] {
            return None;
        }
        let count = (rounds.bytes(p).len() / element_bytes(op, dtype)) as u16;
        let ours = f.inc.group() == plan.wire_id
            && f.inc.req_id == rounds.round(p) as u8
            && f.verdict == (Verdict::Data { op, dtype, count });
        if !ours {
            return None;
        }
        rounds.complete(p, f.body());
        Some(p)
    }

    fn log_missing(&self, plan: &NetPlan<'_>, round: u8) {
        if let Carrier::Nic(port) = plan.carrier {
            tracing::debug!(
                ip = %self.peers.ip,
                round,
                stamp = format_args!("{:#x}", port.stamp(round)),
                want = format_args!("{:#x}", completion_stamp(port.wire_id(), round)),
                "NIC result missing"
            );
        }
    }
}

/// Folds in the node's ranks' parts that came meanwhile (rounds leave once theirs are in);
/// while some are missing, the socket they come on and when they must be in.
fn gather_step<'s>(
    stage: Option<&mut (dyn NodeStage + 's)>,
    rounds: &mut Rounds,
    buf: &mut [u8],
) -> Result<Option<(RawFd, Instant)>, NetAbort> {
    let Some(st) = stage.filter(|_| rounds.ready < buf.len()) else {
        return Ok(None);
    };
    rounds.ready = st.gather(buf);
    if st.failed() {
        return Err(NetAbort::Node);
    }
    Ok((rounds.ready < buf.len()).then(|| (st.fd(), st.deadline())))
}

#[cfg(test)]
mod tests;
