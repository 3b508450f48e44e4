//! The host-to-host side of a leader's endpoint: the messages of one host-algorithm
//! collective ([`hostalg`](super::super::hostalg)) over the leaders' INC sockets, with
//! requests to send a step again (NACKs) for what a peer lacks.

use std::{
    collections::HashMap,
    hash::Hash,
    time::{Duration, Instant},
};

use innet_common::proto::{Dtype, Op};

use super::{
    Endpoint, HOST_PAYLOAD_BYTES, Incoming, MAX_NACK_PACKETS, STEP_FINAL, STEP_NACK,
    refused::{self, Counters},
};
use crate::{
    Error,
    assembly::Assembly,
    frames::{self, MASK24},
    hostalg::{Exchange, Received},
};

/// Answers to requests by key, at most one per `gap`: a peer asks again only after its
/// retry timer, so requests sooner than that are forged (or duplicates) and a flood of
/// them must not make this leader send whole messages at their rate.
pub(super) struct Pacer<K> {
    gap: Duration,
    last: HashMap<K, Instant>,
}

/// Packets of a host message sent between two looks at the socket: 64 KiB of payload,
/// a few milliseconds of a slow link, well inside a receive buffer.
const SEND_SLICE_PACKETS: usize = 64;

/// Keys a pacer remembers before it forgets those older than its gap.
const PACER_KEYS: usize = 1024;

impl<K: Hash + Eq> Pacer<K> {
    pub(super) fn new(gap: Duration) -> Self {
        Self {
            gap,
            last: HashMap::new(),
        }
    }

    /// Whether a request for `key` at `now` is answered (then it counts as the last).
    pub(super) fn allow(&mut self, key: K, now: Instant) -> bool {
        if self.last.len() >= PACER_KEYS {
            let gap = self.gap;
            self.last
                .retain(|_, t| now.saturating_duration_since(*t) < gap);
        }
        match self.last.get_mut(&key) {
            Some(t) if now.saturating_duration_since(*t) < self.gap => false,
            Some(t) => {
                *t = now;
                true
            }
            None => {
                self.last.insert(key, now);
                true
            }
        }
    }
}

/// A complete final result of collective `seq` (`total` bytes in packets of `per`) from a
/// leader `asked` says this one asked for it (it waits for that leader, or sent to it: a
/// finished leader answers what it gets with the final result); finals from others are
/// dropped and counted.
pub(super) fn take_final(
    pending: &mut Assembly,
    (seq, total, per): (u32, usize, usize),
    asked: impl Fn(usize) -> bool,
    refused: &Counters,
) -> Option<Vec<u8>> {
    for src in pending.senders(seq, STEP_FINAL) {
        // A result slipped in by a leader nobody asked: a wrong result.
        if !asked(src) {
            pending.discard((seq, src, STEP_FINAL));
            refused::count(&refused.final_from_unasked_rank);
            continue;
        }
        if let Some(data) = pending.take_message((seq, src, STEP_FINAL), total, per) {
            return Some(data);
        }
    }
    None
}

impl Endpoint {
    /// The host-to-host exchange for collective `seq`, valid until `deadline`.
    pub fn exchange(
        &mut self,
        seq: u32,
        (op, dtype): (Op, Dtype),
        total: usize,
        deadline: Instant,
        retry: Duration,
    ) -> UdpExchange<'_> {
        self.shared.note_seq(seq);
        UdpExchange {
            ep: self,
            seq: seq & MASK24,
            op,
            dtype,
            total,
            deadline,
            retry,
            sent: vec![],
            nacks: Pacer::new(retry / 2),
        }
    }
}

/// Host messages of one collective over the leaders' INC sockets.
pub struct UdpExchange<'a> {
    ep: &'a mut Endpoint,
    seq: u32,
    op: Op,
    dtype: Dtype,
    /// Bytes of the collective's result (the length of a final-result message).
    total: usize,
    deadline: Instant,
    /// First wait before asking a peer again for a missing message (doubles each time).
    retry: Duration,
    /// What this leader sent in this collective: (to, step, data), for peers that ask again.
    sent: Vec<(usize, u8, Vec<u8>)>,
    /// The NACKs answered, by (peer, step).
    nacks: Pacer<(usize, u8)>,
}

impl UdpExchange<'_> {
    /// Answers the peers' requests to send a step of this collective again.
    fn answer_nacks(&mut self) -> Result<(), Error> {
        let seq = self.seq;
        for f in self.ep.pending.take_step(seq, STEP_NACK) {
            let (to, step) = (f.inc.src_rank() as usize, f.body().first().copied());
            // Forged NACKs making this leader resend a whole step at their rate.
            if !self.nacks.allow((to, step.unwrap_or(0)), Instant::now()) {
                refused::count(&self.ep.shared.refused.resend_rate_limited);
                continue;
            }
            // The rest of the body: a bitmap of the packets the peer has.
            let has = |i: usize| {
                f.body()
                    .get(1 + i / 8)
                    .is_some_and(|b| b & (1 << (i % 8)) != 0)
            };
            for (_, s, data) in self
                .sent
                .iter()
                .filter(|(t, s, _)| *t == to && Some(*s) == step)
            {
                self.ep
                    .peers
                    .send_host_packets(
                        &*self.ep.wire,
                        to,
                        (seq, *s),
                        (self.op, self.dtype),
                        data,
                        |i| !has(i),
                    )
                    .map_err(Error::Io)?;
            }
        }
        Ok(())
    }

    /// Keeps the host packets that arrived, without waiting (other events wait for nothing
    /// in a host exchange, as in [`Exchange::recv`]).
    fn take_arrived(&mut self) {
        let now = Instant::now();
        while let Some(incoming) = self.ep.next(now) {
            if let Incoming::Host(f) = incoming {
                self.ep.keep_host_packet(f, self.seq, Some(self.total));
            }
        }
    }

    /// NACK body: the step, then a bitmap of the packets of `from`'s step message held.
    fn nack(&self, from: usize, step: u8) -> Vec<u8> {
        let mut body = vec![step];
        for i in self.ep.pending.held_indices((self.seq, from, step)) {
            if i < MAX_NACK_PACKETS {
                if body.len() < 2 + i / 8 {
                    body.resize(2 + i / 8, 0);
                }
                body[1 + i / 8] |= 1 << (i % 8);
            }
        }
        body
    }

    /// A complete message (step `step`, from `from`, or a final result from a leader this
    /// one asked) out of the pending packets.
    fn assemble(&mut self, from: usize, step: u8, len: usize) -> Option<Received> {
        let per = frames::packet_bytes(self.op, self.dtype, HOST_PAYLOAD_BYTES);
        let pending = &mut self.ep.pending;
        if let Some(data) = pending.take_message((self.seq, from, step), len, per) {
            return Some(Received::Data(data));
        }
        let sent = &self.sent;
        let asked = |src: usize| src == from || sent.iter().any(|(to, ..)| *to == src);
        let key = (self.seq, self.total, per);
        take_final(pending, key, asked, &self.ep.shared.refused).map(Received::Final)
    }
}

impl Exchange for UdpExchange<'_> {
    type Error = Error;

    /// Sends in slices of [`SEND_SLICE_PACKETS`], taking what arrived in between: on a
    /// link slower than the host, the socket's send buffer fills and each send waits for
    /// the link, while the peer sending to this leader fills its receive buffer. Sent
    /// whole, a step of a long message overflowed it (a 4 MiB ring at 200 Mbit/s lost a
    /// quarter of its packets to `UdpRcvbufErrors`, each recovered on a NACK timer).
    fn send(&mut self, to: usize, step: u8, data: &[u8]) -> Result<(), Error> {
        self.sent.push((to, step, data.to_vec()));
        let per = frames::packet_bytes(self.op, self.dtype, HOST_PAYLOAD_BYTES);
        let packets = data.len().div_ceil(per);
        let mut first = 0;
        while first < packets {
            let end = (first + SEND_SLICE_PACKETS).min(packets);
            self.ep
                .peers
                .send_host_packets(
                    &*self.ep.wire,
                    to,
                    (self.seq, step),
                    (self.op, self.dtype),
                    data,
                    |i| (first..end).contains(&i),
                )
                .map_err(Error::Io)?;
            first = end;
            if first < packets {
                self.take_arrived();
            }
        }
        Ok(())
    }

    fn recv(&mut self, from: usize, step: u8, len: usize) -> Result<Received, Error> {
        if len == 0 {
            return Ok(Received::Data(vec![]));
        }
        // A message sent before this leader's socket existed, or lost, is asked for again.
        let mut wait = self.retry;
        let mut ask_at = Instant::now() + wait;
        let mut held = self.ep.pending.held();
        loop {
            self.answer_nacks()?;
            if let Some(r) = self.assemble(from, step, len) {
                return Ok(r);
            }
            // Packets still coming: the timer counts from the last. A long message on a
            // slow link takes longer than the retry to arrive, and asking for its packets
            // still on the way had them sent twice into the full link (a 4 MiB ring at 200
            // Mbit/s ran at a sixth of its bound).
            let now_held = self.ep.pending.held();
            if now_held != held {
                held = now_held;
                ask_at = Instant::now() + wait;
            }
            if Instant::now() >= ask_at {
                let nack = self.nack(from, step);
                self.ep
                    .peers
                    .send_host(
                        &*self.ep.wire,
                        from,
                        self.seq,
                        STEP_NACK,
                        (Op::Sum, Dtype::U8),
                        &nack,
                    )
                    .map_err(Error::Io)?;
                // Capped like the network's retries: under loss, long waits only add up.
                wait = (wait * 2).min(self.retry * 8);
                ask_at = Instant::now() + wait;
            }
            match self.ep.next(ask_at.min(self.deadline)) {
                Some(Incoming::Host(f)) => self.ep.keep_host_packet(f, self.seq, Some(self.total)),
                Some(_) => {}
                None if Instant::now() < self.deadline => {}
                None => {
                    tracing::debug!(
                        seq = self.seq,
                        from,
                        step,
                        len,
                        pending = self.ep.pending.held(),
                        "no host message in time"
                    );
                    return Err(Error::Timeout {
                        what: "the other leaders' host allreduce messages",
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
