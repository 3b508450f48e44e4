//! Who reads a leader's INC socket, and when.
//!
//! While a collective runs, the thread that called it reads the socket itself: a bounded
//! busy-poll (non-blocking receives, yielding the CPU in between), then `ppoll(2)` until its
//! deadline. No packet is handed from one thread to another on that path, so a result costs
//! one wake-up of the caller, not two.
//!
//! While the application is away (computing between collectives for longer than
//! [`AWAY`]), the progress thread reads the socket instead: it answers what must not wait
//! (a late peer asking for a finished collective's result, an NMRR whose notify was lost)
//! and keeps anything else for the application's next call. Coming back, the application
//! takes the socket over with two atomic stores and, only if the progress thread was
//! listening, one `eventfd` write to wake it out of `ppoll`.

use std::{
    collections::VecDeque,
    io,
    mem::MaybeUninit,
    net::{SocketAddr, SocketAddrV4, UdpSocket},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering::SeqCst},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

/// How long the application must have left the socket alone before the progress thread
/// reads it. Peers ask again after their retry timer (20 ms by default), so answering them
/// a few milliseconds late costs nothing, and a tight loop of collectives never wakes the
/// progress thread.
pub const AWAY: Duration = Duration::from_millis(5);
/// Largest datagram read (a jumbo INC frame is at most 3,520 bytes).
const BUF: usize = 4096;
/// Datagrams one receive system call takes at most (`recvmmsg`).
const BATCH: usize = 16;

/// The hand-over state both threads see.
struct Turn<T> {
    /// The application is inside a collective and owns the socket.
    app_inside: AtomicBool,
    /// The progress thread is reading, or about to read, the socket.
    listening: AtomicBool,
    /// When the application last left, in nanoseconds since `epoch`.
    left_at: AtomicU64,
    epoch: Instant,
    /// What the progress thread received for the application.
    backlog: Mutex<VecDeque<T>>,
    /// Whether `backlog` may hold something (checked without the lock).
    queued: AtomicBool,
    /// Wakes the progress thread out of `ppoll`.
    kick: OwnedFd,
    stop: AtomicBool,
}

impl<T> Turn<T> {
    fn since_left(&self) -> Duration {
        let now = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(now.saturating_sub(self.left_at.load(SeqCst)))
    }

    fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: an eventfd and an 8-byte value. A full counter (never here) only means a
        // wake-up is already pending.
        unsafe { libc::write(self.kick.as_raw_fd(), (&raw const one).cast(), 8) };
    }

    fn push(&self, item: T) {
        self.backlog.lock().expect("backlog").push_back(item);
        self.queued.store(true, SeqCst);
    }
}

/// A leader's INC socket, read by whichever thread's turn it is.
pub struct Inbox<T> {
    sock: Arc<UdpSocket>,
    turn: Arc<Turn<T>>,
    /// Busy-poll budget of a blocking receive.
    spin: Duration,
    /// This thread's view of `turn.app_inside`.
    inside: bool,
    /// Times a receive blocked in the kernel.
    blocked: u32,
    batch: Batch,
    thread: Option<JoinHandle<()>>,
}

impl<T: Send + 'static> Inbox<T> {
    /// An inbox on `sock` whose receives busy-poll for at most `spin` before blocking.
    ///
    /// # Errors
    /// No eventfd could be made.
    pub fn new(sock: Arc<UdpSocket>, spin: Duration) -> io::Result<Self> {
        // SAFETY: plain eventfd creation; the fd is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            sock,
            turn: Arc::new(Turn {
                // The application owns the socket until it first lets go.
                app_inside: AtomicBool::new(true),
                listening: AtomicBool::new(false),
                left_at: AtomicU64::new(0),
                epoch: Instant::now(),
                backlog: Mutex::new(VecDeque::new()),
                queued: AtomicBool::new(false),
                // SAFETY: a fresh fd nobody else owns.
                kick: unsafe { OwnedFd::from_raw_fd(fd) },
                stop: AtomicBool::new(false),
            }),
            spin,
            inside: true,
            blocked: 0,
            batch: Batch::new(),
            thread: None,
        })
    }

    /// Starts the progress thread: while the application is away it reads the socket and
    /// passes each datagram to `handle`, which answers it or returns what the application
    /// must see.
    ///
    /// # Errors
    /// The thread could not be spawned.
    pub fn start(
        &mut self,
        name: String,
        mut handle: impl FnMut(&UdpSocket, &[u8], SocketAddr) -> Option<T> + Send + 'static,
    ) -> io::Result<()> {
        let (sock, turn) = (self.sock.clone(), self.turn.clone());
        self.thread = Some(std::thread::Builder::new().name(name).spawn(move || {
            let mut buf = vec![0u8; BUF];
            while !turn.stop.load(SeqCst) {
                let away = turn.since_left();
                if turn.app_inside.load(SeqCst) || away < AWAY {
                    std::thread::sleep(AWAY.saturating_sub(away).max(AWAY / 4));
                    continue;
                }
                // Dekker: the application stores `app_inside` then reads `listening`; this
                // thread stores `listening` then reads `app_inside`: one sees the other.
                turn.listening.store(true, SeqCst);
                if !turn.app_inside.load(SeqCst) {
                    wait_readable(
                        sock.as_raw_fd(),
                        Some(turn.kick.as_raw_fd()),
                        Some(AWAY * 20),
                    );
                    drain_eventfd(turn.kick.as_raw_fd());
                    while let Some((n, from)) = recv_now(sock.as_raw_fd(), &mut buf) {
                        if let Some(item) = handle(&sock, &buf[..n], from) {
                            turn.push(item);
                        }
                        if turn.app_inside.load(SeqCst) {
                            break;
                        }
                    }
                }
                turn.listening.store(false, SeqCst);
            }
        })?);
        Ok(())
    }

    /// Takes the socket for the application's thread (a no-op when it has it).
    pub fn claim(&mut self) {
        if self.inside {
            return;
        }
        self.inside = true;
        self.turn.app_inside.store(true, SeqCst);
        if self.turn.listening.load(SeqCst) {
            self.turn.wake();
            while self.turn.listening.load(SeqCst) {
                std::thread::yield_now();
            }
        }
    }

    /// Leaves the socket to the progress thread (after [`AWAY`]).
    pub fn release(&mut self) {
        if !self.inside {
            return;
        }
        self.inside = false;
        let now = u64::try_from(self.turn.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.turn.left_at.store(now, SeqCst);
        self.turn.app_inside.store(false, SeqCst);
    }

    /// Something the progress thread kept for the application.
    pub fn kept(&mut self) -> Option<T> {
        self.claim();
        if !self.turn.queued.load(SeqCst) {
            return None;
        }
        let mut q = self.turn.backlog.lock().expect("backlog");
        let item = q.pop_front();
        if q.is_empty() {
            self.turn.queued.store(false, SeqCst);
        }
        item
    }

    /// The next datagram, waiting until `deadline` (busy-polling first); `None` when none
    /// came in time. One system call takes every datagram queued, up to `BATCH`.
    pub fn recv(&mut self, deadline: Instant) -> Option<(&[u8], SocketAddr)> {
        self.claim();
        if self.batch.is_empty() {
            let fd = self.sock.as_raw_fd();
            let spin_until = (Instant::now() + self.spin).min(deadline);
            while !self.batch.fill(fd) {
                let now = Instant::now();
                if now >= deadline {
                    return None;
                }
                if now < spin_until {
                    std::thread::yield_now();
                } else {
                    self.blocked = self.blocked.wrapping_add(1);
                    wait_readable(fd, None, Some(deadline - now));
                }
            }
        }
        self.batch.take()
    }

    /// A datagram already received and not yet taken, without a system call: the caller
    /// takes these before it leaves the socket to the progress thread, which never sees
    /// them.
    pub fn take_received(&mut self) -> Option<(&[u8], SocketAddr)> {
        self.batch.take()
    }

    /// Whether datagrams already received wait to be taken.
    #[must_use]
    pub fn has_received(&self) -> bool {
        !self.batch.is_empty()
    }

    /// Times a receive blocked in the kernel so far (wrapping).
    #[must_use]
    pub fn blocked(&self) -> u32 {
        self.blocked
    }

    /// How long a receive busy-polls before it blocks.
    #[must_use]
    pub fn spin(&self) -> Duration {
        self.spin
    }

    /// Sets how long a receive busy-polls before it blocks.
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = spin;
    }
}

impl<T> Drop for Inbox<T> {
    fn drop(&mut self) {
        self.turn.stop.store(true, SeqCst);
        self.turn.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Datagrams received by one `recvmmsg`, taken one by one.
struct Batch {
    bufs: Box<[[u8; BUF]]>,
    lens: [usize; BATCH],
    from: [SocketAddr; BATCH],
    next: usize,
    filled: usize,
}

impl Batch {
    fn new() -> Self {
        Self {
            bufs: vec![[0; BUF]; BATCH].into_boxed_slice(),
            lens: [0; BATCH],
            from: [SocketAddr::V4(SocketAddrV4::new(0.into(), 0)); BATCH],
            next: 0,
            filled: 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.next == self.filled
    }

    /// Receives what is queued on `fd` (never blocks); whether anything came.
    fn fill(&mut self, fd: RawFd) -> bool {
        let mut addrs = [MaybeUninit::<libc::sockaddr_in>::zeroed(); BATCH];
        let mut iovs: [libc::iovec; BATCH] = std::array::from_fn(|i| libc::iovec {
            iov_base: self.bufs[i].as_mut_ptr().cast(),
            iov_len: BUF,
        });
        // SAFETY: zeroed mmsghdrs are valid (null pointers, zero lengths); filled below.
        let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        for (i, m) in msgs.iter_mut().enumerate() {
            m.msg_hdr.msg_name = addrs[i].as_mut_ptr().cast();
            m.msg_hdr.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
            m.msg_hdr.msg_iov = &raw mut iovs[i];
            m.msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: BATCH headers, each naming one buffer of BUF bytes and one address buffer,
        // all alive for the call.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                msgs.as_mut_ptr(),
                BATCH as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        let Ok(n) = usize::try_from(n) else {
            return false;
        };
        for (i, m) in msgs[..n].iter().enumerate() {
            self.lens[i] = m.msg_len as usize;
            // SAFETY: the kernel filled the address (an IPv4 socket).
            self.from[i] = socket_addr(unsafe { addrs[i].assume_init() });
        }
        (self.next, self.filled) = (0, n);
        n > 0
    }

    fn take(&mut self) -> Option<(&[u8], SocketAddr)> {
        if self.is_empty() {
            return None;
        }
        let i = self.next;
        self.next += 1;
        Some((&self.bufs[i][..self.lens[i]], self.from[i]))
    }
}

/// One datagram if one is queued (never blocks).
fn recv_now(fd: RawFd, buf: &mut [u8]) -> Option<(usize, SocketAddr)> {
    let mut addr = MaybeUninit::<libc::sockaddr_in>::zeroed();
    let mut len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a valid socket, a buffer of its length, an address buffer of `len` bytes.
    let n = unsafe {
        libc::recvfrom(
            fd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
            addr.as_mut_ptr().cast(),
            &raw mut len,
        )
    };
    let n = usize::try_from(n).ok()?;
    // SAFETY: the kernel filled the address (an IPv4 socket).
    Some((n, socket_addr(unsafe { addr.assume_init() })))
}

/// A sender's address as the kernel wrote it.
fn socket_addr(a: libc::sockaddr_in) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(
        u32::from_be(a.sin_addr.s_addr).into(),
        u16::from_be(a.sin_port),
    ))
}

/// Blocks until `fd` (or `also`) is readable or `timeout` passes.
fn wait_readable(fd: RawFd, also: Option<RawFd>, timeout: Option<Duration>) {
    let mut fds = [
        libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: also.unwrap_or(-1),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().try_into().unwrap_or(libc::time_t::MAX),
        tv_nsec: t.subsec_nanos().into(),
    });
    let ts_ptr = ts.as_ref().map_or(std::ptr::null(), std::ptr::from_ref);
    // SAFETY: two pollfds (a negative fd is ignored), a timespec or null, no signal mask.
    unsafe { libc::ppoll(fds.as_mut_ptr(), 2, ts_ptr, std::ptr::null()) };
}

fn drain_eventfd(fd: RawFd) {
    let mut v: u64 = 0;
    // SAFETY: a non-blocking eventfd and an 8-byte buffer.
    unsafe { libc::read(fd, (&raw mut v).cast(), 8) };
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn pair() -> (UdpSocket, Arc<UdpSocket>) {
        let a = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let b = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        a.connect(b.local_addr().unwrap()).unwrap();
        (a, Arc::new(b))
    }

    #[test]
    fn the_caller_reads_while_inside_and_times_out_empty() {
        let (a, b) = pair();
        let mut inbox: Inbox<Vec<u8>> = Inbox::new(b, Duration::from_micros(20)).unwrap();
        inbox.start("t".into(), |_, d, _| Some(d.to_vec())).unwrap();
        a.send(b"one").unwrap();
        let (d, from) = inbox.recv(Instant::now() + Duration::from_secs(2)).unwrap();
        assert_eq!(d, b"one");
        assert_eq!(from, a.local_addr().unwrap());
        let t = Instant::now();
        assert!(inbox.recv(t + Duration::from_millis(30)).is_none());
        assert!(t.elapsed() >= Duration::from_millis(30));
        assert!(
            inbox.kept().is_none(),
            "nothing went to the progress thread"
        );
    }

    #[test]
    fn while_away_the_progress_thread_answers_or_keeps() {
        let (a, b) = pair();
        let mut inbox: Inbox<Vec<u8>> = Inbox::new(b, Duration::ZERO).unwrap();
        // The handler answers "ping" itself and keeps everything else.
        inbox
            .start("t".into(), |s, d, from| {
                if d == b"ping" {
                    s.send_to(b"pong", from).unwrap();
                    None
                } else {
                    Some(d.to_vec())
                }
            })
            .unwrap();
        inbox.release();
        std::thread::sleep(AWAY * 3);
        // In order: by the time "pong" comes back, "data" was read (and kept) too.
        a.send(b"data").unwrap();
        a.send(b"ping").unwrap();
        let mut buf = [0u8; 8];
        a.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let n = a.recv(&mut buf).unwrap();
        assert_eq!(
            &buf[..n],
            b"pong",
            "answered while the application was away"
        );
        // Coming back takes the socket over; the kept datagram is there, once.
        assert_eq!(inbox.kept().as_deref(), Some(&b"data"[..]));
        assert!(inbox.kept().is_none());
        // Inside again: datagrams come to the caller, not the progress thread.
        a.send(b"mine").unwrap();
        let (d, _) = inbox.recv(Instant::now() + Duration::from_secs(2)).unwrap();
        assert_eq!(d, b"mine");
    }
}
