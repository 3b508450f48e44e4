//! The node-local path between a node's ranks: Unix datagram sockets named after the job
//! and rank, in the temporary directory. The SRR uses it to hand the group parameters of the
//! handshake to its SRs (the switch paper's step 0), and the allreduce for intra-node reduce and
//! broadcast: a rank's data never touches the network before its leader has combined it.
//!
//! The sockets live in the file system, not in the abstract namespace, because a node with
//! one NIC per CPU socket is modelled with one network namespace per socket: the node's
//! ranks share the file system, not the namespace.

use std::{
    collections::HashMap,
    io,
    os::{
        fd::{AsRawFd as _, RawFd},
        unix::net::UnixDatagram,
    },
    path::PathBuf,
    time::{Duration, Instant},
};

use super::handshake::GroupParams;

/// Largest datagram the channel sends; longer messages go in pieces, each at an offset that
/// is a multiple of it (the receiver files pieces by index: one sent again replaces it).
pub const CHUNK: usize = 32 * 1024;
/// kind, 3 × pad, seq, from, offset, total (little-endian; never leaves the node).
const HEADER: usize = 20;

/// What a local message carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// The SRR's group parameters.
    Params = 1,
    /// A rank's contribution, to its leader.
    Contribution = 2,
    /// The allreduce result, from the leader.
    Result = 3,
}

/// One rank's endpoint on its node.
pub struct LocalChannel {
    sock: UnixDatagram,
    path: PathBuf,
    job: u64,
    rank: u32,
    /// Partly received messages by (kind, sender).
    partial: HashMap<(Kind, u32), Partial>,
    /// Complete messages that arrived before anyone asked for them.
    ready: Vec<(Kind, u32, u32, Vec<u8>)>,
    /// Receive buffer, kept: zeroing 32 KiB per message cost more than the message.
    buf: Vec<u8>,
    /// Peers' socket paths by rank, built once each.
    peers: HashMap<u32, PathBuf>,
}

/// A message being received, filed by piece: a leader sends a result's piece 0 (the report)
/// last, and a piece that comes again replaces the first and counts once.
struct Partial {
    seq: u32,
    data: Vec<u8>,
    /// Which pieces came, and how many.
    got: Vec<bool>,
    count: usize,
}

impl Partial {
    fn new(seq: u32, total: usize) -> Self {
        let pieces = total.div_ceil(CHUNK).max(1);
        Self {
            seq,
            data: vec![0; total],
            got: vec![false; pieces],
            count: 0,
        }
    }

    /// Bytes from the start that have come.
    fn prefix(&self) -> usize {
        let whole = self.got.iter().take_while(|&&g| g).count();
        (whole * CHUNK).min(self.data.len())
    }
}

fn path(job: u64, rank: u32) -> PathBuf {
    std::env::temp_dir().join(format!("innet-{job:016x}-{rank}.sock"))
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, what.to_owned())
}

impl LocalChannel {
    /// Binds rank `rank` of job `job` on this node.
    ///
    /// # Errors
    /// The name is taken (the same rank bound twice, or a stale socket file of a crashed job
    /// with the same id) or a socket error.
    pub fn bind(job: u64, rank: u32) -> io::Result<Self> {
        let path = path(job, rank);
        let sock = UnixDatagram::bind(&path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("binding the node-local socket {}: {e}", path.display()),
            )
        })?;
        Ok(Self {
            sock,
            path,
            job,
            rank,
            partial: HashMap::new(),
            ready: vec![],
            buf: vec![0u8; HEADER + CHUNK],
            peers: HashMap::new(),
        })
    }

    /// Sends `bytes` to rank `to` of the same job on this node, as one datagram.
    fn send(&mut self, to: u32, bytes: &[u8]) -> io::Result<()> {
        let job = self.job;
        let to = self.peers.entry(to).or_insert_with(|| path(job, to));
        self.sock.send_to(bytes, to).map(|_| ())
    }

    /// Sends message `kind`/`seq` to rank `to`, in as many datagrams as it needs. Retries
    /// while the receiver is not bound yet (it may still be starting), until `deadline`.
    ///
    /// # Errors
    /// The receiver did not appear before the deadline, or a socket error.
    pub fn send_msg(
        &mut self,
        to: u32,
        kind: Kind,
        seq: u32,
        data: &[u8],
        deadline: Instant,
    ) -> io::Result<()> {
        self.send_pieces(to, (kind, seq, data.len()), 0, data, deadline)
    }

    /// Sends the pieces of message `kind`/`seq` (`total` bytes) that cover `data`, which
    /// starts at `offset` (a multiple of [`CHUNK`]) of the message, to rank `to`: a message
    /// can leave in parts as they become ready, and a part sent again replaces the first.
    ///
    /// # Errors
    /// As [`send_msg`](Self::send_msg).
    pub fn send_pieces(
        &mut self,
        to: u32,
        (kind, seq, total): (Kind, u32, usize),
        offset: usize,
        data: &[u8],
        deadline: Instant,
    ) -> io::Result<()> {
        debug_assert!(offset.is_multiple_of(CHUNK) && offset + data.len() <= total);
        let mut at = 0;
        loop {
            let end = (at + CHUNK).min(data.len());
            let mut d = Vec::with_capacity(HEADER + end - at);
            d.push(kind as u8);
            d.extend_from_slice(&[0; 3]);
            for v in [seq, self.rank, (offset + at) as u32, total as u32] {
                d.extend_from_slice(&v.to_le_bytes());
            }
            d.extend_from_slice(&data[at..end]);
            loop {
                match self.send(to, &d) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                        ) && Instant::now() < deadline =>
                    {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(e) => return Err(e),
                }
            }
            at = end;
            if at >= data.len() {
                return Ok(());
            }
        }
    }

    /// Takes every datagram already queued, without waiting.
    ///
    /// # Errors
    /// A socket error.
    pub fn drain(&mut self) -> io::Result<()> {
        let mut buf = std::mem::take(&mut self.buf);
        let got = loop {
            // SAFETY: a buffer of buf.len() writable bytes.
            let n = unsafe {
                libc::recv(
                    self.sock.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if let Ok(n) = usize::try_from(n) {
                self.take(&buf[..n]);
                continue;
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock => break Ok(()),
                _ => break Err(e),
            }
        };
        self.buf = buf;
        got
    }

    /// The part of message `kind`/`seq` from rank `from` received so far, from its start
    /// (pieces come in order), and the message's length.
    #[must_use]
    pub fn received(&self, kind: Kind, seq: u32, from: u32) -> Option<(&[u8], usize)> {
        if let Some(p) = self.partial.get(&(kind, from)).filter(|p| p.seq == seq) {
            return Some((&p.data[..p.prefix()], p.data.len()));
        }
        self.ready
            .iter()
            .find(|(k, s, f, _)| *k == kind && *s == seq && *f == from)
            .map(|(.., data)| (data.as_slice(), data.len()))
    }

    /// The socket, to wait on with others.
    #[must_use]
    pub fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// Receives message `kind`/`seq` from rank `from` (any sender with `None`), waiting
    /// until `deadline`. Other complete messages are kept for later calls.
    ///
    /// # Errors
    /// Timeout, a socket error, or a message of a different `seq` from the same sender (the
    /// ranks disagree on how many collectives they ran).
    pub fn recv_msg(
        &mut self,
        kind: Kind,
        seq: u32,
        from: Option<u32>,
        deadline: Instant,
    ) -> io::Result<(u32, Vec<u8>)> {
        let mut buf = std::mem::take(&mut self.buf);
        let got = self.recv_into(&mut buf, kind, seq, from, deadline);
        self.buf = buf;
        got
    }

    fn recv_into(
        &mut self,
        buf: &mut [u8],
        kind: Kind,
        seq: u32,
        from: Option<u32>,
        deadline: Instant,
    ) -> io::Result<(u32, Vec<u8>)> {
        loop {
            if let Some(i) = self
                .ready
                .iter()
                .position(|(k, _, f, _)| *k == kind && from.is_none_or(|r| r == *f))
            {
                let (_, s, f, data) = self.ready.remove(i);
                if s != seq {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "rank {f} is at collective {s}, rank {} at {seq}: every rank must call the same collectives in the same order",
                            self.rank
                        ),
                    ));
                }
                return Ok((f, data));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(timed_out("no message from the node's other ranks in time"));
            }
            self.sock.set_read_timeout(Some(left))?;
            let n = match self.sock.recv(buf) {
                Ok(n) => n,
                // A signal interrupts a receive with a timeout even under SA_RESTART.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) =>
                {
                    continue;
                }
                Err(e) => return Err(e),
            };
            self.take(&buf[..n]);
        }
    }

    /// Files one datagram into the reassembly state.
    fn take(&mut self, d: &[u8]) {
        if d.len() < HEADER {
            return;
        }
        let kind = match d[0] {
            1 => Kind::Params,
            2 => Kind::Contribution,
            3 => Kind::Result,
            _ => return,
        };
        let u32_at = |i: usize| u32::from_le_bytes([d[i], d[i + 1], d[i + 2], d[i + 3]]);
        let (seq, from, offset, total) = (u32_at(4), u32_at(8), u32_at(12) as usize, u32_at(16));
        let (body, total) = (&d[HEADER..], total as usize);
        let piece = offset / CHUNK;
        if !offset.is_multiple_of(CHUNK) || body.len() != (total - offset.min(total)).min(CHUNK) {
            return;
        }
        let entry = self
            .partial
            .entry((kind, from))
            .or_insert_with(|| Partial::new(seq, total));
        if entry.seq != seq || entry.data.len() != total {
            *entry = Partial::new(seq, total);
        }
        let Some(dst) = entry.data.get_mut(offset..offset + body.len()) else {
            return;
        };
        dst.copy_from_slice(body);
        if !std::mem::replace(&mut entry.got[piece], true) {
            entry.count += 1;
        }
        if entry.count == entry.got.len()
            && let Some(p) = self.partial.remove(&(kind, from))
        {
            self.ready.push((kind, p.seq, from, p.data));
        }
    }

    /// SRR: hands the group parameters to each of `srs`.
    ///
    /// # Errors
    /// As [`Self::send_msg`].
    pub fn share_params(
        &mut self,
        srs: &[u32],
        params: &GroupParams,
        deadline: Instant,
    ) -> io::Result<()> {
        let bytes = params.to_bytes();
        srs.iter()
            .try_for_each(|&sr| self.send_msg(sr, Kind::Params, 0, &bytes, deadline))
    }

    /// SR: waits for its SRR's group parameters.
    ///
    /// # Errors
    /// Timeout, a socket error, or a message that is not group parameters.
    pub fn recv_params(&mut self, srr: u32, deadline: Instant) -> io::Result<GroupParams> {
        let (_, bytes) = self.recv_msg(Kind::Params, 0, Some(srr), deadline)?;
        GroupParams::from_bytes(&bytes)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not group parameters"))
    }
}

impl Drop for LocalChannel {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn job(tag: u64) -> u64 {
        u64::from(std::process::id()) << 16 | tag
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(2)
    }

    #[test]
    fn the_srr_hands_the_parameters_to_its_srs() {
        let job = job(0x5a);
        let params = GroupParams {
            true_comm_id: 0x1234_5601,
            wire_id: 0x34_5601,
            spine: Ipv4Addr::new(10, 77, 250, 1),
            ops: 0x0fff,
            dtypes: 0x00ff,
            max_data_size: 1408,
            window: 32,
            fail_cause: 0,
        };
        let mut srs: Vec<LocalChannel> = (1..4)
            .map(|r| LocalChannel::bind(job, r).expect("bind"))
            .collect();
        let mut srr = LocalChannel::bind(job, 0).expect("bind");
        srr.share_params(&[1, 2, 3], &params, soon())
            .expect("share");
        for sr in &mut srs {
            assert_eq!(sr.recv_params(0, soon()).expect("params"), params);
        }
        assert!(LocalChannel::bind(job, 0).is_err(), "a rank binds once");
        let quick = Instant::now() + Duration::from_millis(20);
        assert!(srs[0].recv_params(0, quick).is_err(), "nothing more queued");
    }

    #[test]
    fn long_messages_arrive_whole_and_interleaved_senders_stay_apart() {
        let job = job(0x5b);
        let mut leader = LocalChannel::bind(job, 0).expect("bind");
        let mut a = LocalChannel::bind(job, 1).expect("bind");
        let mut b = LocalChannel::bind(job, 2).expect("bind");
        let long: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let t = std::thread::spawn(move || {
            a.send_msg(0, Kind::Contribution, 7, &long, soon())
                .expect("a");
            b.send_msg(0, Kind::Contribution, 7, &[9; 5], soon())
                .expect("b");
            long
        });
        let (from, got) = leader
            .recv_msg(Kind::Contribution, 7, Some(2), soon())
            .expect("b's");
        assert_eq!((from, got), (2, vec![9; 5]));
        let (from, got) = leader
            .recv_msg(Kind::Contribution, 7, None, soon())
            .expect("a's");
        assert_eq!((from, got), (1, t.join().unwrap()));
    }

    #[test]
    fn a_piece_sent_again_replaces_the_first_and_completes_nothing() {
        let job = job(0x5d);
        let mut rank = LocalChannel::bind(job, 1).expect("bind");
        let mut leader = LocalChannel::bind(job, 0).expect("bind");
        let right: Vec<u8> = (0..3 * CHUNK - 5).map(|i| (i % 251) as u8).collect();
        let wrong = vec![0xee; CHUNK];
        let id = (Kind::Result, 9, right.len());
        leader.send_pieces(1, id, CHUNK, &wrong, soon()).unwrap();
        leader.send_pieces(1, id, CHUNK, &right[CHUNK..], soon()).unwrap();
        let quick = Instant::now() + Duration::from_millis(20);
        assert!(
            rank.recv_msg(Kind::Result, 9, Some(0), quick).is_err(),
            "three pieces came, piece 0 is still missing"
        );
        assert_eq!(rank.received(Kind::Result, 9, 0), Some((&[][..], right.len())));
        leader.send_pieces(1, id, 0, &right[..CHUNK], soon()).unwrap();
        let (_, got) = rank.recv_msg(Kind::Result, 9, Some(0), soon()).unwrap();
        assert_eq!(got, right);
    }

    #[test]
    fn a_rank_at_another_collective_is_named() {
        let job = job(0x5c);
        let mut leader = LocalChannel::bind(job, 0).expect("bind");
        let mut sr = LocalChannel::bind(job, 1).expect("bind");
        sr.send_msg(0, Kind::Contribution, 3, &[1], soon()).unwrap();
        let e = leader
            .recv_msg(Kind::Contribution, 4, Some(1), soon())
            .unwrap_err();
        assert!(e.to_string().contains("same collectives"), "{e}");
    }
}
