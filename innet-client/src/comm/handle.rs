//! The application's handle on a communicator: the blocking collectives, the non-blocking
//! ones (see `progress`), and what the communicator is. The collectives themselves are the
//! core's (`comm::Core`, behind the handle's lock).

use std::{sync::Arc, thread::JoinHandle};

use innet_common::proto::{Dtype, Op, element_bytes};

use super::{
    Config, Core, Error, Refusals, Report, check_message,
    progress::{Engine, Job, Message, Request, Slot},
};
use crate::{
    element::Element, handshake::GroupParams, layout::Order, roles::Grouping, stages::CallStamps,
};

/// One rank's membership in a communicator, and its collectives: blocking
/// ([`allreduce`](Self::allreduce)) and non-blocking ([`iallreduce`](Self::iallreduce)).
pub struct Communicator {
    engine: Arc<Engine>,
    /// Spawned at the first non-blocking collective.
    progress: Option<JoinHandle<()>>,
    rank: usize,
    size: usize,
    ranks_per_node: usize,
    sockets_per_node: usize,
    grouping: Grouping,
}

impl Communicator {
    /// Joins the communicator: validates the layout, binds the node-local channel and (as a
    /// leader) the INC socket, and in the in-network modes runs the control-plane handshake
    /// of the switch paper. Every rank of the job must call it; it returns when this rank's
    /// part is done.
    ///
    /// A handshake that does not finish is not an error: the collectives then run on the
    /// hosts, reported as [`Fallback::NoNetwork`](super::Fallback::NoNetwork).
    ///
    /// # Errors
    /// A bad layout or placement, a socket that cannot be bound, or (on a non-leader) no
    /// parameters from the leader in time.
    pub fn new(cfg: Config) -> Result<Self, Error> {
        let core = Core::new(cfg)?;
        Ok(Self {
            rank: core.rank(),
            size: core.size(),
            ranks_per_node: core.ranks_per_node(),
            sockets_per_node: core.sockets_per_node(),
            grouping: core.grouping(),
            engine: Arc::new(Engine::new(core)),
            progress: None,
        })
    }

    #[must_use]
    pub fn size(&self) -> usize {
        self.size
    }

    #[must_use]
    pub fn rank(&self) -> usize {
        self.rank
    }

    #[must_use]
    pub fn ranks_per_node(&self) -> usize {
        self.ranks_per_node
    }

    #[must_use]
    pub fn sockets_per_node(&self) -> usize {
        self.sockets_per_node
    }

    /// Node or Socket grouping, as chosen from the mode and layout.
    #[must_use]
    pub fn grouping(&self) -> Grouping {
        self.grouping
    }

    /// What the handshake set up (in-network modes): on a leader, the group in use (set up
    /// again when the network lost it, see [`Report::regrouped`]); on the other ranks, the
    /// one set up when the communicator was made. Waits while the progress thread runs a
    /// collective.
    #[must_use]
    pub fn group(&self) -> Option<GroupParams> {
        self.engine.peek().group()
    }

    /// What this rank refused from the network so far, one counter per attack its checks
    /// stop (forged host frames, results from outside its tree, floods of its queues and
    /// reassembly memory, forged requests to send again; see [`Refusals`]). All zero on a
    /// rank that is no leader. Waits while the progress thread runs a collective.
    #[must_use]
    pub fn refusals(&self) -> Refusals {
        self.engine.peek().refusals()
    }

    /// Per-stage timestamps of the traced collectives so far ([`Config::trace_calls`]).
    #[must_use]
    pub fn stages(&self) -> Vec<CallStamps> {
        self.engine.peek().stages().to_vec()
    }

    /// Forgets the traced collectives and traces the next `calls` ones.
    pub fn trace_calls(&mut self, calls: usize) {
        self.engine.core().trace_calls(calls);
    }

    /// `recv = send₀ OP send₁ OP …` over every rank, element by element. Every rank passes
    /// buffers of the same length. MINLOC/MAXLOC take [`Loc`](crate::Loc) pairs, the other
    /// ops plain numbers. Blocks until the result is here or the timeout passes; runs after
    /// every non-blocking collective started before it.
    ///
    /// ```no_run
    /// # fn f(comm: &mut innet_client::Communicator) -> Result<(), innet_client::Error> {
    /// use innet_client::{Loc, Op};
    /// let mut sum = [0.0f64; 3];
    /// comm.allreduce(&[1.0, 2.0, 3.0], &mut sum, Op::Sum)?;
    /// let mut lowest = [Loc::default()];
    /// comm.allreduce(&[Loc::new(0.5f32, comm.rank() as i32)], &mut lowest, Op::Minloc)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Lengths`] for buffers of different lengths, [`Error::LocElements`] for an
    /// op and element type that do not pair, and whatever
    /// [`allreduce_bytes`](Self::allreduce_bytes) returns: a call rejected leaves `recv`
    /// alone, one that fails once started leaves `send`'s data there.
    pub fn allreduce<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        op: Op,
    ) -> Result<Report, Error> {
        self.engine.core().allreduce(send, recv, op)
    }

    /// [`allreduce_bytes`](Self::allreduce_bytes) of a message in place, with no copy of
    /// it kept: for callers that do not need the input back after a failure (MPI leaves a
    /// failed collective's buffer undefined), one pass over the message fewer.
    ///
    /// # Errors
    /// As [`allreduce_bytes`](Self::allreduce_bytes); a failure once started leaves `buf`
    /// undefined.
    pub fn allreduce_bytes_in_place(
        &mut self,
        buf: &mut [u8],
        op: Op,
        dtype: Dtype,
    ) -> Result<Report, Error> {
        self.engine.core().allreduce_bytes_in_place(buf, op, dtype)
    }

    /// [`allreduce`](Self::allreduce) of raw bytes, for callers that hold untyped buffers
    /// (the MPI interposer): `recv = send₀ OP send₁ OP …` over every rank. Buffers hold
    /// native-order elements of `dtype` (MINLOC/MAXLOC: each value followed by an `i32`
    /// location), any count. Blocks until the result is here or the timeout passes; runs
    /// after every non-blocking collective started before it.
    ///
    /// # Errors
    /// Mismatched or partial buffers, a type the hosts cannot reduce (these leave `recv`
    /// alone), a timeout (a rank that does not call), or a socket error. A collective that
    /// fails once started leaves `send`'s data in `recv`: never a partial result, and an
    /// in-place caller (`send` a copy of `recv`) loses nothing.
    pub fn allreduce_bytes(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        op: Op,
        dtype: Dtype,
    ) -> Result<Report, Error> {
        self.engine.core().allreduce_bytes(send, recv, op, dtype)
    }

    /// Starts an allreduce of `buf`, in place, and returns at once; the collective
    /// progresses on the communicator's progress thread while the caller computes.
    /// [`Request::wait`] gives `buf` back with `buf₀ OP buf₁ OP …` in it. Collectives of a
    /// communicator complete in the order started, blocking ones included; every rank
    /// starts the same ones in the same order (MPI's rule).
    ///
    /// ```no_run
    /// # fn f(comm: &mut innet_client::Communicator) -> Result<(), innet_client::Error> {
    /// use innet_client::Op;
    /// let grads = comm.iallreduce(vec![1.0f32; 256], Op::Sum)?;
    /// let norms = comm.iallreduce(vec![2.0f64], Op::Max)?;
    /// // … compute …
    /// let (grads, report) = grads.wait();
    /// report?;
    /// let (norms, _) = norms.wait();
    /// # Ok(()) }
    /// ```
    ///
    /// The buffer is owned, not borrowed: the progress thread writes it after this call
    /// returns, which a borrow could not make safe (a forgotten request would outlive it).
    ///
    /// # Errors
    /// What [`allreduce`](Self::allreduce) rejects before it starts ([`Error::LocElements`],
    /// an op the type does not define), or a progress thread that could not be spawned;
    /// `buf` is then dropped. Errors of the collective itself come from
    /// [`Request::wait`].
    pub fn iallreduce<T: Element + Send + 'static>(
        &mut self,
        buf: Vec<T>,
        op: Op,
    ) -> Result<Request<Vec<T>>, Error> {
        if op.carries_location() != T::LOC {
            return Err(Error::LocElements { op });
        }
        check_message(op, T::DTYPE, element_bytes(op, T::DTYPE) * buf.len())?;
        T::as_bytes(&buf, &mut [], |native, _| {
            self.engine
                .send_ahead(op, T::DTYPE, Message::Native(native));
        });
        let slot = Slot::new();
        let done = slot.clone();
        self.start(Box::new(move |core| {
            let mut buf = buf;
            let send = buf.clone();
            let r = core.allreduce(&send, &mut buf, op);
            done.complete(buf, r);
        }))?;
        Ok(Request::new(slot, &self.engine))
    }

    /// [`iallreduce`](Self::iallreduce) of raw bytes (native-order elements of `dtype`, as
    /// in [`allreduce_bytes`](Self::allreduce_bytes)).
    ///
    /// # Errors
    /// A partial element or an op the type does not define, or no progress thread.
    pub fn iallreduce_bytes(
        &mut self,
        buf: Vec<u8>,
        op: Op,
        dtype: Dtype,
    ) -> Result<Request<Vec<u8>>, Error> {
        check_message(op, dtype, buf.len())?;
        self.engine.send_ahead(op, dtype, Message::Native(&buf));
        let slot = Slot::new();
        let done = slot.clone();
        self.start(Box::new(move |core| {
            let mut buf = buf;
            // The input is kept: a failed request gives it back (Request::wait).
            let send = buf.clone();
            let r = core.allreduce_bytes(&send, &mut buf, op, dtype);
            done.complete(buf, r);
        }))?;
        Ok(Request::new(slot, &self.engine))
    }

    /// Starts an allreduce of `wire`, a message of `op`/`dtype` already in the wire's order
    /// ([`Strided::gather`](crate::Strided::gather) with [`Order::Wire`] makes one in a
    /// single pass over the caller's elements), and calls `done` with the buffer, the order
    /// its result is in and the outcome when the collective is over, instead of returning
    /// a request: the MPI interposer completes MPI's generalized request there, after
    /// [`Strided::scatter`](crate::Strided::scatter) (one pass again). `done` runs on the
    /// progress thread, or on a thread of the caller that ran the queue itself (a blocking
    /// collective, [`Request::wait`]); it must not start collectives on this communicator.
    ///
    /// The buffer is the collective's own: its first packets leave from it and the result
    /// comes back in it; no copy of the input is kept, so after a failure its contents are
    /// undefined (MPI's rule for a failed collective).
    ///
    /// # Errors
    /// As [`iallreduce_bytes`](Self::iallreduce_bytes); `done` is then not called.
    pub fn iallreduce_wire_then(
        &mut self,
        wire: Vec<u8>,
        op: Op,
        dtype: Dtype,
        done: impl FnOnce(Vec<u8>, Order, Result<Report, Error>) + Send + 'static,
    ) -> Result<(), Error> {
        check_message(op, dtype, wire.len())?;
        self.engine.send_ahead(op, dtype, Message::Wire(&wire));
        self.start(Box::new(move |core| {
            let mut buf = wire;
            let (r, order) = core.allreduce_wire_kept(&mut buf, op, dtype);
            done(buf, order, r);
        }))
    }

    /// Runs the started collectives to their end on the calling thread when the progress
    /// thread has not taken them yet (it may be waiting for their answers without the
    /// communicator: see `comm/progress.rs`); returns at once when it has. For a thread
    /// about to wait for one of them: it takes the results as they come instead of waiting
    /// for the progress thread to hand them over. Their `done` callbacks run here.
    pub fn progress_here(&self) {
        self.engine.drive();
    }

    /// [`progress_here`](Self::progress_here) only when the started collective's answer is
    /// at the socket already: for a thread that tests, which must not wait for packets.
    pub fn progress_if_answered(&self) {
        self.engine.drive_if_answered();
    }

    /// Queues `job` behind the collectives started before it, spawning the progress thread
    /// at the first.
    fn start(&mut self, job: Job) -> Result<(), Error> {
        if self.progress.is_none() {
            let name = format!("innet-nb-{}", self.rank);
            self.progress = Some(Engine::spawn(&self.engine, name)?);
        }
        self.engine.push(job);
        Ok(())
    }
}

/// The allgather and reduce-scatter (`comm/gather.rs`) on the handle: blocking, after the
/// non-blocking collectives started before them.
impl Communicator {
    /// Every rank's `send` block, in rank order, into every rank's `recv`
    /// (`recv.len() == size × send.len()`).
    ///
    /// # Errors
    /// [`Error::GatherBuffer`] for a receive buffer of the wrong size (`recv` is then left
    /// alone), and what [`allreduce_bytes`](Self::allreduce_bytes) returns; a call that
    /// fails once started leaves `recv` zero but for this rank's block.
    pub fn allgather_bytes(&mut self, send: &[u8], recv: &mut [u8]) -> Result<Report, Error> {
        self.engine.core().allgather_bytes(send, recv)
    }

    /// Typed [`allgather_bytes`](Self::allgather_bytes): `recv` holds `size × send.len()`
    /// elements, rank `i`'s at `i × send.len()`.
    ///
    /// # Errors
    /// As [`allgather_bytes`](Self::allgather_bytes), in elements.
    pub fn allgather<T: Element>(&mut self, send: &[T], recv: &mut [T]) -> Result<Report, Error> {
        self.engine.core().allgather(send, recv)
    }

    /// Reduces `send` (the counts' sum of elements) over every rank, element by element as
    /// the allreduce does, and leaves in `recv` this rank's part: `counts[rank]` elements,
    /// starting after the counts of the ranks before it (MPI_Reduce_scatter).
    ///
    /// # Errors
    /// [`Error::Counts`] or [`Error::ScatterBuffers`] for counts or buffers that do not
    /// fit (`recv` is then left alone), and what [`allreduce_bytes`](Self::allreduce_bytes)
    /// returns; a call that fails once started leaves `recv` alone.
    pub fn reduce_scatter_bytes(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        counts: &[usize],
        op: Op,
        dtype: Dtype,
    ) -> Result<Report, Error> {
        self.engine
            .core()
            .reduce_scatter_bytes(send, recv, counts, op, dtype)
    }

    /// Typed [`reduce_scatter_bytes`](Self::reduce_scatter_bytes).
    ///
    /// # Errors
    /// As [`reduce_scatter_bytes`](Self::reduce_scatter_bytes), in elements.
    pub fn reduce_scatter<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        op: Op,
    ) -> Result<Report, Error> {
        self.engine.core().reduce_scatter(send, recv, counts, op)
    }

    /// [`reduce_scatter`](Self::reduce_scatter) with `recv.len()` elements for every rank
    /// (MPI_Reduce_scatter_block).
    ///
    /// # Errors
    /// As [`reduce_scatter`](Self::reduce_scatter).
    pub fn reduce_scatter_block<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        op: Op,
    ) -> Result<Report, Error> {
        self.engine.core().reduce_scatter_block(send, recv, op)
    }
}

impl Drop for Communicator {
    /// Finishes every collective started, then the core leaves the group (leaders wait for
    /// each other, MRRs free the group on the switches).
    fn drop(&mut self) {
        self.engine.stop();
        if let Some(t) = self.progress.take() {
            let _ = t.join();
        }
        drop(self.engine.core());
    }
}

#[cfg(test)]
mod tests {
    use std::{
        net::Ipv4Addr,
        os::unix::thread::JoinHandleExt as _,
        sync::{Arc, Barrier, Mutex},
        thread,
        time::{Duration, Instant},
    };

    use innet_common::proto::{Dtype, Op};

    use crate::{Communicator, Config, Error, Layout, NodePlacement, Order, Path};

    fn one_node(job: u64, rank: usize, size: usize) -> Communicator {
        let layout = Layout::new(size, size, 1).unwrap();
        let node = NodePlacement::new(0, vec![Ipv4Addr::LOCALHOST]);
        let mut cfg = Config::new(job, rank, layout, vec![node]);
        cfg.timeout = Duration::from_secs(5);
        Communicator::new(cfg).unwrap()
    }

    fn job(tag: u64) -> u64 {
        u64::from(std::process::id()) << 20 | tag
    }

    /// Runs `f` as every rank of a one-node communicator of `size`, each on its thread.
    fn each_rank<R: Send + 'static>(
        tag: u64,
        size: usize,
        f: impl Fn(usize, Communicator) -> R + Send + Sync + 'static,
    ) -> Vec<R> {
        let f = Arc::new(f);
        let job = job(tag);
        let ranks: Vec<_> = (0..size)
            .map(|rank| {
                let f = f.clone();
                thread::spawn(move || f(rank, one_node(job, rank, size)))
            })
            .collect();
        ranks.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn outstanding_requests_complete_in_order_and_before_a_blocking_call() {
        let out = each_rank(0xe0, 3, |rank, mut c| {
            let r = rank as i64;
            let order = Arc::new(Mutex::new(vec![]));
            let mut reqs = vec![];
            for k in 0..6i64 {
                let o = order.clone();
                reqs.push(c.iallreduce(vec![r * 10 + k, -r], Op::Sum).unwrap());
                let bytes = (k.unsigned_abs() as u32 + rank as u32)
                    .to_be_bytes()
                    .to_vec();
                c.iallreduce_wire_then(bytes, Op::Max, Dtype::U32, move |b, order, res| {
                    res.unwrap();
                    let b: [u8; 4] = b.try_into().unwrap();
                    let v = match order {
                        Order::Wire => u32::from_be_bytes(b),
                        Order::Native => u32::from_ne_bytes(b),
                    };
                    o.lock().unwrap().push((k, v));
                })
                .unwrap();
            }
            // A blocking collective started now runs after the six outstanding ones.
            let mut sum = [0u8];
            c.allreduce(&[1u8], &mut sum, Op::Sum).unwrap();
            assert!(
                reqs.iter().all(super::Request::test),
                "done before the blocking call"
            );
            let sums: Vec<Vec<i64>> = reqs.into_iter().map(|q| q.wait().0).collect();
            (sums, order.lock().unwrap().clone(), sum[0])
        });
        for (sums, order, sum) in out {
            // Ranks 0, 1, 2 give 10·rank + k and −rank.
            let want: Vec<Vec<i64>> = (0..6).map(|k| vec![30 + 3 * k, -3]).collect();
            assert_eq!(sums, want);
            let want: Vec<(i64, u32)> = (0..6u32).map(|k| (i64::from(k), k + 2)).collect();
            assert_eq!(order, want, "callbacks in the order started");
            assert_eq!(sum, 3);
        }
    }

    #[test]
    fn a_request_progresses_without_its_caller_and_its_thread_sleeps() {
        let out = each_rank(0xe1, 2, |rank, mut c| {
            if rank == 1 {
                // Comes 400 ms late, as a rank still computing would.
                thread::sleep(Duration::from_millis(400));
                let (v, r) = c.iallreduce(vec![2.5f64], Op::Sum).unwrap().wait();
                r.unwrap();
                return (v, Duration::ZERO, Duration::ZERO);
            }
            let t0 = Instant::now();
            let req = c.iallreduce(vec![1.0f64], Op::Sum).unwrap();
            let started = t0.elapsed();
            // The caller never waits: the progress thread finishes the collective.
            while !req.test() {
                assert!(t0.elapsed() < Duration::from_secs(5), "no progress");
                thread::sleep(Duration::from_millis(5));
            }
            let cpu = thread_cpu(c.progress.as_ref().unwrap());
            let (v, r) = req.wait();
            assert_eq!(r.unwrap().path, Path::Local);
            (v, started, cpu)
        });
        for (v, _, _) in &out {
            assert_eq!(v, &[3.5]);
        }
        let (_, started, cpu) = out[0].clone();
        assert!(
            started < Duration::from_millis(100),
            "start blocked {started:?}"
        );
        // A spinning thread would have burnt most of the 400 ms.
        assert!(
            cpu < Duration::from_millis(60),
            "progress thread used {cpu:?} of CPU"
        );
    }

    /// CPU time a thread has used.
    fn thread_cpu(t: &thread::JoinHandle<()>) -> Duration {
        let mut clock: libc::clockid_t = 0;
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a live thread's pthread_t and out-parameters on the stack.
        unsafe {
            assert_eq!(
                libc::pthread_getcpuclockid(t.as_pthread_t(), &raw mut clock),
                0
            );
            assert_eq!(libc::clock_gettime(clock, &raw mut ts), 0);
        }
        Duration::new(ts.tv_sec.cast_unsigned(), ts.tv_nsec.cast_unsigned() as u32)
    }

    #[test]
    fn dropping_the_communicator_finishes_its_requests_and_bad_starts_are_named() {
        let barrier = Arc::new(Barrier::new(2));
        let out = each_rank(0xe2, 2, move |rank, mut c| {
            let e = c.iallreduce(vec![1i32], Op::Minloc);
            assert!(matches!(e, Err(Error::LocElements { .. })));
            let e = c.iallreduce_bytes(vec![0; 6], Op::Sum, Dtype::I32);
            assert!(matches!(e, Err(Error::Partial { .. })));
            let e = c.iallreduce(vec![1.0f32], Op::Band);
            assert!(matches!(e, Err(Error::Reduce(_))));
            let reqs: Vec<_> = (0..4u16)
                .map(|k| c.iallreduce(vec![k << rank], Op::Bor).unwrap())
                .collect();
            barrier.wait();
            drop(c);
            reqs.into_iter().map(|q| q.wait().0[0]).collect::<Vec<_>>()
        });
        let want: Vec<u16> = (0..4).map(|k| k | k << 1).collect();
        for v in out {
            assert_eq!(v, want);
        }
    }

    #[test]
    fn a_failed_request_gives_the_callers_data_back() {
        let job = job(0xe3);
        let layout = Layout::new(2, 2, 1).unwrap();
        let node = NodePlacement::new(0, vec![Ipv4Addr::LOCALHOST]);
        let (joined, done) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
        let (joined2, done2) = (joined.clone(), done.clone());
        let mut cfg = Config::new(job, 1, layout, vec![node.clone()]);
        cfg.timeout = Duration::from_secs(5);
        // Rank 1 joins but never calls: rank 0's collective times out.
        let peer = thread::spawn(move || {
            let _c = Communicator::new(cfg).unwrap();
            joined2.wait();
            done2.wait();
        });
        let mut cfg = Config::new(job, 0, layout, vec![node]);
        cfg.timeout = Duration::from_millis(200);
        let mut c = Communicator::new(cfg).unwrap();
        joined.wait();
        let (v, r) = c.iallreduce(vec![7u64, 8], Op::Sum).unwrap().wait();
        assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
        assert_eq!(v, [7, 8]);
        done.wait();
        peer.join().unwrap();
    }
}
