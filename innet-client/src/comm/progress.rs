//! Non-blocking collectives: the collectives a communicator started and has not finished,
//! run in the order started, and the requests that tell when each one is done.
//!
//! A communicator's state (its core, [`Core`]) sits behind one lock. Whoever holds it runs
//! the queued collectives, oldest first, each to its end: the progress thread (spawned at
//! the first non-blocking call, asleep on a condition variable while nothing is queued), or
//! a caller that needs the communicator now — [`Request::wait`] when the progress thread
//! has not taken the queue yet, a blocking collective, which runs after every collective
//! started before it. One runner at a time and a FIFO queue give MPI's rule: collectives
//! complete in the order they were started.
//!
//! The progress thread never busy-polls: it sets the core's spin budget to zero, so its
//! waits for packets or for the node's other ranks sleep in `ppoll(2)` and `futex(2)`
//! (the application computes meanwhile, often on the same CPUs). A caller that runs the
//! queue itself keeps the configured spin, as a blocking collective does.

use std::{
    collections::VecDeque,
    sync::{
        Arc, Condvar, Mutex, MutexGuard, PoisonError, TryLockError, Weak,
        atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst},
    },
    thread::JoinHandle,
    time::Duration,
};

use innet_common::proto::{Dtype, Op};

use super::{Communicator as Core, Error, Mode, Report, net_plan};
use crate::{endpoint::Carrier, frames::swap_order};

/// A started collective: runs to its end on the core and completes its request.
pub(super) type Job = Box<dyn FnOnce(&mut Core) + Send>;

/// A communicator's core and its queue of started collectives, shared by the application's
/// handle, its requests and the progress thread.
pub(super) struct Engine {
    core: Mutex<Core>,
    queue: Mutex<Queue>,
    /// Signalled when a job is queued or the engine stops.
    work: Condvar,
    /// Jobs queued and not yet taken: the blocking path checks it without a lock.
    queued: AtomicUsize,
    /// The configured spin, given back to the core after the progress thread ran jobs.
    spin: Duration,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    stop: bool,
}

/// A poisoned lock means a job panicked; the data behind it is still whole (a job leaves
/// the core between collectives or fails its own request).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Engine {
    pub(super) fn new(core: Core) -> Self {
        let spin = core.cfg.spin;
        Self {
            core: Mutex::new(core),
            queue: Mutex::new(Queue::default()),
            work: Condvar::new(),
            queued: AtomicUsize::new(0),
            spin,
        }
    }

    /// The core, for a caller that needs it now: every collective started earlier runs
    /// first (on this thread when the progress thread has not taken them).
    pub(super) fn core(&self) -> MutexGuard<'_, Core> {
        let mut core = lock(&self.core);
        self.run_queued(&mut core);
        core
    }

    /// The core when no collective is queued or running: the next one started runs next.
    pub(super) fn idle_core(&self) -> Option<MutexGuard<'_, Core>> {
        if self.queued.load(SeqCst) > 0 {
            return None;
        }
        self.core.try_lock().ok()
    }

    /// Sends the first packets of the collective about to be queued on the caller's thread
    /// when it is next to run (see [`Core::send_ahead`]).
    pub(super) fn send_ahead(&self, op: Op, dtype: Dtype, native: &[u8]) {
        if let Some(mut core) = self.idle_core() {
            core.send_ahead(op, dtype, native);
        }
    }

    /// The core without running the queue, for reading its settings.
    pub(super) fn peek(&self) -> MutexGuard<'_, Core> {
        lock(&self.core)
    }

    /// Runs the queued jobs in order on `core`, which the caller holds.
    fn run_queued(&self, core: &mut Core) {
        while self.queued.load(SeqCst) > 0 {
            let Some(job) = lock(&self.queue).jobs.pop_front() else {
                break;
            };
            self.queued.fetch_sub(1, SeqCst);
            job(core);
        }
    }

    /// Queues `job` behind every collective started before it and wakes the progress
    /// thread.
    pub(super) fn push(&self, job: Job) {
        let mut q = lock(&self.queue);
        q.jobs.push_back(job);
        self.queued.fetch_add(1, SeqCst);
        drop(q);
        self.work.notify_one();
    }

    /// The progress thread: sleeps until jobs are queued, then runs them without spinning.
    fn progress(&self) {
        loop {
            {
                let mut q = lock(&self.queue);
                while q.jobs.is_empty() && !q.stop {
                    q = self.work.wait(q).unwrap_or_else(PoisonError::into_inner);
                }
                if q.jobs.is_empty() {
                    return;
                }
            }
            let mut core = lock(&self.core);
            core.set_spin(Duration::ZERO);
            self.run_queued(&mut core);
            core.set_spin(self.spin);
        }
    }

    /// Starts the progress thread of `engine`.
    pub(super) fn spawn(engine: &Arc<Self>, name: String) -> std::io::Result<JoinHandle<()>> {
        let e = engine.clone();
        std::thread::Builder::new()
            .name(name)
            .spawn(move || e.progress())
    }

    /// Lets the progress thread end once the queue is empty.
    pub(super) fn stop(&self) {
        lock(&self.queue).stop = true;
        self.work.notify_all();
    }
}

impl Core {
    /// Sends the first window of the next collective (`native`, `op`/`dtype`) into the
    /// network now, on the caller's thread, when this rank is a leader alone on its node and
    /// the collective will go through the switches: the packets leave at the call, and the
    /// progress thread only waits for the results (see `Endpoint::pre_send`). Anything else
    /// (a node's ranks to gather first, a NIC tree, a group to set up again, the hosts)
    /// sends nothing here and is left to the job.
    fn send_ahead(&mut self, op: Op, dtype: Dtype, native: &[u8]) {
        let alone = self.plan.members(self.leader).len() == 1;
        let switches = matches!(self.cfg.mode, Mode::Auto | Mode::IncNode | Mode::IncSocket);
        if !alone || !switches || self.nic.is_some() || self.dpu.is_some() {
            return;
        }
        let seq = self.seq.wrapping_add(1);
        let Some(ep) = self.endpoint.as_ref() else {
            return;
        };
        let over = self
            .cfg
            .network_max_bytes
            .is_some_and(|max| self.cfg.mode == Mode::Auto && native.len() > max);
        if over || ep.regroup_due(seq).is_some() || self.losses.hosts_until.is_some() {
            return;
        }
        let me = self.leader;
        let mut dst = self.plan.ring_successor(me, &self.tor_of);
        if dst == me {
            dst = (me + 1) % self.plan.leaders();
        }
        // The packets must be the job's own: the type `allreduce_in_place` sends.
        let dtype = super::wire_dtype(op, dtype, native.len());
        let Some(Ok(plan)) = self
            .group
            .map(|g| net_plan(&g, op, dtype, &self.cfg, Carrier::Switch { dst }))
        else {
            return;
        };
        let mut wire = native.to_vec();
        swap_order(op, dtype, &mut wire);
        if let Some(ep) = self.endpoint.as_mut() {
            ep.pre_send(seq, (op, dtype), &plan, &wire);
        }
    }

    /// How long waits for packets and for the node's other ranks busy-poll before they
    /// sleep.
    fn set_spin(&mut self, spin: Duration) {
        if let Some(ep) = self.endpoint.as_mut() {
            ep.set_spin(spin);
        }
        if let Some(seg) = self.segment.as_mut() {
            seg.set_spin(spin);
        }
    }
}

/// Where a started collective leaves its outcome.
pub(super) struct Slot<B> {
    done: AtomicBool,
    outcome: Mutex<Option<(B, Result<Report, Error>)>>,
    ready: Condvar,
}

impl<B> Slot<B> {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self {
            done: AtomicBool::new(false),
            outcome: Mutex::new(None),
            ready: Condvar::new(),
        })
    }

    pub(super) fn complete(&self, buf: B, result: Result<Report, Error>) {
        *lock(&self.outcome) = Some((buf, result));
        self.done.store(true, SeqCst);
        self.ready.notify_all();
    }
}

/// A non-blocking collective in progress ([`Communicator::iallreduce`](crate::Communicator::iallreduce)):
/// it owns the buffer until it is done, and [`wait`](Self::wait) gives the buffer back with
/// the result in it. Collectives of one communicator complete in the order they were
/// started. Dropping a request does not cancel its collective (every rank must take part):
/// it still runs, and the communicator waits for it before its next blocking call and when
/// it is dropped.
#[must_use = "a request's result comes back through wait()"]
pub struct Request<B> {
    slot: Arc<Slot<B>>,
    /// Gone once the communicator is dropped, which finishes every collective first.
    engine: Weak<Engine>,
}

impl<B> Request<B> {
    pub(super) fn new(slot: Arc<Slot<B>>, engine: &Arc<Engine>) -> Self {
        Self {
            slot,
            engine: Arc::downgrade(engine),
        }
    }

    /// Whether the collective is done (then [`wait`](Self::wait) returns at once). Never
    /// blocks and never runs a collective: the progress thread does that.
    #[must_use]
    pub fn test(&self) -> bool {
        self.slot.done.load(SeqCst)
    }

    /// Waits until the collective is done and gives the buffer back: the result in it, or
    /// on failure the caller's data as it was (never a partial result), with the error.
    /// When the progress thread has not taken the queue yet, the waiting thread runs it
    /// itself, spinning as a blocking collective does.
    pub fn wait(self) -> (B, Result<Report, Error>) {
        loop {
            if let Some(out) = lock(&self.slot.outcome).take() {
                return out;
            }
            if let Some(engine) = self.engine.upgrade() {
                let core = match engine.core.try_lock() {
                    Ok(core) => Some(core),
                    Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
                    Err(TryLockError::WouldBlock) => None,
                };
                if let Some(mut core) = core {
                    engine.run_queued(&mut core);
                    continue;
                }
            }
            // The progress thread runs the queue: sleep until it finishes this one.
            let mut out = lock(&self.slot.outcome);
            while out.is_none() {
                out = self
                    .slot
                    .ready
                    .wait(out)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            return out.take().expect("checked above");
        }
    }
}
