//! Captures a namespace's INC frames as they cross its interfaces, both ways, with an
//! `AF_PACKET` socket (what tcpdump reads): frames a host's stack sends (after the kernel
//! wrote their IPv4 header) and receives, frames a bridge forwards. Frames XDP consumes,
//! or transmits straight into a veth peer (`XDP_TX`, redirects), pass no tap here: capture
//! them where they arrive.

use std::{
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use innet_common::{
    proto::ROCEV2_UDP_PORT,
    wire::{ETH_LEN, IPV4_LEN},
};

use innet_net::sockopt::setsockopt;

use innet_lab::NetNs;

/// One captured INC frame (Ethernet onwards).
#[derive(Clone, Debug)]
pub struct Captured {
    /// The interface it crossed, in the captured namespace.
    pub ifindex: u32,
    /// Sent out of that interface (else received on it).
    pub outgoing: bool,
    pub frame: Vec<u8>,
}

/// A running capture; [`Capture::finish`] stops it and hands over what it saw.
pub struct Capture {
    stop: Arc<AtomicBool>,
    reader: JoinHandle<Vec<Captured>>,
}

/// `PACKET_OUTGOING`: a frame this host sent (`sll_pkttype`).
const PACKET_OUTGOING: u8 = 4;

impl Capture {
    /// Starts capturing every IPv4 UDP frame to port 4791 on every interface of `ns`.
    ///
    /// # Panics
    /// When the kernel refuses the socket.
    #[must_use]
    pub fn start(ns: &NetNs) -> Self {
        let sock = ns
            .run(open)
            .unwrap_or_else(|e| panic!("capture in {}: {e}", ns.name));
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let reader = std::thread::spawn(move || read(&sock, &flag));
        Self { stop, reader }
    }

    /// Stops the capture (after frames in flight have landed) and returns its frames in
    /// arrival order.
    ///
    /// # Panics
    /// When the reader panicked.
    #[must_use]
    pub fn finish(self) -> Vec<Captured> {
        std::thread::sleep(Duration::from_millis(200));
        self.stop.store(true, Ordering::Relaxed);
        self.reader.join().expect("capture reader")
    }
}

fn open() -> std::io::Result<OwnedFd> {
    let all = i32::from((libc::ETH_P_ALL as u16).to_be());
    // SAFETY: plain socket(2).
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, all) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // A burst of a whole job's frames fits; the timeout lets the reader see `stop`.
    setsockopt(
        &sock,
        libc::SOL_SOCKET,
        libc::SO_RCVBUFFORCE,
        &(64i32 << 20),
    )?;
    let timeout = libc::timeval {
        tv_sec: 0,
        tv_usec: 50_000,
    };
    setsockopt(&sock, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &timeout)?;
    Ok(sock)
}

fn read(sock: &OwnedFd, stop: &AtomicBool) -> Vec<Captured> {
    let mut out = vec![];
    let mut buf = vec![0u8; 1 << 16];
    loop {
        // SAFETY: all-zero is a valid sockaddr_ll.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut len = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: buffer and address of the sizes passed.
        let n = unsafe {
            libc::recvfrom(
                sock.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
                (&raw mut addr).cast(),
                &raw mut len,
            )
        };
        // A timeout (nothing queued): done once asked to stop.
        let Ok(n) = usize::try_from(n) else {
            if stop.load(Ordering::Relaxed) {
                return out;
            }
            continue;
        };
        let frame = &buf[..n];
        if is_inc(frame) {
            out.push(Captured {
                ifindex: addr.sll_ifindex.cast_unsigned(),
                outgoing: addr.sll_pkttype == PACKET_OUTGOING,
                frame: frame.to_vec(),
            });
        }
    }
}

/// IPv4, UDP, destination port 4791.
fn is_inc(f: &[u8]) -> bool {
    let ip = ETH_LEN;
    if f.len() < ip + IPV4_LEN + 8 || f[12..14] != [0x08, 0x00] || f[ip + 9] != 17 {
        return false;
    }
    let udp = ip + usize::from(f[ip] & 0x0f) * 4;
    f.len() >= udp + 4 && u16::from_be_bytes([f[udp + 2], f[udp + 3]]) == ROCEV2_UDP_PORT
}
