//! A leader's INC socket on UDP 4791, shared with every other communicator whose leader
//! uses the same host address, in this process or another.
//!
//! The sockets join one `SO_REUSEPORT` group, and the `innet_inc_socket` sk_reuseport
//! program hands each datagram to its communicator's socket (keys: [`innet_common::demux`]).
//! Its two maps are pinned per (network namespace, address) under [`PIN_ROOT`], so every
//! process that binds there shares them; each binder claims a socket index and registers
//! its keys, under a lock on the address's pin directory, and the last one to leave removes
//! the directory.
//! Without a BPF filesystem (or the right to load programs) the socket is bound alone, as
//! one communicator per address needs.
//!
//! Every INC socket sends with path-MTU discovery on (`IP_PMTUDISC_DO`): the kernel then
//! sets DF and, the socket being unconnected, IPv4 id 0 (`ip_select_ident_segs`), which is
//! the header the library computes each frame's ICRC over (the ICRC covers the id). Under
//! the default `IP_PMTUDISC_WANT` the kernel draws a per-destination id, and every frame
//! would leave with an ICRC a RoCE NIC or switch that checks it drops.

use std::{
    fs::File,
    io,
    net::{Ipv4Addr, SocketAddrV4, UdpSocket},
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, ReusePortSockArray},
    programs::SkReuseport,
};
use innet_common::{
    demux::{KEYS_MAP, MAX_SOCKETS, PROG_SELECT, SOCKETS_MAP},
    proto::ROCEV2_UDP_PORT,
};
use socket2::{Domain, Protocol, Socket, Type};
use tracing::debug;

use innet_objects::selector_object;

use innet_net::netdev::require_bpffs;

/// Where the selectors' maps are pinned, a directory per (network namespace, address).
pub const PIN_ROOT: &str = "/sys/fs/bpf/innet-inc-sockets";

/// `BPF_NOEXIST`: claim an index or a key only if nobody holds it.
const NO_EXIST: u64 = 1;

/// A bound INC socket and, when shared, its registration with the selector.
pub struct IncSocket {
    pub sock: UdpSocket,
    pub share: Option<Share>,
}

/// This socket's index and keys in its address's selector; dropping it unregisters them.
pub struct Share {
    ebpf: Ebpf,
    dir: PathBuf,
    index: u32,
    keys: Vec<u32>,
}

/// Binds the INC socket of `ip` for the communicator whose datagrams carry `keys`.
///
/// # Errors
/// The address is not on this host; another program holds UDP 4791 there without
/// `SO_REUSEPORT`; [`MAX_SOCKETS`] communicators share it already; or one of them uses one
/// of `keys` (two jobs' partition keys can collide: 1 in 32768).
pub fn bind(ip: Ipv4Addr, keys: &[u32]) -> io::Result<IncSocket> {
    let addr = SocketAddrV4::new(ip, ROCEV2_UDP_PORT);
    let taken = |e: io::Error| {
        io::Error::new(
            e.kind(),
            format!(
                "binding the INC socket {addr}: {e} (is {ip} an address of this host, and does no other program hold UDP {ROCEV2_UDP_PORT} on it?)"
            ),
        )
    };
    let alone = || {
        let sock = UdpSocket::bind(addr).map_err(taken)?;
        fix_ip_id(&sock)?;
        Ok(IncSocket { sock, share: None })
    };
    let dir = pin_dir(ip)?;
    let Some(lock) = Lock::take(&dir) else {
        return alone();
    };
    let mut ebpf = match load_selector(&dir) {
        Ok(ebpf) => ebpf,
        Err(e) => {
            debug!(error = %e, "no INC-socket selector: this address serves one communicator at a time");
            return alone();
        }
    };
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))
        .and_then(|s| s.set_reuse_port(true).map(|()| s))
        .map_err(|e| step("creating a SO_REUSEPORT socket", e))?;
    socket.bind(&addr.into()).map_err(taken)?;
    let sock: UdpSocket = socket.into();
    fix_ip_id(&sock)?;
    // The group runs the program of whoever attached last: the same code on the same maps.
    selector(&mut ebpf)?
        .attach(&sock)
        .map_err(|e| step("attaching the selector to the socket", e))?;
    let index = claim_index(&mut ebpf, &sock, ip)?;
    let mut share = Share {
        ebpf,
        dir,
        index,
        keys: vec![],
    };
    let registered = register(&mut share, keys, ip);
    // Before `share` may drop: its unregistering takes the lock again.
    drop(lock);
    registered?;
    debug!(%ip, index, ?keys, "INC socket shares its address");
    Ok(IncSocket {
        sock,
        share: Some(share),
    })
}

/// Makes the kernel send `sock`'s datagrams with DF set and IPv4 id 0, the header the
/// frames' ICRC is computed over (see the module's notes). The socket must stay unconnected:
/// a connected one numbers its datagrams.
fn fix_ip_id(sock: &UdpSocket) -> io::Result<()> {
    let value: libc::c_int = libc::IP_PMTUDISC_DO;
    // SAFETY: setsockopt on an open socket with a c_int option value.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            (&raw const value).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(step(
            "setting IP_PMTUDISC_DO (DF, IPv4 id 0) on the INC socket",
            io::Error::last_os_error(),
        ))
    }
}

/// Loads the selector with its maps pinned in `dir` (reusing them when they are there).
fn load_selector(dir: &Path) -> io::Result<Ebpf> {
    let object = selector_object().map_err(io::Error::other)?;
    // No kernel BTF: the selector needs no CO-RE relocation, and parsing vmlinux's BTF
    // would cost every bind most of a second in a debug build.
    let mut ebpf = EbpfLoader::new()
        .btf(None)
        .default_map_pin_directory(dir)
        .load(object)
        .map_err(|e| step("loading the selector's maps", e))?;
    selector(&mut ebpf)?
        .load()
        .map_err(|e| step("loading the selector", e))?;
    Ok(ebpf)
}

fn selector(ebpf: &mut Ebpf) -> io::Result<&mut SkReuseport> {
    ebpf.program_mut(PROG_SELECT)
        .and_then(|p| p.try_into().ok())
        .ok_or_else(|| io::Error::other(format!("the selector object has no {PROG_SELECT}")))
}

/// Claims the first free index of the socket array for `sock` (a closed socket's index is
/// freed by the kernel).
fn claim_index(ebpf: &mut Ebpf, sock: &UdpSocket, ip: Ipv4Addr) -> io::Result<u32> {
    let mut sockets = sockets(ebpf)?;
    (0..MAX_SOCKETS)
        .find(|&i| sockets.set(i, sock, NO_EXIST).is_ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{MAX_SOCKETS} communicators already share the INC address {ip}: free some, or give their leaders other addresses"),
            )
        })
}

/// Registers `keys` for `share`'s index. A key held by an index whose socket is gone (its
/// process died without unregistering) is taken over; so is one held by this very index,
/// which was free when this socket claimed it.
fn register(share: &mut Share, keys: &[u32], ip: Ipv4Addr) -> io::Result<()> {
    for &key in keys {
        let map = key_map(&mut share.ebpf)?;
        if let Ok(holder) = map.get(&key, 0)
            && holder != share.index
            && !index_is_free(&mut share.ebpf, holder)?
        {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "another communicator on the INC address {ip} uses key {key:#x} (two jobs' partition keys collided): run this one elsewhere or draw another job id"
                ),
            ));
        }
        let mut map = key_map(&mut share.ebpf)?;
        map.insert(key, share.index, 0)
            .map_err(|e| step("registering a key", e))?;
        share.keys.push(key);
    }
    Ok(())
}

/// Whether no socket holds `index`: the kernel answers a claim of a held index with
/// EEXIST before it looks at the socket, so an unbound probe (which never fits) tells.
fn index_is_free(ebpf: &mut Ebpf, index: u32) -> io::Result<bool> {
    let probe = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    let mut sockets = sockets(ebpf)?;
    Ok(match sockets.set(index, &probe, NO_EXIST) {
        Ok(()) => {
            let _ = sockets.clear_index(&index);
            true
        }
        Err(e) => !is_exists(&e),
    })
}

fn is_exists(e: &aya::maps::MapError) -> bool {
    matches!(e, aya::maps::MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(libc::EEXIST))
}

/// An error of one step of the sharing, saying which.
fn step(what: &str, e: impl std::error::Error) -> io::Error {
    use std::fmt::Write as _;
    let mut text = format!("{what}: {e}");
    let mut source = e.source();
    while let Some(s) = source {
        let _ = write!(text, ": {s}");
        source = s.source();
    }
    io::Error::other(text)
}

fn sockets(ebpf: &mut Ebpf) -> io::Result<ReusePortSockArray<&mut MapData>> {
    ebpf.map_mut(SOCKETS_MAP)
        .ok_or_else(|| io::Error::other(format!("the selector object has no {SOCKETS_MAP}")))?
        .try_into()
        .map_err(io::Error::other)
}

fn key_map(ebpf: &mut Ebpf) -> io::Result<HashMap<&mut MapData, u32, u32>> {
    ebpf.map_mut(KEYS_MAP)
        .ok_or_else(|| io::Error::other(format!("the selector object has no {KEYS_MAP}")))?
        .try_into()
        .map_err(io::Error::other)
}

/// Removes the `keys` that socket `index` holds (another socket may have taken a key over).
fn unregister<'k>(
    map: &mut HashMap<&mut MapData, u32, u32>,
    keys: impl IntoIterator<Item = &'k u32>,
    index: u32,
) {
    for key in keys {
        if map.get(key, 0).ok() == Some(index) {
            let _ = map.remove(key);
        }
    }
}

impl Share {
    /// Moves this socket from keys `old` to keys `new` (0: none): its communicator's group
    /// was set up again under a new id.
    ///
    /// # Errors
    /// Another communicator on the address holds one of `new`.
    pub fn replace(&mut self, old: &[u32], new: &[u32], ip: Ipv4Addr) -> io::Result<()> {
        let _lock = Lock::take(&self.dir);
        let added: Vec<u32> = new
            .iter()
            .copied()
            .filter(|k| *k != 0 && !self.keys.contains(k))
            .collect();
        register(self, &added, ip)?;
        let mut map = key_map(&mut self.ebpf)?;
        unregister(
            &mut map,
            old.iter().filter(|k| !new.contains(k)),
            self.index,
        );
        self.keys.retain(|k| !old.contains(k) || new.contains(k));
        Ok(())
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let _lock = Lock::take(&self.dir);
        let Ok(mut map) = key_map(&mut self.ebpf) else {
            return;
        };
        unregister(&mut map, &self.keys, self.index);
        let last = map.keys().next().is_none();
        if let Ok(mut sockets) = sockets(&mut self.ebpf) {
            let _ = sockets.clear_index(&self.index);
        }
        if last {
            // Later binders load fresh maps; open fds (ours) keep these alive until dropped.
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The selector's pin directory of `ip` in this thread's network namespace.
///
/// # Errors
/// This thread's namespace cannot be read from /proc.
pub fn pin_dir(ip: Ipv4Addr) -> io::Result<PathBuf> {
    let netns = std::fs::metadata("/proc/thread-self/ns/net")?.ino();
    let [a, b, c, d] = ip.octets();
    // bpffs names may not hold dots.
    Ok(Path::new(PIN_ROOT).join(format!("{}{a}_{b}_{c}_{d}", netns_prefix(netns))))
}

/// How the pin directories of the network namespace with inode `netns` begin.
#[must_use]
pub fn netns_prefix(netns: u64) -> String {
    format!("{netns}-")
}

/// An exclusive lock on an address's pin directory (created if missing), held while a
/// socket registers or unregisters there, so addresses never wait for each other; `None`
/// when there is no BPF filesystem to pin in.
struct Lock {
    _dir: File,
}

impl Lock {
    fn take(dir: &Path) -> Option<Self> {
        require_bpffs(Path::new(PIN_ROOT).parent()?).ok()?;
        loop {
            std::fs::create_dir_all(dir).ok()?;
            let file = File::open(dir).ok()?;
            // SAFETY: flock on an fd we own.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
                return None;
            }
            // The last socket to leave removes the directory: if it did while this one
            // waited, the lock is on a removed directory, so start over.
            let held = file.metadata().ok()?.ino();
            if std::fs::metadata(dir).is_ok_and(|m| m.ino() == held) {
                return Some(Self { _dir: file });
            }
        }
    }
}
