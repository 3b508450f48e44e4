//! Where a leader's frames leave and the handshake's come in: a [`Wire`]. The leader's INC
//! socket is one ([`IncWire`], with UDP GSO for windows of data packets; a bare
//! `UdpSocket` for the handshake's own sockets); the tests drive the handshake, the
//! endpoint's answers and the network collective's window over scripted wires that lose,
//! reorder, repeat and forge frames, without a fabric.

use std::{
    io,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket},
    os::fd::AsRawFd as _,
    sync::Arc,
    time::Instant,
};

use innet_common::proto::ROCEV2_UDP_PORT;

use crate::{
    frames::DataDatagram,
    inbox,
    sendmany::{self, Datagram as _, Gso},
};

/// A datagram transport to the INC port of other hosts.
pub trait Wire {
    /// Sends one UDP payload to `to`'s INC port.
    ///
    /// # Errors
    /// The transport's.
    fn send(&self, to: Ipv4Addr, payload: &[u8]) -> io::Result<()>;

    /// The IPv4 id each datagram of a window of these lengths leaves with (an INC packet's
    /// ICRC covers it, so the caller builds each for its id): 0 unless the wire coalesces
    /// them ([`IncWire`]).
    fn window_ids(&self, lens: &[usize]) -> Vec<u16> {
        vec![0; lens.len()]
    }

    /// Sends a window of data packets (built for [`window_ids`](Self::window_ids)) to
    /// `to`'s INC port, in order; one by one unless the wire coalesces them. A packet the
    /// wire did not take is sent again on its timer, like a lost one.
    ///
    /// # Errors
    /// The transport's.
    fn send_window(&self, to: Ipv4Addr, packets: &mut [DataDatagram<'_>]) -> io::Result<()> {
        let mut pieces = vec![];
        for p in packets.iter() {
            pieces.clear();
            p.pieces(&mut pieces);
            self.send(to, &pieces.concat())?;
        }
        Ok(())
    }

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

/// A leader's INC socket as its endpoint sends through it: windows of data packets go as
/// UDP GSO super-datagrams while the kernel takes them.
pub struct IncWire {
    pub sock: Arc<UdpSocket>,
    /// Whether windows go as GSO super-datagrams (the kernel may refuse).
    pub gso: Gso,
}

impl Wire for IncWire {
    fn send(&self, to: Ipv4Addr, payload: &[u8]) -> io::Result<()> {
        Wire::send(&*self.sock, to, payload)
    }

    fn window_ids(&self, lens: &[usize]) -> Vec<u16> {
        sendmany::segment_ids(&self.gso, lens)
    }

    fn send_window(&self, to: Ipv4Addr, packets: &mut [DataDatagram<'_>]) -> io::Result<()> {
        let to = SocketAddrV4::new(to, ROCEV2_UDP_PORT);
        let renumber = |p: &mut DataDatagram<'_>, k| p.set_ip_id(k);
        sendmany::send_segmented(&self.sock, to, packets, &self.gso, renumber).map(|_| ())
    }

    fn receive_until(
        &self,
        deadline: Instant,
        each: &mut dyn FnMut(&[u8], SocketAddr) -> bool,
    ) -> io::Result<bool> {
        Wire::receive_until(&*self.sock, deadline, each)
    }
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
impl<W: Wire + ?Sized> Wire for Arc<W> {
    fn send(&self, to: Ipv4Addr, payload: &[u8]) -> io::Result<()> {
        (**self).send(to, payload)
    }

    fn window_ids(&self, lens: &[usize]) -> Vec<u16> {
        (**self).window_ids(lens)
    }

    fn send_window(&self, to: Ipv4Addr, packets: &mut [DataDatagram<'_>]) -> io::Result<()> {
        (**self).send_window(to, packets)
    }

    fn receive_until(
        &self,
        deadline: Instant,
        each: &mut dyn FnMut(&[u8], SocketAddr) -> bool,
    ) -> io::Result<bool> {
        (**self).receive_until(deadline, each)
    }
}
