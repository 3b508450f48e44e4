//! What both sides of innet need below them: the hosts' runtime (`innet-client`) and the
//! operator side (`innet-user`, its switch, NIC and DPU daemons) ask the kernel the same
//! questions about the network and speak one contract between a host and its NIC or DPU.
//!
//! - [`netlink`]: one request/answer exchange with the kernel over rtnetlink or generic
//!   netlink, in the calling thread's network namespace;
//! - [`netdev`]: interfaces, addresses, neighbours, a bridge's forwarding table and a port's
//!   XDP features, as the kernel reports them through netlink (no `ip`, no `/proc` text);
//! - [`nic`]: NIC/DPU trees, the client ↔ daemon messages and the DPU request;
//! - [`sockopt`]: `setsockopt(2)` for the options socket crates do not wrap.

pub mod netdev;
pub mod netlink;
pub mod nic;
pub mod sockopt;
