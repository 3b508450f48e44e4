//! The placement the interposer finds by itself, with no file, at `MPI_Init`: innet-client's
//! discovery ([`innet_client::bootstrap::find_nodes`]) over the world communicator's
//! out-of-band allgather ([`Oob`]), with
//! 1. the node of each rank: the ranks whose MPI processor name (`MPI_Get_processor_name`,
//!    the host name) is the same share a node, its lowest rank speaks for it. This needs no
//!    communicator of its own (`MPI_Comm_split_type` would make and free one at
//!    `MPI_Init`), and the host name is what matters: a node's ranks meet in its shared
//!    memory;
//! 2. the node's INC address ([`node_address`]): the interface `INNET_MPI_IFACE` names;
//!    else the only non-loopback interface that is up with an IPv4 address; else the one
//!    the default route leaves by;
//! 3. the node's TOR: the switch itself says, answering a probe the node sends towards
//!    another node ([`innet_client::bootstrap::tor_of`]).
//!
//! Nodes may hold different numbers of ranks: a communicator is served when its own ranks
//! sit evenly ([`Placement::layout_of`]).

use std::net::Ipv4Addr;

pub use innet_client::bootstrap::address::{Candidate, candidates, default_route_source};
use innet_client::{
    Discovery,
    bootstrap::{
        BootstrapError,
        address::{self, AddressError},
        find_nodes,
    },
};
use tracing::warn;

use crate::{
    config::{JobSettings, NodeEntry, Placement},
    oob::Oob,
};

/// Names the interface whose IPv4 address is the node's INC address.
pub const IFACE_VAR: &str = "INNET_MPI_IFACE";

/// The node's INC address by the rule of this module's head; `Err` says what to set.
pub fn node_address() -> Result<Ipv4Addr, String> {
    choose_address(
        std::env::var(IFACE_VAR).ok().as_deref(),
        &candidates(),
        default_route_source(),
    )
}

/// [`node_address`]'s rule over what the host has (innet-client's, its advice naming
/// [`IFACE_VAR`]).
pub fn choose_address(
    iface: Option<&str>,
    candidates: &[Candidate],
    default_source: Option<Ipv4Addr>,
) -> Result<Ipv4Addr, String> {
    address::choose_address(iface, candidates, default_source).map_err(|e| match e {
        AddressError::NoSuchInterface(name) => {
            format!("{IFACE_VAR}={name}: that interface is not up with an IPv4 address here")
        }
        AddressError::NoInterface => {
            format!("{e}: bring the fabric's up, or name it with {IFACE_VAR}")
        }
        e => format!("{e}: name the fabric's with {IFACE_VAR}"),
    })
}

/// The job's placement, found over `world` (collective: every world rank calls it) for a
/// rank whose MPI processor name is `processor`. `Err` says why innet cannot serve the
/// job, the same on every rank.
pub fn placement(settings: JobSettings, world: &Oob, processor: &str) -> Result<Placement, String> {
    let mut how = Discovery::new(settings.mode);
    how.node = Some(processor.to_owned());
    // The node's address by this module's rule (its advice names INNET_MPI_IFACE); none
    // found travels as 0.0.0.0, which the placement then refuses for this rank's node.
    how.address = Some(node_address().unwrap_or_else(|e| {
        warn!("innet-mpi: {e}");
        Ipv4Addr::UNSPECIFIED
    }));
    let found = find_nodes(world, &how).map_err(|e| match e {
        BootstrapError::NoAddress { rank } => format!(
            "the node of world rank {rank} found no INC address (see that rank's log; {IFACE_VAR} names the interface)"
        ),
        e => e.to_string(),
    })?;
    Ok(Placement {
        settings,
        sockets_per_node: 1,
        nodes: found
            .nodes
            .into_iter()
            .map(|n| NodeEntry {
                tor: n.tor,
                nics: n.nics,
                netns: None,
            })
            .collect(),
        node_of_rank: found.node_of,
        discovered: true,
    })
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
        let one = [cand("eth0", "10.77.0.1")];
        assert_eq!(
            choose_address(None, &one, None),
            Ok("10.77.0.1".parse().unwrap())
        );
        let two = [cand("mgmt0", "192.168.1.5"), cand("fab0", "10.77.0.1")];
        assert_eq!(
            choose_address(Some("fab0"), &two, None),
            Ok("10.77.0.1".parse().unwrap())
        );
        assert_eq!(
            choose_address(None, &two, Some("192.168.1.5".parse().unwrap())),
            Ok("192.168.1.5".parse().unwrap())
        );
        let e = choose_address(None, &two, None).unwrap_err();
        assert!(e.contains(IFACE_VAR) && e.contains("fab0 10.77.0.1"), "{e}");
        assert!(
            choose_address(Some("ib0"), &two, None)
                .unwrap_err()
                .contains("ib0")
        );
        assert!(
            choose_address(None, &[], None)
                .unwrap_err()
                .contains(IFACE_VAR)
        );
    }
}
