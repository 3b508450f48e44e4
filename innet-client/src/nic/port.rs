//! A host's handle on its NIC for one group: installed through the NIC daemon, contributions
//! posted into the NIC's post port (a frame written there runs the NIC's XDP program as the
//! host's own part, and what it transmits leaves by the NIC), results read from the
//! completion array mapped into this process — no system call per result.

use std::{
    io,
    net::Ipv4Addr,
    os::{
        fd::{AsRawFd as _, OwnedFd},
        unix::net::UnixStream,
    },
    ptr::NonNull,
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use innet_common::{
    capabilities::Capabilities,
    fail::FAIL_NO_NIC,
    group::{Completion, completion_stamp, slot_of, valid_window},
};

use innet_net::{
    netdev::PacketSocket,
    nic::ipc::{self, INSTALL_FDS, Reply, Request},
};

/// Why a NIC group could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum NicError {
    #[error(
        "no innet NIC daemon in this network namespace ({0}): start `innet daemon --role nic -i IFNAME` on this host"
    )]
    NoDaemon(io::Error),
    #[error("the NIC daemon refused the group: {error}")]
    Refused { fail_cause: u8, error: String },
    #[error("talking to the NIC daemon: {0}")]
    Io(#[from] io::Error),
    #[error("the NIC daemon answered something unexpected: {0}")]
    Protocol(String),
}

impl NicError {
    /// The `fail_cause` a member reports for this error.
    #[must_use]
    pub fn fail_cause(&self) -> u8 {
        match self {
            Self::Refused { fail_cause, .. } => *fail_cause,
            _ => FAIL_NO_NIC,
        }
    }
}

/// A read-only mapping of the completion array (page-aligned; entries are 8-byte multiples,
/// as the kernel lays them out).
struct Mapping {
    ptr: NonNull<Completion>,
    len: usize,
}

const _: () = assert!(size_of::<Completion>().is_multiple_of(8));

// SAFETY: the mapping is only read, through volatile/atomic loads.
unsafe impl Send for Mapping {}

impl Mapping {
    fn new(fd: &OwnedFd, len: usize) -> io::Result<Self> {
        // SAFETY: mapping a BPF_F_MMAPABLE array read-only; the kernel checks fd and length.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            ptr: NonNull::new(p.cast::<Completion>())
                .ok_or_else(|| io::Error::other("mmap returned null"))?,
            len,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// This host's member of a NIC tree. Dropping it frees the group on the NIC.
pub struct NicPort {
    conn: UnixStream,
    /// Writes whole frames into the post port.
    post: PacketSocket,
    /// The NIC's post port.
    ifindex: u32,
    index: u32,
    wire_id: u32,
    map: Mapping,
    /// What the NIC offers the group (its daemon's `--ops`, types and packet size).
    pub caps: Capabilities,
}

impl NicPort {
    /// Asks this host's NIC daemon to install member `me` of the tree over `members` (NIC
    /// addresses in tree order) with branch degree `degree`.
    ///
    /// # Errors
    /// No daemon, a refusal (with its `fail_cause`), or a broken answer.
    pub fn install(
        wire_id: u32,
        members: &[Ipv4Addr],
        degree: usize,
        me: usize,
        timeout: Duration,
    ) -> Result<Self, NicError> {
        let conn = UnixStream::connect_addr(&ipc::address()?).map_err(NicError::NoDaemon)?;
        conn.set_read_timeout(Some(timeout))?;
        let req = Request::Install {
            wire_id,
            members: members.to_vec(),
            degree,
            me,
        };
        ipc::send(conn.as_raw_fd(), &req, &[])?;
        let (reply, mut fds) = read_reply(&conn)?;
        let Reply::Installed {
            index,
            ifindex,
            completion_entries,
            ops,
            dtypes,
            max_data_size,
            window,
        } = reply
        else {
            return Err(match reply {
                Reply::Refused { fail_cause, error } => NicError::Refused { fail_cause, error },
                other => NicError::Protocol(format!("{other:?}")),
            });
        };
        if fds.len() != INSTALL_FDS {
            return Err(NicError::Protocol(format!(
                "{} descriptors with the install reply, expected {INSTALL_FDS}",
                fds.len()
            )));
        }
        let completions = fds.pop().expect("one fd");
        let post = PacketSocket::new()?;
        let map = Mapping::new(
            &completions,
            completion_entries as usize * size_of::<Completion>(),
        )?;
        if !valid_window(u32::from(window)) {
            return Err(NicError::Protocol(format!("a window of {window} slots")));
        }
        if (index + 1) * u32::from(window) > completion_entries {
            return Err(NicError::Protocol(format!(
                "group index {index} outside {completion_entries} completions"
            )));
        }
        Ok(Self {
            conn,
            post,
            ifindex,
            index,
            wire_id,
            map,
            caps: Capabilities {
                ops,
                dtypes,
                max_data_size,
                window,
            },
        })
    }

    /// Posts `frame` (a whole Ethernet frame: this host's contribution) into the NIC: its
    /// program runs on it as the host's own part.
    ///
    /// # Errors
    /// The kernel's (a full queue: the round is sent again on its timer).
    pub fn post(&self, frame: &[u8]) -> io::Result<()> {
        self.post.send(self.ifindex, frame)
    }

    /// Round `req_id`'s completion entry in the mapping.
    fn entry(&self, req_id: u8) -> *mut Completion {
        let shift = self.caps.window.trailing_zeros() as u8;
        let slot = slot_of(self.index, shift, req_id) as usize;
        // SAFETY: slot < completion_entries (checked at install): inside the mapping.
        unsafe { self.map.ptr.as_ptr().add(slot) }
    }

    /// The result of round `req_id` copied into `out`, once the NIC has written it: its
    /// length.
    #[must_use]
    pub fn landed(&self, req_id: u8, out: &mut [u8]) -> Option<usize> {
        if self.stamp(req_id) != completion_stamp(self.wire_id, req_id) {
            return None;
        }
        let entry = self.entry(req_id);
        // SAFETY: an aligned entry of the mapping; the NIC wrote len and data before the
        // stamp, and rewrites them only with the same values under the same stamp.
        unsafe {
            let len = AtomicU32::from_ptr(&raw mut (*entry).len).load(Ordering::Acquire) as usize;
            let len = len
                .min(out.len())
                .min(innet_common::proto::MAX_PAYLOAD_BYTES);
            let data = (&raw const (*entry).data).cast::<u8>();
            std::ptr::copy_nonoverlapping(data, out.as_mut_ptr(), len);
            Some(len)
        }
    }

    /// The stamp of round `req_id`'s completion entry as it is now.
    #[must_use]
    pub fn stamp(&self, req_id: u8) -> u32 {
        // SAFETY: an aligned entry of the mapping.
        unsafe { AtomicU32::from_ptr(&raw mut (*self.entry(req_id)).stamp).load(Ordering::Acquire) }
    }

    /// The wire group id.
    #[must_use]
    pub fn wire_id(&self) -> u32 {
        self.wire_id
    }
}

impl Drop for NicPort {
    fn drop(&mut self) {
        // Closing the connection alone frees the group; asking first keeps the daemon's
        // counters telling removals from abandoned groups.
        let _ = ipc::send(
            self.conn.as_raw_fd(),
            &Request::Remove {
                wire_id: self.wire_id,
            },
            &[],
        );
        let _ = read_reply(&self.conn);
    }
}

fn read_reply(conn: &UnixStream) -> Result<(Reply, Vec<OwnedFd>), NicError> {
    let mut pending = vec![];
    let (line, fds) = ipc::recv(conn.as_raw_fd(), &mut pending)?
        .ok_or_else(|| NicError::Protocol("the daemon closed the connection".into()))?;
    let reply = serde_json::from_slice(&line).map_err(|e| NicError::Protocol(e.to_string()))?;
    Ok((reply, fds))
}
