//! What a port's driver can do with XDP right now, as the kernel reports it through the
//! `netdev` generic netlink family (`xdp-features`, Linux 6.3+). innet needs
//! `NDO_XMIT` on every port it redirects frames out of: a native-mode redirect into a port
//! without it is dropped by the kernel after the program returned, where no counter of
//! innet sees it. A veth has it only while its peer runs an XDP program or has GRO on (the
//! peer's NAPI receives the frames), which no default veth has.

use std::{io, os::fd::AsRawFd as _, os::fd::FromRawFd as _, os::fd::OwnedFd};

/// `NETDEV_XDP_ACT_*` bits of `xdp-features`.
pub const ACT_BASIC: u64 = 1;
pub const ACT_REDIRECT: u64 = 2;
pub const ACT_NDO_XMIT: u64 = 4;

const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const NETDEV_CMD_DEV_GET: u8 = 1;
const NETDEV_A_DEV_IFINDEX: u16 = 1;
const NETDEV_A_DEV_XDP_FEATURES: u16 = 3;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLMSG_HDRLEN: usize = 16;
const RTM_GETLINK: u16 = 18;
const IFINFOMSG_LEN: usize = 16;
const IFLA_LINK: u16 = 5;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_LINK_NETNSID: u16 = 37;
const IFLA_XDP: u16 = 43;
const IFLA_XDP_ATTACHED: u16 = 2;
const GENL_HDRLEN: usize = 4;

/// The `xdp-features` of `ifindex` in the current network namespace.
///
/// # Errors
/// No `netdev` family (a kernel before 6.3), no such interface, or a socket error.
pub fn of(ifindex: u32) -> io::Result<u64> {
    let sock = socket(libc::NETLINK_GENERIC)?;
    let family = request(
        &sock,
        GENL_ID_CTRL,
        CTRL_CMD_GETFAMILY,
        &attr(CTRL_ATTR_FAMILY_NAME, b"netdev\0"),
    )?;
    let family = find(&family, CTRL_ATTR_FAMILY_ID)
        .and_then(|v| v.get(..2))
        .map(|v| u16::from_ne_bytes([v[0], v[1]]))
        .ok_or_else(|| io::Error::other("no netdev netlink family (Linux 6.3 or later has it)"))?;
    let dev = request(
        &sock,
        family,
        NETDEV_CMD_DEV_GET,
        &attr(NETDEV_A_DEV_IFINDEX, &ifindex.to_ne_bytes()),
    )?;
    find(&dev, NETDEV_A_DEV_XDP_FEATURES)
        .and_then(|v| v.get(..8))
        .map(|v| u64::from_ne_bytes(v.try_into().expect("8 bytes")))
        .ok_or_else(|| io::Error::other("the kernel reported no xdp-features"))
}

/// Whether frames XDP redirects out of `ifindex` can leave by it, and if not, the fix.
/// `None` when the kernel cannot tell (then nothing is said).
#[must_use]
pub fn redirect_blocked(ifname: &str, ifindex: u32) -> Option<String> {
    let features = of(ifindex).ok()?;
    if features & ACT_NDO_XMIT != 0 {
        return None;
    }
    Some(if let Some(peer) = veth_peer(ifindex) {
        format!(
            "frames innet redirects out of {ifname} are dropped by the kernel: its veth peer ({peer}) has no NAPI to receive them. Run `ethtool -K <peer> gro on` in the peer's namespace (or attach an XDP program there), or attach innet with `--mode skb`"
        )
    } else {
        format!(
            "frames innet redirects out of {ifname} are dropped by the kernel: its driver cannot transmit redirected frames (no ndo_xdp_xmit). Attach innet with `--mode skb`"
        )
    })
}

/// How an XDP program is attached to a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    /// In the driver (`xdp` in `ip link`).
    Native,
    /// Generic, on socket buffers (`xdpgeneric`).
    Generic,
    /// Offloaded to the NIC (`xdpoffload`).
    Offload,
}

/// How the XDP program on `ifindex` is attached; `None` when none is (or the kernel does not
/// say). Asks rtnetlink (`IFLA_XDP_ATTACHED`), in the current namespace.
#[must_use]
pub fn attach_mode(ifindex: u32) -> Option<AttachMode> {
    let attrs = link_attributes(ifindex).ok()?;
    let xdp = find(&attrs, IFLA_XDP)?;
    // XDP_ATTACHED_*: 1 driver, 2 generic, 3 offload, 4 several (the driver's first).
    match find(xdp, IFLA_XDP_ATTACHED)?.first()? {
        1 | 4 => Some(AttachMode::Native),
        2 => Some(AttachMode::Generic),
        3 => Some(AttachMode::Offload),
        _ => None,
    }
}

/// The attributes of `RTM_GETLINK` for `ifindex` (also read by [`crate::bridge`]).
pub(crate) fn link_attributes(ifindex: u32) -> io::Result<Vec<u8>> {
    let sock = socket(libc::NETLINK_ROUTE)?;
    // ifinfomsg: family, pad, type, index, flags, change.
    let mut body = vec![0u8; IFINFOMSG_LEN];
    body[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    let answer = exchange(&sock, RTM_GETLINK, &body)?;
    Ok(answer
        .get(NLMSG_HDRLEN + IFINFOMSG_LEN..)
        .unwrap_or_default()
        .to_vec())
}

/// Whether `ifindex` is a veth.
#[must_use]
pub fn is_veth(ifindex: u32) -> bool {
    link_attributes(ifindex).is_ok_and(|a| is_veth_link(&a))
}

/// Whether `RTM_GETLINK` attributes describe a veth (`IFLA_LINKINFO`'s kind).
fn is_veth_link(attrs: &[u8]) -> bool {
    find(attrs, IFLA_LINKINFO)
        .and_then(|info| find(info, IFLA_INFO_KIND))
        .is_some_and(|kind| kind.strip_suffix(b"\0").unwrap_or(kind) == b"veth")
}

/// A veth's peer as `ip` names it (`ifindex N`, and its namespace's id when elsewhere);
/// `None` for other kinds of port.
fn veth_peer(ifindex: u32) -> Option<String> {
    let attrs = link_attributes(ifindex).ok()?;
    if !is_veth_link(&attrs) {
        return None;
    }
    let u32_of = |kind| {
        find(&attrs, kind)
            .and_then(|v| v.get(..4))
            .map(|v| u32::from_ne_bytes(v.try_into().expect("4 bytes")))
    };
    let index = u32_of(IFLA_LINK)?;
    Some(match u32_of(IFLA_LINK_NETNSID) {
        Some(ns) => format!("ifindex {index} in the namespace of netnsid {ns}"),
        None => format!("ifindex {index}"),
    })
}

fn socket(protocol: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2).
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            protocol,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A netlink attribute: length, type, value, padded to 4 bytes.
fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
    let len = 4 + value.len();
    let mut a = Vec::with_capacity(len.next_multiple_of(4));
    a.extend_from_slice(&(len as u16).to_ne_bytes());
    a.extend_from_slice(&kind.to_ne_bytes());
    a.extend_from_slice(value);
    a.resize(len.next_multiple_of(4), 0);
    a
}

/// Sends one generic netlink request and returns the answer's attributes.
fn request(sock: &OwnedFd, family: u16, cmd: u8, attrs: &[u8]) -> io::Result<Vec<u8>> {
    let mut body = vec![cmd, 1, 0, 0]; // cmd, version, reserved
    body.extend_from_slice(attrs);
    let answer = exchange(sock, family, &body)?;
    Ok(answer
        .get(NLMSG_HDRLEN + GENL_HDRLEN..)
        .unwrap_or_default()
        .to_vec())
}

/// Sends one netlink request of type `kind` with `body` and returns the answer (header
/// included, cut to its length); a netlink error becomes an `io::Error`.
fn exchange(sock: &OwnedFd, kind: u16, body: &[u8]) -> io::Result<Vec<u8>> {
    let len = NLMSG_HDRLEN + body.len();
    let mut msg = Vec::with_capacity(len);
    msg.extend_from_slice(&(len as u32).to_ne_bytes());
    msg.extend_from_slice(&kind.to_ne_bytes());
    msg.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    msg.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
    msg.extend_from_slice(body);
    // SAFETY: sockaddr_nl zeroed is the kernel's address.
    let mut to: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    to.nl_family = libc::AF_NETLINK as u16;
    // SAFETY: a valid buffer and address of the sizes passed.
    let sent = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&raw const to).cast(),
            size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 32 * 1024];
    // SAFETY: buf holds buf.len() bytes.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
    let answer = &buf[..n];
    if answer.len() < NLMSG_HDRLEN {
        return Err(io::Error::other("short netlink answer"));
    }
    let kind = u16::from_ne_bytes([answer[4], answer[5]]);
    if kind == NLMSG_ERROR {
        let errno = answer
            .get(NLMSG_HDRLEN..NLMSG_HDRLEN + 4)
            .map_or(0, |e| i32::from_ne_bytes(e.try_into().expect("4 bytes")));
        return Err(io::Error::from_raw_os_error(-errno));
    }
    let total = (u32::from_ne_bytes(answer[..4].try_into().expect("4 bytes")) as usize).min(n);
    Ok(answer[..total].to_vec())
}

/// The value of the first attribute of type `kind`.
pub(crate) fn find(attrs: &[u8], kind: u16) -> Option<&[u8]> {
    let mut at = 0;
    while at + 4 <= attrs.len() {
        let len = usize::from(u16::from_ne_bytes([attrs[at], attrs[at + 1]]));
        let t = u16::from_ne_bytes([attrs[at + 2], attrs[at + 3]]) & 0x3fff;
        if len < 4 || at + len > attrs.len() {
            return None;
        }
        if t == kind {
            return Some(&attrs[at + 4..at + len]);
        }
        at += len.next_multiple_of(4);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_padded_and_found_again() {
        let mut attrs = attr(CTRL_ATTR_FAMILY_NAME, b"netdev\0");
        assert_eq!(attrs.len(), 12, "4 + 7, padded to 12");
        attrs.extend(attr(CTRL_ATTR_FAMILY_ID, &0x1au16.to_ne_bytes()));
        assert_eq!(find(&attrs, CTRL_ATTR_FAMILY_NAME), Some(&b"netdev\0"[..]));
        assert_eq!(
            find(&attrs, CTRL_ATTR_FAMILY_ID),
            Some(&0x1au16.to_ne_bytes()[..])
        );
        assert_eq!(find(&attrs, 9), None);
        assert_eq!(
            find(&attrs[..6], CTRL_ATTR_FAMILY_ID),
            None,
            "a cut attribute"
        );
    }

    #[test]
    fn the_loopback_reports_that_it_cannot_transmit_redirected_frames() {
        let f = of(1).expect("the netdev netlink family answers for lo (Linux 6.3+)");
        assert_eq!(f & ACT_NDO_XMIT, 0, "lo has no ndo_xdp_xmit: {f:#x}");
        assert!(of(u32::MAX).is_err(), "no such interface");
        assert_eq!(attach_mode(1), None, "no XDP program on lo");
        assert!(link_attributes(1).is_ok_and(|a| !a.is_empty()));
        assert!(!is_veth(1), "lo is no veth");
        assert_eq!(veth_peer(1), None);
    }
}
