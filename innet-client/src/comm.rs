//! The communicator: one rank's handle on a group of ranks, and its allreduce.
//!
//! A rank's data goes to its leader over the node-local channel; the leaders reduce through
//! the switches (Node or Socket mode) or host to host (recursive doubling, ring); each
//! leader hands the result back to its ranks. Which way a collective went comes back in a
//! [`Report`]: the result is the same either way, and never wrong — a collective the
//! network cannot finish runs on the hosts instead.
//!
//! This file owns a collective's way through the communicator (gather, the leaders'
//! exchange through the network or the hosts, the broadcast back); `config` what a rank
//! asks for, `report` what it is told back, and `lifecycle` the group's life (joining,
//! the handshake, setting a lost group up again, freeing it).

use std::{io, net::Ipv4Addr, time::Instant};

use innet_common::{
    proto::{Dtype, MAX_PAYLOAD_BYTES, Op, element_bytes},
    reduce::combine_into,
};
use tracing::{debug, warn};

use crate::{
    assembly::before,
    dpu::DpuMember,
    endpoint::{self, Carrier, Endpoint, NetAbort, NetPlan, NodeStage, Notice},
    frames::{self, MASK24, swap_order, swap_order_into},
    handshake::{GroupParams, Offer},
    hostalg::{self, Algorithm},
    layout::{Order, wire_dtype},
    local::{Kind, LocalChannel},
    nic::NicPort,
    roles::{Grouping, RolePlan},
    shm::{NodeSegment, SLOT_BYTES},
    stages::{CallStamps, Stage, StageLog},
};

mod config;
mod error;
mod gather;
mod lifecycle;
mod outcome;
mod pipeline;
mod typed;
// The application's handle on the core below, and its non-blocking collectives.
pub(crate) mod handle;
pub(crate) mod progress;

pub use config::{Config, DEFAULT_PIPE, DEFAULT_SPIN, Mode, NodePlacement};
pub use error::Error;
use error::check_message;
pub use lifecycle::QUICK_LOSS_CALLS;
pub use outcome::{Fallback, Path, Refusals, Report, explain_fail_cause};
use pipeline::Pipeline;

/// A data packet waits at least `timeout / PATIENCE_SHARE` for its result before the
/// collective falls back to the hosts: long enough for a peer that enters the collective
/// late (MPI ranks rarely arrive together), short enough to leave the hosts the rest of
/// the call's time.
pub const PATIENCE_SHARE: u32 = 4;

/// One rank's membership in a communicator: the state behind the public
/// [`Communicator`](crate::Communicator), which runs its collectives one at a time on it
/// (behind one lock, see `progress`).
pub(crate) struct Core {
    cfg: Config,
    plan: RolePlan,
    /// This rank's leader.
    leader: usize,
    local: LocalChannel,
    /// The leader's network side (leaders only).
    endpoint: Option<Endpoint>,
    /// `inc-nic` leaders: this host's member of the NIC tree, and what it offered.
    nic: Option<NicPort>,
    /// `inc-dpu` leaders: this node's member on its DPU.
    dpu: Option<DpuMember>,
    offer: Option<Offer>,
    group: Option<GroupParams>,
    tor_of: Vec<usize>,
    seq: u32,
    /// The node's shared-memory segment (nodes of more than one rank).
    segment: Option<NodeSegment>,
    /// Reused message buffer of the node-local steps.
    scratch: Vec<u8>,
    /// Reused full result of a reduce-scatter.
    scatter: Vec<u8>,
    /// Per-stage timestamps of traced collectives.
    stages: StageLog,
    /// The leaders' record of lost groups.
    losses: Losses,
}

/// What the leaders know of their lost groups (the same on every leader: it changes only
/// at collectives every leader reaches).
#[derive(Default)]
struct Losses {
    /// The collective before which the group in use was set up.
    set_up_at: u32,
    /// Groups lost quickly in a row ([`QUICK_LOSS_CALLS`]).
    quick: u32,
    /// The leaders leave the network alone until this collective.
    hosts_until: Option<u32>,
}

impl Core {
    /// Where this leader's data packets are addressed when they go out through its port.
    /// Under a DPU: to the DPU itself, which takes them as the node's part. Attack it
    /// closes: a DPU without the group (set up again, collected) passes its host's frames
    /// on, and a member's DPU knows its children by tree position, so a raw contribution
    /// addressed to another member would count there as this member's whole subtree (CI
    /// run 23: one node's part missing from every result). Addressed to the DPU, such a
    /// frame ends in the DPU's own stack. Otherwise to the ring successor among the
    /// leaders under this TOR, or, alone under its TOR, to any other leader: the packet
    /// must cross the TOR, which consumes it (the result comes back as its reply).
    fn first_hop(&self) -> Ipv4Addr {
        if let Some(dpu) = &self.dpu {
            return dpu.address();
        }
        let ep = self.endpoint.as_ref().expect("a leader with an endpoint");
        let me = self.leader;
        let mut dst = self.plan.ring_successor(me, &self.tor_of);
        if dst == me {
            dst = (me + 1) % self.plan.leaders();
        }
        ep.ip_of(dst)
    }

    fn members(&self) -> std::ops::Range<usize> {
        self.plan.members(self.leader)
    }

    /// The handle's [`Communicator::size`](crate::Communicator::size), on the core.
    #[must_use]
    pub fn size(&self) -> usize {
        self.cfg.layout.size
    }

    /// The handle's [`Communicator::rank`](crate::Communicator::rank), on the core.
    #[must_use]
    pub fn rank(&self) -> usize {
        self.cfg.rank
    }

    /// The handle's [`Communicator::ranks_per_node`](crate::Communicator::ranks_per_node), on the core.
    #[must_use]
    pub fn ranks_per_node(&self) -> usize {
        self.cfg.layout.ranks_per_node
    }

    /// The handle's [`Communicator::sockets_per_node`](crate::Communicator::sockets_per_node), on the core.
    #[must_use]
    pub fn sockets_per_node(&self) -> usize {
        self.cfg.layout.sockets_per_node
    }

    /// The handle's [`Communicator::grouping`](crate::Communicator::grouping), on the core.
    #[must_use]
    pub fn grouping(&self) -> Grouping {
        self.plan.grouping
    }

    /// The handle's [`Communicator::group`](crate::Communicator::group), on the core.
    #[must_use]
    pub fn group(&self) -> Option<GroupParams> {
        self.group
    }

    /// The handle's [`Communicator::refusals`](crate::Communicator::refusals), on the core.
    #[must_use]
    pub fn refusals(&self) -> Refusals {
        self.endpoint
            .as_ref()
            .map_or_else(Refusals::default, Endpoint::refusals)
    }

    /// The handle's [`Communicator::stages`](crate::Communicator::stages), on the core.
    #[must_use]
    pub fn stages(&self) -> &[CallStamps] {
        self.stages.calls()
    }

    /// The handle's [`Communicator::trace_calls`](crate::Communicator::trace_calls), on the core.
    pub fn trace_calls(&mut self, calls: usize) {
        self.stages.restart(calls);
    }

    /// The handle's [`Communicator::allreduce_bytes`](crate::Communicator::allreduce_bytes),
    /// on the core. The message travels in `recv` (in wire order), so the result lands
    /// where the caller wants it, with no copy back.
    pub fn allreduce_bytes(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        op: Op,
        dtype: Dtype,
    ) -> Result<Report, Error> {
        if send.len() != recv.len() {
            return Err(Error::Buffers {
                send: send.len(),
                recv: recv.len(),
            });
        }
        check_message(op, dtype, send.len())?;
        self.allreduce_loaded(
            recv,
            (op, dtype),
            |wire, r| swap_order_into(op, wire, send, r),
            |r| r.copy_from_slice(send),
        )
    }

    /// The handle's [`Communicator::allreduce_bytes_in_place`](crate::Communicator::allreduce_bytes_in_place),
    /// on the core: no copy of the input is kept, so a failure leaves `buf` undefined.
    pub fn allreduce_bytes_in_place(
        &mut self,
        buf: &mut [u8],
        op: Op,
        dtype: Dtype,
    ) -> Result<Report, Error> {
        check_message(op, dtype, buf.len())?;
        self.allreduce_in_place(buf, op, dtype, |_| {})
    }

    /// The allreduce of a checked message already in wire order (of `wire_dtype(op, dtype,
    /// len)`), in place, and the order its result comes back
    /// in (the network hands a lone leader's converted already); a failure leaves `buf`
    /// undefined. For a started collective whose buffer is its own: its owner converts the
    /// result on its way out, in the same pass.
    pub(crate) fn allreduce_wire_kept(
        &mut self,
        buf: &mut [u8],
        op: Op,
        dtype: Dtype,
    ) -> (Result<Report, Error>, Order) {
        self.allreduce_ordered(buf, (op, dtype), |_, _| {})
    }

    /// The allreduce of a checked message of `buf`'s length that `load(wire dtype, buf)`
    /// puts into `buf` in wire order once the call's clock runs, and the order its result
    /// comes back in (the network hands a lone leader's converted already).
    fn allreduce_ordered(
        &mut self,
        buf: &mut [u8],
        (op, dtype): (Op, Dtype),
        load: impl FnOnce(Dtype, &mut [u8]),
    ) -> (Result<Report, Error>, Order) {
        let dtype = wire_dtype(op, dtype, buf.len());
        let mut stamps = self.stages.start();
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let deadline = Instant::now() + self.cfg.timeout;
        load(dtype, buf);
        let report = self.allreduce_wire(seq, (op, dtype), buf, deadline, &mut stamps);
        let order = match &report {
            Ok(r) => {
                self.stages.keep(stamps);
                let converted = matches!(r.path, Path::Network(_) | Path::NicTree)
                    && self.network_converts_result();
                if converted {
                    Order::Native
                } else {
                    Order::Wire
                }
            }
            Err(_) => Order::Wire,
        };
        (report, order)
    }

    /// The allreduce of a checked native-order message in `buf`, in place; on failure
    /// `restore` puts the caller's input back (never a partial result).
    fn allreduce_in_place(
        &mut self,
        buf: &mut [u8],
        op: Op,
        dtype: Dtype,
        restore: impl FnOnce(&mut [u8]),
    ) -> Result<Report, Error> {
        let load = |wire, b: &mut [u8]| swap_order(op, wire, b);
        self.allreduce_loaded(buf, (op, dtype), load, restore)
    }

    /// The allreduce of a checked message of `buf`'s length that `load(wire dtype, buf)`
    /// writes into `buf` in wire order (one pass: from the caller's send buffer, or
    /// converting in place); on failure `restore` puts the caller's input back (never a
    /// partial result).
    fn allreduce_loaded(
        &mut self,
        buf: &mut [u8],
        (op, dtype): (Op, Dtype),
        load: impl FnOnce(Dtype, &mut [u8]),
        restore: impl FnOnce(&mut [u8]),
    ) -> Result<Report, Error> {
        let (report, order) = self.allreduce_ordered(buf, (op, dtype), load);
        match &report {
            Ok(_) if order == Order::Wire => swap_order(op, wire_dtype(op, dtype, buf.len()), buf),
            Ok(_) => {}
            Err(_) => restore(buf),
        }
        report
    }

    /// [`allreduce_bytes`](Self::allreduce_bytes) of a wire-order message, in place.
    fn allreduce_wire(
        &mut self,
        seq: u32,
        (op, dtype): (Op, Dtype),
        wire: &mut [u8],
        deadline: Instant,
        stamps: &mut CallStamps,
    ) -> Result<Report, Error> {
        let leader_rank = self.plan.leader_rank(self.leader);
        let timeout = |e: io::Error, what| {
            if e.kind() == io::ErrorKind::TimedOut {
                Error::Timeout { what }
            } else {
                Error::Io(e)
            }
        };
        // Messages that fit a slot meet in the node's shared memory, longer ones go
        // through the node-local datagram channel.
        let shm = self.segment.is_some() && wire.len() + Report::BYTES <= SLOT_BYTES;
        let report = if self.cfg.rank == leader_rank {
            if self.cfg.pipeline && !shm && self.members().len() > 1 && self.endpoint.is_some() {
                return self.leader_pipelined(seq, (op, dtype), wire, deadline, stamps);
            }
            if shm {
                self.gather_shared(seq, (op, dtype), wire, deadline)
            } else {
                self.gather_datagrams(seq, (op, dtype), wire, deadline)
            }
            .map_err(|e| match e {
                Error::Io(e) => timeout(e, "the contributions of this node's ranks"),
                e => e,
            })?;
            stamps.stamp(Stage::Gathered);
            let report = self.leaders_allreduce(seq, (op, dtype), wire, (deadline, stamps), None);
            // Until the next collective, the progress thread answers for this leader.
            if let Some(ep) = self.endpoint.as_mut() {
                ep.idle();
            }
            let report = report?;
            if self.members().len() == 1 {
                // Nobody to hand the result to (and no copy of a long message to make).
                return Ok(report);
            }
            if let Some(seg) = self.segment.as_ref().filter(|_| shm) {
                // Straight into the slot: the report, then the result.
                seg.post_parts(0, seq, &[&report.encode(), wire]);
            } else {
                self.scratch.clear();
                self.scratch.extend_from_slice(&report.encode());
                self.scratch.extend_from_slice(wire);
                for r in self.members().skip(1) {
                    self.local
                        .send_msg(r as u32, Kind::Result, seq, &self.scratch, deadline)?;
                }
            }
            report
        } else if let Some(seg) = self.segment.as_ref().filter(|_| shm) {
            seg.post(self.cfg.rank - leader_rank, seq, wire);
            stamps.stamp(Stage::Gathered);
            // The result goes straight from the slot into the caller's buffer.
            let mut header = [0u8; Report::BYTES];
            let whole = seg
                .wait_into(0, seq, deadline, &mut [&mut header, wire])
                .map_err(|e| timeout(e, "the result from this node's leader"))?;
            if !whole {
                return Err(Error::BadLocalMessage);
            }
            Report::decode(&header).ok_or(Error::BadLocalMessage)?
        } else {
            self.local
                .send_msg(leader_rank as u32, Kind::Contribution, seq, wire, deadline)?;
            stamps.stamp(Stage::Gathered);
            let msg = self
                .local
                .recv_msg(Kind::Result, seq, Some(leader_rank as u32), deadline)
                .map_err(|e| timeout(e, "the result from this node's leader"))?
                .1;
            let report = Report::decode(&msg).ok_or(Error::BadLocalMessage)?;
            let data = &msg[Report::BYTES..];
            if data.len() != wire.len() {
                return Err(Error::BadLocalMessage);
            }
            wire.copy_from_slice(data);
            report
        };
        Ok(report)
    }

    /// Leader of several ranks, a message longer than a shared-memory slot: the node's
    /// gather overlaps the network's rounds (see `pipeline`).
    fn leader_pipelined(
        &mut self,
        seq: u32,
        id: (Op, Dtype),
        wire: &mut [u8],
        deadline: Instant,
        stamps: &mut CallStamps,
    ) -> Result<Report, Error> {
        let ranks = self.members().skip(1).map(|r| r as u32).collect();
        let mut pipe = Pipeline::new(seq, id, ranks, wire.len(), deadline);
        let report = self.leaders_allreduce(seq, id, wire, (deadline, stamps), Some(&mut pipe));
        if let Some(ep) = self.endpoint.as_mut() {
            ep.idle();
        }
        let report = report?;
        pipe.finish(&mut self.local, &report, wire)?;
        Ok(report)
    }

    /// Leader: combines the contributions of its node's ranks from the shared-memory slots
    /// into `wire`; slot order is rank order, so float results do not depend on timing.
    fn gather_shared(
        &mut self,
        seq: u32,
        (op, dtype): (Op, Dtype),
        wire: &mut [u8],
        deadline: Instant,
    ) -> Result<(), Error> {
        let seg = self.segment.as_ref().expect("a node of several ranks");
        for slot in 1..self.plan.members(self.leader).len() {
            seg.wait(slot, seq, deadline, &mut self.scratch)?;
            same_size(self.cfg.rank + slot, self.scratch.len(), wire.len())?;
            combine_into(op, dtype, wire, &self.scratch)?;
        }
        Ok(())
    }

    /// Leader: combines the contributions of its node's ranks from the datagram channel
    /// into `wire`, in rank order (not arrival order: float results must not depend on
    /// timing).
    fn gather_datagrams(
        &mut self,
        seq: u32,
        (op, dtype): (Op, Dtype),
        wire: &mut [u8],
        deadline: Instant,
    ) -> Result<(), Error> {
        let mut parts = Vec::with_capacity(self.members().len() - 1);
        for _ in self.members().skip(1) {
            let (from, d) = self
                .local
                .recv_msg(Kind::Contribution, seq, None, deadline)?;
            same_size(from as usize, d.len(), wire.len())?;
            parts.push((from, d));
        }
        parts.sort_by_key(|(from, _)| *from);
        for (_, d) in &parts {
            combine_into(op, dtype, wire, d)?;
        }
        Ok(())
    }

    /// The leaders' part: through the network when it can, else on the hosts.
    /// With `pipe`, the node's ranks' parts are still coming: the network takes them as
    /// they come, the hosts only once all are in.
    fn leaders_allreduce(
        &mut self,
        seq: u32,
        (op, dtype): (Op, Dtype),
        wire: &mut [u8],
        (deadline, stamps): (Instant, &mut CallStamps),
        mut pipe: Option<&mut Pipeline>,
    ) -> Result<Report, Error> {
        let mut report = Report {
            path: Path::Local,
            fallback: None,
            retransmissions: 0,
            regrouped: None,
        };
        // A single leader (one node) has no endpoint: the local reduce was everything.
        if self.endpoint.is_none() {
            return Ok(report);
        }
        let algorithm = match self.cfg.mode {
            Mode::HostRd => Algorithm::RecursiveDoubling,
            Mode::HostRing => Algorithm::Ring,
            Mode::Auto | Mode::IncNode | Mode::IncSocket | Mode::IncNic | Mode::IncDpu => {
                let stamped = (deadline, &mut *stamps);
                let node = pipe.as_deref_mut();
                if self.through_network(seq, (op, dtype), wire, stamped, node, &mut report) {
                    return Ok(report);
                }
                Algorithm::for_bytes(wire.len())
            }
        };
        if let Some(p) = pipe {
            if let Some(e) = p.take_error() {
                return Err(e);
            }
            p.gather_all(&mut self.local, wire)?;
        }
        let (n, me) = (self.plan.leaders(), self.leader);
        let ep = self.endpoint.as_mut().expect("a leader of several");
        report.path = Path::Host(algorithm);
        let mut x = ep.exchange(seq, (op, dtype), wire.len(), deadline, self.cfg.retry);
        hostalg::allreduce(algorithm, &mut x, me, n, op, dtype, wire)?;
        ep.keep_final(seq, op, dtype, wire);
        Ok(report)
    }

    /// Whether a group that failed to set up with `fail_cause` may be set up later: the
    /// switches' tree is set up again (not a NIC or DPU tree, which is built once), and the
    /// cause may pass ([`outcome::may_pass`]).
    fn may_set_up_later(&self, fail_cause: u8) -> bool {
        matches!(self.cfg.mode, Mode::Auto | Mode::IncNode | Mode::IncSocket)
            && outcome::may_pass(fail_cause)
    }

    /// Whether the network hands this leader the result in native order
    /// ([`NetPlan::native_result`]: one pass over a long message less): every collective
    /// returns it so to its caller, and a leader alone on its node has nobody to pass it
    /// on to in wire order.
    fn network_converts_result(&self) -> bool {
        self.members().len() == 1
    }

    /// The in-network modes: reduces `wire` through the network, setting the group up
    /// again first when an earlier collective found it gone. Whether it did; if not,
    /// `report` says why.
    fn through_network(
        &mut self,
        seq: u32,
        (op, dtype): (Op, Dtype),
        wire: &mut [u8],
        (deadline, stamps): (Instant, &mut CallStamps),
        mut pipe: Option<&mut Pipeline>,
        report: &mut Report,
    ) -> bool {
        // Twice at most: a leader that learns only now that the others set the group up
        // again after an earlier collective does so too, then sends again.
        for attempt in 0..2 {
            if let Some(n) = self.endpoint.as_ref().and_then(|ep| ep.regroup_due(seq)) {
                report.regrouped = Some(self.regroup(n, seq, deadline));
            } else if self
                .losses
                .hosts_until
                .is_some_and(|until| !before(seq & MASK24, until))
            {
                // The pause is over, on every leader at this same collective.
                let generation = self.endpoint.as_ref().map_or(0, Endpoint::generation);
                let n = Notice {
                    generation: generation.saturating_add(1),
                    seq: seq.wrapping_sub(2),
                };
                report.regrouped = Some(self.regroup(n, seq, deadline));
            }
            let carrier = match &self.nic {
                Some(port) => Carrier::Nic(port),
                None => Carrier::Switch {
                    dst: self.first_hop(),
                },
            };
            if let Some(max) = self.cfg.cutover_limit(wire.len()) {
                report.fallback = Some(Fallback::Cutover {
                    max_bytes: u32::try_from(max).unwrap_or(u32::MAX),
                });
                return false;
            }
            let plan = match self
                .group
                .map(|g| net_plan(&g, op, dtype, &self.cfg, carrier))
            {
                Some(Ok(plan)) => NetPlan {
                    native_result: self.network_converts_result(),
                    ..plan
                },
                Some(Err(f)) => {
                    if let Fallback::NoNetwork { fail_cause } = f
                        && self.may_set_up_later(fail_cause)
                        && let Some(ep) = self.endpoint.as_mut()
                    {
                        // A set-up that failed for a reason that may pass (a switch full or
                        // busy, a flood, a leader late) is tried again like a lost group's:
                        // after the next collective, every leader alike, and after failures
                        // in a row only after longer and longer spells on the hosts
                        // (`QUICK_LOSS_CALLS`). Without it, one bad moment at the start
                        // left the communicator on the hosts for its whole life.
                        ep.announce_loss(seq.wrapping_add(1));
                    }
                    report.fallback = Some(f);
                    return false;
                }
                None => return false,
            };
            let ep = self.endpoint.as_mut().expect("a leader of several");
            let mut node = pipe.as_deref_mut().map(|p| p.stage(&mut self.local));
            let stage = node.as_mut().map(|s| s as &mut dyn NodeStage);
            match ep.network_allreduce(seq, (op, dtype), &plan, (wire, stage), stamps) {
                Ok(retransmissions) => {
                    report.path = match plan.carrier {
                        Carrier::Nic(_) => Path::NicTree,
                        // The DPUs' tree: the frames go through the switches' ports, the
                        // reduction is the NIC tree's.
                        Carrier::Switch { .. } if self.dpu.is_some() => Path::NicTree,
                        Carrier::Switch { .. } => Path::Network(self.plan.grouping),
                    };
                    report.retransmissions = retransmissions;
                    return true;
                }
                Err(NetAbort::Regroup) if attempt == 0 => {}
                // The node's stage failed: the caller says why.
                Err(NetAbort::Node) => return false,
                Err(abort) => {
                    debug!(seq, ?abort, "the network did not deliver: host allreduce");
                    report.fallback = Some(match abort {
                        NetAbort::Timeout { tries } => Fallback::Timeout { tries },
                        NetAbort::PeerFellBack | NetAbort::Regroup | NetAbort::Node => {
                            Fallback::PeerFellBack
                        }
                        NetAbort::Vanished => Fallback::GroupVanished,
                    });
                    // A leader that waited out its patience finds its peers a collective
                    // ahead, waiting for its contribution with the same patience: they may
                    // give up on that one first and run it on the hosts. Setting the group
                    // up again only after it keeps every leader on the same side (the
                    // peers that had not given up yet hear the notice and join the hosts).
                    // A vanished group is seen by every leader in the same collective.
                    let after = match abort {
                        NetAbort::Timeout { .. } => Some(seq.wrapping_add(1)),
                        NetAbort::Vanished => Some(seq),
                        NetAbort::PeerFellBack | NetAbort::Regroup | NetAbort::Node => None,
                    };
                    if let Some(after) = after {
                        warn!(
                            seq,
                            ?abort,
                            "the network lost this communicator's group: this collective runs on the hosts; the group is set up again after collective {after}"
                        );
                        ep.announce_loss(after);
                    }
                    return false;
                }
            }
        }
        report.fallback = Some(Fallback::PeerFellBack);
        false
    }
}

/// A node rank's contribution must be as long as its leader's buffer.
fn same_size(from: usize, contribution: usize, wire: usize) -> Result<(), Error> {
    if contribution == wire {
        return Ok(());
    }
    warn!(from, "a rank passed another buffer size");
    Err(Error::Buffers {
        send: contribution,
        recv: wire,
    })
}

/// How this leader sends a collective into the network, or why it cannot.
fn net_plan<'a>(
    g: &GroupParams,
    op: Op,
    dtype: Dtype,
    cfg: &Config,
    carrier: Carrier<'a>,
) -> Result<NetPlan<'a>, Fallback> {
    if g.fail_cause != 0 {
        return Err(Fallback::NoNetwork {
            fail_cause: g.fail_cause,
        });
    }
    let limit = usize::from(g.max_data_size)
        .min(cfg.max_packet_bytes)
        .min(MAX_PAYLOAD_BYTES);
    if g.ops & (1 << op as u8) == 0
        || g.dtypes & (1 << dtype as u8) == 0
        || element_bytes(op, dtype) > limit
    {
        return Err(Fallback::Unsupported);
    }
    Ok(NetPlan {
        wire_id: g.wire_id,
        carrier,
        packet_bytes: frames::packet_bytes(op, dtype, limit),
        in_flight: endpoint::in_flight(g.window),
        pipe: cfg.pipe,
        retry: cfg.retry,
        max_tries: cfg.max_tries.max(1),
        patience: cfg.timeout / PATIENCE_SHARE,
        drop_every: cfg.drop_results_every(),
        native_result: false,
    })
}

#[cfg(test)]
mod tests;
