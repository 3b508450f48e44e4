//! innet under unmodified MPI programs. The PMPI interposer is two halves: a small C shim per
//! MPI implementation (`shim/innet_mpi.c`, compiled against that implementation's `mpi.h`,
//! since OpenMPI's handles are pointers and MPICH's integers), which maps MPI's handles to
//! innet's op and type codes and does MPI's side of the bookkeeping; and this library, which
//! it calls through the C ABI declared in `shim/innet_mpi.h`: placement, groups, allreduce,
//! counters. Nothing here calls MPI.

pub mod config;
pub mod discover;
pub mod learn;
pub mod netns;
pub mod nonblocking;
pub mod report;
pub mod saved;
pub mod session;

use std::{
    ffi::{c_int, c_void},
    net::Ipv4Addr,
    panic::{AssertUnwindSafe, catch_unwind},
    sync::{
        OnceLock,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
};

use innet_common::proto::{Dtype, Op};
use tracing::{info, warn};

use crate::{
    config::{ENABLE_VAR, Placement, Settings, Start, disabled_by},
    discover::Record,
    learn::Way,
    report::Counters,
    session::{Session, Shape},
};

/// `INNET_MPI_LOG`: a tracing filter for the interposer's logs (default `warn`).
pub const LOG_VAR: &str = "INNET_MPI_LOG";

struct State {
    world_rank: usize,
    /// What `INNET_MPI_CONFIG` asks for when the interposer places the ranks itself.
    discover: Option<Settings>,
    /// Set once: from the file at start, or from the discovered records.
    placement: OnceLock<Placement>,
    counters: Counters,
    /// Communicators this rank joined so far (numbers the learners).
    joined: AtomicU64,
}

static STATE: OnceLock<State> = OnceLock::new();

fn env_flag(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// A C int that counts or indexes (negative ones never come from the shim; they clamp to 0).
fn index(v: c_int) -> usize {
    usize::try_from(v).unwrap_or(0)
}

fn state() -> Option<&'static State> {
    STATE.get()
}

/// Runs `f`, turning a panic into `on_panic` (a panic must not unwind into C).
fn guarded<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        eprintln!("innet-mpi: internal error (panic); the call goes to MPI");
        on_panic
    })
}

/// Called once, after `MPI_Init`. Reads the configuration; returns 1 when a file places the
/// ranks, 2 when the shim must find the placement ([`innet_mpi_node_address`],
/// [`innet_mpi_probe_tor`], [`innet_mpi_placed`]), 0 when every collective goes to MPI
/// (disabled, or misconfigured: rank 0 says why).
#[unsafe(no_mangle)]
pub extern "C" fn innet_mpi_start(world_rank: c_int, world_size: c_int) -> c_int {
    guarded(0, || {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_env(LOG_VAR)
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
            )
            .with_writer(std::io::stderr)
            .try_init();
        let world_rank = index(world_rank);
        let start = if disabled_by(std::env::var(ENABLE_VAR).ok().as_deref()) {
            None
        } else {
            match Start::from_env(index(world_size)) {
                Ok(s) => Some(s),
                Err(e) => {
                    if world_rank == 0 {
                        eprintln!("innet-mpi: {e}; collectives go to MPI");
                    }
                    None
                }
            }
        };
        let placement = OnceLock::new();
        let counters = Counters::default();
        let (discover, code) = match start {
            None => (None, 0),
            Some(Start::Placed(p)) => {
                counters.placed(&p, world_rank);
                let _ = placement.set(p);
                (None, 1)
            }
            Some(Start::Discover(s)) => (Some(s), 2),
        };
        let _ = STATE.set(State {
            world_rank,
            discover,
            placement,
            counters,
            joined: AtomicU64::new(0),
        });
        code
    })
}

/// The key of the node whose MPI processor name is the `len` bytes at `name`.
///
/// # Safety
/// `name` points to `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_node_key(name: *const u8, len: c_int) -> u64 {
    // SAFETY: the caller's bytes.
    discover::node_key(unsafe { std::slice::from_raw_parts(name, index(len)) })
}

/// The rank that speaks for `rank`'s node, given every rank's node key.
///
/// # Safety
/// `keys` points to `size` keys.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_node_leader(rank: c_int, size: c_int, keys: *const u64) -> u32 {
    // SAFETY: the caller's keys.
    let keys = unsafe { std::slice::from_raw_parts(keys, index(size)) };
    u32::try_from(discover::leader_of(index(rank), keys)).unwrap_or(u32::MAX)
}

/// The node's INC address (see [`discover`]) into `*ip` (host order); 0 on success, else
/// 1 (the reason is logged, `*ip` is 0).
///
/// # Safety
/// `ip` points to a writable u32.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_node_address(ip: *mut u32) -> c_int {
    guarded(1, || {
        let found = discover::node_address();
        let value = found.as_ref().map_or(0, |a| u32::from(*a));
        // SAFETY: the caller's u32.
        unsafe { ip.write(value) };
        match found {
            Ok(a) => {
                info!(address = %a, "the node's INC address");
                0
            }
            Err(e) => {
                warn!("innet-mpi: {e}");
                1
            }
        }
    })
}

/// The TOR of the node whose INC address is `own` (host order), probed towards another
/// node of the `size` records: its address, or 0 when no innet TOR answered (or the mode
/// needs no TOR).
///
/// # Safety
/// `records` points to `size` records.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_probe_tor(own: u32, size: c_int, records: *const Record) -> u32 {
    guarded(0, || {
        let Some(settings) = state().and_then(|st| st.discover.as_ref()) else {
            return 0;
        };
        if !settings.mode.uses_switches() || own == 0 {
            return 0;
        }
        // SAFETY: the caller's records.
        let records = unsafe { std::slice::from_raw_parts(records, index(size)) };
        let own = Ipv4Addr::from(own);
        let Some(peer) = discover::probe_peer(records, own) else {
            return 0; // one node: no network between its ranks
        };
        innet_client::bootstrap::probed_tor(own, peer)
    })
}

/// Builds the placement from every world rank's record; 1 when innet serves the job, 0
/// when its collectives go to MPI (rank 0 prints why).
///
/// # Safety
/// `records` points to `size` records.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_placed(size: c_int, records: *const Record) -> c_int {
    guarded(0, || {
        let Some(st) = state() else {
            return 0;
        };
        let Some(settings) = st.discover.clone() else {
            return c_int::from(st.placement.get().is_some());
        };
        // SAFETY: the caller's records.
        let records = unsafe { std::slice::from_raw_parts(records, index(size)) };
        match discover::placement(settings, records) {
            Ok(p) => {
                if st.world_rank == 0 {
                    info!(nodes = p.nodes.len(), "innet found the placement");
                }
                st.counters.placed(&p, st.world_rank);
                let _ = st.placement.set(p);
                1
            }
            Err(e) => {
                if st.world_rank == 0 {
                    eprintln!("innet-mpi: {e}; collectives go to MPI");
                }
                st.counters.not_served(&e.to_string());
                0
            }
        }
    })
}

/// A fresh group id, drawn by a communicator's rank 0 and broadcast by the shim.
#[unsafe(no_mangle)]
pub extern "C" fn innet_mpi_new_job() -> u64 {
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

/// Joins innet group `job` as rank `rank` of a communicator of `size` ranks whose rank `i` is
/// world rank `members[i]`. NULL when innet cannot serve it (the reason is logged); every
/// member must call it, and the shim agrees on the outcome before using it.
///
/// # Safety
/// `members` points to `size` ints.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_open(
    job: u64,
    rank: c_int,
    size: c_int,
    members: *const c_int,
) -> *mut c_void {
    guarded(std::ptr::null_mut(), || {
        let Some(st) = state() else {
            return std::ptr::null_mut();
        };
        let Some(placement) = st.placement.get() else {
            return std::ptr::null_mut();
        };
        // SAFETY: the caller's array of `size` world ranks.
        let members: Vec<usize> = unsafe { std::slice::from_raw_parts(members, index(size)) }
            .iter()
            .map(|&r| index(r))
            .collect();
        let number = st.joined.fetch_add(1, Relaxed);
        match Session::open(placement, job, index(rank), &members, number) {
            Ok(s) => {
                info!(job, rank, size, "joined an innet group");
                st.counters.opened(true);
                Box::into_raw(Box::new(s)).cast()
            }
            Err(reason) => {
                if rank == 0 {
                    warn!(
                        size,
                        "innet cannot serve this communicator: {reason}; its collectives go to MPI"
                    );
                }
                st.counters.opened(false);
                st.counters.not_served(&reason);
                std::ptr::null_mut()
            }
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

/// Runs collective `kind` on `session` through `f` and counts it: 0 when innet served it,
/// 1 when it failed (logged; the communicator is no longer usable through innet).
///
/// # Safety
/// `session` from [`innet_mpi_open`], used by one thread at a time (MPI's rule for
/// collectives on a communicator).
unsafe fn serve(
    session: *mut c_void,
    kind: c_int,
    f: impl FnOnce(&mut Session) -> Result<innet_client::Report, innet_client::Error>,
) -> c_int {
    guarded(1, || {
        // SAFETY: the caller's session.
        let s = unsafe { &mut *session.cast::<Session>() };
        counted(index(kind), f(s))
    })
}

/// Counts the outcome of a collective of `kind` innet ran: served (by its path), or
/// failed (logged, passed as `error`). 0 when served, 1 when failed.
fn counted(kind: usize, r: Result<innet_client::Report, innet_client::Error>) -> c_int {
    match r {
        Ok(r) => {
            if let Some(st) = state() {
                st.counters.served(kind, &r);
            }
            0
        }
        Err(e) => {
            warn!(error = %e, kind = report::KINDS.get(kind).copied(), "innet collective failed");
            if let Some(st) = state() {
                st.counters.passed(kind, report::ERROR);
            }
            1
        }
    }
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

/// An allreduce (on behalf of collective `kind`, see `INNET_KIND_*`) through innet: `count`
/// elements of `op`/`dtype` codes, `stride` bytes apart, a pair's location at `loc_offset`.
/// `send` NULL: in place. Returns 0 on success; otherwise the error is logged and the
/// communicator is no longer usable through innet.
///
/// # Safety
/// `session` from [`innet_mpi_open`]; the buffers valid for `count` elements as described.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_allreduce(
    session: *mut c_void,
    kind: c_int,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    stride: usize,
    loc_offset: usize,
    op: c_int,
    dtype: c_int,
) -> c_int {
    let Some((op, dtype)) = op_dtype(op, dtype) else {
        return 1;
    };
    let shape = Shape {
        count,
        stride,
        loc_offset,
    };
    let send = (!send.is_null()).then_some(send.cast::<u8>());
    // SAFETY: the caller's session and buffers.
    unsafe {
        serve(session, kind, |s| {
            s.allreduce(send, recv.cast(), shape, op, dtype)
        })
    }
}

/// MPI_Allgather of `block` bytes per rank through innet (`send` NULL: in place, this
/// rank's block already in `recv`). Returns 0 on success, 1 on failure as
/// [`innet_mpi_allreduce`].
///
/// # Safety
/// `session` from [`innet_mpi_open`]; `send` valid for `block` bytes, `recv` writable for
/// `block` bytes per rank.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_allgather(
    session: *mut c_void,
    send: *const c_void,
    recv: *mut c_void,
    block: usize,
) -> c_int {
    let send = (!send.is_null()).then_some(send.cast::<u8>());
    let kind = report::ALLGATHER as c_int;
    // SAFETY: the caller's session and buffers.
    unsafe { serve(session, kind, |s| s.allgather(send, recv.cast(), block)) }
}

/// MPI_Reduce_scatter (`counts`: one per rank) or MPI_Reduce_scatter_block (`counts`
/// NULL: `block` elements each) through innet, on behalf of `kind`; elements as
/// [`innet_mpi_allreduce`] describes them, `send` NULL in place. Returns 0 on success, 1
/// on failure.
///
/// # Safety
/// `session` from [`innet_mpi_open`]; `counts` NULL or one int per rank; the buffers as
/// MPI defines them for these calls.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_reduce_scatter(
    session: *mut c_void,
    kind: c_int,
    send: *const c_void,
    recv: *mut c_void,
    counts: *const c_int,
    block: usize,
    stride: usize,
    loc_offset: usize,
    op: c_int,
    dtype: c_int,
) -> c_int {
    let Some((op, dtype)) = op_dtype(op, dtype) else {
        return 1;
    };
    let shape = Shape {
        count: 0,
        stride,
        loc_offset,
    };
    let send = (!send.is_null()).then_some(send.cast::<u8>());
    // SAFETY: the caller's session, counts and buffers.
    unsafe {
        serve(session, kind, |s| {
            let counts: Vec<usize> = if counts.is_null() {
                vec![block; s.size()]
            } else {
                std::slice::from_raw_parts(counts, s.size())
                    .iter()
                    .map(|&c| index(c))
                    .collect()
            };
            s.reduce_scatter(send, recv.cast(), &counts, shape, op, dtype)
        })
    }
}

/// The way of a call of `kind` with `bytes` on `session`: [`ROUTE_NETWORK`] set when innet
/// serves it (else MPI, counted), [`ROUTE_TRIAL`] set when the shim must time it and call
/// [`innet_mpi_took`].
///
/// # Safety
/// `session` comes from `innet_mpi_open` and is not closed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_route(session: *mut c_void, kind: c_int, bytes: usize) -> c_int {
    guarded(ROUTE_NETWORK, || {
        // SAFETY: the caller's open session, one collective at a time.
        let s = unsafe { &mut *session.cast::<Session>() };
        let r = s.route(index(kind), bytes);
        if r.way == Way::Mpi
            && let Some(st) = state()
        {
            let reason = if r.trial {
                report::LEARNING
            } else {
                report::CUTOVER
            };
            st.counters.passed(index(kind), reason);
        }
        let way = if r.way == Way::Network {
            ROUTE_NETWORK
        } else {
            0
        };
        way | if r.trial { ROUTE_TRIAL } else { 0 }
    })
}

/// [`innet_mpi_route`]: innet serves the call.
pub const ROUTE_NETWORK: c_int = 1;
/// [`innet_mpi_route`]: the call is part of a trial.
pub const ROUTE_TRIAL: c_int = 2;

/// Records how long a trial call took on this rank; 1 at the end of a trial's round: the
/// shim then sums every rank's [`innet_mpi_medians`] (one allreduce) and every rank calls
/// [`innet_mpi_decide`] with the sums (which ends the trial or lets it go on).
///
/// # Safety
/// `session` comes from `innet_mpi_open` and is not closed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_took(
    session: *mut c_void,
    kind: c_int,
    bytes: usize,
    nanos: u64,
) -> c_int {
    guarded(0, || {
        // SAFETY: as above.
        let s = unsafe { &mut *session.cast::<Session>() };
        s.learner()
            .map_or(0, |l| c_int::from(l.took(index(kind), bytes, nanos)))
    })
}

/// This rank's median µs per way in the trial just ended, into `out[0]` (the network) and
/// `out[1]` (MPI).
///
/// # Safety
/// `session` comes from `innet_mpi_open` and is not closed; `out` points to two doubles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_medians(
    session: *mut c_void,
    kind: c_int,
    bytes: usize,
    out: *mut f64,
) {
    guarded((), || {
        // SAFETY: as above.
        let s = unsafe { &mut *session.cast::<Session>() };
        let m = s
            .learner()
            .map_or([0.0; 2], |l| l.medians_us(index(kind), bytes));
        // SAFETY: the caller's two doubles.
        unsafe { std::ptr::copy_nonoverlapping(m.as_ptr(), out, 2) };
    });
}

/// Decides this size class on the sums over the ranks of their medians (`network_us`,
/// `mpi_us`: the same on every rank), or lets its trial go on (see `learn`'s rule).
///
/// # Safety
/// `session` comes from `innet_mpi_open` and is not closed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_decide(
    session: *mut c_void,
    kind: c_int,
    bytes: usize,
    network_us: f64,
    mpi_us: f64,
) {
    guarded((), || {
        // SAFETY: as above.
        let s = unsafe { &mut *session.cast::<Session>() };
        let ranks = s.size().max(1) as f64;
        let means = [network_us / ranks, mpi_us / ranks];
        if let Some(d) = s
            .learner()
            .and_then(|l| l.decide_on_means(index(kind), bytes, means))
            && let Some(st) = state()
        {
            info!(?d, "learned cutover");
            st.counters.decided(d);
        }
    });
}

/// Counts a collective of `kind` handed to MPI for `reason` (see `INNET_PASS_*`).
#[unsafe(no_mangle)]
pub extern "C" fn innet_mpi_passed(kind: c_int, reason: c_int) {
    if let Some(st) = state() {
        st.counters.passed(index(kind), index(reason));
    }
}

/// Writes this rank's report (see [`report`]); called by `MPI_Finalize` after every group is
/// closed.
#[unsafe(no_mangle)]
pub extern "C" fn innet_mpi_finish() {
    guarded((), || {
        if let Some(st) = state() {
            let summary = st.counters.summary(st.world_rank);
            if st.world_rank == 0 {
                saved::save_at_finalize(&summary.cutover);
            }
            summary.publish();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::report::{KINDS, PASS_REASONS};
    use innet_common::proto::{Dtype, Op};

    /// The `NAME = value` constants of the C header.
    fn header_codes() -> Vec<(String, usize)> {
        include_str!("../shim/innet_mpi.h")
            .lines()
            .filter_map(|l| {
                let (name, value) = l.trim().trim_end_matches(',').split_once(" = ")?;
                Some((name.to_owned(), value.parse().ok()?))
            })
            .collect()
    }

    fn code(name: &str) -> usize {
        header_codes()
            .into_iter()
            .find_map(|(n, v)| (n == name).then_some(v))
            .unwrap_or_else(|| panic!("{name} is not in shim/innet_mpi.h"))
    }

    #[test]
    fn the_c_header_matches_the_rust_codes() {
        for op in Op::ALL {
            assert_eq!(
                code(&format!("INNET_OP_{}", op.name().to_uppercase())),
                op as usize
            );
        }
        for d in Dtype::ALL {
            assert_eq!(
                code(&format!("INNET_{}", d.short().to_uppercase())),
                d as usize
            );
        }
        for (i, k) in KINDS.iter().enumerate() {
            assert_eq!(code(&format!("INNET_KIND_{}", k.to_uppercase())), i);
        }
        assert_eq!(
            [
                super::report::IALLREDUCE,
                super::report::IREDUCE,
                super::report::IBCAST,
                super::report::IBARRIER
            ]
            .map(|k| KINDS[k]),
            ["iallreduce", "ireduce", "ibcast", "ibarrier"]
        );
        assert_eq!(KINDS[super::report::ALLGATHER], "allgather");
        assert_eq!(KINDS[super::report::BARRIER], "barrier");
        for (i, r) in PASS_REASONS.iter().enumerate() {
            assert_eq!(code(&format!("INNET_PASS_{}", r.to_uppercase())), i);
        }
        assert_eq!(code("INNET_ROUTE_NETWORK"), super::ROUTE_NETWORK as usize);
        assert_eq!(code("INNET_ROUTE_TRIAL"), super::ROUTE_TRIAL as usize);
        assert_eq!(
            std::mem::size_of::<super::Record>(),
            code("INNET_RECORD_WORDS") * 4
        );
        assert_eq!(
            header_codes().len(),
            Op::ALL.len() + Dtype::ALL.len() + KINDS.len() + PASS_REASONS.len() + 3,
            "the header has codes Rust does not know"
        );
    }
}
