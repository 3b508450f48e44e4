//! Between a host's client library and its NIC daemon: one JSON message per line over a
//! Unix stream socket with an abstract name, so each network namespace (host) has its own
//! daemon. An installed group lives as long as the connection that installed it: a client
//! that exits or dies frees its group. With the install reply come two descriptors
//! (`SCM_RIGHTS`): the post program and the completion map, so the client needs no access
//! to the daemon's pins.

use std::{
    io,
    net::Ipv4Addr,
    os::fd::{FromRawFd as _, OwnedFd, RawFd},
};

/// The daemon's abstract socket name (per network namespace).
pub const SOCKET_NAME: &str = "innet-nic";
/// Descriptors that come with [`Reply::Installed`]: `NIC_COMPLETIONS`.
pub const INSTALL_FDS: usize = 1;
/// Longest message either side accepts.
pub const MAX_MESSAGE: usize = 64 * 1024;

/// What a client asks.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Install this host's member of a tree: the members' NIC addresses in tree order, the
    /// branch degree, and which member this host is.
    Install {
        wire_id: u32,
        members: Vec<Ipv4Addr>,
        degree: usize,
        me: usize,
    },
    /// Free a group this connection installed.
    Remove { wire_id: u32 },
}

impl Request {
    /// The group the request is about.
    #[must_use]
    pub fn wire_id(&self) -> u32 {
        match self {
            Self::Install { wire_id, .. } | Self::Remove { wire_id } => *wire_id,
        }
    }
}

/// What the daemon answers.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    Installed {
        /// The group's index: its completions are entries `index·window ..`.
        index: u32,
        /// The port a host posts its contributions into (the NIC's post port: each frame
        /// written into it runs the NIC's program as the host's own part).
        ifindex: u32,
        /// Entries of the completion map (for mapping it).
        completion_entries: u32,
        /// What this NIC reduces (bit `1 << op`, `1 << dtype`) and its largest payload.
        ops: u16,
        dtypes: u16,
        max_data_size: u16,
        /// Slots per group: the completions of each group, and twice the rounds in flight.
        window: u16,
    },
    Removed,
    /// Not installed: `fail_cause` for the handshake, `error` for people.
    Refused {
        fail_cause: u8,
        error: String,
    },
}

/// Sends one message (a line), with `fds` attached to its first byte.
///
/// # Errors
/// The socket's.
pub fn send(sock: RawFd, msg: &impl serde::Serialize, fds: &[RawFd]) -> io::Result<()> {
    let mut line = serde_json::to_vec(msg).map_err(io::Error::other)?;
    line.push(b'\n');
    let mut sent = 0;
    while sent < line.len() {
        let n = sendmsg(sock, &line[sent..], if sent == 0 { fds } else { &[] })?;
        sent += n;
    }
    Ok(())
}

fn sendmsg(sock: RawFd, data: &[u8], fds: &[RawFd]) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr().cast_mut().cast(),
        iov_len: data.len(),
    };
    // u64 elements keep the control buffer aligned for cmsghdr.
    let mut control = [0u64; 8];
    // SAFETY: zeroed msghdr is valid; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let bytes = std::mem::size_of_val(fds);
        // SAFETY: CMSG_SPACE is a pure size computation.
        let space = unsafe { libc::CMSG_SPACE(bytes as u32) } as usize;
        assert!(space <= size_of_val(&control), "too many descriptors");
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: the control buffer holds one header of `space` bytes (checked above).
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&raw const msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes as u32) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast(), fds.len());
        }
    }
    // SAFETY: msg describes valid buffers for the duration of the call.
    let n = unsafe { libc::sendmsg(sock, &raw const msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n.cast_unsigned())
}

/// Reads until a whole line is in `pending`; returns that line (without the newline) and
/// the descriptors that came with it. `Ok(None)` at end of stream.
///
/// # Errors
/// The socket's, or a message longer than [`MAX_MESSAGE`].
pub fn recv(sock: RawFd, pending: &mut Vec<u8>) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let mut fds = vec![];
    loop {
        if let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line = pending.drain(..=end).take(end).collect();
            return Ok(Some((line, fds)));
        }
        if pending.len() > MAX_MESSAGE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "message longer than 64 KiB",
            ));
        }
        let mut buf = [0u8; 4096];
        let (n, got) = match recvmsg(sock, &mut buf) {
            // A signal interrupts a receive with a timeout even under SA_RESTART.
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            got => got?,
        };
        fds.extend(got);
        if n == 0 {
            return Ok(None);
        }
        pending.extend_from_slice(&buf[..n]);
    }
}

fn recvmsg(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = [0u64; 8];
    // SAFETY: zeroed msghdr is valid; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = size_of_val(&control);
    // SAFETY: msg describes valid buffers for the duration of the call.
    let n = unsafe { libc::recvmsg(sock, &raw mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = vec![];
    // SAFETY: walking the control messages the kernel wrote into our buffer.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&raw const msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(c);
                for i in 0..bytes / size_of::<RawFd>() {
                    let raw = data.add(i * size_of::<RawFd>()).cast::<[u8; 4]>().read();
                    fds.push(OwnedFd::from_raw_fd(RawFd::from_ne_bytes(raw)));
                }
            }
            c = libc::CMSG_NXTHDR(&raw const msg, c);
        }
    }
    Ok((n.cast_unsigned(), fds))
}

/// The daemon's socket address in this network namespace.
///
/// # Errors
/// Never in practice (the name is short).
pub fn address() -> io::Result<std::os::unix::net::SocketAddr> {
    use std::os::linux::net::SocketAddrExt as _;
    std::os::unix::net::SocketAddr::from_abstract_name(SOCKET_NAME)
}

#[cfg(test)]
mod tests {
    use std::os::{fd::AsRawFd as _, unix::net::UnixStream};

    use super::*;

    #[test]
    fn messages_and_descriptors_cross_a_socket_pair() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        let req = Request::Install {
            wire_id: 0x00ab_cdef,
            members: vec![Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)],
            degree: 4,
            me: 1,
        };
        send(a.as_raw_fd(), &req, &[file.as_raw_fd(), file.as_raw_fd()]).unwrap();
        send(a.as_raw_fd(), &Request::Remove { wire_id: 7 }, &[]).unwrap();
        let mut pending = vec![];
        let (line, fds) = recv(b.as_raw_fd(), &mut pending).unwrap().unwrap();
        assert_eq!(serde_json::from_slice::<Request>(&line).unwrap(), req);
        assert_eq!(fds.len(), 2);
        let (line, fds) = recv(b.as_raw_fd(), &mut pending).unwrap().unwrap();
        assert_eq!(
            serde_json::from_slice::<Request>(&line).unwrap(),
            Request::Remove { wire_id: 7 }
        );
        assert!(fds.is_empty());
        drop(a);
        assert!(recv(b.as_raw_fd(), &mut pending).unwrap().is_none());
    }
}
