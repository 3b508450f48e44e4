//! Interface names and indices, privilege and bpffs checks.

use std::{ffi::CString, path::Path};

use crate::error::{Error, Result};

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
            path: "socket(AF_INET)".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: zeroed ifreq is valid; the name fits (checked above) and stays NUL-terminated.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(ifname.bytes()) {
        *d = s as libc::c_char;
    }
    // SAFETY: SIOCGIFHWADDR fills ifr_hwaddr of a valid ifreq.
    let rc = unsafe { libc::ioctl(fd, libc::SIOCGIFHWADDR, &raw mut req) };
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    if rc != 0 {
        return Err(unknown());
    }
    // SAFETY: on success the union holds the hardware address.
    let data = unsafe { req.ifr_ifru.ifru_hwaddr.sa_data };
    let mut mac = [0u8; 6];
    for (m, d) in mac.iter_mut().zip(data) {
        *m = d.cast_unsigned();
    }
    Ok(mac)
}
