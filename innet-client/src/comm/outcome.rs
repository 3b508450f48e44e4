//! What a rank is told after a collective: which way it went, why it fell back, and what a
//! group's `fail_cause` means. A report crosses the node-local channel, so it has a wire
//! form.

use std::fmt;

use innet_common::fail::{
    FAIL_CAPACITY, FAIL_DPU_REFUSED, FAIL_GROUP_LOST, FAIL_HANDSHAKE, FAIL_NO_DPU, FAIL_NO_NIC,
    FAIL_NO_ROUTE, FAIL_NO_SWITCH, FAIL_PORT_CONFLICT, FAIL_REFUSED, FAIL_TOO_LARGE,
    FAIL_UNSUPPORTED,
};

use crate::{hostalg::Algorithm, roles::Grouping};

/// Whether a group that could not be set up for `fail_cause` may be set up on a later try:
/// a switch that was full, a set-up a switch forgot or never heard of (a flood, a daemon
/// restarting), a member's address on two ports (a spoofer's frames during the set-up),
/// a handshake that did not finish in time. Not: what the switches cannot do, no innet
/// switch, a refused spec, a group given up for good.
#[must_use]
pub fn may_pass(fail_cause: u8) -> bool {
    matches!(
        fail_cause,
        FAIL_CAPACITY | FAIL_NO_ROUTE | FAIL_PORT_CONFLICT | FAIL_HANDSHAKE
    )
}

/// What a group's `fail_cause` means, and what to do about it.
#[must_use]
pub fn explain_fail_cause(fail_cause: u8) -> &'static str {
    match fail_cause {
        0 => "the network serves the group",
        FAIL_CAPACITY => {
            "a switch (or NIC) has no room for another group: free idle ones (`innet group list`, `innet group del`) or raise its capacity"
        }
        FAIL_NO_ROUTE => {
            "a TOR has no route to the group's SPINE (no query came back down its uplinks): check the uplinks and the SPINE's daemon"
        }
        FAIL_UNSUPPORTED => {
            "the switches cannot reduce this op or type: see their capabilities in `innet daemon --help`"
        }
        FAIL_TOO_LARGE => {
            "the packets are larger than the switches accept: lower max_packet_bytes (INNET_MAX_PACKET_BYTES)"
        }
        FAIL_NO_SWITCH => {
            "a query crossed no innet switch: start `innet daemon` on the TORs (and SPINEs) between the hosts"
        }
        FAIL_HANDSHAKE => {
            "the handshake did not finish in time: are all leaders running, and `innet daemon` on the switches?"
        }
        FAIL_NO_NIC => "a leader's host has no NIC daemon: start `innet daemon --role nic` there",
        FAIL_NO_DPU => {
            "no DPU daemon answered a leader (inc-dpu): start `innet daemon --role dpu -i pf0hpf -i p0 --uplink p0 --ip ADDR` on its node's DPU"
        }
        FAIL_DPU_REFUSED => {
            "a leader's DPU could not install the group (no ARP answer from its parent, or a bad request): see the DPU daemon's log"
        }
        FAIL_REFUSED => {
            "a switch refused the group's spec (a reserved id or too many members): see the daemon's log"
        }
        FAIL_PORT_CONFLICT => {
            "a member's address came in on two switch ports during set-up (a host that moved, or one spoofing it): find the second port with `innet stats` (refused_wrong_port); the binding lapses 60 s after the address's last control packet"
        }
        FAIL_GROUP_LOST => {
            "the network lost the group again right after it was set up: the leaders leave it alone for a while (QUICK_LOSS_CALLS collectives, doubling); check the daemons' logs and `innet stats`"
        }
        _ => "unknown cause: see the switches' daemon logs",
    }
}

/// Which way a collective went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Path {
    /// Through the switches.
    Network(Grouping),
    /// Through the node leaders' NICs (a NIC tree).
    NicTree,
    /// Host to host among the leaders.
    Host(Algorithm),
    /// One leader holds every rank: the node-local reduce was all.
    Local,
}

impl Path {
    /// A short name for logs and tables.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Network(Grouping::Node) => "network, node",
            Self::Network(Grouping::Socket) => "network, socket",
            Self::NicTree => "nic tree",
            Self::Host(Algorithm::RecursiveDoubling) => "host, rd",
            Self::Host(Algorithm::Ring) => "host, ring",
            Self::Local => "local",
        }
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a collective that was to use the network ran on the hosts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fallback {
    /// The handshake says the network cannot serve the group (`fail_cause`).
    NoNetwork { fail_cause: u8 },
    /// The switches cannot reduce this op or type, or not in packets this large.
    Unsupported,
    /// A packet's result did not come after this many sends. This one and the next run on
    /// the hosts (the peers may have given up on the next one meanwhile); the one after
    /// sets the group up again.
    Timeout { tries: u32 },
    /// Another leader ran it on the hosts (its results did not come).
    PeerFellBack,
    /// `auto` mode: the cutover table gives messages longer than this to the hosts, where
    /// they are faster.
    Cutover { max_bytes: u32 },
    /// A contribution came back unaggregated: the switches no longer hold the group (a
    /// daemon restarted without its state, `innet group del`, the idle timeout). This one
    /// runs on the hosts; the next sets the group up again.
    GroupVanished,
}

impl Fallback {
    /// A short name for logs and reports.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::NoNetwork { .. } => "no_network",
            Self::Unsupported => "unsupported",
            Self::Timeout { .. } => "timeout",
            Self::PeerFellBack => "peer_fell_back",
            Self::Cutover { .. } => "cutover",
            Self::GroupVanished => "group_vanished",
        }
    }
}

/// How one collective ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    pub path: Path,
    pub fallback: Option<Fallback>,
    /// Data packets this leader sent again.
    pub retransmissions: u32,
    /// This collective first set the group up again, because an earlier one found it
    /// gone: the new group's `fail_cause` (0: it runs in the network).
    pub regrouped: Option<u8>,
}

impl Report {
    pub(crate) const BYTES: usize = 14;

    pub(crate) fn encode(&self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        (b[0], b[1]) = match self.path {
            Path::Network(Grouping::Node) => (1, 0),
            Path::Network(Grouping::Socket) => (1, 1),
            Path::NicTree => (1, 2),
            Path::Host(Algorithm::RecursiveDoubling) => (2, 0),
            Path::Host(Algorithm::Ring) => (2, 1),
            Path::Local => (3, 0),
        };
        (b[2], b[3]) = match self.fallback {
            None => (0, 0),
            Some(Fallback::NoNetwork { fail_cause }) => (1, fail_cause),
            Some(Fallback::Unsupported) => (2, 0),
            Some(Fallback::Timeout { tries }) => (3, tries.min(255) as u8),
            Some(Fallback::PeerFellBack) => (4, 0),
            Some(Fallback::Cutover { max_bytes }) => {
                b[8..12].copy_from_slice(&max_bytes.to_le_bytes());
                (5, 0)
            }
            Some(Fallback::GroupVanished) => (6, 0),
        };
        b[4..8].copy_from_slice(&self.retransmissions.to_le_bytes());
        (b[12], b[13]) = self.regrouped.map_or((0, 0), |c| (1, c));
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Option<Self> {
        let b: &[u8; Self::BYTES] = b.get(..Self::BYTES)?.try_into().ok()?;
        let path = match (b[0], b[1]) {
            (1, 0) => Path::Network(Grouping::Node),
            (1, 1) => Path::Network(Grouping::Socket),
            (1, 2) => Path::NicTree,
            (2, 0) => Path::Host(Algorithm::RecursiveDoubling),
            (2, 1) => Path::Host(Algorithm::Ring),
            (3, 0) => Path::Local,
            _ => return None,
        };
        let fallback = match (b[2], b[3]) {
            (0, _) => None,
            (1, c) => Some(Fallback::NoNetwork { fail_cause: c }),
            (2, _) => Some(Fallback::Unsupported),
            (3, t) => Some(Fallback::Timeout {
                tries: u32::from(t),
            }),
            (4, _) => Some(Fallback::PeerFellBack),
            (5, _) => Some(Fallback::Cutover {
                max_bytes: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            }),
            (6, _) => Some(Fallback::GroupVanished),
            _ => return None,
        };
        Some(Self {
            path,
            fallback,
            retransmissions: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            regrouped: (b[12] == 1).then_some(b[13]),
        })
    }
}

/// What a leader's endpoint refused from the network since the communicator was made, one
/// counter per attack its check stops (docs/trust.md lists them). All zero on the other
/// ranks and on a communicator of one node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Refusals {
    /// Host-to-host frames (goodbye, regroup notice, final result, NACK, host-algorithm
    /// step) whose `src_rank` is no leader or whose source address is not that leader's:
    /// a host outside the job forging them.
    pub host_frame_spoofed: u64,
    /// Contributions of the group in use coming back from an address that is no leader's:
    /// a forged "the group vanished", which would make the leaders set it up again.
    pub stray_spoofed: u64,
    /// Results from an address outside the member's tree (no leader's; in `inc-dpu`, not
    /// its DPU's): a forged result.
    pub result_spoofed: u64,
    /// Results of a group other than the one in use: not this communicator's to keep.
    pub result_of_other_group: u64,
    /// Regroup notices whose generation or collective lies beyond what a leader a
    /// collective or two ahead can announce: one that would keep the job on the hosts or
    /// overflow the generation.
    pub regroup_out_of_range: u64,
    /// Final results from a leader this one neither waits for nor sent to: a result slipped
    /// in by another rank.
    pub final_from_unasked_rank: u64,
    /// Host packets whose collective, step or packet index the message cannot have: one
    /// small frame asking for a huge reassembly table.
    pub reassembly_key_out_of_range: u64,
    /// Host packets dropped because their sender (or the communicator) holds the most
    /// reassembly memory it may: a flood of partial messages.
    pub reassembly_memory_full: u64,
    /// Datagrams the progress thread received while the application was away and could not
    /// keep (its queue was full): a flood while the application computes.
    pub backlog_full: u64,
    /// Datagrams a handshake received while setting the group up again and could not keep
    /// (its queue was full): a flood during a set-up.
    pub aside_full: u64,
    /// Requests to send a step (or a final result) again that came sooner than a peer asks
    /// again and were not answered: forged NACKs making a leader resend whole messages.
    pub resend_rate_limited: u64,
}

impl Refusals {
    /// Everything refused, all reasons together.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.host_frame_spoofed
            + self.stray_spoofed
            + self.result_spoofed
            + self.result_of_other_group
            + self.regroup_out_of_range
            + self.final_from_unasked_rank
            + self.reassembly_key_out_of_range
            + self.reassembly_memory_full
            + self.backlog_full
            + self.aside_full
            + self.resend_rate_limited
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_survive_the_local_channel() {
        for path in [
            Path::Network(Grouping::Node),
            Path::Network(Grouping::Socket),
            Path::Host(Algorithm::RecursiveDoubling),
            Path::Host(Algorithm::Ring),
            Path::Local,
        ] {
            for fallback in [
                None,
                Some(Fallback::NoNetwork { fail_cause: 5 }),
                Some(Fallback::Unsupported),
                Some(Fallback::Timeout { tries: 8 }),
                Some(Fallback::PeerFellBack),
                Some(Fallback::Cutover { max_bytes: 70_000 }),
                Some(Fallback::GroupVanished),
            ] {
                for regrouped in [None, Some(0), Some(FAIL_GROUP_LOST)] {
                    let r = Report {
                        path,
                        fallback,
                        retransmissions: 77,
                        regrouped,
                    };
                    assert_eq!(Report::decode(&r.encode()), Some(r));
                }
            }
        }
    }
}
