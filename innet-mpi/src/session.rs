//! One MPI communicator served by innet: its innet [`Communicator`], which way each call
//! takes (the cutover table, or the [`Learner`]), and the copies MPI's buffer layouts need
//! (in-place calls, MINLOC/MAXLOC pairs with padding).

use innet_client::{
    Communicator, Config, Error, Order, Report,
    policy::{CLASSES, Learner, Policy},
};
use innet_common::proto::{Dtype, Op};

use crate::{
    config::Placement,
    kind::{Kind, NAMES},
    netns,
    oob::Oob,
    saved,
};
use tracing::{info, warn};

/// `0` (or `off`): no learning; innet serves every size a cutover table does not hand to
/// MPI (to measure innet alone).
pub const LEARN_VAR: &str = "INNET_MPI_LEARN";

/// How the caller's elements sit in memory (innet-client's strided layout).
pub use innet_client::Strided as Shape;

mod gather;
mod learning;

/// A communicator innet serves.
pub struct Session {
    comm: Communicator,
    /// This rank and the size of the MPI communicator (innet numbers the ranks its own
    /// way, node by node: blocks are laid out in MPI's order).
    rank: usize,
    size: usize,
    /// Which way each call takes: the cutover table (longer messages go to MPI, where
    /// they are faster) or, without one, the learned cutover.
    policy: Policy,
    /// The MPI communicator's out-of-band allgather: the learner's agreements.
    oob: Oob,
    /// Reused across calls: padded pairs packed (reduced in place), an allgather's own
    /// block.
    scratch: Vec<u8>,
    /// A reduce-scatter's whole result, in the caller's layout.
    full: Vec<u8>,
}

/// Starts `learner`'s classes from the decisions `path` keeps for `shape`, those every
/// rank read alike (one innet allreduce over the communicator; see [`saved`]).
fn seed_learner(
    learner: &mut Learner,
    comm: &mut Communicator,
    path: &std::path::Path,
    shape: (usize, usize),
) -> Result<(), String> {
    let own = match saved::read(path) {
        Ok(file) => saved::seeds(&file, shape, &NAMES),
        Err(e) => {
            warn!(error = %e, "the saved learned cutover cannot be read: every class learns");
            vec![saved::NONE; NAMES.len() * CLASSES]
        }
    };
    let input = saved::agreement_input(&own);
    let mut max = vec![0u8; input.len()];
    comm.allreduce_bytes(&input, &mut max, Op::Max, Dtype::U8)
        .map_err(|e| format!("agreeing on the saved learned cutover: {e}"))?;
    let seeded = learner.seed(saved::agreed(&max).into_iter().map(saved::way_of));
    if seeded > 0 && comm.rank() == 0 {
        info!(classes = seeded, file = %path.display(), "the learned cutover starts from saved decisions");
    }
    Ok(())
}

impl Session {
    /// Joins innet group `job` as rank `rank` of a communicator whose rank `i` is world rank
    /// `members[i]`, the `communicator`-th this rank joins, `oob` its allgather. Every
    /// member must call it. `Err` is a reason innet cannot serve the communicator (the
    /// caller then hands its collectives to MPI).
    pub fn open(
        placement: &Placement,
        job: u64,
        (rank, oob): (usize, Oob),
        members: &[usize],
        communicator: u64,
    ) -> Result<Self, String> {
        let c = placement.layout_of(members)?;
        let settings = &placement.settings;
        let network_max_bytes = innet_client::cutover::network_max_bytes(
            &settings.cutover,
            c.layout.nodes(),
            c.layout.ranks_per_node,
        );
        let learn = settings.cutover.is_empty()
            && !crate::config::disabled_by(std::env::var(LEARN_VAR).ok().as_deref());
        let me = c
            .innet_rank(rank)
            .ok_or_else(|| format!("rank {rank} is outside a communicator of {}", members.len()))?;
        let mut cfg = Config::new(job, me, c.layout, placement.placements(&c.nodes));
        cfg.mode = settings.mode;
        cfg.timeout = settings.timeout;
        let netns = placement
            .node_of(members[rank])
            .and_then(|n| placement.nodes[n].netns.clone());
        let join = || Communicator::new(cfg).map_err(|e| format!("joining innet: {e}"));
        let mut comm = match netns {
            Some(ns) => netns::within(&ns, join).map_err(|e| e.to_string())??,
            None => join()?,
        };
        let shape = (c.layout.nodes(), c.layout.ranks_per_node);
        let mut policy = if learn {
            Policy::Learned(
                Learner::new(communicator, &NAMES)
                    .with_shape(shape.0, shape.1)
                    .spanning(Kind::Barrier.index()),
            )
        } else {
            Policy::Table { network_max_bytes }
        };
        if let (Some(l), Some(path)) = (policy.learner(), saved::path()) {
            seed_learner(l, &mut comm, &path, shape)?;
        }
        Ok(Self {
            comm,
            rank,
            size: members.len(),
            policy,
            oob,
            scratch: vec![],
            full: vec![],
        })
    }

    /// The size of the MPI communicator.
    #[must_use]
    pub fn size(&self) -> usize {
        self.size
    }

    /// Allreduce of `shape.count` elements at `send` (`None`: in place, the input is in
    /// `recv`) into `recv`, both laid out as `shape` says.
    ///
    /// # Safety
    /// `send` (if any) and `recv` must be valid for `(count - 1) * stride + element` bytes,
    /// `recv` writable; they may overlap only if they are the same buffer.
    pub unsafe fn allreduce(
        &mut self,
        send: Option<*const u8>,
        recv: *mut u8,
        shape: Shape,
        op: Op,
        dtype: Dtype,
    ) -> Result<Report, Error> {
        let span = shape.span(op, dtype);
        // SAFETY: the caller's receive buffer, `span` bytes as laid out.
        let out = unsafe { std::slice::from_raw_parts_mut(recv, span) };
        if !shape.is_packed(op, dtype) {
            // MINLOC/MAXLOC over padded pairs: pack, reduce in place, unpack (the padding of
            // `recv` is left as it was).
            let input = match send {
                // SAFETY: the caller's input, as long.
                Some(s) if s != recv.cast_const() => unsafe { std::slice::from_raw_parts(s, span) },
                _ => &*out,
            };
            self.scratch.clear();
            shape.gather(op, dtype, input, Order::Native, &mut self.scratch);
            let report = self
                .comm
                .allreduce_bytes_in_place(&mut self.scratch, op, dtype)?;
            shape.scatter(op, dtype, &mut self.scratch, Order::Native, out);
            return Ok(report);
        }
        match send {
            Some(s) if s != recv.cast_const() => {
                // SAFETY: the caller's input, packed, as long.
                let input = unsafe { std::slice::from_raw_parts(s, span) };
                self.comm.allreduce_bytes(input, out, op, dtype)
            }
            // In place: no copy of the input kept (MPI leaves a failed call's buffer
            // undefined).
            _ => self.comm.allreduce_bytes_in_place(out, op, dtype),
        }
    }
}

/// A raw pointer a completion carries to the progress thread.
struct Raw<T>(T);
// SAFETY: MPI's rule for non-blocking calls: the caller leaves the buffer (and the shim its
// request state) alone until the request completes, so one thread at a time touches it.
unsafe impl<T> Send for Raw<T> {}

/// The non-blocking collectives.
impl Session {
    /// Runs the started collectives on the calling thread when the progress thread has
    /// not taken them (see [`Communicator::progress_here`]).
    pub fn progress_here(&self) {
        self.comm.progress_here();
    }

    /// The same, only when the results are at the socket already (for a test).
    pub fn progress_if_answered(&self) {
        self.comm.progress_if_answered();
    }

    /// Starts an allreduce of `shape.count` elements at `send` (`None`: in place, the input
    /// is in `recv`), as [`allreduce`](Self::allreduce) lays them out; the input is copied
    /// before this returns. When it is over, the result goes to `recv` (none when `recv` is
    /// null: a reduce's non-root) and `done` runs with the outcome, on the progress thread.
    ///
    /// # Errors
    /// What the allreduce rejects before starting (`done` is then not called).
    ///
    /// # Safety
    /// As [`allreduce`](Self::allreduce); `recv` (if not null) stays valid and untouched by
    /// the caller until `done` runs.
    pub unsafe fn start_allreduce(
        &mut self,
        send: Option<*const u8>,
        recv: *mut u8,
        shape: Shape,
        op: Op,
        dtype: Dtype,
        done: impl FnOnce(Result<Report, Error>) + Send + 'static,
    ) -> Result<(), Error> {
        let span = shape.span(op, dtype);
        let input = send.unwrap_or(recv.cast_const());
        // One pass from the caller's elements into the wire's order; the result comes back
        // out in one pass too.
        let mut wire = Vec::new();
        // SAFETY: the caller's input, `span` bytes as laid out.
        shape.gather(
            op,
            dtype,
            unsafe { std::slice::from_raw_parts(input, span) },
            Order::Wire,
            &mut wire,
        );
        let recv = Raw(recv);
        self.comm
            .iallreduce_wire_then(wire, op, dtype, move |mut buf, order, r| {
                let recv = recv;
                if r.is_ok() && !recv.0.is_null() {
                    // SAFETY: the caller's receive buffer, which it leaves alone until the
                    // request completes; `span` bytes as laid out.
                    let out = unsafe { std::slice::from_raw_parts_mut(recv.0, span) };
                    shape.scatter(op, dtype, &mut buf, order, out);
                }
                done(r);
            })
    }
}
