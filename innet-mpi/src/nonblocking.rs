//! The C ABI of the non-blocking collectives (`MPI_Iallreduce`, `MPI_Ireduce`, `MPI_Ibcast`,
//! `MPI_Ibarrier`): the shim asks which way a call goes ([`innet_mpi_nb_route`]), starts
//! it ([`innet_mpi_iallreduce`]) and completes MPI's generalized request in the callback
//! innet runs when the collective is over, on the communicator's progress thread (or on
//! the application's thread that came to wait first: [`innet_mpi_progress`]). Each kind
//! learns its own way on its calls' start-to-completion times ([`innet_mpi_nb_took`],
//! agreed in a blocking collective: [`innet_mpi_nb_due`], [`innet_mpi_nb_decide`]).

use std::ffi::{c_int, c_void};

use tracing::info;

use crate::{
    ROUTE_NETWORK, ROUTE_TRIAL, counted, guarded, index,
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

/// The non-blocking kinds, which learn their own decisions.
const STARTED: [usize; 4] = [
    report::IALLREDUCE,
    report::IREDUCE,
    report::IBCAST,
    report::IBARRIER,
];

/// The way of a non-blocking call of `kind` with `bytes` on `session`: the
/// `INNET_ROUTE_*` bits (a call MPI takes counted as `cutover`, or `learning` in a trial).
/// `ticket` NULL: no trials (another thread may use the session); otherwise a timed trial
/// call's ticket goes there (bit `ROUTE_TRIAL` with `*ticket` set: time the call from its
/// start to the completion the application sees, for [`innet_mpi_nb_took`]). See
/// `learn/started.rs`.
///
/// # Safety
/// `session` comes from `innet_mpi_open` and is not closed; `ticket` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_nb_route(
    session: *mut c_void,
    kind: c_int,
    bytes: usize,
    ticket: *mut u32,
) -> c_int {
    guarded(0, || {
        // SAFETY: the caller's open session, used by the application's thread.
        let s = unsafe { &mut *session.cast::<Session>() };
        let k = index(kind);
        let (r, t) = s.route_nonblocking(k, blocking_kind(k), bytes, !ticket.is_null());
        if r.way == Way::Mpi
            && let Some(st) = state()
        {
            let reason = if r.trial {
                report::LEARNING
            } else {
                report::CUTOVER
            };
            st.counters.passed(k, reason);
        }
        match t {
            // SAFETY: the caller's writable ticket (not null: trials were allowed).
            Some(t) if !ticket.is_null() => unsafe { *ticket = t },
            _ => {}
        }
        let way = if r.way == Way::Network {
            ROUTE_NETWORK
        } else {
            0
        };
        way | if t.is_some() { ROUTE_TRIAL } else { 0 }
    })
}

/// A timed non-blocking trial call's start-to-completion time on this rank.
///
/// # Safety
/// `session` comes from `innet_mpi_open` and is not closed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_nb_took(
    session: *mut c_void,
    kind: c_int,
    bytes: usize,
    ticket: u32,
    nanos: u64,
) {
    guarded((), || {
        // SAFETY: as above.
        let s = unsafe { &mut *session.cast::<Session>() };
        s.took_nonblocking(index(kind), bytes, ticket, nanos);
    });
}

/// In a blocking collective the application calls on the communicator (every rank is
/// there): 1 when a non-blocking size class's ranks must agree now, with its kind, a size
/// of it and this rank's part in `part[4]`; the shim sums the parts over the ranks (one
/// allreduce) and calls [`innet_mpi_nb_decide`] with the sums. 0: nothing due.
///
/// # Safety
/// `session` comes from `innet_mpi_open` and is not closed; the pointers writable (`part`
/// for four doubles).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_nb_due(
    session: *mut c_void,
    kind: *mut c_int,
    bytes: *mut usize,
    part: *mut f64,
) -> c_int {
    guarded(0, || {
        // SAFETY: as above.
        let s = unsafe { &mut *session.cast::<Session>() };
        let Some((k, b, p)) = s.due_nonblocking(&STARTED) else {
            return 0;
        };
        // SAFETY: the caller's writable kind, size and four doubles.
        unsafe {
            *kind = c_int::try_from(k).unwrap_or(0);
            *bytes = b;
            std::ptr::copy_nonoverlapping(p.as_ptr(), part, 4);
        }
        1
    })
}

/// Decides the due class on the ranks' sums of [`innet_mpi_nb_due`]'s parts.
///
/// # Safety
/// `session` comes from `innet_mpi_open` and is not closed; `sums` holds four doubles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn innet_mpi_nb_decide(
    session: *mut c_void,
    kind: c_int,
    bytes: usize,
    sums: *const f64,
) {
    guarded((), || {
        // SAFETY: as above; the caller's four doubles.
        let (s, sums) = unsafe {
            (
                &mut *session.cast::<Session>(),
                std::ptr::read(sums.cast::<[f64; 4]>()),
            )
        };
        let k = index(kind);
        if let Some(d) = s.decide_nonblocking(k, blocking_kind(k), bytes, sums)
            && let Some(st) = state()
        {
            info!(?d, "learned cutover");
            st.counters.decided(d);
        }
    });
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

/// The application's thread waits (`wait` 1) or tests (0) for a call started on
/// `session`: it runs the started calls itself, taking their results as they come, unless
/// innet's progress thread has taken them already (then it returns at once and the caller
/// waits for `done`); a test does so only when the results are at the socket already, so
/// it never waits for packets.
///
/// # Safety
/// `session` comes from `innet_mpi_open` and is not closed.
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
