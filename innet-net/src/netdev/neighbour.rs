//! Neighbours (`RTM_GETNEIGH`, `RTM_NEWNEIGH`): a host's MAC as ARP resolved it, the
//! resolution started through netlink when it is not known yet, and a bridge's learned
//! forwarding table (the `AF_BRIDGE` neighbours).

use std::{
    collections::HashMap,
    io,
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    neighbour::{
        NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
    },
};

use crate::netlink::{Ask, route};

/// Every neighbour of `family` in the current network namespace.
fn dump(family: AddressFamily) -> io::Result<Vec<NeighbourMessage>> {
    let mut m = NeighbourMessage::default();
    m.header.family = family;
    Ok(route(RouteNetlinkMessage::GetNeighbour(m), Ask::Dump)?
        .into_iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewNeighbour(n) => Some(n),
            _ => None,
        })
        .collect())
}

fn lladdr(n: &NeighbourMessage) -> Option<[u8; 6]> {
    n.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::LinkLayerAddress(mac) => mac.as_slice().try_into().ok(),
        _ => None,
    })
}

/// Whether an entry's link-layer address can be used (`ip neigh`'s REACHABLE, STALE,
/// DELAY, PROBE, PERMANENT, NOARP).
fn usable(state: NeighbourState) -> bool {
    !matches!(
        state,
        NeighbourState::Incomplete | NeighbourState::Failed | NeighbourState::None
    )
}

/// The MAC of `ip` on `ifindex` if ARP knows it.
fn known(ip: Ipv4Addr, ifindex: u32) -> io::Result<Option<[u8; 6]>> {
    Ok(dump(AddressFamily::Inet)?
        .iter()
        .filter(|n| n.header.ifindex == ifindex && usable(n.header.state))
        .find(|n| {
            n.attributes
                .contains(&NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)))
        })
        .and_then(lladdr))
}

/// Asks the kernel to resolve `ip` on `ifindex` (`NTF_USE` on a new entry: ARP starts as if
/// a packet were waiting for it). Needs CAP_NET_ADMIN.
fn resolve(ip: Ipv4Addr, ifindex: u32) -> io::Result<()> {
    let mut m = NeighbourMessage::default();
    m.header.family = AddressFamily::Inet;
    m.header.ifindex = ifindex;
    m.header.flags = NeighbourFlags::Use;
    m.header.state = NeighbourState::None;
    m.attributes
        .push(NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)));
    route(
        RouteNetlinkMessage::NewNeighbour(m),
        Ask::Change { create: true },
    )
    .map(drop)
}

/// The MAC of neighbour `ip` on `ifname`, resolved by the kernel (ARP) when it is not known
/// yet; `None` when it is not known within `timeout` (or `ifname` does not exist).
#[must_use]
pub fn neighbour_mac(ip: Ipv4Addr, ifname: &str, timeout: Duration) -> Option<[u8; 6]> {
    let ifindex = super::link::ifindex(ifname).ok()?;
    let deadline = Instant::now() + timeout;
    let mut asked = false;
    loop {
        if let Some(mac) = known(ip, ifindex).ok().flatten() {
            return Some(mac);
        }
        if Instant::now() >= deadline {
            return None;
        }
        if !asked {
            asked = true;
            // Refused only without CAP_NET_ADMIN; then the entry may still come from traffic.
            let _ = resolve(ip, ifindex);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A bridge's learned forwarding entries: MAC → the ifindex of the port behind which it
/// was learned (`bridge fdb show br BRIDGE` without its own and permanent entries).
///
/// # Errors
/// A netlink error.
pub fn bridge_fdb(bridge: u32) -> io::Result<HashMap<[u8; 6], u32>> {
    Ok(dump(AddressFamily::Bridge)?
        .iter()
        .filter(|n| {
            n.attributes
                .contains(&NeighbourAttribute::Controller(bridge))
                && !n.header.flags.contains(NeighbourFlags::Own)
                && n.header.state != NeighbourState::Permanent
        })
        .filter_map(|n| Some((lladdr(n)?, n.header.ifindex)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_resolved_entries_give_an_address() {
        assert!(usable(NeighbourState::Reachable));
        assert!(usable(NeighbourState::Stale));
        assert!(usable(NeighbourState::Permanent));
        assert!(!usable(NeighbourState::Incomplete));
        assert!(!usable(NeighbourState::Failed));
    }

    #[test]
    fn a_missing_interface_or_bridge_gives_nothing() {
        let t = Duration::from_millis(20);
        assert_eq!(
            neighbour_mac(Ipv4Addr::new(192, 0, 2, 1), "innet-none0", t),
            None
        );
        assert!(bridge_fdb(u32::MAX).expect("the table dumps").is_empty());
    }
}
