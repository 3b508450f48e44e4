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
//!
//! With UDP GRO on the socket (`UDP_GRO`, Linux 5.0), the kernel may hand a train of
//! equal-length datagrams of one sender over as one message, with the segment size in a
//! control message; every reader here splits it into the datagrams again, so callers see
//! exactly the datagrams that were sent.

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
/// Largest datagram read: an INC packet's UDP payload with the largest payload (8 KiB),
/// rounded up.
const BUF: usize = 9216;
const _: () =
    assert!(BUF >= innet_common::proto::MAX_PAYLOAD_BYTES + innet_common::proto::PAYLOAD_OVERHEAD);
/// Largest message read from a socket with UDP GRO on: a coalesced train of datagrams is
/// at most an IPv4 packet.
pub const GRO_BUF: usize = 65_536;
/// `UDP_GRO` (`linux/udp.h`): as a socket option, coalesce; as a control message, the
/// segment size of a coalesced message (an `int`).
const UDP_GRO: libc::c_int = 104;
/// Items the progress thread keeps for the application at most; the excess is dropped and
/// counted ([`Inbox::backlog_full`]). Enough for a window of results and the first message
/// of a peer a collective ahead up to ~23 MB (in 1,408-byte packets); a longer one's
/// dropped packets are asked for again by NACK. Without it, a flood while the application
/// computes grows the queue without bound.
pub const BACKLOG_MAX: usize = 16_384;
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
    /// Items dropped because `backlog` held [`BACKLOG_MAX`].
    backlog_full: AtomicU64,
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
        let mut backlog = self.backlog.lock().expect("backlog");
        // A flood while the application computes: memory without bound.
        if backlog.len() >= BACKLOG_MAX {
            self.backlog_full.fetch_add(1, SeqCst);
            return;
        }
        backlog.push_back(item);
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
    #[cfg(test)]
    pub fn new(sock: Arc<UdpSocket>, spin: Duration) -> io::Result<Self> {
        Self::with_gro(sock, spin, false)
    }

    /// An inbox on `sock` whose receives busy-poll for at most `spin` before blocking, with
    /// buffers for coalesced messages when `gro` (the socket has [`set_gro`]).
    ///
    /// # Errors
    /// No eventfd could be made.
    pub fn with_gro(sock: Arc<UdpSocket>, spin: Duration, gro: bool) -> io::Result<Self> {
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
                backlog_full: AtomicU64::new(0),
                // SAFETY: a fresh fd nobody else owns.
                kick: unsafe { OwnedFd::from_raw_fd(fd) },
                stop: AtomicBool::new(false),
            }),
            spin,
            inside: true,
            blocked: 0,
            batch: Batch::new(if gro { GRO_BUF } else { BUF }),
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
        mut handle: impl FnMut(&[u8], SocketAddr) -> Option<T> + Send + 'static,
    ) -> io::Result<()> {
        let (sock, turn) = (self.sock.clone(), self.turn.clone());
        let buf_len = self.batch.buf_len;
        self.thread = Some(std::thread::Builder::new().name(name).spawn(move || {
            let mut buf = vec![0u8; buf_len];
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
                    while let Ok((n, from, seg)) =
                        recv_segmented(sock.as_raw_fd(), &mut buf, libc::MSG_DONTWAIT)
                    {
                        // Every datagram of a coalesced message, even if the application
                        // is back meanwhile: it waits for `listening` to drop.
                        for datagram in segments(&buf[..n], seg) {
                            if let Some(item) = handle(datagram, from) {
                                turn.push(item);
                            }
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
    /// came in time, or when `also` (another socket the caller serves) woke it from its
    /// sleep (the spin does not watch it: the caller serves it between datagrams anyway).
    /// One system call takes every datagram queued, up to `BATCH`.
    pub fn recv_or(
        &mut self,
        deadline: Instant,
        also: Option<RawFd>,
    ) -> Option<(&[u8], SocketAddr)> {
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
                    // Woken for the other socket: the caller serves it first.
                    if wait_readable(fd, also, Some(deadline - now)) {
                        return None;
                    }
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

    /// Messages received so far by the calling thread's receives, and the datagrams they
    /// held (more datagrams than messages: UDP GRO coalesced some).
    #[must_use]
    pub fn coalescing(&self) -> (u64, u64) {
        (self.batch.messages, self.batch.datagrams)
    }

    /// Items the progress thread dropped because its queue was full.
    #[must_use]
    pub fn backlog_full(&self) -> u64 {
        self.turn.backlog_full.load(SeqCst)
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

/// Messages received by one `recvmmsg`, taken datagram by datagram (a message UDP GRO
/// coalesced holds several).
struct Batch {
    bufs: Vec<u8>,
    buf_len: usize,
    lens: [usize; BATCH],
    /// Each message's segment size (its length when not coalesced).
    segs: [usize; BATCH],
    from: [SocketAddr; BATCH],
    /// The next message to take from, and where in it.
    next: usize,
    offset: usize,
    filled: usize,
    /// Messages and datagrams received so far.
    messages: u64,
    datagrams: u64,
}

/// Room for one `UDP_GRO` control message (CMSG_SPACE(4) is 24 bytes on 64-bit Linux).
type Control = [u64; 4];

impl Batch {
    fn new(buf_len: usize) -> Self {
        Self {
            bufs: vec![0; buf_len * BATCH],
            buf_len,
            lens: [0; BATCH],
            segs: [0; BATCH],
            from: [SocketAddr::V4(SocketAddrV4::new(0.into(), 0)); BATCH],
            next: 0,
            offset: 0,
            filled: 0,
            messages: 0,
            datagrams: 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.next == self.filled
    }

    /// Receives what is queued on `fd` (never blocks); whether anything came.
    fn fill(&mut self, fd: RawFd) -> bool {
        let mut addrs = [MaybeUninit::<libc::sockaddr_in>::zeroed(); BATCH];
        let mut controls = [Control::default(); BATCH];
        let buf_len = self.buf_len;
        let mut iovs: [libc::iovec; BATCH] = std::array::from_fn(|i| libc::iovec {
            iov_base: self.bufs[i * buf_len..].as_mut_ptr().cast(),
            iov_len: buf_len,
        });
        // SAFETY: zeroed mmsghdrs are valid (null pointers, zero lengths); filled below.
        let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        for (i, m) in msgs.iter_mut().enumerate() {
            m.msg_hdr.msg_name = addrs[i].as_mut_ptr().cast();
            m.msg_hdr.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
            m.msg_hdr.msg_iov = &raw mut iovs[i];
            m.msg_hdr.msg_iovlen = 1;
            m.msg_hdr.msg_control = controls[i].as_mut_ptr().cast();
            m.msg_hdr.msg_controllen = size_of::<Control>() as _;
        }
        // SAFETY: BATCH headers, each naming one buffer of `buf_len` bytes, one address
        // buffer and one control buffer, all alive for the call.
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
            let len = m.msg_len as usize;
            self.lens[i] = len;
            self.segs[i] = gro_segment(&m.msg_hdr).unwrap_or(len);
            // SAFETY: the kernel filled the address (an IPv4 socket).
            self.from[i] = socket_addr(unsafe { addrs[i].assume_init() });
            self.datagrams += len.div_ceil(self.segs[i].max(1)).max(1) as u64;
        }
        self.messages += n as u64;
        (self.next, self.offset, self.filled) = (0, 0, n);
        n > 0
    }

    fn take(&mut self) -> Option<(&[u8], SocketAddr)> {
        if self.is_empty() {
            return None;
        }
        let i = self.next;
        let (len, seg) = (self.lens[i], self.segs[i].max(1));
        let start = self.offset;
        let end = (start + seg).min(len);
        if end >= len {
            (self.next, self.offset) = (i + 1, 0);
        } else {
            self.offset = end;
        }
        let base = i * self.buf_len;
        Some((&self.bufs[base + start..base + end], self.from[i]))
    }
}

/// Turns UDP GRO on for `sock`: the kernel may then hand over several datagrams of one
/// sender as one message, which [`recv_segmented`] reads and [`segments`] splits.
///
/// # Errors
/// The kernel does not know the option (before Linux 5.0).
pub fn set_gro(sock: &UdpSocket) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: setsockopt on an open socket with a c_int option value.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_UDP,
            UDP_GRO,
            (&raw const on).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The segment size a `UDP_GRO` control message of `hdr` gives, if the message was
/// coalesced.
fn gro_segment(hdr: &libc::msghdr) -> Option<usize> {
    // SAFETY: `hdr` is a header the kernel filled, its control buffer alive; the CMSG
    // macros stay within `msg_controllen`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(hdr);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == UDP_GRO {
                let seg = libc::CMSG_DATA(c).cast::<libc::c_int>().read_unaligned();
                return usize::try_from(seg).ok().filter(|&s| s > 0);
            }
            c = libc::CMSG_NXTHDR(hdr, c);
        }
    }
    None
}

/// Receives one message on `fd` into `buf` (with `flags`, such as `MSG_DONTWAIT`): its
/// length, its sender and its segment size (the length when it was not coalesced). `buf`
/// should hold [`GRO_BUF`] bytes on a socket with UDP GRO on.
///
/// # Errors
/// Nothing came (`WouldBlock`, also when a read timeout passed) or the socket failed.
pub fn recv_segmented(
    fd: RawFd,
    buf: &mut [u8],
    flags: libc::c_int,
) -> io::Result<(usize, SocketAddr, usize)> {
    let mut addr = MaybeUninit::<libc::sockaddr_in>::zeroed();
    let mut control = Control::default();
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: a zeroed msghdr is valid; filled below.
    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    hdr.msg_name = addr.as_mut_ptr().cast();
    hdr.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
    hdr.msg_iov = &raw mut iov;
    hdr.msg_iovlen = 1;
    hdr.msg_control = control.as_mut_ptr().cast();
    hdr.msg_controllen = size_of::<Control>() as _;
    // SAFETY: a header naming one buffer of its length, an address and a control buffer,
    // all alive for the call.
    let n = unsafe { libc::recvmsg(fd, &raw mut hdr, flags) };
    let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
    let seg = gro_segment(&hdr).unwrap_or(n);
    // SAFETY: the kernel filled the address (an IPv4 socket).
    Ok((n, socket_addr(unsafe { addr.assume_init() }), seg))
}

/// The datagrams of a message of segment size `seg` (the last may be shorter); a message
/// that was not coalesced is one datagram, an empty one too.
pub fn segments(message: &[u8], seg: usize) -> impl Iterator<Item = &[u8]> {
    let seg = seg.clamp(1, message.len().max(1));
    let empty = message.is_empty().then_some(message);
    message.chunks(seg).chain(empty)
}

/// A sender's address as the kernel wrote it.
fn socket_addr(a: libc::sockaddr_in) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(
        u32::from_be(a.sin_addr.s_addr).into(),
        u16::from_be(a.sin_port),
    ))
}

/// Whether `fd` has something to read now (never blocks).
pub(crate) fn readable_now(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd, no wait.
    unsafe { libc::poll(&raw mut p, 1, 0) > 0 && p.revents & libc::POLLIN != 0 }
}

/// Blocks until `fd` (or `also`) is readable or `timeout` passes; whether `also` is.
pub(crate) fn wait_readable(fd: RawFd, also: Option<RawFd>, timeout: Option<Duration>) -> bool {
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
    let ready = unsafe { libc::ppoll(fds.as_mut_ptr(), 2, ts_ptr, std::ptr::null()) };
    ready > 0 && fds[1].revents & libc::POLLIN != 0
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
        inbox.start("t".into(), |d, _| Some(d.to_vec())).unwrap();
        a.send(b"one").unwrap();
        let (d, from) = inbox
            .recv_or(Instant::now() + Duration::from_secs(2), None)
            .unwrap();
        assert_eq!(d, b"one");
        assert_eq!(from, a.local_addr().unwrap());
        let t = Instant::now();
        assert!(inbox.recv_or(t + Duration::from_millis(30), None).is_none());
        assert!(t.elapsed() >= Duration::from_millis(30));
        assert!(
            inbox.kept().is_none(),
            "nothing went to the progress thread"
        );
    }

    #[test]
    fn while_away_the_progress_thread_answers_or_keeps() {
        let (a, b) = pair();
        let mut inbox: Inbox<Vec<u8>> = Inbox::new(b.clone(), Duration::ZERO).unwrap();
        // The handler answers "ping" itself and keeps everything else.
        inbox
            .start("t".into(), move |d, from| {
                if d == b"ping" {
                    b.send_to(b"pong", from).unwrap();
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
        let (d, _) = inbox
            .recv_or(Instant::now() + Duration::from_secs(2), None)
            .unwrap();
        assert_eq!(d, b"mine");
    }

    #[test]
    fn a_flood_while_away_keeps_at_most_the_backlog_cap() {
        let (_a, b) = pair();
        let inbox: Inbox<u32> = Inbox::new(b, Duration::ZERO).unwrap();
        let mut inbox = inbox;
        for i in 0..BACKLOG_MAX as u32 + 5 {
            inbox.turn.push(i);
        }
        assert_eq!(inbox.backlog_full(), 5);
        let mut kept = 0;
        while inbox.kept().is_some() {
            kept += 1;
        }
        assert_eq!(kept, BACKLOG_MAX, "the oldest kept, the excess dropped");
    }

    #[test]
    fn a_coalesced_message_reaches_the_caller_as_its_datagrams() {
        let (a, b) = pair();
        set_gro(&b).unwrap();
        let mut inbox: Inbox<Vec<u8>> = Inbox::with_gro(b.clone(), Duration::ZERO, true).unwrap();
        let mut sent: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 1200]).collect();
        sent.push(vec![0xee; 33]);
        let std::net::SocketAddr::V4(to) = b.local_addr().unwrap() else {
            unreachable!()
        };
        let gso = crate::sendmany::Gso::new(true);
        crate::sendmany::send_segmented(&a, to, &mut sent, &gso, |_, _| {}).unwrap();
        a.send(b"after").unwrap();
        let deadline = Instant::now() + Duration::from_secs(2);
        for want in sent.iter().map(Vec::as_slice).chain([&b"after"[..]]) {
            let (d, from) = inbox.recv_or(deadline, None).unwrap();
            assert_eq!((d, from), (want, a.local_addr().unwrap()));
        }
        assert!(!inbox.has_received());
        assert_eq!(
            inbox.coalescing(),
            (2, 12),
            "the GSO train came as one message"
        );
    }
}
