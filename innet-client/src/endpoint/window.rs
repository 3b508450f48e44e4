//! The window of a leader's network allreduce: which rounds (packets) of a message are in
//! flight, when each is due again (backoff), and sending them.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use innet_common::{
    codec::{Addressing, payload_len},
    proto::{Dtype, INC_DEST_QP, Op},
};

use super::{Carrier, FIRST_RETRY_OF_A_NEW_GROUP, NetPlan};
use crate::{
    frames::{self, DataDatagram, DataId},
    stages::{CallStamps, Stage},
    wire::Wire,
};

/// First wait for a packet's result, doubling with each send up to 8×. Until a group has
/// delivered once, the first wait is short: the MRR's first packets can overtake its own
/// notify through the switch's daemon, and find the group not installed yet.
fn backoff(plan: &NetPlan<'_>, tries: u32, proven: bool) -> Duration {
    if !proven && tries == 1 {
        return plan.retry.min(FIRST_RETRY_OF_A_NEW_GROUP);
    }
    plan.retry * (1 << tries.saturating_sub(1).min(3))
}

/// Results of packets sent after an unanswered one that come before its own: this many
/// mean it was lost (its contribution or its result), as three duplicate ACKs do for TCP.
/// Every leader sends its rounds in order and the switches complete a round when its last
/// contribution arrives, so results come back in round order unless a packet is lost.
///
/// The evidence cannot tell this leader's loss from another leader's (whose contribution
/// the round also waits for), so such a resend is a cheap guess: at most [`MAX_GUESSES`]
/// per packet between its timer's sends, and neither a try nor a step of its backoff.
const OVERTAKEN_LOST: u8 = 3;

/// Resends on evidence a packet gets between two of its timer's sends. A guess counts
/// only results of packets sent after it, so a resend lost too is guessed again three
/// results later. Once only, it waited out its timer (20 ms and more) with the whole window
/// stalled behind it: on a full link with 1 % loss on each of a round's links, that is
/// about one round in a hundred, and it cost a third of the goodput.
const MAX_GUESSES: u8 = 3;

/// When a data packet was first and last sent, and how often.
#[derive(Clone, Copy)]
pub(super) struct Sent {
    pub(super) first: Instant,
    pub(super) last: Instant,
    pub(super) tries: u32,
    /// The collective's send count at its last send: which packets left after it.
    pub(super) order: u32,
    /// Resends on evidence ([`OVERTAKEN_LOST`]) since its timer last sent it.
    pub(super) guesses: u8,
}

impl Sent {
    /// Whether the network has had its chance with this packet: every try sent, and
    /// `plan.patience` gone since the first — a peer that enters the collective late (a
    /// rank still computing) holds the round up without the network being lost.
    pub(super) fn given_up(&self, plan: &NetPlan<'_>, now: Instant) -> bool {
        self.tries >= plan.max_tries && now.duration_since(self.first) >= plan.patience
    }
}

/// The packets of one network collective: which were sent (when, how often), which are
/// answered, and the result so far. The endpoint keeps one and reuses it, so a long message
/// allocates (and faults in) nothing per call; the contribution stays intact until the last
/// result is in, for the hosts to reduce should the network give up.
#[derive(Default)]
pub(super) struct Rounds {
    /// Absolute round of packet 0.
    pub(super) base: u32,
    pub(super) per: usize,
    pub(super) sent: Vec<Option<Sent>>,
    pub(super) done: Vec<bool>,
    /// Test hook on polled results: the send count at which a result was dropped.
    pub(super) dropped_at: Vec<u32>,
    /// Results of later-sent packets that came before this one's since its last send.
    pub(super) overtaken: Vec<u8>,
    /// Packets sent so far (every try): [`Sent::order`].
    pub(super) sends: u32,
    /// First packet without its result.
    pub(super) oldest: usize,
    /// Packets from `oldest` on that may be in flight.
    pub(super) in_flight: usize,
    /// Of those, the ones sent and unanswered at most: a lost packet's resend waits in
    /// the queue behind at most these, while the window runs on past it.
    pub(super) pipe: usize,
    /// Bytes of the contribution that are final: packets beyond wait for the node's ranks
    /// (see `NodeStage`).
    pub(super) ready: usize,
    pub(super) result: Vec<u8>,
}

impl Rounds {
    /// Starts a collective of `len` bytes in packets of `per` bytes from round `base`, with
    /// `in_flight` rounds from the oldest unanswered one of which `pipe` may be unanswered.
    pub(super) fn reset(
        &mut self,
        base: u32,
        per: usize,
        len: usize,
        (in_flight, pipe): (usize, usize),
    ) {
        (self.in_flight, self.pipe) = (in_flight, pipe);
        let packets = len.div_ceil(per);
        (self.base, self.per, self.oldest) = (base, per, 0);
        self.sent.clear();
        self.sent.resize(packets, None);
        self.done.clear();
        self.done.resize(packets, false);
        self.dropped_at.clear();
        self.dropped_at.resize(packets, 0);
        self.overtaken.clear();
        self.overtaken.resize(packets, 0);
        self.sends = 0;
        self.ready = len;
        // Every byte is written by a result before it is read.
        self.result.resize(len, 0);
    }

    /// Whether a packet in flight waits for its result.
    pub(super) fn awaiting(&self) -> bool {
        self.in_flight()
            .any(|p| self.sent[p].is_some() && !self.done[p])
    }

    pub(super) fn count(&self) -> usize {
        self.done.len()
    }

    pub(super) fn round(&self, p: usize) -> u32 {
        self.base.wrapping_add(p as u32)
    }

    /// Bytes of the message packet `p` carries.
    pub(super) fn bytes(&self, p: usize) -> std::ops::Range<usize> {
        p * self.per..((p + 1) * self.per).min(self.result.len())
    }

    /// The packets that may be in flight now.
    pub(super) fn in_flight(&self) -> std::ops::Range<usize> {
        self.oldest..self.count().min(self.oldest + self.in_flight)
    }

    /// Whether every packet of the collective has been sent once.
    pub(super) fn all_sent(&self) -> bool {
        self.sent.iter().all(Option::is_some)
    }

    pub(super) fn finished(&self) -> bool {
        self.oldest == self.count()
    }

    pub(super) fn complete(&mut self, p: usize, body: &[u8]) {
        let range = self.bytes(p);
        self.result[range].copy_from_slice(body);
        self.done[p] = true;
        while self.oldest < self.count() && self.done[self.oldest] {
            self.oldest += 1;
        }
    }

    /// Packets in flight sent and still without their result.
    fn unanswered(&self) -> usize {
        self.in_flight()
            .filter(|&p| self.sent[p].is_some() && !self.done[p])
            .count()
    }

    /// The packets of the window not sent yet that the pipe has room for, in order.
    fn due_new(&self, due: &mut Vec<usize>) {
        due.clear();
        let room = self.pipe.saturating_sub(self.unanswered());
        due.extend(
            self.in_flight()
                .filter(|&p| {
                    self.sent[p].is_none() && !self.done[p] && self.bytes(p).end <= self.ready
                })
                .take(room),
        );
    }

    /// Sends the packets of the window not sent yet that the pipe has room for (`due`: a
    /// buffer for their numbers).
    pub(super) fn send_new(
        &mut self,
        sender: &PacketSender<'_>,
        due: &mut Vec<usize>,
        stamps: &mut CallStamps,
    ) {
        self.due_new(due);
        sender.send_first(self, due, stamps);
        let now = Instant::now();
        for &p in due.iter() {
            self.first_sent(p, now);
        }
    }

    /// Records packet `p`'s first send, at `now`.
    fn first_sent(&mut self, p: usize, now: Instant) {
        self.sends += 1;
        self.sent[p] = Some(Sent {
            first: now,
            last: now,
            tries: 1,
            order: self.sends,
            guesses: 0,
        });
    }

    /// Counts packet `q`'s result (just taken) against every unanswered packet in flight
    /// sent before it, and sends again at once each that [`OVERTAKEN_LOST`] results have
    /// now overtaken; how many. Without it a lost packet waits out its timer with the
    /// window stalled behind it, and every other leader's rounds time out behind that.
    pub(super) fn resend_overtaken(
        &mut self,
        q: usize,
        sender: &PacketSender<'_>,
        stamps: &mut CallStamps,
    ) -> u32 {
        let mut resent = 0;
        for p in self.in_flight() {
            if self.overtaken_by(p, q) {
                sender.send(self, p, stamps);
                self.guessed(p);
                resent += 1;
            }
        }
        resent
    }

    /// Records a resend of packet `p` on evidence: later sends count against it anew, its
    /// timer and tries stay as they were.
    fn guessed(&mut self, p: usize) {
        self.sends += 1;
        self.overtaken[p] = 0;
        if let Some(s) = self.sent[p].as_mut() {
            (s.order, s.guesses) = (self.sends, s.guesses.saturating_add(1));
        }
    }

    /// Counts `q`'s result against packet `p` if `p` is unanswered and left before `q`;
    /// whether that makes [`OVERTAKEN_LOST`].
    fn overtaken_by(&mut self, p: usize, q: usize) -> bool {
        let (Some(sp), Some(sq)) = (self.sent[p], self.sent.get(q).copied().flatten()) else {
            return false;
        };
        if self.done[p] || sp.guesses >= MAX_GUESSES || sp.order >= sq.order {
            return false;
        }
        self.overtaken[p] += 1;
        self.overtaken[p] >= OVERTAKEN_LOST
    }

    /// Records another send of packet `p` by its timer (last sent as `sent`) at `now`.
    fn resent(&mut self, p: usize, sent: Sent, now: Instant) {
        self.sends += 1;
        self.overtaken[p] = 0;
        self.sent[p] = Some(Sent {
            last: now,
            tries: sent.tries + 1,
            order: self.sends,
            guesses: 0,
            ..sent
        });
    }

    /// Sends again every unanswered packet in flight whose timer ran out; how many. A
    /// packet the network has had its chance with ends the collective: its round and tries.
    pub(super) fn resend_due(
        &mut self,
        sender: &PacketSender<'_>,
        proven: bool,
        stamps: &mut CallStamps,
    ) -> Result<u32, (u32, u32)> {
        let (plan, now) = (sender.plan, Instant::now());
        let mut resent = 0;
        for p in self.in_flight() {
            let Some(sent) = self.sent[p] else {
                continue;
            };
            if self.done[p] || sent.last + backoff(plan, sent.tries, proven) > now {
                continue;
            }
            if sent.given_up(plan, now) {
                return Err((self.round(p), sent.tries));
            }
            sender.send(self, p, stamps);
            self.resent(p, sent, now);
            resent += 1;
        }
        Ok(resent)
    }

    /// When the next unanswered packet in flight is due again.
    pub(super) fn deadline(&self, plan: &NetPlan<'_>, proven: bool) -> Instant {
        self.in_flight()
            .filter(|&p| !self.done[p])
            .filter_map(|p| self.sent[p].map(|s| s.last + backoff(plan, s.tries, proven)))
            .min()
            .unwrap_or_else(Instant::now)
    }
}

/// Sends a leader's data packets the way its plan says.
pub(super) struct PacketSender<'a> {
    pub(super) wire: &'a dyn Wire,
    pub(super) me: usize,
    pub(super) ip: Ipv4Addr,
    pub(super) dst: Ipv4Addr,
    pub(super) plan: &'a NetPlan<'a>,
    pub(super) id: (Op, Dtype),
    pub(super) contribution: &'a [u8],
}

impl PacketSender<'_> {
    /// Packet `p`'s addressing, identity and payload.
    pub(super) fn parts(
        &self,
        rounds: &Rounds,
        p: usize,
    ) -> (Addressing, DataId, std::ops::Range<usize>) {
        let round = rounds.round(p);
        let addr = frames::addressing(self.ip, self.dst, round, INC_DEST_QP);
        let id = DataId {
            src_rank: self.me as u32,
            op: self.id.0,
            dtype: self.id.1,
            req_id: round as u8,
            pkt_index: p as u32,
        };
        (addr, id, rounds.bytes(p))
    }

    pub(super) fn send(&self, rounds: &Rounds, p: usize, stamps: &mut CallStamps) {
        let (addr, id, bytes) = self.parts(rounds, p);
        let body = &self.contribution[bytes];
        match self.plan.carrier {
            Carrier::Switch { .. } => {
                let pkt = frames::data(&addr, self.plan.wire_id, id, body);
                stamps.stamp(Stage::Framed);
                // A packet the wire did not take is sent again on its timer, like a lost one.
                let _ = self.wire.send(self.dst, &pkt);
            }
            Carrier::Nic(port) => {
                let frame = frames::data_frame(&addr, self.plan.wire_id, id, body);
                stamps.stamp(Stage::Framed);
                if let Err(e) = port.post(&frame) {
                    tracing::debug!(error = %e, "posting into the NIC failed");
                }
            }
        }
        stamps.stamp(Stage::Sent);
    }

    /// Sends the packets `ps` for the first time: through the switches as one window (in
    /// one system call, runs of equal length as UDP GSO super-datagrams on the INC socket:
    /// each packet built for the IPv4 id its segment gets).
    pub(super) fn send_first(&self, rounds: &Rounds, ps: &[usize], stamps: &mut CallStamps) {
        if ps.len() < 2 || !matches!(self.plan.carrier, Carrier::Switch { .. }) {
            for &p in ps {
                self.send(rounds, p, stamps);
            }
            return;
        }
        // The bodies stay in the message: the kernel gathers each packet from its pieces.
        // Each is numbered for the segment it leaves as, its ICRC computed once.
        let parts: Vec<_> = ps.iter().map(|&p| self.parts(rounds, p)).collect();
        let lens: Vec<usize> = parts
            .iter()
            .map(|(_, _, bytes)| payload_len(bytes.len()))
            .collect();
        let ids = self.wire.window_ids(&lens);
        let mut packets: Vec<DataDatagram<'_>> = parts
            .into_iter()
            .zip(ids)
            .map(|((addr, id, bytes), ip_id)| {
                let body = &self.contribution[bytes];
                DataDatagram::new(&addr, self.plan.wire_id, id, body, ip_id)
            })
            .collect();
        stamps.stamp(Stage::Framed);
        // A packet the wire did not take is sent again on its timer, like a lost one.
        if let Err(e) = self.wire.send_window(self.dst, &mut packets) {
            tracing::debug!(error = %e, "sending a window of packets failed");
        }
        stamps.stamp(Stage::Sent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Marks the packets `send_new` would send as sent once, in order; which.
    fn send_window(r: &mut Rounds) -> Vec<usize> {
        let now = Instant::now();
        let mut due = Vec::new();
        r.due_new(&mut due);
        for &p in &due {
            r.first_sent(p, now);
        }
        due
    }

    /// Rounds of `n` packets of which `window` may be in flight, and as many unanswered,
    /// the first window sent.
    fn started(n: usize, window: usize) -> Rounds {
        piped(n, window, window)
    }

    /// Rounds of `n` packets of which `window` may be in flight and `pipe` unanswered, the
    /// first packets sent.
    fn piped(n: usize, window: usize, pipe: usize) -> Rounds {
        let mut r = Rounds::default();
        r.reset(0, 8, 8 * n, (window, pipe));
        send_window(&mut r);
        r
    }

    /// Takes `q`'s result and refills the window; the packets it makes count as lost
    /// (recorded as resent, as `resend_overtaken` does after sending them).
    fn take(r: &mut Rounds, q: usize) -> Vec<usize> {
        r.complete(q, &[0; 8]);
        let lost: Vec<usize> = r.in_flight().filter(|&p| r.overtaken_by(p, q)).collect();
        for &p in &lost {
            r.guessed(p);
        }
        send_window(r);
        lost
    }

    /// Packet `p`'s timer sends it again.
    fn timer_resends(r: &mut Rounds, p: usize) {
        let sent = r.sent[p].unwrap();
        r.resent(p, sent, Instant::now());
    }

    #[test]
    fn a_packet_overtaken_by_three_later_results_counts_as_lost_once() {
        let mut r = started(8, 8);
        assert!(take(&mut r, 0).is_empty());
        // Packet 1 lost: 2 and 3 overtake it without a verdict, 4 is the third.
        assert!(take(&mut r, 2).is_empty());
        assert!(take(&mut r, 3).is_empty());
        assert_eq!(take(&mut r, 4), [1]);
        // A guess: neither a try nor a step of the timer's backoff.
        assert_eq!(r.sent[1].unwrap().tries, 1);
        // Results of packets sent before its resend are no evidence against it.
        for q in 5..8 {
            assert!(take(&mut r, q).is_empty());
        }
        assert!(take(&mut r, 1).is_empty());
        assert!(r.finished());
    }

    #[test]
    fn the_pipe_bounds_unanswered_packets_and_the_window_runs_past_a_lost_one() {
        let mut r = piped(40, 32, 8);
        assert_eq!(
            r.unanswered(),
            8,
            "the first send fills the pipe, not the window"
        );
        // Packet 0 is lost: each later result frees room for one new packet, even far past
        // the lost one (the window reaches 32 rounds).
        let last_sent = |r: &Rounds| r.sent.iter().rposition(Option::is_some);
        for q in 1..20 {
            let lost = take(&mut r, q);
            if q == 3 {
                assert_eq!(lost, [0], "three later results send it again");
            }
            assert_eq!(r.unanswered(), 8, "result {q}");
            assert_eq!(last_sent(&r), Some(7 + q), "result {q} let one more leave");
        }
        assert_eq!(r.oldest, 0);
        // The window's end holds it: nothing past round 31 while round 0 is unanswered.
        for q in 20..32 {
            take(&mut r, q);
        }
        assert_eq!(last_sent(&r), Some(31));
        assert!(take(&mut r, 0).is_empty());
        assert_eq!(r.oldest, 32);
        assert_eq!(last_sent(&r), Some(39), "the pipe refilled at once");
    }

    #[test]
    fn results_in_order_resend_nothing() {
        let mut r = started(64, 16);
        for q in 0..64 {
            assert!(take(&mut r, q).is_empty(), "result {q}");
        }
        assert!(r.finished());
    }

    #[test]
    fn packets_sent_as_the_window_slides_overtake_a_lost_one() {
        let mut r = started(8, 4);
        assert!(take(&mut r, 0).is_empty());
        // The window slid to 1..5: packet 4 left after packet 1, which is lost.
        assert_eq!(r.sent[4].unwrap().tries, 1);
        assert!(take(&mut r, 2).is_empty());
        assert!(take(&mut r, 3).is_empty());
        assert_eq!(take(&mut r, 4), [1]);
        // Its resend answered, the window slides on.
        assert!(take(&mut r, 1).is_empty());
        for q in 5..8 {
            assert!(take(&mut r, q).is_empty());
        }
        assert!(r.finished());
    }

    #[test]
    fn a_packet_is_guessed_lost_again_on_later_evidence_up_to_the_cap() {
        let mut r = started(17, 17);
        assert!(take(&mut r, 1).is_empty());
        assert!(take(&mut r, 2).is_empty());
        assert_eq!(take(&mut r, 3), [0]);
        // Results of packets sent before the guess are no evidence against it.
        for q in [4, 5, 6] {
            assert!(!take(&mut r, q).contains(&0), "result {q}");
        }
        // The resend is lost too: three results of packets sent after it guess again,
        // up to MAX_GUESSES between the timer's sends.
        for guess in 2..=MAX_GUESSES {
            let later: Vec<usize> = (0..3).map(|k| 7 + 3 * usize::from(guess - 2) + k).collect();
            for &q in &later {
                timer_resends(&mut r, q);
            }
            // (The packets still in flight from the first window are overtaken too: the
            // timer's sends of 7, 8 and 9 left after them.)
            let lost: Vec<usize> = later.iter().flat_map(|&q| take(&mut r, q)).collect();
            assert!(lost.contains(&0), "guess {guess}: {lost:?}");
            assert_eq!(r.sent[0].unwrap().guesses, guess);
        }
        assert_eq!(r.sent[0].unwrap().guesses, MAX_GUESSES);
        for q in [13, 14, 15] {
            timer_resends(&mut r, q);
        }
        for q in [13, 14, 15] {
            assert!(!take(&mut r, q).contains(&0), "past the cap: result {q}");
        }
        // A guess is neither a try nor a step of the backoff; its timer's send is, and
        // makes later results count against it again.
        assert_eq!(r.sent[0].unwrap().tries, 1);
        timer_resends(&mut r, 0);
        assert_eq!(r.sent[0].unwrap().tries, 2);
        assert_eq!(r.sent[0].unwrap().guesses, 0);
        timer_resends(&mut r, 16);
        take(&mut r, 16);
        assert_eq!(r.overtaken[0], 1);
    }
}
