//! `fail_cause`: why a group cannot use the network, one number for every place that can
//! say so (a switch in its notify, the MRR, a NIC or DPU daemon, the leaders themselves).
//! The host runtime explains each with its fix (`innet_client::explain_fail_cause`).

/// A switch has no room left for the group (slots, children or map entries).
pub const FAIL_CAPACITY: u8 = 1;
/// A switch on the group's path has no port towards the next one the MRR chose (no query
/// or climb of the group came through it), or the MRR found no switch above every leader.
pub const FAIL_NO_ROUTE: u8 = 2;
/// The MRR found that the switches cannot reduce the group's op or type.
pub const FAIL_UNSUPPORTED: u8 = 3;
/// The reduction payload exceeds what the switches accept per packet.
pub const FAIL_TOO_LARGE: u8 = 4;
/// A query crossed no innet switch (no daemon, or plain bridges): the network cannot
/// reduce.
pub const FAIL_NO_SWITCH: u8 = 5;
/// A leader's handshake itself did not finish.
pub const FAIL_HANDSHAKE: u8 = 6;
/// A member's host has no NIC daemon, or the daemon refused.
pub const FAIL_NO_NIC: u8 = 7;
/// The switch refused the group's spec (a reserved id such as the host-to-host group 0,
/// too many members …): the job must not count on the network.
pub const FAIL_REFUSED: u8 = 8;
/// A member's address came in on two ports while the group was set up: the switch cannot
/// tell the member from an impostor, so the group does not use it.
pub const FAIL_PORT_CONFLICT: u8 = 9;
/// The leaders leave the network alone because it keeps losing their group (or for good,
/// when a NIC tree lost it).
pub const FAIL_GROUP_LOST: u8 = 10;
/// No DPU daemon answered the leader's request (no SmartNIC, or no `innet daemon --role
/// dpu` on it).
pub const FAIL_NO_DPU: u8 = 11;
/// The DPU daemon could not install the member (its log says why).
pub const FAIL_DPU_REFUSED: u8 = 12;
