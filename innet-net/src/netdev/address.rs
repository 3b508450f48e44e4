//! IPv4 addresses (`RTM_GETADDR`).

use std::{
    io,
    net::{IpAddr, Ipv4Addr},
};

use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    address::{AddressAttribute, AddressMessage},
};

use crate::netlink::{Ask, route};

/// Every IPv4 address of the current network namespace with its interface's index.
fn ipv4() -> io::Result<Vec<(u32, Ipv4Addr)>> {
    let mut m = AddressMessage::default();
    m.header.family = AddressFamily::Inet;
    Ok(route(RouteNetlinkMessage::GetAddress(m), Ask::Dump)?
        .iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewAddress(a) => Some(a),
            _ => None,
        })
        .flat_map(|a| {
            a.attributes.iter().filter_map(|attr| match attr {
                // IFA_LOCAL is the interface's own address (IFA_ADDRESS is the peer's on
                // point-to-point links).
                AddressAttribute::Local(IpAddr::V4(ip)) => Some((a.header.index, *ip)),
                _ => None,
            })
        })
        .collect())
}

/// The interface that holds `ip` in the current network namespace.
#[must_use]
pub fn ifname_of(ip: Ipv4Addr) -> Option<String> {
    let index = ipv4().ok()?.into_iter().find(|(_, a)| *a == ip)?.0;
    super::link::ifname(index)
}

/// The IPv4 addresses of `ifname` in the current network namespace.
#[must_use]
pub fn ipv4_addresses(ifname: &str) -> Vec<Ipv4Addr> {
    let Ok(index) = super::link::ifindex(ifname) else {
        return vec![];
    };
    ipv4()
        .unwrap_or_default()
        .into_iter()
        .filter(|(i, _)| *i == index)
        .map(|(_, a)| a)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loopback_holds_127_0_0_1() {
        assert_eq!(ipv4_addresses("lo"), vec![Ipv4Addr::LOCALHOST]);
        assert_eq!(ifname_of(Ipv4Addr::LOCALHOST).as_deref(), Some("lo"));
        assert_eq!(ifname_of(Ipv4Addr::new(192, 0, 2, 99)), None);
        assert!(ipv4_addresses("innet-none0").is_empty());
    }
}
