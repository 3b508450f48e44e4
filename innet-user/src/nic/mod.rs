//! NIC-triggered reduction (seed 001): for fabrics whose switches do not run innet, each
//! host's NIC (or a SmartNIC port) runs `innet_nic` and the members form a k-ary tree.
//!
//! - [`tree`]: who is whose parent, and where results go;
//! - [`daemon`]: `innet daemon --role nic`, which attaches the program to the host's NICs and
//!   installs and frees groups for the host's clients;
//! - [`ipc`]: the client ↔ daemon messages;
//! - [`port`]: the client's handle — posting contributions, reading completions;
//! - [`dpu`] and [`dpu_daemon`]: the same tree on BlueField-style DPUs (`innet daemon
//!   --role dpu` on the DPU; the host sends and receives ordinary RoCEv2 frames).

pub mod daemon;
pub mod dpu;
pub mod dpu_daemon;
pub mod ipc;
pub mod port;
pub mod tree;

pub use dpu::{FAIL_DPU_REFUSED, FAIL_NO_DPU};
pub use port::{FAIL_NO_NIC, NicError, NicPort};
pub use tree::{Tree, TreeError, result_address};
