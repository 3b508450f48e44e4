//! Many datagrams to one address in one system call (`sendmmsg(2)`): a leader opening its
//! window sends a round per packet, and a system call each cost as much as the UDP send.
//!
//! With UDP GSO (`UDP_SEGMENT`, Linux 4.18) consecutive datagrams of one length also share
//! the kernel's send path: each run of them goes down as one super-datagram (the
//! datagrams' buffers side by side, the segment size in a control message), and the kernel
//! or the NIC cuts it into the same datagrams at the last moment. The kernel numbers the
//! segments' IPv4 ids up from the super-datagram's, so the caller renumbers the datagrams
//! that leave as later segments (for INC packets: their ICRC covers the id).

use std::{
    io,
    net::{SocketAddrV4, UdpSocket},
    os::fd::AsRawFd as _,
    sync::atomic::{AtomicU8, Ordering::Relaxed},
};

/// Headers one call takes at most; longer lists go in several calls.
const PER_CALL: usize = 64;
/// Segments of one GSO super-datagram at most (the kernel's `UDP_MAX_SEGMENTS` was 64
/// until Linux 6.10, 128 since).
pub const MAX_SEGMENTS: usize = 64;
/// UDP payload of one super-datagram at most: an IPv4 packet's 65,535 bytes less the IPv4
/// and UDP headers.
pub const MAX_GSO_BYTES: usize = 65_535 - 20 - 8;
/// `UDP_SEGMENT` (`linux/udp.h`): the segment size of a super-datagram, a `u16`.
const UDP_SEGMENT: libc::c_int = 103;

/// A datagram as the pieces the kernel gathers into it (one iovec each): a whole packet,
/// or headers, a body where it lies and a trailer (no copy of the body into a packet).
pub trait Datagram {
    /// Bytes in all.
    fn len(&self) -> usize;
    /// Appends its pieces, in order.
    fn pieces<'a>(&'a self, out: &mut Vec<&'a [u8]>);
}

impl Datagram for Vec<u8> {
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn pieces<'a>(&'a self, out: &mut Vec<&'a [u8]>) {
        out.push(self);
    }
}

/// Whether a socket sends with UDP GSO: configured off, not tried yet, working, or refused
/// by the kernel at the first try (then never tried again on that socket).
#[derive(Debug)]
pub struct Gso(AtomicU8);

const GSO_OFF: u8 = 0;
const GSO_UNTRIED: u8 = 1;
const GSO_WORKS: u8 = 2;
const GSO_REFUSED: u8 = 3;

impl Gso {
    /// The state of a fresh socket: GSO to be tried (`enabled`) or never used.
    #[must_use]
    pub fn new(enabled: bool) -> Self {
        Self(AtomicU8::new(if enabled { GSO_UNTRIED } else { GSO_OFF }))
    }

    /// Whether datagrams go down as super-datagrams (the kernel has not refused them).
    #[must_use]
    pub fn active(&self) -> bool {
        matches!(self.0.load(Relaxed), GSO_UNTRIED | GSO_WORKS)
    }
}

/// Sends every datagram of `packets` to `to` as UDP GSO super-datagrams, several per
/// system call, when `gso` allows; returns how many datagrams the kernel took (all of them
/// unless an error stopped it). A run of datagrams of one length (up to
/// [`MAX_SEGMENTS`] and [`MAX_GSO_BYTES`], and one shorter datagram after them) goes as
/// one super-datagram; `renumber(datagram, k)` is called for the datagram that leaves as
/// its segment `k > 0`, whose IPv4 id is the super-datagram's plus `k`.
///
/// When the kernel refuses GSO the first time (`EIO`, `EINVAL`, `ENOPROTOOPT`,
/// `EOPNOTSUPP`) the datagrams are numbered back (`renumber(datagram, 0)`) and go one by
/// one ([`send_all`]), as every later call on that socket does.
///
/// # Errors
/// The first datagram could not be sent.
pub fn send_segmented<D: Datagram>(
    sock: &UdpSocket,
    to: SocketAddrV4,
    packets: &mut [D],
    gso: &Gso,
    mut renumber: impl FnMut(&mut D, u16),
) -> io::Result<usize> {
    if !gso.active() || packets.len() < 2 {
        return send_all(sock, to, packets);
    }
    let runs = runs(packets.iter().map(Datagram::len));
    if runs.len() == packets.len() {
        // Nothing to coalesce.
        return send_all(sock, to, packets);
    }
    for &(start, count) in &runs {
        for k in 1..count {
            renumber(&mut packets[start + k], k as u16);
        }
    }
    match send_runs(sock, to, packets, &runs) {
        Err(e) if gso.0.load(Relaxed) == GSO_UNTRIED && refuses_gso(&e) => {
            gso.0.store(GSO_REFUSED, Relaxed);
            tracing::debug!(error = %e, "the kernel refuses UDP GSO on this socket: datagrams go one by one");
            for &(start, count) in &runs {
                for k in 1..count {
                    renumber(&mut packets[start + k], 0);
                }
            }
            send_all(sock, to, packets)
        }
        r => {
            if r.is_ok() {
                let _ = gso
                    .0
                    .compare_exchange(GSO_UNTRIED, GSO_WORKS, Relaxed, Relaxed);
            }
            r
        }
    }
}

/// The IPv4 id, counted from the super-datagram's, that each datagram of lengths `lens`
/// leaves with when [`send_segmented`] sends them now with `gso`: a sender that numbers
/// its datagrams so from the start has nothing to renumber (0 for every datagram that
/// goes alone).
#[must_use]
pub fn segment_ids(gso: &Gso, lens: &[usize]) -> Vec<u16> {
    let mut ids = vec![0; lens.len()];
    if gso.active() && lens.len() >= 2 {
        for (start, count) in runs(lens.iter().copied()) {
            for k in 1..count {
                ids[start + k] = k as u16;
            }
        }
    }
    ids
}

/// The errors by which the kernel (or the route's device) says it does not do UDP GSO.
fn refuses_gso(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT | libc::EOPNOTSUPP)
    )
}

/// The super-datagrams of datagrams of lengths `lens`: (first datagram, datagrams).
fn runs(lens: impl Iterator<Item = usize>) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = vec![];
    // The open run: its segment size and bytes; closed by a shorter datagram.
    let mut open: Option<(usize, usize)> = None;
    for (i, len) in lens.enumerate() {
        if let (Some((seg, bytes)), Some(last)) = (open, runs.last_mut())
            && len <= seg
            && last.1 < MAX_SEGMENTS
            && bytes + len <= MAX_GSO_BYTES
        {
            last.1 += 1;
            open = (len == seg).then_some((seg, bytes + len));
            continue;
        }
        runs.push((i, 1));
        open = (len > 0).then_some((len, len));
    }
    runs
}

/// Sends `runs` of `packets`, each a super-datagram (a plain one when it holds one
/// datagram); returns the datagrams the kernel took.
fn send_runs<D: Datagram>(
    sock: &UdpSocket,
    to: SocketAddrV4,
    packets: &[D],
    runs: &[(usize, usize)],
) -> io::Result<usize> {
    let mut addr = sockaddr(to);
    // Every packet's pieces side by side; `first[i]`: packet i's first piece.
    let mut pieces = Vec::with_capacity(packets.len() * 3);
    let mut first = Vec::with_capacity(packets.len() + 1);
    for p in packets {
        first.push(pieces.len());
        p.pieces(&mut pieces);
    }
    first.push(pieces.len());
    let iovs: Vec<libc::iovec> = pieces
        .iter()
        .map(|p| libc::iovec {
            iov_base: p.as_ptr().cast_mut().cast(),
            iov_len: p.len(),
        })
        .collect();
    // One control message per header: CMSG_SPACE(2) is 24 bytes on 64-bit Linux.
    let mut controls = vec![[0u64; 4]; runs.len().min(PER_CALL)];
    let mut sent = 0;
    for chunk in runs.chunks(PER_CALL) {
        let mut msgs: Vec<libc::mmsghdr> = Vec::with_capacity(chunk.len());
        for (&(start, count), control) in chunk.iter().zip(&mut controls) {
            // SAFETY: a zeroed msghdr is valid (null pointers, zero lengths).
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_name = (&raw mut addr).cast();
            m.msg_hdr.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
            m.msg_hdr.msg_iov = iovs[first[start]..].as_ptr().cast_mut();
            m.msg_hdr.msg_iovlen = (first[start + count] - first[start]) as _;
            if count > 1 {
                let seg = packets[start].len() as u16;
                // SAFETY: the buffer holds CMSG_SPACE(2) bytes, 8-aligned; the header and
                // its data are written inside it.
                unsafe {
                    let space = libc::CMSG_SPACE(size_of::<u16>() as u32);
                    debug_assert!(space as usize <= size_of_val(control));
                    m.msg_hdr.msg_control = control.as_mut_ptr().cast();
                    m.msg_hdr.msg_controllen = space as _;
                    let c = libc::CMSG_FIRSTHDR(&raw const m.msg_hdr);
                    (*c).cmsg_level = libc::SOL_UDP;
                    (*c).cmsg_type = UDP_SEGMENT;
                    (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as _;
                    libc::CMSG_DATA(c).cast::<u16>().write_unaligned(seg);
                }
            }
            msgs.push(m);
        }
        let mut done = 0;
        while done < msgs.len() {
            // SAFETY: headers naming live buffers, one address and live control buffers,
            // all alive for the call; the kernel only reads them.
            let n = unsafe {
                libc::sendmmsg(
                    sock.as_raw_fd(),
                    msgs[done..].as_mut_ptr(),
                    (msgs.len() - done) as libc::c_uint,
                    0,
                )
            };
            match usize::try_from(n) {
                Ok(n) if n > 0 => {
                    sent += chunk[done..done + n].iter().map(|r| r.1).sum::<usize>();
                    done += n;
                }
                _ if sent > 0 => return Ok(sent),
                _ => return Err(io::Error::last_os_error()),
            }
        }
    }
    Ok(sent)
}

fn sockaddr(to: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: to.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*to.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// Sends every datagram of `packets` to `to`, one header each; returns how many the kernel
/// took (all of them unless an error stopped it).
///
/// # Errors
/// The first datagram could not be sent.
pub fn send_all<D: Datagram>(
    sock: &UdpSocket,
    to: SocketAddrV4,
    packets: &[D],
) -> io::Result<usize> {
    let runs: Vec<(usize, usize)> = (0..packets.len()).map(|i| (i, 1)).collect();
    send_runs(sock, to, packets, &runs)
}

#[cfg(test)]
mod tests {
    use std::{net::Ipv4Addr, time::Duration};

    use super::*;
    use crate::inbox;

    fn pair() -> (UdpSocket, UdpSocket, SocketAddrV4) {
        let rx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let tx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let std::net::SocketAddr::V4(to) = rx.local_addr().unwrap() else {
            unreachable!()
        };
        (rx, tx, to)
    }

    /// Marks datagram `k` of its super-datagram in its last two bytes.
    fn mark(p: &mut [u8], k: u16) {
        let n = p.len();
        p[n - 2..].copy_from_slice(&k.to_be_bytes());
    }

    #[test]
    fn every_datagram_arrives_whole_and_in_order_across_calls() {
        let (rx, tx, to) = pair();
        let packets: Vec<Vec<u8>> = (0..PER_CALL + 7)
            .map(|i| vec![i as u8; 1 + i % 13])
            .collect();
        assert_eq!(send_all(&tx, to, &packets).unwrap(), packets.len());
        let mut buf = [0u8; 64];
        for p in &packets {
            let n = rx.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], &p[..]);
        }
    }

    #[test]
    fn runs_hold_equal_lengths_and_end_at_a_shorter_one_or_a_limit() {
        let lens = [100, 100, 100, 40, 100, 100, 7, 7, 30];
        assert_eq!(
            runs(lens.into_iter()),
            [(0, 4), (4, 3), (7, 1), (8, 1)],
            "a shorter datagram closes its run; a longer one opens the next"
        );
        let many = runs(std::iter::repeat_n(1000, MAX_SEGMENTS + 3));
        assert_eq!(many, [(0, MAX_SEGMENTS), (MAX_SEGMENTS, 3)]);
        let big = runs(std::iter::repeat_n(9000, 9));
        assert_eq!(big, [(0, 7), (7, 2)], "7 × 9000 B fit in one IPv4 packet");
    }

    #[test]
    fn gso_sends_equal_datagrams_and_a_short_last_as_the_same_datagrams() {
        let (rx, tx, to) = pair();
        let mut packets: Vec<Vec<u8>> = (0..20u8).map(|i| vec![i; 1400]).collect();
        packets.push(vec![0xee; 300]);
        let gso = Gso::new(true);
        let sent =
            send_segmented(&tx, to, &mut packets, &gso, |p: &mut Vec<u8>, k| mark(p, k)).unwrap();
        assert_eq!(sent, packets.len());
        assert!(gso.active(), "loopback takes GSO");
        assert_eq!(gso.0.load(Relaxed), GSO_WORKS);
        // A receiver without UDP_GRO gets the datagrams one by one, renumbered as sent.
        let mut buf = [0u8; 2048];
        for (k, p) in packets.iter().enumerate() {
            assert_eq!(&p[p.len() - 2..], &(k as u16).to_be_bytes());
            let n = rx.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], &p[..], "datagram {k}");
        }
    }

    #[test]
    fn segment_ids_are_the_numbers_send_segmented_gives() {
        let lens = [100, 100, 100, 40, 100, 100, 7, 7, 30];
        // Each datagram carries its index in its first byte.
        let mut packets: Vec<Vec<u8>> = (0..lens.len())
            .map(|i| {
                let mut p = vec![0; lens[i]];
                p[0] = i as u8;
                p
            })
            .collect();
        let on = Gso::new(true);
        let mut given = vec![0u16; lens.len()];
        let (_rx, tx, to) = pair();
        send_segmented(&tx, to, &mut packets, &on, |p: &mut Vec<u8>, k| {
            given[usize::from(p[0])] = k;
        })
        .unwrap();
        assert_eq!(segment_ids(&on, &lens), given);
        assert_eq!(given, [0, 1, 2, 3, 0, 1, 2, 0, 0]);
        assert_eq!(segment_ids(&Gso::new(false), &lens), [0; 9]);
        assert_eq!(segment_ids(&on, &[100]), [0]);
    }

    #[test]
    fn gso_off_sends_one_by_one_unnumbered() {
        let (rx, tx, to) = pair();
        let mut packets: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 500]).collect();
        let orig = packets.clone();
        let gso = Gso::new(false);
        let sent = send_segmented(&tx, to, &mut packets, &gso, |_, _| panic!("renumbered"));
        assert_eq!(sent.unwrap(), 5);
        assert_eq!(packets, orig);
        let mut buf = [0u8; 1024];
        for p in &orig {
            let n = rx.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], &p[..]);
        }
    }

    #[test]
    fn a_gro_receiver_gets_one_message_and_splits_it_into_the_datagrams() {
        let (rx, tx, to) = pair();
        inbox::set_gro(&rx).unwrap();
        let mut packets: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i; 1000]).collect();
        packets.push(vec![9; 10]);
        let gso = Gso::new(true);
        send_segmented(&tx, to, &mut packets, &gso, |p: &mut Vec<u8>, k| mark(p, k)).unwrap();
        let mut buf = vec![0u8; inbox::GRO_BUF];
        let (n, _, seg) = inbox::recv_segmented(rx.as_raw_fd(), &mut buf, 0).unwrap();
        assert_eq!((n, seg), (8 * 1000 + 10, 1000), "one coalesced message");
        let got: Vec<&[u8]> = inbox::segments(&buf[..n], seg).collect();
        let want: Vec<&[u8]> = packets.iter().map(Vec::as_slice).collect();
        assert_eq!(got, want);
    }
}
