//! innet under unmodified MPI programs. The PMPI interposer is two halves: a small C shim per
//! MPI implementation (`shim/innet_mpi.c`, compiled against that implementation's `mpi.h`,
//! since OpenMPI's handles are pointers and MPICH's integers), which maps MPI's handles to
//! innet's op and type codes and does MPI's side of the bookkeeping; and this library, which
//! it calls through the C ABI declared in `shim/innet_mpi.h`: placement, groups, allreduce,
//! counters. Nothing here calls MPI.

pub mod config;
pub mod netns;
pub mod report;
pub mod session;

use std::{
    ffi::{c_int, c_void},
    panic::{AssertUnwindSafe, catch_unwind},
    sync::OnceLock,
};

use innet_common::proto::{Dtype, Op};
use tracing::{info, warn};

use crate::{
    config::{ENABLE_VAR, Placement, disabled_by},
    report::Counters,
    session::{Session, Shape},
};

/// `INNET_MPI_LOG`: a tracing filter for the interposer's logs (default `warn`).
pub const LOG_VAR: &str = "INNET_MPI_LOG";

struct State {
    world_rank: usize,
    placement: Option<Placement>,
    counters: Counters,
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

/// Called once, after `MPI_Init`. Reads the configuration; returns 1 when innet serves this
/// job, 0 when every collective goes to MPI (disabled, or misconfigured: rank 0 says why).
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
        let placement = if disabled_by(std::env::var(ENABLE_VAR).ok().as_deref()) {
            None
        } else {
            match Placement::from_env(index(world_size)) {
                Ok(p) => Some(p),
                Err(e) => {
                    if world_rank == 0 {
                        eprintln!("innet-mpi: {e}; collectives go to MPI");
                    }
                    None
                }
            }
        };
        let on = placement.is_some();
        let _ = STATE.set(State {
            world_rank,
            placement,
            counters: Counters::default(),
        });
        c_int::from(on)
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
        let Some(placement) = &st.placement else {
            return std::ptr::null_mut();
        };
        // SAFETY: the caller's array of `size` world ranks.
        let members: Vec<usize> = unsafe { std::slice::from_raw_parts(members, index(size)) }
            .iter()
            .map(|&r| index(r))
            .collect();
        match Session::open(placement, job, index(rank), &members) {
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
    guarded(1, || {
        let code = |v: c_int| u8::try_from(v).unwrap_or(u8::MAX);
        let (Some(op), Some(dtype)) = (Op::from_u8(code(op)), Dtype::from_u8(code(dtype))) else {
            warn!(op, dtype, "unknown op or type code from the shim");
            return 1;
        };
        // SAFETY: the caller's session, used by one thread at a time (MPI's rule for
        // collectives on a communicator).
        let s = unsafe { &mut *session.cast::<Session>() };
        let shape = Shape {
            count,
            stride,
            loc_offset,
        };
        let send = (!send.is_null()).then_some(send.cast::<u8>());
        // SAFETY: the caller's buffers.
        match unsafe { s.allreduce(send, recv.cast(), shape, op, dtype) } {
            Ok(r) => {
                if let Some(st) = state() {
                    st.counters.served(index(kind), &r);
                }
                0
            }
            Err(e) => {
                warn!(error = %e, "innet allreduce failed");
                if let Some(st) = state() {
                    st.counters
                        .passed(index(kind), report::PASS_REASONS.len() - 1);
                }
                1
            }
        }
    })
}

/// Whether innet serves a call of `bytes` on `session` (1), or MPI is faster for it (0,
/// counted as passed for the cutover).
///
/// # Safety
/// `session` comes from `innet_mpi_open` and is not closed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_serves(
    session: *mut c_void,
    kind: c_int,
    bytes: usize,
) -> c_int {
    guarded(1, || {
        // SAFETY: the caller's open session.
        let s = unsafe { &*session.cast::<Session>() };
        if s.serves(bytes) {
            return 1;
        }
        if let Some(st) = state() {
            st.counters.passed(index(kind), report::CUTOVER);
        }
        0
    })
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
            st.counters.summary(st.world_rank).publish();
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
        for (i, r) in PASS_REASONS.iter().enumerate() {
            assert_eq!(code(&format!("INNET_PASS_{}", r.to_uppercase())), i);
        }
        assert_eq!(
            header_codes().len(),
            Op::ALL.len() + Dtype::ALL.len() + KINDS.len() + PASS_REASONS.len(),
            "the header has codes Rust does not know"
        );
    }
}
