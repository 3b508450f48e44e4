//! innet's userspace library: loads and attaches the XDP programs, pins them under a bpffs,
//! reads their counters, and writes example INC packets to pcap files.
//!
//! The `innet` binary is a thin clap front end over this crate; integration tests drive the
//! same functions.

pub mod client;
pub mod daemon;
pub mod error;
pub mod fault;
pub mod group;
pub mod loader;
pub mod metrics;
pub mod netdev;
pub mod nic;
pub mod object;
pub mod pcap;
pub mod pins;
pub mod port_health;
pub mod stats;
pub mod xdp_features;

pub use error::Error;
pub use innet_common as common;
