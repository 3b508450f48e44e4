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
//!
//! Whoever gets there first takes the results. When the start sent a collective's first
//! packets ahead ([`Core::send_ahead`]), the progress thread does not hold the core while
//! the answer travels: an application thread that comes to wait for the collective
//! ([`Engine::drive`]: `Request::wait`, `Communicator::progress_here`) or finds its answer
//! at the socket when it tests ([`Engine::drive_if_answered`]) takes the core and the
//! results itself, so its wait costs only what is still missing, with no hand-over between
//! two threads. When the start sent *every* packet, the network finishes the collective
//! without this host, and taking the results early gains nothing: once a caller has shown
//! it drives its collectives, the progress thread leaves them to it for [`LEFT_TO_CALLER`]
//! (2 ms) and takes them only if nobody came (a program away computing, a lost packet to
//! ask for again). Otherwise the progress thread waits for the socket to turn readable, then takes
//! the core. Taking the core early is what costs: a progress thread that holds it while the
//! application computes on every CPU is not scheduled again for a slice, and the
//! application's wait waits for it.

use std::{
    collections::VecDeque,
    os::fd::{AsRawFd, RawFd},
    sync::{
        Arc, Condvar, Mutex, MutexGuard, PoisonError, TryLockError, Weak,
        atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering::SeqCst},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use innet_common::proto::{Dtype, Op};

use super::{Core, Error, Mode, Report, net_plan};
use crate::{
    endpoint::Carrier,
    frames::swap_order,
    inbox::{readable_now, wait_readable},
};

/// How long the progress thread waits for the answer to packets sent ahead before it takes
/// the core and waits there (where the collective's own loss recovery runs): well above a
/// collective's time through the switches, well below its first resend.
const AHEAD_WAIT: Duration = Duration::from_millis(5);
/// How long the progress thread leaves a collective the network finishes alone to a caller
/// that drives its collectives: longer than the computations a start hides in the bench
/// (0.05–0.9 ms), shorter than the INC socket's reader waits for an absent application
/// ([`crate::inbox::AWAY`], 5 ms), whose backlog a test does not look into: a caller away
/// longer finds its collective done, taken by the progress thread.
const LEFT_TO_CALLER: Duration = Duration::from_millis(2);

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
    /// The socket the next queued collective's first packets were sent from (-1: none):
    /// the progress thread waits for it to be readable before it takes the core.
    ahead: AtomicI32,
    /// Whether those packets were all of it (the network finishes it alone).
    alone: AtomicBool,
    /// Whether a caller has run started collectives itself ([`Self::drive`]): it will
    /// again, so the progress thread may leave it those the network finishes alone.
    driven: AtomicBool,
    /// Jobs run so far (the progress thread tells its job taken by someone else).
    ran: AtomicU64,
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
            ahead: AtomicI32::new(-1),
            alone: AtomicBool::new(false),
            driven: AtomicBool::new(false),
            ran: AtomicU64::new(0),
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
    pub(super) fn send_ahead(&self, op: Op, dtype: Dtype, message: Message<'_>) {
        if let Some(mut core) = self.idle_core()
            && let Some((fd, whole)) = core.send_ahead(op, dtype, message)
        {
            self.alone.store(whole, SeqCst);
            self.ahead.store(fd, SeqCst);
        }
    }

    /// Runs the started collectives on the calling thread, with the configured spin, when
    /// the progress thread has not taken them (it may be waiting for their answers, see
    /// the module's notes); returns at once when it has. For a thread about to wait for
    /// one of them.
    pub(super) fn drive(&self) {
        self.driven.store(true, SeqCst);
        if self.queued.load(SeqCst) == 0 {
            return;
        }
        let mut core = match self.core.try_lock() {
            Ok(core) => core,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        self.run_queued(&mut core);
    }

    /// [`Self::drive`] when the answer to packets sent ahead is at the socket: for a caller
    /// that tests, which must not wait for packets still on their way.
    pub(super) fn drive_if_answered(&self) {
        let fd = self.ahead.load(SeqCst);
        if fd >= 0 && readable_now(fd) {
            self.drive();
        }
    }

    /// The core without running the queue, for reading its settings.
    pub(super) fn peek(&self) -> MutexGuard<'_, Core> {
        lock(&self.core)
    }

    /// Runs the queued jobs in order on `core`, which the caller holds.
    fn run_queued(&self, core: &mut Core) {
        // The answer sent ahead is this runner's to take now (a later start cannot send
        // ahead while it holds the core).
        self.ahead.store(-1, SeqCst);
        while self.queued.load(SeqCst) > 0 {
            let Some(job) = lock(&self.queue).jobs.pop_front() else {
                break;
            };
            self.queued.fetch_sub(1, SeqCst);
            job(core);
            self.ran.fetch_add(1, SeqCst);
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
            let fd = self.ahead.load(SeqCst);
            if fd >= 0 && self.alone.load(SeqCst) && self.driven.load(SeqCst) {
                if self.taken_meanwhile(LEFT_TO_CALLER) {
                    continue;
                }
            } else if fd >= 0 {
                // Not holding the core: a waiting application thread may take the results.
                wait_readable(fd, None, Some(AHEAD_WAIT));
            }
            let mut core = lock(&self.core);
            core.set_spin(Duration::ZERO);
            self.run_queued(&mut core);
            core.set_spin(self.spin);
        }
    }

    /// Waits up to `grace` for someone else to run the job at the head of the queue;
    /// whether someone did.
    fn taken_meanwhile(&self, grace: Duration) -> bool {
        let target = self.ran.load(SeqCst) + 1;
        let deadline = Instant::now() + grace;
        let mut q = lock(&self.queue);
        loop {
            if self.ran.load(SeqCst) >= target || q.stop {
                return !q.stop;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            q = self
                .work
                .wait_timeout(q, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Starts the progress thread of `engine`.
    pub(super) fn spawn(engine: &Arc<Self>, name: String) -> std::io::Result<JoinHandle<()>> {
        let e = engine.clone();
        std::thread::Builder::new().name(name).spawn(move || {
            yield_to_the_application();
            e.progress();
        })
    }

    /// Lets the progress thread end once the queue is empty.
    pub(super) fn stop(&self) {
        lock(&self.queue).stop = true;
        self.work.notify_all();
    }
}

/// Puts the calling thread (the progress thread) under `SCHED_BATCH`: it runs where a CPU
/// is free, but its wake-ups do not preempt the thread running there. Otherwise the
/// wake-up at a non-blocking start hands the CPU to it at once (it sleeps most of the time,
/// so the scheduler favours it), and the application's start call lasts as long as the
/// progress thread's run: 21–46 µs of a 71–95 µs allreduce that no computation can hide
/// (`nbc_overlap`'s start time, 4 × 1; docs/bench/nonblocking-45). An application that
/// waits takes the results itself meanwhile ([`Engine::drive`]). Unprivileged; a refusal leaves the default policy.
fn yield_to_the_application() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: the calling thread (0) and a valid parameter.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &raw const param) } != 0 {
        tracing::debug!(
            error = %std::io::Error::last_os_error(),
            "progress thread keeps the default scheduling policy"
        );
    }
}

impl Core {
    /// Sends the first window of the next collective (`native`, `op`/`dtype`) into the
    /// network now, on the caller's thread, when this rank is a leader alone on its node and
    /// the collective will go through the switches: the packets leave at the call, and the
    /// progress thread only waits for the results (see `Endpoint::pre_send`). Anything else
    /// (a node's ranks to gather first, a NIC tree, a group to set up again, the hosts)
    /// sends nothing here and is left to the job. Returns the socket the answer comes to
    /// when it sent, and whether it sent every packet.
    fn send_ahead(&mut self, op: Op, dtype: Dtype, message: Message<'_>) -> Option<(RawFd, bool)> {
        let bytes = message.len();
        let alone = self.plan.members(self.leader).len() == 1;
        let switches = matches!(self.cfg.mode, Mode::Auto | Mode::IncNode | Mode::IncSocket);
        if !alone || !switches || self.nic.is_some() || self.dpu.is_some() {
            return None;
        }
        let seq = self.seq.wrapping_add(1);
        let ep = self.endpoint.as_ref()?;
        let over = self.cfg.cutover_limit(bytes).is_some();
        if over || ep.regroup_due(seq).is_some() || self.losses.hosts_until.is_some() {
            return None;
        }
        let dst = self.first_hop();
        // The packets must be the job's own: the type `allreduce_in_place` sends.
        let dtype = super::wire_dtype(op, dtype, bytes);
        let Some(Ok(plan)) = self
            .group
            .map(|g| net_plan(&g, op, dtype, &self.cfg, Carrier::Switch { dst }))
        else {
            return None;
        };
        let converted;
        let wire = match message {
            Message::Wire(wire) => wire,
            Message::Native(native) => {
                let mut copy = native.to_vec();
                swap_order(op, dtype, &mut copy);
                converted = copy;
                &converted
            }
        };
        let ep = self.endpoint.as_mut()?;
        let whole = ep.pre_send(seq, (op, dtype), &plan, wire)?;
        Some((ep.sock.as_raw_fd(), whole))
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

/// A message about to be started, in the caller's (native) byte order or already in the
/// wire's.
#[derive(Clone, Copy, Debug)]
pub(super) enum Message<'a> {
    Native(&'a [u8]),
    Wire(&'a [u8]),
}

impl Message<'_> {
    fn len(&self) -> usize {
        match self {
            Self::Native(b) | Self::Wire(b) => b.len(),
        }
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
    /// waits for packets: it takes the results on this thread only when they are at the
    /// socket and the progress thread has not taken them.
    #[must_use]
    pub fn test(&self) -> bool {
        if !self.slot.done.load(SeqCst)
            && let Some(engine) = self.engine.upgrade()
        {
            engine.drive_if_answered();
        }
        self.slot.done.load(SeqCst)
    }

    /// Waits until the collective is done and gives the buffer back: the result in it, or
    /// on failure the caller's data as it was (never a partial result), with the error.
    /// When the progress thread has not taken the queue yet, the waiting thread runs it
    /// itself, spinning as a blocking collective does.
    pub fn wait(self) -> (B, Result<Report, Error>) {
        if let Some(out) = lock(&self.slot.outcome).take() {
            return out;
        }
        if let Some(engine) = self.engine.upgrade() {
            engine.drive();
        }
        // Done here, or another thread runs the queue: sleep until this one is over.
        let mut out = lock(&self.slot.outcome);
        while out.is_none() {
            out = self
                .slot
                .ready
                .wait(out)
                .unwrap_or_else(PoisonError::into_inner);
        }
        out.take().expect("checked above")
    }
}
