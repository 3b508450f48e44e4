//! A leader's network endpoint: its INC socket and the two ways a leader reduces with the
//! others — through the switches (windowed, with retransmission) and host to host (the
//! [`hostalg`](super::hostalg) algorithms over UDP).
//!
//! The calling thread reads the socket itself during a collective ([`Inbox`]); while the
//! application is away, the progress thread answers on the leader's behalf what must not
//! wait: a peer still working on a collective this leader has finished gets its final
//! result, and an NMRR whose notify was lost gets it again.
//!
//! `network` runs a collective through the network (switches or the NIC tree), with
//! `window` holding its rounds in flight and sending them; `host_exchange` carries the
//! host-to-host messages of the host algorithms.

use std::{
    cell::RefCell,
    collections::{HashSet, VecDeque},
    io,
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    os::fd::RawFd,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use innet_common::{
    demux,
    group::MAX_WINDOW,
    proto::{DEFAULT_PAYLOAD_BYTES, Dtype, Op},
};

use crate::{
    assembly::{self, Assembly, before},
    frames::{Frame, MASK24},
    handshake::Notices,
    inbox::{self, Inbox},
    inc_socket,
    sendmany::Gso,
    wire::{IncWire, Wire},
};

mod answer;
mod host_exchange;
mod network;
mod refused;
mod window;
use answer::{Peers, Shared, classify, defer, packets_of};
pub use network::{Carrier, NetAbort, NetPlan, NodeStage};
use window::Rounds;

/// Rounds a leader keeps in flight with a window of `window` slots per group (the smallest
/// along its group's path): half of it, so a round's result is never evicted while some
/// leader may still ask for it again (every leader that sends round `r + window` has seen
/// the result of `r + window/2`, which needed every leader's contribution to it, sent only
/// after each had the result of `r`).
#[must_use]
pub fn in_flight(window: u16) -> usize {
    usize::from(window.min(MAX_WINDOW as u16) / 2).max(1)
}
/// Host-packet step that carries a collective's final result.
pub const STEP_FINAL: u8 = 0xff;
/// Host-packet step that says "this leader is done with the communicator".
const STEP_BYE: u8 = 0xfe;
/// Host-packet step that asks a peer to send one step's message again (its body: the step).
/// A peer that has finished the collective answers with the final result instead.
pub const STEP_NACK: u8 = 0xfd;
/// Host-packet step that says "the switches lost the group: set it up again" (its body: a
/// [`Notice`]).
pub const STEP_REGROUP: u8 = 0xfc;
// The host algorithms' steps stay below the transport's own.
const _: () = assert!(STEP_REGROUP as usize >= super::hostalg::ALGORITHM_STEPS);
/// Packets a NACK's bitmap can name (one packet's worth of bitmap); later ones are asked
/// for again whole.
const MAX_NACK_PACKETS: usize = 8 * (HOST_PAYLOAD_BYTES - 1);
/// Payload of host-to-host packets: the 1500 B MTU's, which every link carries (both ends
/// must split a message alike, with or without a group to negotiate through).
const HOST_PAYLOAD_BYTES: usize = DEFAULT_PAYLOAD_BYTES;
/// How many collectives past the one in progress a host packet may belong to: a peer is at
/// most one ahead; two leaves a margin.
const MAX_SEQ_AHEAD: u32 = 2;
/// Final results kept for peers that still need them, and their bytes at most (beyond the
/// newest). A peer that needs a final result is at most one collective behind: it has sent
/// its contribution to the newest one, so it finished the one before.
const FINALS_KEPT: usize = 64;
const FINALS_BYTES: usize = 16 << 20;
/// How far above the generation in use a regroup notice may be. A leader announces its own
/// generation + 1, and the leaders are at most a collective apart (each needs every
/// other's contribution to finish one): a leader a collective behind may hear of the
/// generation its peers set up and then lost (+ 2), and two leaders that lost in two
/// collectives in a row may overlap (+ 3). 4 leaves room for that and stops a spoofed
/// notice from throwing the job far ahead or to `u32::MAX` (which it never reaches
/// honestly: 4 billion regroups).
pub(crate) const MAX_GENERATION_LEAP: u32 = 4;
/// How far before or after the collective in use a regroup notice's collective may be:
/// a peer announces the loss for its collective or the next, and is at most one collective
/// ahead or behind. A notice for a collective far ahead would keep every collective until
/// then on the hosts ([`Endpoint::told`]).
const NOTICE_SEQ_SPAN: u32 = 8;
/// Least time between two final results sent to one peer for one collective: a late peer
/// asks again only after its retry timer (20 ms by default), while its every step's first
/// packet (or a forged one) would otherwise bring the whole result at once.
const FINAL_ANSWER_GAP: Duration = Duration::from_millis(5);
/// First retransmission timer of a group that has not delivered yet ([`backoff`]).
const FIRST_RETRY_OF_A_NEW_GROUP: Duration = Duration::from_millis(2);
/// Sleep between polls of a NIC's completions once the spin budget is spent.
const POLL_SLICE: Duration = Duration::from_micros(50);

/// A received packet the collective in progress must see.
pub enum Incoming {
    Result(Frame),
    Host(Frame),
    Bye(usize),
    /// A contribution of group `wire_id` came back to a host unaggregated: the first switch
    /// on its way no longer holds the group (switches consume every packet of a group
    /// they hold).
    Stray {
        wire_id: u32,
    },
    /// A peer's word that the group is gone (kept in `Shared::notice`).
    Regroup,
}

/// "The group the leaders used until now is gone": the collective `seq` that found out runs
/// on the hosts, and before the next one the leaders set up generation `generation` of
/// their group. A leader already in the next one on the old group when the word comes
/// leaves it ([`NetAbort::Regroup`]), sets the group up too and sends again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Notice {
    pub generation: u32,
    pub seq: u32,
}

/// Whether the leaders set the group of notice `n` up before collective `seq`.
fn regroup_before(n: Notice, seq: u32) -> bool {
    before(n.seq & MASK24, seq & MASK24)
}

impl Notice {
    fn body(self) -> [u8; 4] {
        self.generation.to_le_bytes()
    }

    fn parse(f: &Frame) -> Option<Self> {
        let b: &[u8; 4] = f.body().get(..4)?.try_into().ok()?;
        Some(Self {
            generation: u32::from_le_bytes(*b),
            seq: f.deth.src_qp(),
        })
    }
}

/// A collective sent ahead: (sequence number, op and type, wire id, first round, bytes).
type PreSent = (u32, (Op, Dtype), u32, u32, usize);

/// Which of UDP GSO and GRO a leader's INC socket uses ([`Config::gso`](crate::Config::gso),
/// [`Config::gro`](crate::Config::gro)).
#[derive(Clone, Copy, Debug, Default)]
pub struct Batching {
    pub gso: bool,
    pub gro: bool,
}

/// A leader's network endpoint.
pub struct Endpoint {
    /// This socket's registration with its address's selector (kept while it is bound).
    share: Option<inc_socket::Share>,
    /// The INC socket: the inbox reads it, the progress machinery polls it.
    pub sock: Arc<UdpSocket>,
    /// Where every frame this leader sends leaves: the socket ([`IncWire`], windows as GSO
    /// super-datagrams while the kernel takes them), a scripted wire in the tests.
    wire: Arc<dyn Wire + Send + Sync>,
    peers: Peers,
    shared: Arc<Shared>,
    inbox: Inbox<Incoming>,
    /// Host packets of collectives not finished yet.
    pending: Assembly,
    byes: HashSet<usize>,
    /// Absolute aggregation round of the next data packet.
    next_round: u32,
    results_seen: u64,
    /// The INC-socket keys of the group in use and of the one it would be set up again as.
    comm_keys: [u32; 2],
    /// Events received on the way by a handshake that set the group up again.
    deferred: RefCell<VecDeque<Incoming>>,
    /// The network collective in progress (kept between calls for its buffers).
    rounds: Rounds,
    /// The collective whose first window [`pre_send`](Self::pre_send) sent: (sequence
    /// number, op and type, wire id, first round, bytes); `rounds` holds its state.
    pre_sent: Option<PreSent>,
    /// Whether a collective went through the group in use: every switch held it then, so a
    /// contribution that comes back unaggregated later means it is gone (before, it may
    /// only mean a switch has not installed it yet).
    proven: bool,
}

impl Endpoint {
    /// Binds the INC socket of leader `me` at `ips[me]` for communicator `comm` (its
    /// `true_comm_id`) and the id `next` it would be set up again as; host packets carry
    /// `pkey`. Other communicators' leaders may share the address (see
    /// [`inc_socket`]). `batching` says whether the socket sends with UDP GSO and receives
    /// with UDP GRO (left off, with a debug message, where the kernel does not know it).
    ///
    /// # Errors
    /// The address is not on this host, or UDP port 4791 cannot be shared there.
    pub fn bind(
        me: usize,
        ips: Vec<Ipv4Addr>,
        (comm, next): (u32, u32),
        pkey: u16,
        spin: Duration,
        batching: Batching,
    ) -> io::Result<Self> {
        let ip = ips[me];
        let comm_keys = [demux::comm_key(comm), demux::comm_key(next)];
        let bound = inc_socket::bind(ip, &[comm_keys[0], demux::host_key(pkey), comm_keys[1]])?;
        let sock = Arc::new(bound.sock);
        set_receive_buffer(&sock, 4 << 20);
        let gro = batching.gro
            && inbox::set_gro(&sock)
                .inspect_err(|e| tracing::debug!(error = %e, "no UDP GRO on the INC socket"))
                .is_ok();
        let wire = Arc::new(IncWire {
            sock: sock.clone(),
            gso: Gso::new(batching.gso),
        });
        let peers = Peers {
            me,
            ip,
            pkey,
            ips: Arc::new(ips),
        };
        let mut ep = Self::on(sock, wire, peers, comm_keys, (spin, gro))?;
        ep.share = bound.share;
        Ok(ep)
    }

    /// A leader of `peers` that reads `sock` and sends through `wire`, for the group of
    /// `comm_keys` ([`bind`](Self::bind) without the address's selector; the tests' leader
    /// on a scripted wire).
    fn on(
        sock: Arc<UdpSocket>,
        wire: Arc<dyn Wire + Send + Sync>,
        peers: Peers,
        comm_keys: [u32; 2],
        (spin, gro): (Duration, bool),
    ) -> io::Result<Self> {
        let shared = Shared {
            wire_id: AtomicU32::new(comm_keys[0]),
            ..Shared::default()
        };
        Ok(Self {
            share: None,
            inbox: Inbox::with_gro(sock.clone(), spin, gro)?,
            wire,
            sock,
            peers,
            shared: Arc::new(shared),
            pending: Assembly::default(),
            byes: HashSet::new(),
            next_round: 0,
            results_seen: 0,
            comm_keys,
            deferred: RefCell::default(),
            rounds: Rounds::default(),
            pre_sent: None,
            proven: false,
        })
    }

    /// From now on the leaders use group `comm` (generation `generation`; `None`: no group,
    /// the hosts reduce), and `next` is the id it would be set up again as: the socket
    /// takes their packets, contributions start again at round 0, and the group has to
    /// deliver once before a stray contribution counts as its loss.
    ///
    /// # Errors
    /// Another communicator on this address holds one of the new ids' keys.
    pub fn switch_group(
        &mut self,
        generation: u32,
        comm: Option<u32>,
        next: u32,
    ) -> io::Result<()> {
        // The handshake that follows reads the socket itself.
        self.inbox.claim();
        self.keep_received();
        self.shared.wire_id.store(0, Relaxed);
        self.shared.generation.store(generation, Relaxed);
        let keys = [comm.map_or(0, demux::comm_key), demux::comm_key(next)];
        if let Some(share) = self.share.as_mut() {
            share.replace(&self.comm_keys, &keys, self.peers.ip)?;
        }
        self.comm_keys = keys;
        self.next_round = 0;
        self.proven = false;
        if let Some(comm) = comm {
            self.shared.wire_id.store(demux::comm_key(comm), Relaxed);
        }
        Ok(())
    }

    /// Takes a datagram a handshake received while the leaders set their group up again:
    /// answers what must not wait (a peer finishing an earlier collective asks for its
    /// result) and keeps the rest for the collective.
    pub fn take_stray(&self, datagram: &[u8], from: SocketAddr) {
        if let Some(e) = classify(&*self.wire, &self.peers, &self.shared, datagram, from) {
            defer(&mut self.deferred.borrow_mut(), &self.shared.refused, e);
        }
    }

    /// Results come from `parent` only (the member's DPU), or from the leaders' addresses
    /// (`None`: through switches).
    pub fn set_tree_parent(&self, parent: Option<Ipv4Addr>) {
        self.shared.set_parent(parent);
    }

    /// What this endpoint refused so far, by attack.
    #[must_use]
    pub fn refusals(&self) -> crate::Refusals {
        self.shared.refused.snapshot_with(self.inbox.backlog_full())
    }

    /// How often the group was set up anew (0: the first group).
    #[must_use]
    pub fn generation(&self) -> u32 {
        self.shared.generation.load(Relaxed)
    }

    /// The generation the leaders must set their group up as before collective `seq`, if
    /// some leader found the group in use gone in an earlier collective.
    #[must_use]
    pub fn regroup_due(&self, seq: u32) -> Option<Notice> {
        self.shared.note_seq(seq);
        self.regroup_notice().filter(|&n| regroup_before(n, seq))
    }

    /// What word that the group in use is gone means for collective `seq`: found out in
    /// this collective, it runs on the hosts; earlier, the group must be set up again first.
    fn abort_for_gone_group(&self, seq: u32) -> Option<NetAbort> {
        let n = self.regroup_notice()?;
        Some(if regroup_before(n, seq) {
            NetAbort::Regroup
        } else {
            NetAbort::PeerFellBack
        })
    }

    /// The word that the group in use is gone, if any.
    fn regroup_notice(&self) -> Option<Notice> {
        if self.shared.heard.load(Relaxed) <= self.shared.generation.load(Relaxed) {
            return None;
        }
        *self.shared.notice.lock().expect("notice")
    }

    /// This leader found the group in use gone in collective `seq`: it tells every other
    /// leader, and they all set the group up again after collective `after` (`seq` or
    /// later); the collectives up to it run on the hosts.
    pub fn announce_loss(&mut self, after: u32) {
        self.shared.announce(&*self.wire, &self.peers, after);
    }

    /// Sets how long receives busy-poll before they block (see [`Inbox::set_spin`]).
    pub fn set_spin(&mut self, spin: Duration) {
        self.inbox.set_spin(spin);
    }

    #[must_use]
    pub fn ip(&self) -> Ipv4Addr {
        self.peers.ip
    }

    #[must_use]
    pub fn ip_of(&self, leader: usize) -> Ipv4Addr {
        self.peers.ips[leader]
    }

    /// MRR: remembers the notifies it sent, for NMRRs that ask again and for the kill.
    pub fn remember_notices(&self, notices: Notices) {
        *self.shared.notify.lock().expect("notify") = notices;
    }

    /// MRR: the notifies it sent for group `comm` (none when it sent another group's last).
    #[must_use]
    pub fn notices_of(&self, comm: u32) -> Notices {
        let notices = self.shared.notify.lock().expect("notify");
        let ours = notices.iter().all(|(_, n)| n.true_comm_id() == comm);
        if ours {
            notices.clone()
        } else {
            Notices::new()
        }
    }

    /// Starts the progress thread (after the handshake, which reads the socket itself) and
    /// leaves the socket to it until the first collective.
    ///
    /// # Errors
    /// The thread cannot be started.
    pub fn start(&mut self) -> io::Result<()> {
        let (peers, shared, wire) = (self.peers.clone(), self.shared.clone(), self.wire.clone());
        self.inbox.start(
            format!("innet-progress-{}", peers.me),
            move |datagram, from| classify(&*wire, &peers, &shared, datagram, from),
        )?;
        self.inbox.release();
        Ok(())
    }

    /// The collective in progress is over: the progress thread may answer for this leader.
    pub fn idle(&mut self) {
        self.keep_received();
        self.inbox.release();
    }

    /// Takes the datagrams this thread received but has not looked at yet (the progress
    /// thread, or a handshake reading the socket, would never see them): answers what must
    /// not wait and keeps the rest for the next collective.
    fn keep_received(&mut self) {
        while let Some((datagram, from)) = self.inbox.take_received() {
            if let Some(e) = classify(&*self.wire, &self.peers, &self.shared, datagram, from) {
                defer(self.deferred.get_mut(), &self.shared.refused, e);
            }
        }
    }

    /// Waits for the next event until `deadline`; `None` on timeout. Goodbyes are noted
    /// on the way.
    fn next(&mut self, deadline: Instant) -> Option<Incoming> {
        self.next_or(deadline, None)
    }

    /// [`next`](Self::next), also `None` as soon as `also` is readable.
    fn next_or(&mut self, deadline: Instant, also: Option<RawFd>) -> Option<Incoming> {
        self.next_event(deadline, also, false)
    }

    /// The next event until `deadline` (`None` on timeout or when `also` is readable);
    /// goodbyes are noted, and returned too when `byes` says so.
    fn next_event(
        &mut self,
        deadline: Instant,
        also: Option<RawFd>,
        byes: bool,
    ) -> Option<Incoming> {
        loop {
            let deferred = self.deferred.get_mut().pop_front();
            let event = if let Some(e) = deferred {
                e
            } else if let Some(e) = self.inbox.kept() {
                e
            } else {
                let (datagram, from) = self.inbox.recv_or(deadline, also)?;
                let Some(e) = classify(&*self.wire, &self.peers, &self.shared, datagram, from)
                else {
                    continue;
                };
                e
            };
            match event {
                Incoming::Bye(from) => {
                    self.byes.insert(from);
                    if byes {
                        return Some(Incoming::Bye(from));
                    }
                }
                e => return Some(e),
            }
        }
    }

    /// Keeps a host packet for collective `seq` (`total` bytes, when known) or the next
    /// ones; answers one of an earlier, finished collective.
    fn keep_host_packet(&mut self, f: Frame, seq: u32, total: Option<usize>) {
        let of = f.deth.src_qp();
        if before(of, seq) {
            if f.inc.req_id != STEP_FINAL {
                self.shared.answer_from_finals(&*self.wire, &self.peers, &f);
            }
            return;
        }
        let refused = &self.shared.refused;
        if let Some(total) = total {
            self.pending.expect(total);
        }
        let Some(max_packets) = packets_of(&f, seq, total) else {
            refused::count(&refused.reassembly_key_out_of_range);
            return;
        };
        match self.pending.insert_packet(f, max_packets) {
            Ok(()) => {}
            Err(assembly::Refused::KeyOutOfRange) => {
                refused::count(&refused.reassembly_key_out_of_range);
            }
            Err(assembly::Refused::MemoryFull) => {
                refused::count(&refused.reassembly_memory_full);
            }
        }
    }

    /// Records the final result of collective `seq` for peers that may still ask.
    pub fn keep_final(&mut self, seq: u32, op: Op, dtype: Dtype, result: &[u8]) {
        self.keep_final_with(seq, (op, dtype), result.len(), |reused| {
            let mut copy = reused.unwrap_or_default();
            copy.clear();
            copy.extend_from_slice(result);
            (copy, None)
        });
    }

    /// [`keep_final`](Self::keep_final) of a result this endpoint owns: moved, not copied.
    /// Returns the buffer of an older result that went (already mapped memory, for the
    /// next collective's result).
    pub(crate) fn keep_final_owned(
        &mut self,
        seq: u32,
        id: (Op, Dtype),
        result: Vec<u8>,
    ) -> Option<Vec<u8>> {
        self.keep_final_with(seq, id, result.len(), |reused| (result, reused))
    }

    /// Drops the finals beyond the count or the bytes once a result of `len` bytes joins
    /// them (the newest is always kept), keeps the one `make` returns (given the buffer of
    /// an unshared final that went), and answers what was pending for it.
    fn keep_final_with(
        &mut self,
        seq: u32,
        (op, dtype): (Op, Dtype),
        len: usize,
        make: impl FnOnce(Option<Vec<u8>>) -> (Vec<u8>, Option<Vec<u8>>),
    ) -> Option<Vec<u8>> {
        let seq = seq & MASK24;
        let mut finals = self.shared.finals.lock().expect("finals");
        let mut bytes: usize = finals.iter().map(|f| f.3.len()).sum::<usize>() + len;
        let mut reuse = None;
        while !finals.is_empty() && (finals.len() >= FINALS_KEPT || bytes > FINALS_BYTES) {
            let (.., old) = finals.pop_front().expect("not empty");
            bytes -= old.len();
            reuse = Arc::try_unwrap(old).ok().or(reuse);
        }
        let (kept, spare) = make(reuse);
        finals.push_back((seq, op, dtype, Arc::new(kept)));
        drop(finals);
        // Whatever is still pending for it will be answered from the finals.
        for f in self.pending.take_until(seq) {
            if f.inc.req_id != STEP_FINAL {
                self.shared.answer_from_finals(&*self.wire, &self.peers, &f);
            }
        }
        spare
    }

    /// Whether some leader already runs collective `seq` on the hosts.
    #[must_use]
    pub fn peer_fell_back(&self, seq: u32) -> bool {
        let seq = seq & MASK24;
        self.pending.any_for(seq)
    }

    /// Says goodbye to every other leader and waits (until `deadline`) until each has said
    /// it too, answering late requests meanwhile; the progress thread stops with the endpoint.
    pub fn close(&mut self, seq: u32, deadline: Instant) {
        let (n, me) = (self.peers.ips.len(), self.peers.me);
        let waiting = |byes: &HashSet<usize>| (0..n).any(|i| i != me && !byes.contains(&i));
        while waiting(&self.byes) && Instant::now() < deadline {
            self.say_bye(seq);
            let until = (Instant::now() + Duration::from_millis(100)).min(deadline);
            // Done as soon as the last goodbye is in: waiting out the 100 ms cost every
            // MPI program that long at MPI_Finalize.
            while let Some(e) = self.next_event(until, None, true) {
                if let Incoming::Host(f) = e {
                    self.keep_host_packet(f, seq.wrapping_add(1) & MASK24, None);
                }
                if !waiting(&self.byes) {
                    break;
                }
            }
        }
        // One more, for a peer that missed ours while we were waiting.
        self.say_bye(seq);
    }

    fn say_bye(&self, seq: u32) {
        for i in (0..self.peers.ips.len()).filter(|&i| i != self.peers.me) {
            let bye = (Op::Sum, Dtype::U8);
            let _ = self
                .peers
                .send_host(&*self.wire, i, seq & MASK24, STEP_BYE, bye, &[0]);
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let (messages, datagrams) = self.inbox.coalescing();
        tracing::debug!(
            messages,
            datagrams,
            "INC socket closed: datagrams the caller received, in messages (fewer: UDP GRO coalesced)"
        );
        let refusals = self.refusals();
        if refusals.total() > 0 {
            tracing::warn!(
                ?refusals,
                "the INC socket refused frames from outside this job's tree or beyond its bounds (docs/trust.md)"
            );
        }
    }
}

fn set_receive_buffer(sock: &UdpSocket, bytes: i32) {
    use std::os::fd::AsRawFd as _;
    // SAFETY: a valid socket fd and a properly sized int option value.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&raw const bytes).cast(),
            size_of::<i32>() as libc::socklen_t,
        );
    }
}

#[cfg(test)]
mod tests;
