//! The C ABI the shim calls: eleven functions, declared in the header [`crate::header`]
//! generates. The shim does what only C can (MPI's handles and types, generalized
//! requests, attributes) and gives Rust one thing of MPI, an allgather over a
//! communicator ([`Oob`]); discovery, the join, which way each call takes and the learned
//! cutover's agreements run here.
//!
//! - [`innet_mpi_start`] after `MPI_Init`, [`innet_mpi_finish`] in `MPI_Finalize`;
//! - [`innet_mpi_open`] / [`innet_mpi_close`]: a communicator's session;
//! - [`innet_mpi_route`], then [`innet_mpi_collective`] or [`innet_mpi_start_collective`]
//!   when innet takes the call; [`innet_mpi_took`] after a timed trial call;
//!   [`innet_mpi_agree`] where every rank is (a blocking collective);
//! - [`innet_mpi_progress`] from the application's wait and test calls;
//! - [`innet_mpi_passed`]: a call handed to MPI before it reached a session.

use std::ffi::{c_char, c_int, c_void};

use innet_common::proto::{Dtype, Op};
use tracing::{info, warn};

use innet_client::policy::{Decision, Way};

use crate::{
    State, counted, guarded,
    kind::{Kind, Pass},
    oob::Oob,
    session::{Session, Shape},
    state,
};

/// [`innet_mpi_route`]: innet serves the call.
pub const ROUTE_NETWORK: c_int = 1;
/// [`innet_mpi_route`]: the call is a timed trial call ([`innet_mpi_took`] follows).
pub const ROUTE_TRIAL: c_int = 2;

/// One collective call as the shim describes it (`struct innet_mpi_call`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Call {
    /// `INNET_KIND_*`: what the application called.
    pub kind: c_int,
    /// `INNET_OP_*` and `INNET_*` type codes (not read for an allgather).
    pub op: c_int,
    pub dtype: c_int,
    /// NULL: in place (the input is in `recv`).
    pub send: *const c_void,
    /// NULL: the result is not kept (a non-blocking reduce's non-root).
    pub recv: *mut c_void,
    /// Elements, `stride` bytes apart; a MINLOC/MAXLOC pair's location `loc_offset` into
    /// its element.
    pub count: usize,
    pub stride: usize,
    pub loc_offset: usize,
    /// A reduce-scatter's counts, one per rank (NULL: `block` elements each).
    pub counts: *const c_int,
    /// An allgather's bytes per rank; a reduce-scatter-block's elements per rank.
    pub block: usize,
}

impl Call {
    /// How the elements sit in the caller's buffers.
    fn shape(&self) -> Shape {
        Shape {
            count: self.count,
            stride: self.stride,
            loc_offset: self.loc_offset,
        }
    }

    /// The input, `None` in place.
    fn input(&self) -> Option<*const u8> {
        (!self.send.is_null()).then_some(self.send.cast::<u8>())
    }
}

/// The shim's completion of a started call: its request state and 0 (done) or 1 (failed).
pub type Done = unsafe extern "C" fn(arg: *mut c_void, failed: c_int);

/// A C int that counts or indexes (negative ones never come from the shim; they clamp to 0).
fn index(v: c_int) -> usize {
    usize::try_from(v).unwrap_or(0)
}

/// The op and type of the shim's codes (`None`: unknown, logged).
fn op_dtype(op: c_int, dtype: c_int) -> Option<(Op, Dtype)> {
    let code = |v: c_int| u8::try_from(v).unwrap_or(u8::MAX);
    let found = Op::from_u8(code(op)).zip(Dtype::from_u8(code(dtype)));
    if found.is_none() {
        warn!(op, dtype, "unknown op or type code from the shim");
    }
    found
}

fn kind_of(code: c_int) -> Kind {
    Kind::from_c(code).unwrap_or_else(|| {
        warn!(
            code,
            "unknown collective kind from the shim (counted as allreduce)"
        );
        Kind::Allreduce
    })
}

fn record(d: Option<Decision>) {
    if let (Some(d), Some(st)) = (d, state()) {
        st.counters.decided(d);
    }
}

/// Called once, after `MPI_Init`, by every world rank (collective over `world` when the
/// interposer finds the placement itself). `processor` (`len` bytes): the rank's MPI
/// processor name. Returns 1 when innet serves the job, 0 when every collective goes to
/// MPI (disabled, or misconfigured: rank 0 says why).
///
/// # Safety
/// `world` points to the world communicator's [`Oob`]; `processor` to `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_start(
    world: *const Oob,
    processor: *const c_char,
    len: c_int,
) -> c_int {
    guarded(0, || {
        // SAFETY: the caller's communicator and name.
        let (world, name) = unsafe {
            (
                *world,
                std::slice::from_raw_parts(processor.cast::<u8>(), index(len)),
            )
        };
        c_int::from(State::start(&world, &String::from_utf8_lossy(name)))
    })
}

/// Joins innet for the communicator `comm` describes (collective over it: every member
/// calls it), whose rank `i` is world rank `world_ranks[i]`: its rank 0 draws the group id,
/// every rank joins, and the ranks agree that all of them did. NULL when innet does not
/// serve it (the reason is logged and reported); `world_ranks` NULL: this rank refuses (it
/// still takes part).
///
/// # Safety
/// `comm` points to the communicator's [`Oob`], whose `ctx` stays valid until
/// [`innet_mpi_close`]; `world_ranks` NULL or one int per rank.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_open(
    comm: *const Oob,
    world_ranks: *const c_int,
) -> *mut c_void {
    guarded(std::ptr::null_mut(), || {
        // SAFETY: the caller's communicator.
        let oob = unsafe { *comm };
        let members: Vec<usize> = if world_ranks.is_null() {
            vec![] // a rank that could not tell: it takes part and refuses
        } else {
            // SAFETY: the caller's world ranks, one per rank.
            unsafe { std::slice::from_raw_parts(world_ranks, index(oob.size)) }
                .iter()
                .map(|&r| index(r))
                .collect()
        };
        match Session::join(oob, &members) {
            Some(s) => Box::into_raw(Box::new(s)).cast(),
            None => std::ptr::null_mut(),
        }
    })
}

/// Leaves the group of a session from [`innet_mpi_open`] (collective: every member calls it).
///
/// # Safety
/// `session` came from [`innet_mpi_open`] and is not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_close(session: *mut c_void) {
    if session.is_null() {
        return;
    }
    guarded((), || {
        // SAFETY: the caller's session, given back once.
        drop(unsafe { Box::from_raw(session.cast::<Session>()) });
        if let Some(st) = state() {
            st.counters.closed();
        }
    });
}

/// The way of the next call of `call_kind` with `bytes` on `session`: [`ROUTE_NETWORK`]
/// set when innet serves it (else MPI, counted), [`ROUTE_TRIAL`] set when the shim must
/// time it and call [`innet_mpi_took`]. `ticket`: for a non-blocking kind, where a timed
/// call's ticket goes (NULL: no trials, another thread may use the session); NULL for a
/// blocking one.
///
/// # Safety
/// `session` from [`innet_mpi_open`], not closed; `ticket` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_route(
    session: *mut c_void,
    call_kind: c_int,
    bytes: usize,
    ticket: *mut u32,
) -> c_int {
    guarded(ROUTE_NETWORK, || {
        // SAFETY: the caller's open session, one collective at a time.
        let s = unsafe { &mut *session.cast::<Session>() };
        let kind = kind_of(call_kind);
        let (r, t) = s.route(kind, bytes, !ticket.is_null());
        if r.way == Way::Mpi
            && let Some(st) = state()
        {
            let reason = if r.trial {
                Pass::Learning
            } else {
                Pass::Cutover
            };
            st.counters.passed(kind, reason);
        }
        if let Some(t) = t.filter(|_| !ticket.is_null()) {
            // SAFETY: the caller's writable ticket.
            unsafe { *ticket = t };
        }
        let timed = if kind.is_started() {
            t.is_some()
        } else {
            r.trial
        };
        let way = if r.way == Way::Network {
            ROUTE_NETWORK
        } else {
            0
        };
        way | if timed { ROUTE_TRIAL } else { 0 }
    })
}

/// A timed trial call of `call_kind` with `bytes` took `nanos` on this rank (`ticket`: a
/// non-blocking call's, from [`innet_mpi_route`]). After a blocking call, collective over
/// the communicator: at the end of a trial's round the ranks agree here.
///
/// # Safety
/// `session` from [`innet_mpi_open`], not closed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_took(
    session: *mut c_void,
    call_kind: c_int,
    bytes: usize,
    ticket: u32,
    nanos: u64,
) {
    guarded((), || {
        // SAFETY: as above.
        let s = unsafe { &mut *session.cast::<Session>() };
        record(s.took(kind_of(call_kind), bytes, ticket, nanos));
    });
}

/// Where every rank of the communicator is anyway (a blocking collective or barrier the
/// application called): the ranks agree on a non-blocking size class whose trial calls are
/// all started, if one is due (collective; nothing happens when none is).
///
/// # Safety
/// `session` from [`innet_mpi_open`], not closed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_agree(session: *mut c_void) {
    guarded((), || {
        // SAFETY: as above.
        let s = unsafe { &mut *session.cast::<Session>() };
        record(s.agree());
    });
}

/// Runs `call` through innet: 0 when served, 1 when it failed (logged, counted; the
/// communicator is no longer usable through innet).
///
/// # Safety
/// `session` from [`innet_mpi_open`], used by one thread at a time (MPI's rule for
/// collectives on a communicator); the buffers valid as `call` describes them, as MPI
/// defines them for the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_collective(session: *mut c_void, call: *const Call) -> c_int {
    guarded(1, || {
        // SAFETY: the caller's session and call.
        let (s, c) = unsafe { (&mut *session.cast::<Session>(), *call) };
        let kind = kind_of(c.kind);
        let (send, recv, shape) = (c.input(), c.recv.cast::<u8>(), c.shape());
        if kind == Kind::Allgather {
            // SAFETY: the caller's buffers: `block` bytes, `block` per rank.
            return counted(kind, unsafe { s.allgather(send, recv, c.block) });
        }
        let Some((op, dtype)) = op_dtype(c.op, c.dtype) else {
            return 1;
        };
        let r = if matches!(kind, Kind::ReduceScatter | Kind::ReduceScatterBlock) {
            let counts: Vec<usize> = if c.counts.is_null() {
                vec![c.block; s.size()]
            } else {
                // SAFETY: one count per rank.
                unsafe { std::slice::from_raw_parts(c.counts, s.size()) }
                    .iter()
                    .map(|&n| index(n))
                    .collect()
            };
            // SAFETY: the caller's buffers, as MPI_Reduce_scatter defines them.
            unsafe { s.reduce_scatter(send, recv, &counts, shape, op, dtype) }
        } else {
            // SAFETY: the caller's buffers, `count` elements as described.
            unsafe { s.allreduce(send, recv, shape, op, dtype) }
        };
        counted(kind, r)
    })
}

/// Starts `call` (a non-blocking kind's allreduce, laid out as [`innet_mpi_collective`]'s)
/// and returns: 0 when started, `done(arg, failed)` then runs once when it is over (on
/// innet's progress thread, or on the application's thread in [`innet_mpi_progress`] or a
/// later innet collective on this communicator), after the result is in `recv`; 1 when it
/// could not start (logged, counted as failed; `done` does not run).
///
/// # Safety
/// As [`innet_mpi_collective`]; `recv` left alone by the caller until `done` runs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_start_collective(
    session: *mut c_void,
    call: *const Call,
    done: Done,
    arg: *mut c_void,
) -> c_int {
    guarded(1, || {
        // SAFETY: the caller's session and call, used by the application's thread.
        let (s, c) = unsafe { (&mut *session.cast::<Session>(), *call) };
        let kind = kind_of(c.kind);
        let Some((op, dtype)) = op_dtype(c.op, c.dtype) else {
            return 1;
        };
        let arg = Arg(arg);
        let finish = move |r: Result<innet_client::Report, innet_client::Error>| {
            let arg = arg;
            let failed = counted(kind, r);
            // SAFETY: the shim's callback and its request state, called once.
            unsafe { done(arg.0, failed) };
        };
        // SAFETY: the caller's buffers, as documented.
        match unsafe { s.start_allreduce(c.input(), c.recv.cast(), c.shape(), op, dtype, finish) } {
            Ok(()) => 0,
            Err(e) => counted(kind, Err(e)),
        }
    })
}

/// The application's thread waits (`wait` 1) or tests (0) for a call started on
/// `session`: it runs the started calls itself, taking their results as they come, unless
/// innet's progress thread has taken them already (then it returns at once and the caller
/// waits for `done`); a test does so only when the results are at the socket already, so
/// it never waits for packets.
///
/// # Safety
/// `session` from [`innet_mpi_open`], not closed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_progress(session: *mut c_void, wait: c_int) {
    guarded((), || {
        // SAFETY: the caller's open session; the communicator's own lock orders threads.
        let s = unsafe { &*session.cast::<Session>() };
        if wait != 0 {
            s.progress_here();
        } else {
            s.progress_if_answered();
        }
    });
}

/// Counts a call of `call_kind` handed to MPI for `reason` (`INNET_PASS_*`) before it
/// reached a session.
#[unsafe(no_mangle)]
pub extern "C" fn innet_mpi_passed(call_kind: c_int, reason: c_int) {
    if let Some(st) = state() {
        let reason = Pass::from_c(reason).unwrap_or(Pass::Disabled);
        st.counters.passed(kind_of(call_kind), reason);
    }
}

/// Writes this rank's report (see [`crate::rank_report`]); called by `MPI_Finalize` after every
/// group is closed, also when innet did not serve the job.
#[unsafe(no_mangle)]
pub extern "C" fn innet_mpi_finish() {
    guarded((), || {
        if let Some(st) = state() {
            let summary = st.counters.summary(st.world_rank);
            if st.world_rank == 0 {
                crate::saved::save_at_finalize(&summary.cutover);
            }
            summary.publish();
        }
    });
}

/// The shim's request state, handed to the progress thread.
struct Arg(*mut c_void);
// SAFETY: the shim touches its request state again only after `done` (MPI's request rules).
unsafe impl Send for Arg {}

/// A communicator's join (see [`innet_mpi_open`]).
impl Session {
    /// Joins over `oob` as its rank, the communicator's rank `i` being world rank
    /// `members[i]`; `None` when innet does not serve it (every rank alike).
    fn join(oob: Oob, members: &[usize]) -> Option<Self> {
        let st = state()?;
        let rank = index(oob.rank);
        let drawn = if rank == 0 { new_job() } else { 0 };
        let job = match oob.from_rank0(drawn) {
            Ok(job) => job,
            Err(e) => {
                warn!(error = %e, "joining innet");
                return None;
            }
        };
        let number = st.joined.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let opened = match st.placement.get() {
            Some(p) => Session::open(p, job, (rank, oob), members, number),
            None => Err("innet found no placement for the job".into()),
        };
        let everyone = oob.all(opened.is_ok()).unwrap_or(false);
        match opened {
            Ok(s) if everyone => {
                info!(job, rank, size = members.len(), "joined an innet group");
                st.counters.opened(true);
                Some(s)
            }
            Ok(_) => {
                st.counters.opened(false);
                st.counters
                    .not_served("another rank of the communicator could not join");
                None
            }
            Err(reason) => {
                if rank == 0 {
                    warn!(
                        size = members.len(),
                        "innet cannot serve this communicator: {reason}; its collectives go to MPI"
                    );
                }
                st.counters.opened(false);
                st.counters.not_served(&reason);
                None
            }
        }
    }
}

/// A fresh group id, drawn by a communicator's rank 0.
fn new_job() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: an 8-byte buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != 8 {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        return t ^ (u64::from(std::process::id()) << 32);
    }
    u64::from_ne_bytes(b)
}
