//! Each NIC or DPU member below the root joins its group's result address (`239.x.y.z`)
//! by IGMP on the port the results arrive on, for as long as the member is installed.
//! IGMP-snooping bridges then forward the root's result only to member ports (and to
//! their multicast-router ports, towards the querier) instead of flooding every port, as
//! they do with traffic of a group nobody joined. The frames themselves never reach the
//! host's stack (`innet_nic` consumes them): the membership only tells the fabric.
//!
//! A membership is a socket: closing it leaves the group (the kernel sends the IGMP leave),
//! so a daemon that exits or crashes leaves every group with it.

use std::{
    collections::HashMap,
    net::{Ipv4Addr, SocketAddrV4},
};

use innet_net::{nic::tree::result_address, sockopt::setsockopt};
use socket2::{Domain, InterfaceIndexOrAddress, Protocol, Socket, Type};

use crate::error::{Error, Result};

/// The result addresses this daemon's members joined, by wire id.
#[derive(Default)]
pub struct Memberships {
    joined: HashMap<u32, Socket>,
}

impl Memberships {
    /// Joins group `wire_id`'s result address on interface `ifindex` (again: nothing).
    ///
    /// # Errors
    /// The kernel refused the socket or the membership (the interface has no IPv4, or
    /// `net.ipv4.igmp_max_memberships` is reached).
    pub fn join(&mut self, wire_id: u32, ifindex: u32) -> Result<()> {
        if self.joined.contains_key(&wire_id) {
            return Ok(());
        }
        let (group, _) = result_address(wire_id);
        let what =
            || format!("joining {group} (group {wire_id:#08x}) by IGMP on ifindex {ifindex}");
        let sock = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))
            .and_then(|s| {
                s.join_multicast_v4_n(&group, &InterfaceIndexOrAddress::Index(ifindex))
                    .map(|()| s)
            })
            .map_err(|source| Error::Io {
                path: format!("{}: {source}", what()).into(),
                source,
            })?;
        // The kernel announces a join a few jiffies later; a job's first results can be
        // faster (seen in `inc-dpu`: the first 3 to 6 of 18 missed members and were
        // recovered by reposts). Announcing it now, before the member is reported
        // installed, has the bridges learn it before any data of the group flows.
        announce(group, ifindex).map_err(|source| Error::Io {
            path: format!(
                "announcing {group} (group {wire_id:#08x}) on ifindex {ifindex}: {source}"
            )
            .into(),
            source,
        })?;
        self.joined.insert(wire_id, sock);
        Ok(())
    }

    /// Leaves group `wire_id`'s result address, if joined.
    pub fn leave(&mut self, wire_id: u32) {
        self.joined.remove(&wire_id);
    }
}

/// Sends one IGMPv2 membership report for `group` out of interface `ifindex` (RFC 2236: to
/// the group, TTL 1, Router Alert), as the kernel's unsolicited report would; snooping
/// bridges take v2 reports whatever version their querier runs.
fn announce(group: Ipv4Addr, ifindex: u32) -> std::io::Result<()> {
    let sock = Socket::new(
        Domain::IPV4,
        Type::RAW,
        Some(Protocol::from(libc::IPPROTO_IGMP)),
    )?;
    let via = libc::ip_mreqn {
        imr_multiaddr: libc::in_addr { s_addr: 0 },
        imr_address: libc::in_addr { s_addr: 0 },
        imr_ifindex: ifindex as libc::c_int,
    };
    setsockopt(&sock, libc::IPPROTO_IP, libc::IP_MULTICAST_IF, &via)?;
    let router_alert: [u8; 4] = [0x94, 0x04, 0, 0];
    setsockopt(&sock, libc::IPPROTO_IP, libc::IP_OPTIONS, &router_alert)?;
    sock.set_multicast_ttl_v4(1)?;
    sock.set_multicast_loop_v4(false)?;
    let mut report = [0x16, 0, 0, 0, 0, 0, 0, 0];
    report[4..].copy_from_slice(&group.octets());
    let sum = innet_common::codec::ipv4_checksum(&report);
    report[2..4].copy_from_slice(&sum.to_be_bytes());
    sock.send_to(&report, &SocketAddrV4::new(group, 0).into())?;
    Ok(())
}
