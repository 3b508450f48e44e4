//! NIC-triggered reduction (seed 001), the hosts' side and the contract with the daemons
//! (`innet daemon --role nic|dpu`, in `innet-user`):
//!
//! - [`tree`]: who is whose parent, and where results go;
//! - [`ipc`]: the client ↔ NIC daemon messages;
//! - [`port`]: the client's handle — posting contributions, reading completions;
//! - [`dpu`]: what a leader asks its DPU over its own port, and the answer.

pub mod dpu;
pub mod ipc;
pub mod port;
pub mod tree;

pub use port::{NicError, NicPort};
pub use tree::{Tree, TreeError, result_address};
