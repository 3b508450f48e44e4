//! Many datagrams to one address in one system call (`sendmmsg(2)`): a leader opening its
//! window sends a round per packet, and a system call each cost as much as the UDP send.

use std::{
    io,
    net::{SocketAddrV4, UdpSocket},
    os::fd::AsRawFd as _,
};

/// Headers one call takes at most; longer lists go in several calls.
const PER_CALL: usize = 64;

/// Sends every datagram of `packets` to `to`; returns how many the kernel took (all of
/// them unless an error stopped it).
///
/// # Errors
/// The first datagram could not be sent.
pub fn send_all(sock: &UdpSocket, to: SocketAddrV4, packets: &[Vec<u8>]) -> io::Result<usize> {
    let mut addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: to.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*to.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    let mut sent = 0;
    for chunk in packets.chunks(PER_CALL) {
        let mut iovs: Vec<libc::iovec> = chunk
            .iter()
            .map(|p| libc::iovec {
                iov_base: p.as_ptr().cast_mut().cast(),
                iov_len: p.len(),
            })
            .collect();
        let mut msgs: Vec<libc::mmsghdr> = iovs
            .iter_mut()
            .map(|iov| {
                // SAFETY: a zeroed msghdr is valid (null pointers, zero lengths).
                let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                m.msg_hdr.msg_name = (&raw mut addr).cast();
                m.msg_hdr.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
                m.msg_hdr.msg_iov = iov;
                m.msg_hdr.msg_iovlen = 1;
                m
            })
            .collect();
        let mut done = 0;
        while done < msgs.len() {
            // SAFETY: headers naming live buffers and one address, all alive for the call;
            // the kernel only reads the buffers.
            let n = unsafe {
                libc::sendmmsg(
                    sock.as_raw_fd(),
                    msgs[done..].as_mut_ptr(),
                    (msgs.len() - done) as libc::c_uint,
                    0,
                )
            };
            match usize::try_from(n) {
                Ok(n) if n > 0 => done += n,
                _ if sent + done > 0 => return Ok(sent + done),
                _ => return Err(io::Error::last_os_error()),
            }
        }
        sent += done;
    }
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn every_datagram_arrives_whole_and_in_order_across_calls() {
        let rx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let tx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let std::net::SocketAddr::V4(to) = rx.local_addr().unwrap() else {
            unreachable!()
        };
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
}
