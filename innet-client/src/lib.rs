//! innet's host runtime, the library applications and the MPI interposer link: a
//! communicator of ranks and its allreduce, which runs through the switches (Node or Socket
//! mode of seed 000), through NIC or DPU trees (seed 001) or, when the network cannot help,
//! with host algorithms. It holds no loader, daemon or CLI (those are `innet-user`).
//!
//! Where a collective goes: [`comm`] (the communicator, its modes and fallbacks) →
//! [`local`] / [`shm`] (the node's ranks meet their leader) → [`handshake`] (the group is set
//! up, [`tree`] chooses its switches) → [`endpoint`] (the leader's window of rounds on its INC socket, [`inbox`] reads it)
//! or [`hostalg`] (recursive doubling, ring) → back through [`local`].
//!
//! ```no_run
//! use innet_client::{Communicator, Config, Layout, NodePlacement};
//! use innet_common::proto::{Dtype, Op};
//! # fn main() -> Result<(), innet_client::Error> {
//! // Rank 0 of 8: two nodes of four ranks under one TOR.
//! let nodes = vec![
//!     NodePlacement { tor: 0, nics: vec!["10.0.0.1".parse().unwrap()] },
//!     NodePlacement { tor: 0, nics: vec!["10.0.0.2".parse().unwrap()] },
//! ];
//! let mut comm = Communicator::new(Config::new(42, 0, Layout::new(8, 4, 1)?, nodes))?;
//! let send: Vec<u8> = [1i32, 2, 3].iter().flat_map(|v| v.to_ne_bytes()).collect();
//! let mut recv = vec![0u8; send.len()];
//! let report = comm.allreduce(&send, &mut recv, Op::Sum, Dtype::I32)?;
//! println!("{:?}", report.path);
//! # Ok(()) }
//! ```

mod assembly;
pub mod comm;
pub mod cutover;
pub mod dpu;
pub mod endpoint;
pub mod frames;
pub mod handshake;
pub mod hostalg;
pub mod inbox;
pub mod inc_socket;
pub mod local;
pub mod nic;
pub mod probe;
pub mod roles;
mod sendmany;
pub mod shm;
pub mod stages;
pub mod tree;

pub use comm::{
    Communicator, Config, Error, Fallback, Mode, NodePlacement, Path, Report, explain_fail_cause,
};
pub use cutover::{Cutover, CutoverTable};
pub use hostalg::Algorithm;
pub use roles::{Grouping, Layout, LayoutError};
