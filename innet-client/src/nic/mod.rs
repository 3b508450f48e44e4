//! NIC-triggered reduction, the hosts' side: [`port`] is the client's handle on its NIC
//! daemon (posting contributions, reading completions). The tree, the client ↔ daemon
//! messages and the DPU request are the contract with `innet daemon --role nic|dpu` and
//! live below both sides, in [`innet_net::nic`].

pub mod port;

pub use innet_net::nic::{Tree, TreeError};
pub use port::NicPort;
