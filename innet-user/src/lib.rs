//! innet's operator side: loads and attaches the XDP programs, pins them under a bpffs,
//! runs the switch, NIC and DPU daemons (control plane, group lifecycle), reads their
//! counters, and writes example INC packets to pcap files.
//!
//! The `innet` binary is a thin clap front end over this crate; integration tests drive the
//! same functions. The hosts' side (communicators, allreduce) is the `innet-client` crate.

pub mod attached;
pub mod bridge;
pub mod switch_daemon;
pub mod daemon_config;
pub mod error;
pub mod group_maps;
pub mod host_ports;
pub mod loader;
pub mod metrics;
pub mod nic;
pub mod pcap;
pub mod pins;
pub mod port_health;
pub mod port_watch;
pub mod stats;
pub mod xdp_features;

pub use error::Error;
pub use innet_common as common;
