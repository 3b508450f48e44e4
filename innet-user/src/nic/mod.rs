//! NIC-triggered reduction (the NIC paper), the daemons' side: for fabrics whose switches do not
//! run innet, each host's NIC (or a SmartNIC port) runs `innet_nic` and the members form a
//! k-ary tree.
//!
//! - [`nic_daemon`]: `innet daemon --role nic`, which attaches the program to the host's NICs and
//!   installs and frees groups for the host's clients;
//! - [`dpu_daemon`]: the same tree on BlueField-style DPUs (`innet daemon --role dpu` on the
//!   DPU; the host sends and receives ordinary RoCEv2 frames).
//!
//! What hosts and daemons share (the tree's shape, the client ↔ daemon messages, the DPU
//! request) is the contract between them and lives below both, in `innet_net::nic`.

pub mod nic_daemon;
pub mod dpu_daemon;
pub mod membership;
pub mod post_port;
