//! A node's INC address when nobody names it: the interface asked for; else the only
//! non-loopback interface that is up with an IPv4 address; else the one the default route
//! leaves by.

use std::{ffi::CStr, net::Ipv4Addr};

/// An up, non-loopback interface's IPv4 address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub ifname: String,
    pub ip: Ipv4Addr,
}

/// Why no address was chosen.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AddressError {
    #[error("interface {0} is not up with an IPv4 address here")]
    NoSuchInterface(String),
    #[error("no interface is up with an IPv4 address")]
    NoInterface,
    #[error("several interfaces carry IPv4 addresses ({0}) and no default route picks one")]
    Several(String),
}

/// This host's candidates for the INC address.
#[must_use]
pub fn candidates() -> Vec<Candidate> {
    let mut out = vec![];
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list`, freed below.
    if unsafe { libc::getifaddrs(&raw mut list) } != 0 {
        return out;
    }
    let mut at = list;
    while !at.is_null() {
        // SAFETY: a node of the list getifaddrs returned.
        let ifa = unsafe { &*at };
        at = ifa.ifa_next;
        let flags = ifa.ifa_flags;
        if ifa.ifa_addr.is_null()
            || flags & libc::IFF_UP as u32 == 0
            || flags & libc::IFF_LOOPBACK as u32 != 0
        {
            continue;
        }
        // SAFETY: a non-null sockaddr; read as sockaddr_in only when its family says so.
        unsafe {
            if i32::from((*ifa.ifa_addr).sa_family) != libc::AF_INET {
                continue;
            }
            let sin: libc::sockaddr_in = std::ptr::read_unaligned(ifa.ifa_addr.cast());
            out.push(Candidate {
                ifname: CStr::from_ptr(ifa.ifa_name).to_string_lossy().into_owned(),
                ip: Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
            });
        }
    }
    // SAFETY: the list getifaddrs allocated.
    unsafe { libc::freeifaddrs(list) };
    out
}

/// The source address of the default route: connecting a UDP socket sends nothing, it
/// only asks the kernel which address it would use (TEST-NET-1: no such host is reached).
#[must_use]
pub fn default_route_source() -> Option<Ipv4Addr> {
    let s = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).ok()?;
    s.connect((Ipv4Addr::new(192, 0, 2, 1), 9)).ok()?;
    match s.local_addr().ok()? {
        std::net::SocketAddr::V4(a) if !a.ip().is_unspecified() => Some(*a.ip()),
        _ => None,
    }
}

/// This node's INC address by the rule of this module's head.
///
/// # Errors
/// The rule finds none.
pub fn node_address(iface: Option<&str>) -> Result<Ipv4Addr, AddressError> {
    choose_address(iface, &candidates(), default_route_source())
}

/// [`node_address`]'s rule over what the host has.
///
/// # Errors
/// The rule finds none.
pub fn choose_address(
    iface: Option<&str>,
    candidates: &[Candidate],
    default_source: Option<Ipv4Addr>,
) -> Result<Ipv4Addr, AddressError> {
    if let Some(name) = iface {
        return candidates
            .iter()
            .find(|c| c.ifname == name)
            .map(|c| c.ip)
            .ok_or_else(|| AddressError::NoSuchInterface(name.to_owned()));
    }
    match candidates {
        [] => Err(AddressError::NoInterface),
        [one] => Ok(one.ip),
        several => default_source
            .filter(|ip| several.iter().any(|c| c.ip == *ip))
            .ok_or_else(|| {
                let names: Vec<String> = several
                    .iter()
                    .map(|c| format!("{} {}", c.ifname, c.ip))
                    .collect();
                AddressError::Several(names.join(", "))
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(ifname: &str, a: &str) -> Candidate {
        Candidate {
            ifname: ifname.into(),
            ip: a.parse().unwrap(),
        }
    }

    #[test]
    fn the_address_rule() {
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        let one = [cand("eth0", "10.77.0.1")];
        assert_eq!(choose_address(None, &one, None), Ok(ip("10.77.0.1")));
        let two = [cand("mgmt0", "192.168.1.5"), cand("fab0", "10.77.0.1")];
        assert_eq!(
            choose_address(Some("fab0"), &two, None),
            Ok(ip("10.77.0.1"))
        );
        let by_route = choose_address(None, &two, Some(ip("192.168.1.5")));
        assert_eq!(by_route, Ok(ip("192.168.1.5")));
        let e = choose_address(None, &two, None).unwrap_err();
        assert!(e.to_string().contains("fab0 10.77.0.1"), "{e}");
        assert_eq!(
            choose_address(Some("ib0"), &two, None),
            Err(AddressError::NoSuchInterface("ib0".into()))
        );
        assert_eq!(
            choose_address(None, &[], None),
            Err(AddressError::NoInterface)
        );
    }
}
