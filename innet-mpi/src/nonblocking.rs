//! The C ABI of the non-blocking collectives (`MPI_Iallreduce`, `MPI_Ireduce`, `MPI_Ibcast`,
//! `MPI_Ibarrier`): the shim asks which way a call goes ([`innet_mpi_nb_route`]), starts
//! it ([`innet_mpi_iallreduce`]) and completes MPI's generalized request in the callback
//! innet runs when the collective is over, on the communicator's progress thread.

use std::ffi::{c_int, c_void};

use crate::{
    counted, guarded, index,
    learn::Way,
    op_dtype,
    report::{self, KINDS},
    session::{Session, Shape},
    state,
};

/// The shim's completion of a started call: its request state and 0 (done) or 1 (failed).
pub type Done = unsafe extern "C" fn(arg: *mut c_void, failed: c_int);

/// The blocking collective whose learned cutover a non-blocking `kind` follows
/// (`iallreduce` → `allreduce` …); `kind` itself when it has none.
fn blocking_kind(kind: usize) -> usize {
    KINDS
        .get(kind)
        .and_then(|k| k.strip_prefix('i'))
        .and_then(|b| KINDS.iter().position(|k| *k == b))
        .unwrap_or(kind)
}

/// The way of a non-blocking call of `kind` with `bytes` on `session`: 1 innet, 0 MPI
/// (counted as `cutover`). See [`Session::route_nonblocking`].
///
/// # Safety
/// `session` comes from `innet_mpi_open` and is not closed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_nb_route(
    session: *mut c_void,
    kind: c_int,
    bytes: usize,
) -> c_int {
    guarded(0, || {
        // SAFETY: the caller's open session, used by the application's thread.
        let s = unsafe { &*session.cast::<Session>() };
        if s.route_nonblocking(blocking_kind(index(kind)), bytes) == Way::Network {
            return 1;
        }
        if let Some(st) = state() {
            st.counters.passed(index(kind), report::CUTOVER);
        }
        0
    })
}

/// Starts an allreduce on behalf of non-blocking collective `kind`, laid out as
/// `innet_mpi_allreduce`'s (`send` NULL: in place; `recv` NULL: the result is not kept, a
/// reduce's non-root). Returns 0 when started: `done(arg, failed)` then runs once, when it
/// is over (on innet's progress thread, or in a later innet collective on this
/// communicator), after the result is in `recv`, and the call is counted as served (or
/// failed). Returns 1 when it could not start (logged, counted as failed; `done` does not
/// run).
///
/// # Safety
/// `session` from `innet_mpi_open`; the buffers valid for `count` elements as described;
/// `recv` left alone by the caller until `done` runs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_iallreduce(
    session: *mut c_void,
    kind: c_int,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    stride: usize,
    loc_offset: usize,
    op: c_int,
    dtype: c_int,
    done: Done,
    arg: *mut c_void,
) -> c_int {
    guarded(1, || {
        let Some((op, dtype)) = op_dtype(op, dtype) else {
            return 1;
        };
        let shape = Shape {
            count,
            stride,
            loc_offset,
        };
        // SAFETY: the caller's open session, used by the application's thread.
        let s = unsafe { &mut *session.cast::<Session>() };
        let send = (!send.is_null()).then_some(send.cast::<u8>());
        let arg = Arg(arg);
        let k = index(kind);
        let finish = move |r: Result<innet_client::Report, innet_client::Error>| {
            let arg = arg;
            let bad = counted(k, r);
            // SAFETY: the shim's callback and its request state, called once.
            unsafe { done(arg.0, bad) };
        };
        // SAFETY: the caller's buffers, as documented.
        match unsafe { s.start_allreduce(send, recv.cast(), shape, op, dtype, finish) } {
            Ok(()) => 0,
            Err(e) => counted(k, Err(e)),
        }
    })
}

/// The shim's request state, handed to the progress thread.
struct Arg(*mut c_void);
// SAFETY: the shim touches its request state again only after `done` (MPI's request rules).
unsafe impl Send for Arg {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonblocking_kinds_follow_their_blocking_kinds() {
        let at = |k: &str| KINDS.iter().position(|n| *n == k).unwrap();
        for (nb, b) in [
            ("iallreduce", "allreduce"),
            ("ireduce", "reduce"),
            ("ibcast", "bcast"),
            ("ibarrier", "barrier"),
        ] {
            assert_eq!(blocking_kind(at(nb)), at(b));
        }
        assert_eq!(blocking_kind(at("allgather")), at("allgather"));
    }
}
