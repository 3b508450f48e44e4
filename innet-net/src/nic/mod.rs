//! NIC-triggered reduction trees, the contract between a host's client library and the
//! daemons that run its NIC or DPU (`innet daemon --role nic|dpu`):
//!
//! - [`tree`]: who is whose parent, and where results go;
//! - [`ipc`]: the client ↔ NIC daemon messages;
//! - [`dpu`]: what a leader asks its DPU over its own port, and the answer.

pub mod dpu;
pub mod ipc;
pub mod tree;

pub use tree::{Tree, TreeError, result_address};
