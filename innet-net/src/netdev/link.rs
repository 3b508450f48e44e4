//! Links (`RTM_GETLINK`): what daemons and hosts need of a port in one answer.

use std::io;

use netlink_packet_route::{
    RouteNetlinkMessage,
    link::{LinkAttribute, LinkInfo, LinkMessage, LinkXdp, XdpAttached},
};

use super::{Error, Result};
use crate::netlink::{Ask, route};

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

/// One link of the current network namespace as the kernel reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    /// The hardware address (none for tunnels and the like).
    pub mac: Option<[u8; 6]>,
    pub mtu: Option<u32>,
    /// The largest MTU the driver takes (`IFLA_MAX_MTU`).
    pub max_mtu: Option<u32>,
    /// The bridge (or bond) it is enslaved to (`IFLA_MASTER`).
    pub master: Option<u32>,
    /// `IFLA_INFO_KIND`: `bridge`, `veth` …; physical ports have none.
    pub kind: Option<String>,
    /// A veth's peer (`IFLA_LINK`) and, when the peer lives in another namespace, that
    /// namespace's id as seen from here (`IFLA_LINK_NETNSID`).
    pub peer: Option<(u32, Option<i32>)>,
    /// How its XDP program is attached, if one is.
    pub xdp: Option<AttachMode>,
    /// Frames the kernel dropped on transmit (`tx_dropped` of `IFLA_STATS64`).
    pub tx_dropped: Option<u64>,
}

impl Link {
    fn from_message(m: &LinkMessage) -> Self {
        let mut link = Self {
            index: m.header.index,
            ..Self::default()
        };
        let mut peer_index = None;
        let mut peer_netns = None;
        for a in &m.attributes {
            match a {
                LinkAttribute::IfName(n) => link.name.clone_from(n),
                LinkAttribute::Address(a) => link.mac = a.as_slice().try_into().ok(),
                LinkAttribute::Mtu(v) => link.mtu = Some(*v),
                LinkAttribute::MaxMtu(v) => link.max_mtu = Some(*v),
                LinkAttribute::Controller(v) => link.master = Some(*v),
                LinkAttribute::Link(v) => peer_index = Some(*v),
                LinkAttribute::LinkNetNsId(v) => peer_netns = Some(*v),
                LinkAttribute::Stats64(s) => link.tx_dropped = Some(s.tx_dropped),
                LinkAttribute::LinkInfo(infos) => link.kind = kind(infos),
                LinkAttribute::Xdp(xdp) => link.xdp = attach_mode(xdp),
                _ => {}
            }
        }
        if link.kind.as_deref() == Some("veth") {
            link.peer = peer_index.map(|i| (i, peer_netns));
        }
        link
    }
}

fn kind(infos: &[LinkInfo]) -> Option<String> {
    infos.iter().find_map(|i| match i {
        LinkInfo::Kind(k) => Some(k.to_string()),
        _ => None,
    })
}

fn attach_mode(xdp: &[LinkXdp]) -> Option<AttachMode> {
    xdp.iter().find_map(|x| match x {
        // Several programs: the driver's comes first.
        LinkXdp::Attached(XdpAttached::Driver | XdpAttached::Multiple) => Some(AttachMode::Native),
        LinkXdp::Attached(XdpAttached::SocketBuffer) => Some(AttachMode::Generic),
        LinkXdp::Attached(XdpAttached::Hardware) => Some(AttachMode::Offload),
        _ => None,
    })
}

/// The link `ifindex` of the current network namespace.
///
/// # Errors
/// No such link (`ENODEV`) or a netlink error.
pub fn link(ifindex: u32) -> io::Result<Link> {
    let mut m = LinkMessage::default();
    m.header.index = ifindex;
    one(m)
}

/// The link named `ifname` in the current network namespace.
///
/// # Errors
/// [`Error::UnknownInterface`] when there is none, [`Error::Netlink`] otherwise.
pub fn link_named(ifname: &str) -> Result<Link> {
    if ifname.is_empty() || ifname.len() >= libc::IF_NAMESIZE {
        return Err(Error::UnknownInterface {
            ifname: ifname.to_owned(),
        });
    }
    let mut m = LinkMessage::default();
    m.attributes.push(LinkAttribute::IfName(ifname.to_owned()));
    one(m).map_err(|source| match source.raw_os_error() {
        Some(libc::ENODEV) => Error::UnknownInterface {
            ifname: ifname.to_owned(),
        },
        _ => Error::Netlink {
            ifname: ifname.to_owned(),
            source,
        },
    })
}

/// Every link of the current network namespace, by index.
///
/// # Errors
/// A netlink error.
pub fn links() -> io::Result<Vec<Link>> {
    let mut out: Vec<Link> = route(
        RouteNetlinkMessage::GetLink(LinkMessage::default()),
        Ask::Dump,
    )?
    .iter()
    .filter_map(|m| match m {
        RouteNetlinkMessage::NewLink(l) => Some(Link::from_message(l)),
        _ => None,
    })
    .collect();
    out.sort_by_key(|l| l.index);
    Ok(out)
}

fn one(request: LinkMessage) -> io::Result<Link> {
    route(RouteNetlinkMessage::GetLink(request), Ask::One)?
        .iter()
        .find_map(|m| match m {
            RouteNetlinkMessage::NewLink(l) => Some(Link::from_message(l)),
            _ => None,
        })
        .ok_or_else(|| io::Error::other("the kernel answered RTM_GETLINK with no link"))
}

/// The ifindex of `ifname` in the current network namespace.
///
/// # Errors
/// [`Error::UnknownInterface`] when there is no such interface.
pub fn ifindex(ifname: &str) -> Result<u32> {
    link_named(ifname).map(|l| l.index)
}

/// The name of interface `ifindex`, if it exists in this namespace.
#[must_use]
pub fn ifname(ifindex: u32) -> Option<String> {
    link(ifindex).ok().map(|l| l.name)
}

/// The MAC address of `ifname` in the current network namespace. (sysfs would show the
/// namespace it was mounted in, which `nsenter --net` does not change.)
///
/// # Errors
/// [`Error::UnknownInterface`] when there is no such interface or it has no MAC.
pub fn mac(ifname: &str) -> Result<[u8; 6]> {
    link_named(ifname)?
        .mac
        .ok_or_else(|| Error::UnknownInterface {
            ifname: ifname.to_owned(),
        })
}

/// The MTU of `ifname` in the current network namespace.
///
/// # Errors
/// [`Error::UnknownInterface`] when there is no such interface.
pub fn mtu(ifname: &str) -> Result<usize> {
    Ok(link_named(ifname)?.mtu.unwrap_or(0) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loopback_by_name_and_index() {
        let lo = link_named("lo").expect("lo");
        assert_eq!((lo.index, lo.name.as_str()), (1, "lo"));
        assert_eq!(lo.mac, Some([0; 6]));
        assert_eq!(lo.mtu, Some(65536));
        assert_eq!((lo.master, lo.peer, lo.xdp), (None, None, None));
        assert!(lo.tx_dropped.is_some(), "stats64 come with every link");
        assert_eq!(link(1).expect("by index"), lo);
        assert_eq!(ifindex("lo").unwrap(), 1);
        assert_eq!(ifname(1).as_deref(), Some("lo"));
        assert_eq!(mtu("lo").unwrap(), 65536);
        assert!(links().unwrap().iter().any(|l| l.name == "lo"));
    }

    #[test]
    fn a_missing_interface_is_named() {
        for name in ["innet-none0", "", "a-name-too-long-for-linux"] {
            let e = ifindex(name).unwrap_err();
            assert!(
                matches!(&e, Error::UnknownInterface { ifname } if ifname == name),
                "{e}"
            );
        }
        assert_eq!(ifname(u32::MAX), None);
    }
}
