//! Each NIC or DPU member below the root joins its group's result address (`239.x.y.z`)
//! by IGMP on the port the results arrive on, for as long as the member is installed.
//! IGMP-snooping bridges then forward the root's result only to member ports (and to
//! their multicast-router ports, towards the querier) instead of flooding every port, as
//! they do with traffic of a group nobody joined. The frames themselves never reach the
//! host's stack (`innet_nic` consumes them): the membership only tells the fabric.
//!
//! A membership is a socket: closing it leaves the group (the kernel sends the IGMP leave),
//! so a daemon that exits or crashes leaves every group with it.

use std::collections::HashMap;

use innet_net::nic::tree::result_address;
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
        self.joined.insert(wire_id, sock);
        Ok(())
    }

    /// Leaves group `wire_id`'s result address, if joined.
    pub fn leave(&mut self, wire_id: u32) {
        self.joined.remove(&wire_id);
    }
}
