//! What a leader answers without its application, on the thread that reads the socket
//! (the caller's during a collective, the progress thread between them): the state both
//! share, the leaders' addresses, and what a received datagram means. Answers leave
//! through a [`Wire`] (the leader's INC socket; a scripted one in the tests).

use std::collections::VecDeque;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use innet_common::codec::Addressing;
use innet_common::proto::{COMM_TYPE_CLIMB, Dtype, HOST_COMM_ID, MASTER_DPU_SETUP, Op, PacketKind};
use innet_common::validate::Verdict;
use innet_common::wire::ControlPayload;

use super::{
    FINAL_ANSWER_GAP, HOST_PAYLOAD_BYTES, Incoming, MAX_GENERATION_LEAP, MAX_SEQ_AHEAD,
    NOTICE_SEQ_SPAN, Notice, STEP_BYE, STEP_FINAL, STEP_NACK, STEP_REGROUP, host_exchange, refused,
};
use crate::assembly::before;
use crate::frames::{DataId, Frame, MASK24};
use crate::handshake::{Notices, Wire};
use crate::{assembly, frames, inbox};

/// A finished collective: (sequence number, op, type, wire-order result).
pub(super) type Final = (u32, Op, Dtype, Arc<Vec<u8>>);

#[derive(Default)]
pub(super) struct Shared {
    /// Recent final results, for peers that still need them.
    pub(super) finals: Mutex<VecDeque<Final>>,
    /// The notifies this leader sent as an MRR, each NMRR's (for repeated queries and the
    /// kill, which follows the same paths).
    pub(super) notify: Mutex<Notices>,
    /// The wire id of the group in use (0: none), to tell its stray contributions.
    pub(super) wire_id: AtomicU32,
    /// The generation of the group in use.
    pub(super) generation: AtomicU32,
    /// The newest word that the group is gone, once its generation is newer than the one in
    /// use; `heard` mirrors its generation for a lock-free check.
    pub(super) notice: Mutex<Option<Notice>>,
    pub(super) heard: AtomicU32,
    /// The collective this leader runs or ran last (24 bits), which notices are weighed
    /// against.
    pub(super) seq: AtomicU32,
    /// The member's parent in a DPU tree (0: none), the only address its results come from.
    pub(super) parent: AtomicU32,
    /// What this endpoint refused, by attack.
    pub(super) refused: refused::Counters,
    /// The final results sent to late peers, by (peer, collective).
    pub(super) answered: Mutex<Option<host_exchange::Pacer<(usize, u32)>>>,
}

/// Addresses of the leaders, shared with the progress thread.
#[derive(Clone)]
pub(super) struct Peers {
    pub(super) me: usize,
    pub(super) ip: Ipv4Addr,
    /// The job's partition key, carried by its host-to-host packets.
    pub(super) pkey: u16,
    pub(super) ips: Arc<Vec<Ipv4Addr>>,
}

impl Peers {
    /// The leader whose address `from` is, if any (the first, when leaders share one).
    pub(super) fn leader_at(&self, from: SocketAddr) -> Option<usize> {
        let SocketAddr::V4(from) = from else {
            return None;
        };
        self.ips.iter().position(|ip| ip == from.ip())
    }

    /// The rank host frame `f` claims, when it is a leader's and `from` is that leader's
    /// address.
    pub(super) fn sent_by(&self, f: &Frame, from: SocketAddr) -> Option<usize> {
        let rank = usize::try_from(f.inc.src_rank()).ok()?;
        let ip = self.ips.get(rank)?;
        matches!(from, SocketAddr::V4(a) if a.ip() == ip).then_some(rank)
    }

    /// Sends a host message (any length; none at all when empty) to leader `to`.
    pub(super) fn send_host(
        &self,
        sock: &dyn Wire,
        to: usize,
        seq: u32,
        step: u8,
        id: (Op, Dtype),
        data: &[u8],
    ) -> io::Result<()> {
        self.send_host_packets(sock, to, (seq, step), id, data, |_| true)
    }

    /// Sends the packets of a host message that `wanted` names (by index).
    pub(super) fn send_host_packets(
        &self,
        sock: &dyn Wire,
        to: usize,
        (seq, step): (u32, u8),
        (op, dtype): (Op, Dtype),
        data: &[u8],
        wanted: impl Fn(usize) -> bool,
    ) -> io::Result<()> {
        let per = frames::packet_bytes(op, dtype, HOST_PAYLOAD_BYTES);
        for (i, chunk) in data.chunks(per).enumerate().filter(|(i, _)| wanted(*i)) {
            let addr = Addressing {
                pkey: self.pkey,
                ..frames::addressing(self.ip, self.ips[to], i as u32, seq)
            };
            let id = DataId {
                src_rank: self.me as u32,
                op,
                dtype,
                req_id: step,
                pkt_index: i as u32,
            };
            let p = frames::data(&addr, HOST_COMM_ID, id, chunk);
            sock.send(self.ips[to], &p)?;
        }
        Ok(())
    }
}

impl Shared {
    /// Collective `seq` is (about to be) under way on this leader.
    pub(super) fn note_seq(&self, seq: u32) {
        self.seq.store(seq & MASK24, Relaxed);
    }

    /// Results come from `parent` only (a DPU tree), or from the leaders' addresses (`None`:
    /// switches).
    pub(super) fn set_parent(&self, parent: Option<Ipv4Addr>) {
        self.parent.store(parent.map_or(0, u32::from), Relaxed);
    }

    /// Whether a result from `from` comes down the member's tree: from its DPU (a DPU
    /// tree), else from a leader's address (a switch delivers a result with the headers of
    /// a leader's packet to the member, or of the member's own turned around).
    pub(super) fn comes_down_the_tree(&self, peers: &Peers, from: SocketAddr) -> bool {
        match self.parent.load(Relaxed) {
            0 => peers.leader_at(from).is_some(),
            parent => matches!(from, SocketAddr::V4(a) if u32::from(*a.ip()) == parent),
        }
    }

    /// This leader found the group in use gone: every leader sets up the next generation
    /// after collective `after`.
    pub(super) fn announce(&self, sock: &dyn Wire, peers: &Peers, after: u32) {
        // At the last generation there is no next one: the loss stays unannounced (and this
        // collective on the hosts) rather than the generation wrapping to an old group's.
        let Some(generation) = self.generation.load(Relaxed).checked_add(1) else {
            return;
        };
        let n = Notice {
            generation,
            seq: after & MASK24,
        };
        self.take_gone_notice(sock, peers, n);
    }

    /// Takes in a notice that the group is gone: the first one of a generation newer than
    /// the one in use is kept and passed on to every other leader once (so one lost packet
    /// cannot leave a leader behind).
    pub(super) fn take_gone_notice(&self, sock: &dyn Wire, peers: &Peers, n: Notice) {
        let current = self.generation.load(Relaxed);
        if n.generation <= current {
            return;
        }
        // A spoofed notice far ahead (up to u32::MAX) would move the job to a generation
        // no peer uses, or keep its collectives on the hosts until a far collective.
        let near = |a: u32, b: u32| (a.wrapping_sub(b) & MASK24) <= NOTICE_SEQ_SPAN;
        let now = self.seq.load(Relaxed);
        if n.generation - current > MAX_GENERATION_LEAP || !(near(n.seq, now) || near(now, n.seq)) {
            refused::count(&self.refused.regroup_out_of_range);
            return;
        }
        let mut notice = self.notice.lock().expect("notice");
        match notice.as_mut() {
            Some(old) if old.generation > n.generation => return,
            // Two leaders found out in two collectives: the earlier one counts, so every
            // leader sets the group up before the same collective.
            Some(old) if old.generation == n.generation => {
                if before(n.seq & MASK24, old.seq & MASK24) {
                    old.seq = n.seq;
                }
                return;
            }
            _ => *notice = Some(n),
        }
        self.heard.store(n.generation, Relaxed);
        drop(notice);
        let (step, id) = (STEP_REGROUP, (Op::Sum, Dtype::U8));
        for i in (0..peers.ips.len()).filter(|&i| i != peers.me) {
            let _ = peers.send_host(sock, i, n.seq & MASK24, step, id, &n.body());
        }
    }

    /// Answers a host packet of a collective this leader has finished with its final
    /// result (once per message: on its first packet). Returns whether it was answered.
    pub(super) fn answer_from_finals(&self, sock: &dyn Wire, peers: &Peers, f: &Frame) -> bool {
        let seq = f.deth.src_qp();
        let finals = self.finals.lock().expect("finals");
        let Some((_, op, dtype, result)) = finals.iter().find(|(s, ..)| *s == seq) else {
            return false;
        };
        let from = f.inc.src_rank() as usize;
        if f.bth.psn() == 0 && from < peers.ips.len() {
            let mut answered = self.answered.lock().expect("answered");
            let pacer = answered.get_or_insert_with(|| host_exchange::Pacer::new(FINAL_ANSWER_GAP));
            // Forged requests (or a late peer's every step) making this leader send its
            // whole result at their rate.
            if !pacer.allow((from, seq), Instant::now()) {
                refused::count(&self.refused.resend_rate_limited);
                return true;
            }
            drop(answered);
            let _ = peers.send_host(sock, from, seq, STEP_FINAL, (*op, *dtype), result);
        }
        true
    }

    /// MRR: a repeated query (its notify was lost) gets the notify again.
    pub(super) fn answer_query(
        &self,
        sock: &dyn Wire,
        peers: &Peers,
        from: SocketAddr,
        q: &ControlPayload,
    ) {
        let SocketAddr::V4(from) = from else { return };
        let notify = self.notify.lock().expect("notify");
        // A request to a DPU that has no daemon lands here: it is no query of the group.
        // Nor is a late copy of the MRR's own climb (it comes back with the addresses swapped).
        if let Some((_, n)) = notify.iter().find(|(to, _)| to == from.ip())
            && q.master_num != MASTER_DPU_SETUP
            && q.sup_comm_type != COMM_TYPE_CLIMB
            && n.true_comm_id() == q.true_comm_id()
        {
            let p = frames::control(peers.ip, *from.ip(), PacketKind::Notify, peers.me as u32, n);
            let _ = sock.send(*from.ip(), &p);
        }
    }
}

/// What a received datagram means: answered here (a repeated query, a late peer's request
/// for a finished collective), ignored (not ours), or an event for the collective.
pub(super) fn classify(
    sock: &dyn Wire,
    peers: &Peers,
    shared: &Shared,
    datagram: &[u8],
    from: SocketAddr,
) -> Option<Incoming> {
    let f = frames::parse(datagram)?;
    let wire_id = shared.wire_id.load(Relaxed);
    let data = matches!(f.verdict, Verdict::Data { .. });
    if wire_id != 0 && f.inc.group() == wire_id && data && !f.is_result() {
        // A "group vanished" forged from outside the job: set-ups over and over.
        if peers.leader_at(from).is_none() {
            refused::count(&shared.refused.stray_spoofed);
            return None;
        }
        return Some(Incoming::Stray { wire_id });
    }
    if let Some(c) = f.control() {
        if f.verdict == Verdict::Control(PacketKind::Query) {
            shared.answer_query(sock, peers, from, &c);
        }
        return None;
    }
    if f.is_result() {
        // Another group's results (or any while no group is in use): queued for nothing.
        if wire_id == 0 || f.inc.group() != wire_id {
            refused::count(&shared.refused.result_of_other_group);
            return None;
        }
        // A result forged from outside the member's tree: a wrong result.
        if !shared.comes_down_the_tree(peers, from) {
            refused::count(&shared.refused.result_spoofed);
            return None;
        }
        Some(Incoming::Result(f))
    } else if f.is_host() && f.bth.pkey() == peers.pkey {
        // A host frame (goodbye, notice, final, NACK, step) forged by a host outside the
        // job or by a leader under another's rank.
        let Some(rank) = peers.sent_by(&f, from) else {
            refused::count(&shared.refused.host_frame_spoofed);
            return None;
        };
        match f.inc.req_id {
            STEP_BYE => Some(Incoming::Bye(rank)),
            STEP_REGROUP => {
                let n = Notice::parse(&f)?;
                shared.take_gone_notice(sock, peers, n);
                Some(Incoming::Regroup)
            }
            STEP_FINAL => Some(Incoming::Host(f)),
            _ if shared.answer_from_finals(sock, peers, &f) => None,
            _ => Some(Incoming::Host(f)),
        }
    } else {
        None
    }
}

/// Packets host packet `f`'s message can have, while collective `seq` (`total` bytes, when
/// known) runs; `None` when its collective or step is none a peer can send now. A peer is
/// at most a collective ahead (it needs this leader's contribution to finish one), so
/// packets of a collective further on, or of a step no algorithm uses, only take memory
/// until a collective that may never come; a NACK is one packet; a message of this
/// collective is at most its length.
pub(super) fn packets_of(f: &Frame, seq: u32, total: Option<usize>) -> Option<usize> {
    let of = f.deth.src_qp();
    let step = f.inc.req_id;
    let known = usize::from(step) < crate::hostalg::ALGORITHM_STEPS || step == STEP_FINAL;
    // Keys the message cannot have: a collective far ahead, an unknown step.
    if (of.wrapping_sub(seq) & MASK24) > MAX_SEQ_AHEAD || !(known || step == STEP_NACK) {
        return None;
    }
    let Verdict::Data { op, dtype, .. } = f.verdict else {
        return None;
    };
    Some(match total {
        _ if step == STEP_NACK => 1,
        Some(total) if of == seq & MASK24 => total
            .div_ceil(frames::packet_bytes(op, dtype, HOST_PAYLOAD_BYTES))
            .max(1),
        _ => assembly::MAX_MESSAGE_PACKETS,
    })
}

/// Keeps event `e` for the collective, unless [`inbox::BACKLOG_MAX`] are kept already.
pub(super) fn defer(deferred: &mut VecDeque<Incoming>, refused: &refused::Counters, e: Incoming) {
    // A flood while the leaders set their group up again: memory without bound.
    if deferred.len() >= inbox::BACKLOG_MAX {
        refused::count(&refused.aside_full);
        return;
    }
    deferred.push_back(e);
}
