//! The network interfaces of the current namespace as hosts and daemons both ask the
//! kernel for them: names and indices, addresses, MTU, neighbours, privilege and bpffs
//! checks, and a raw packet socket.

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
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

use NetdevError as Error;

type Result<T> = std::result::Result<T, NetdevError>;

/// The ifindex of `ifname` in the current network namespace.
///
/// # Errors
/// [`Error::UnknownInterface`] when there is no such interface.
pub fn ifindex(ifname: &str) -> Result<u32> {
    let unknown = || Error::UnknownInterface {
        ifname: ifname.to_owned(),
    };
    let c = CString::new(ifname).map_err(|_| unknown())?;
    // SAFETY: c is a valid NUL-terminated string.
    match unsafe { libc::if_nametoindex(c.as_ptr()) } {
        0 => Err(unknown()),
        i => Ok(i),
    }
}

/// The name of interface `ifindex`, if it exists in this namespace.
#[must_use]
pub fn ifname(ifindex: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buf holds IF_NAMESIZE bytes as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: on success buf holds a NUL-terminated name.
    Some(
        unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned(),
    )
}

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

/// The MAC address of `ifname` in the current network namespace. (sysfs would show the
/// namespace it was mounted in, which `nsenter --net` does not change.)
///
/// # Errors
/// [`Error::UnknownInterface`] when there is no such interface.
pub fn mac(ifname: &str) -> Result<[u8; 6]> {
    let req = ifreq(ifname, libc::SIOCGIFHWADDR)?;
    // SAFETY: on success the union holds the hardware address.
    let data = unsafe { req.ifr_ifru.ifru_hwaddr.sa_data };
    let mut mac = [0u8; 6];
    for (m, d) in mac.iter_mut().zip(data) {
        // c_char is i8 on x86 and u8 on aarch64.
        *m = u8::from_ne_bytes(d.to_ne_bytes());
    }
    Ok(mac)
}

/// The MTU of `ifname` in the current network namespace.
///
/// # Errors
/// [`Error::UnknownInterface`] when there is no such interface.
pub fn mtu(ifname: &str) -> Result<usize> {
    let req = ifreq(ifname, libc::SIOCGIFMTU)?;
    // SAFETY: on success the union holds the MTU.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu };
    Ok(usize::try_from(mtu).unwrap_or(0))
}

/// `ioctl(request)` on an `ifreq` naming `ifname`, through a throwaway socket of the
/// current network namespace.
fn ifreq(ifname: &str, request: libc::Ioctl) -> Result<libc::ifreq> {
    let unknown = || Error::UnknownInterface {
        ifname: ifname.to_owned(),
    };
    if ifname.len() >= libc::IF_NAMESIZE {
        return Err(unknown());
    }
    // SAFETY: plain socket call; the fd is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(Error::Io {
            what: "socket(AF_INET)",
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: zeroed ifreq is valid; the name fits (checked above) and stays NUL-terminated.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(ifname.bytes()) {
        *d = s as libc::c_char;
    }
    // SAFETY: the request fills the union of a valid ifreq.
    let rc = unsafe { libc::ioctl(fd, request, &raw mut req) };
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    if rc != 0 {
        return Err(unknown());
    }
    Ok(req)
}

/// The interface that holds `ip` in the current network namespace.
#[must_use]
pub fn ifname_of(ip: std::net::Ipv4Addr) -> Option<String> {
    let mut found = None;
    each_ipv4(|name, a| {
        if a == ip && found.is_none() {
            found = Some(name.to_owned());
        }
    });
    found
}

/// The IPv4 addresses of `ifname` in the current network namespace.
#[must_use]
pub fn ipv4_addresses(ifname: &str) -> Vec<std::net::Ipv4Addr> {
    let mut out = vec![];
    each_ipv4(|name, a| {
        if name == ifname {
            out.push(a);
        }
    });
    out
}

/// Calls `f(interface, address)` for every IPv4 address of the current network namespace.
fn each_ipv4(mut f: impl FnMut(&str, std::net::Ipv4Addr)) {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills head with a list we free below.
    if unsafe { libc::getifaddrs(&raw mut head) } != 0 {
        return;
    }
    let mut p = head;
    while !p.is_null() {
        // SAFETY: p is a node of the list getifaddrs returned.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: ifa_name is NUL-terminated; ifa_addr of family AF_INET is a sockaddr_in.
        unsafe {
            if i32::from((*ifa.ifa_addr).sa_family) != libc::AF_INET {
                continue;
            }
            let name = std::ffi::CStr::from_ptr(ifa.ifa_name).to_string_lossy();
            let sin = ifa
                .ifa_addr
                .cast::<u8>()
                .cast::<libc::sockaddr_in>()
                .read_unaligned();
            f(
                &name,
                std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
            );
        }
    }
    // SAFETY: the list from getifaddrs, freed once.
    unsafe { libc::freeifaddrs(head) };
}

/// The MAC of neighbour `ip` on `ifname`, resolved by the kernel (ARP) when it is not
/// known yet: one UDP datagram to the discard port starts the resolution.
#[must_use]
pub fn neighbour_mac(
    ip: std::net::Ipv4Addr,
    ifname: &str,
    timeout: std::time::Duration,
) -> Option<[u8; 6]> {
    let deadline = std::time::Instant::now() + timeout;
    let mut asked = false;
    loop {
        if let Some(mac) = arp_entry(ip, ifname) {
            return Some(mac);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        if !asked {
            asked = true;
            if let Ok(s) = std::net::UdpSocket::bind((std::net::Ipv4Addr::UNSPECIFIED, 0)) {
                let _ = s.send_to(&[], (ip, 9));
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A complete entry of this namespace's ARP table (`/proc/thread-self/net` follows the
/// calling thread's namespace).
fn arp_entry(ip: std::net::Ipv4Addr, ifname: &str) -> Option<[u8; 6]> {
    let table = std::fs::read_to_string("/proc/thread-self/net/arp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // IP address, HW type, Flags (0x2: complete), HW address, Mask, Device.
        if f.len() < 6 || f[0] != ip.to_string() || f[5] != ifname || f[2] == "0x0" {
            return None;
        }
        let mut mac = [0u8; 6];
        let mut parts = f[3].split(':');
        for m in &mut mac {
            *m = u8::from_str_radix(parts.next()?, 16).ok()?;
        }
        Some(mac)
    })
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
