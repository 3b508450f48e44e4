//! The network of the current namespace as hosts and daemons both ask the kernel for it,
//! all through netlink ([`crate::netlink`]): links ([`Link`], [`link`], [`links`]: names,
//! indices, MAC, MTU, bridge, veth peer, attached XDP, counters), addresses
//! ([`ipv4_addresses`], [`ifname_of`]), neighbours ([`neighbour_mac`]) and a bridge's
//! forwarding table ([`bridge_fdb`]), a port's XDP features ([`xdp_features`]); beside
//! them the privilege and bpffs checks and a raw packet socket.

mod address;
mod link;
mod neighbour;
mod xdp;

pub use address::{ifname_of, ipv4_addresses};
pub use link::{AttachMode, Link, ifindex, ifname, link, link_named, links, mac, mtu};
pub use neighbour::{bridge_fdb, neighbour_mac};
pub use xdp::{ACT_BASIC, ACT_NDO_XMIT, ACT_REDIRECT, xdp_features};

use std::{
    ffi::CString,
    path::{Path, PathBuf},
};

/// What the kernel refused about an interface or the BPF filesystem; each names the fix.
#[derive(Debug, thiserror::Error)]
pub enum NetdevError {
    #[error("`{action}` needs root (CAP_BPF and CAP_NET_ADMIN): run it with sudo")]
    NotPrivileged { action: &'static str },
    #[error(
        "no interface named `{ifname}`: check `ip link` (and that you are in the right network namespace)"
    )]
    UnknownInterface { ifname: String },
    #[error(
        "no BPF filesystem at {path}: mount one with `mount -t bpf bpf /sys/fs/bpf` (or run `cargo xtask setup`)"
    )]
    BpffsMissing { path: PathBuf },
    #[error("asking the kernel about `{ifname}` over netlink failed: {source}")]
    Netlink {
        ifname: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

use NetdevError as Error;

type Result<T> = std::result::Result<T, NetdevError>;

/// Fails unless running as root (loading XDP needs CAP_BPF and CAP_NET_ADMIN).
///
/// # Errors
/// [`Error::NotPrivileged`].
pub fn require_root(action: &'static str) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Error::NotPrivileged { action });
    }
    Ok(())
}

const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Fails unless `dir` is on a BPF filesystem (pins can live nowhere else).
///
/// # Errors
/// [`Error::BpffsMissing`].
pub fn require_bpffs(dir: &Path) -> Result<()> {
    let missing = || Error::BpffsMissing {
        path: dir.to_owned(),
    };
    let c = CString::new(dir.as_os_str().as_encoded_bytes()).map_err(|_| missing())?;
    // SAFETY: zeroed statfs is a valid out-parameter.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is NUL-terminated and st is a valid statfs.
    if unsafe { libc::statfs(c.as_ptr(), &raw mut st) } != 0 || st.f_type as i64 != BPF_FS_MAGIC {
        return Err(missing());
    }
    Ok(())
}

/// A raw `AF_PACKET` socket that sends whole Ethernet frames out of a port of the network
/// namespace it was made in (and receives nothing).
pub struct PacketSocket(std::os::fd::OwnedFd);

impl PacketSocket {
    /// # Errors
    /// The socket cannot be made (needs CAP_NET_RAW).
    pub fn new() -> std::io::Result<Self> {
        use std::os::fd::FromRawFd as _;
        // SAFETY: plain socket(2); protocol 0 receives nothing, it only sends.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh fd we own.
        Ok(Self(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }

    /// Sends `frame` (Ethernet header included) out of `ifindex`.
    ///
    /// # Errors
    /// The kernel refused it.
    pub fn send(&self, ifindex: u32, frame: &[u8]) -> std::io::Result<()> {
        use std::os::fd::AsRawFd as _;
        // SAFETY: all-zero is a valid sockaddr_ll.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_ifindex = ifindex as i32;
        // The frame carries its own Ethernet header: no address beyond the port is needed.
        // SAFETY: valid buffer and address of the sizes passed.
        let n = unsafe {
            libc::sendto(
                self.0.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&raw const addr).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if n < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
}
