//! Where the handshake's frames come and go: a [`Wire`]. The leader's INC socket is one
//! (the only one in production); the tests drive the handshake over scripted wires that
//! lose, reorder, repeat and forge frames, without a fabric.

use std::{
    io,
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    os::fd::AsRawFd as _,
    time::Instant,
};

use innet_common::proto::ROCEV2_UDP_PORT;

use crate::inbox;

/// A datagram transport to the INC port of other hosts.
pub trait Wire {
    /// Sends one UDP payload to `to`'s INC port.
    ///
    /// # Errors
    /// The transport's.
    fn send(&self, to: Ipv4Addr, payload: &[u8]) -> io::Result<()>;

    /// Hands every datagram that arrives to `each` (with its sender) until `each` says it
    /// found what it waits for (`true`: returns `Ok(true)`) or `deadline` passes
    /// (`Ok(false)`). A datagram `each` did not want is its to dispose of.
    ///
    /// # Errors
    /// The transport's (not a timeout).
    fn receive_until(
        &self,
        deadline: Instant,
        each: &mut dyn FnMut(&[u8], SocketAddr) -> bool,
    ) -> io::Result<bool>;
}

impl Wire for UdpSocket {
    fn send(&self, to: Ipv4Addr, payload: &[u8]) -> io::Result<()> {
        self.send_to(payload, (to, ROCEV2_UDP_PORT)).map(|_| ())
    }

    fn receive_until(
        &self,
        deadline: Instant,
        each: &mut dyn FnMut(&[u8], SocketAddr) -> bool,
    ) -> io::Result<bool> {
        let before = self.read_timeout()?;
        let found = receive_on(self, deadline, each);
        // The socket goes back to its owner as it was (the endpoint polls it).
        self.set_read_timeout(before)?;
        found
    }
}

fn receive_on(
    sock: &UdpSocket,
    deadline: Instant,
    each: &mut dyn FnMut(&[u8], SocketAddr) -> bool,
) -> io::Result<bool> {
    let mut buf = vec![0u8; inbox::GRO_BUF];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        sock.set_read_timeout(Some(left))?;
        match inbox::recv_segmented(sock.as_raw_fd(), &mut buf, 0) {
            Ok((n, from, seg)) => {
                // Every datagram of a message UDP GRO coalesced, the found one's followers
                // included.
                let mut found = false;
                for datagram in inbox::segments(&buf[..n], seg) {
                    found |= each(datagram, from);
                }
                if found {
                    return Ok(true);
                }
            }
            // A signal interrupts a receive with a timeout even under SA_RESTART.
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(false);
            }
            Err(e) => return Err(e),
        }
    }
}

/// A shared transport (the endpoint's socket, shared with its progress thread).
impl<W: Wire + ?Sized> Wire for std::sync::Arc<W> {
    fn send(&self, to: Ipv4Addr, payload: &[u8]) -> io::Result<()> {
        (**self).send(to, payload)
    }

    fn receive_until(
        &self,
        deadline: Instant,
        each: &mut dyn FnMut(&[u8], SocketAddr) -> bool,
    ) -> io::Result<bool> {
        (**self).receive_until(deadline, each)
    }
}
