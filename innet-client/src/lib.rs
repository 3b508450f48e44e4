//! innet's host runtime, the library applications and the MPI interposer link: a
//! communicator of ranks and its allreduce, which runs through the switches (Node or Socket
//! mode of the switch paper), through NIC or DPU trees (the NIC paper) or, when the network cannot help,
//! with host algorithms — the same result either way; the [`Report`] says which. It holds
//! no loader, daemon or CLI (those are `innet-user`).
//!
//! A rank joins with what its launcher provides — its number and an allgather, a
//! [`Bootstrap`] — and innet finds where each node sits; then it reduces typed buffers:
//!
//! ```no_run
//! use innet_client::{Communicator, Discovery, Mode, Op, bootstrap::Threads};
//! # fn main() -> Result<(), innet_client::Error> {
//! # let boot = Threads::group(1).pop().unwrap();
//! // `boot`: this rank's Bootstrap (MPI's allgather, a PMIx or TCP store, `Threads` …).
//! let mut comm = Communicator::bootstrap(42, &boot, &Discovery::new(Mode::Auto))?;
//! let mut sum = [0i32; 3];
//! let report = comm.allreduce(&[1, 2, 3], &mut sum, Op::Sum)?;
//! println!("{:?}", report.path);
//! # Ok(()) }
//! ```
//!
//! A job that knows its placement builds the [`Config`] itself ([`Config::new`] with a
//! [`Layout`] and a [`NodePlacement`] per node); one that holds untyped buffers (the MPI
//! interposer) calls [`Communicator::allreduce_bytes`].
//!
//! Inside, a collective goes from the communicator (`comm`: its modes and fallbacks) to
//! the node's leader (`local`, `shm`), which reduces with the other leaders through its INC
//! socket (`endpoint`, `inbox`, sending through a `wire`, set up by `handshake` over the
//! switches `tree` chose) or host to host (`hostalg`), and back. docs/architecture.md tells the whole way; the
//! `test-hooks` feature opens these modules to innet's own tests, lab and fuzzers.

/// Declares internal modules: private, or `#[doc(hidden)] pub` under `test-hooks` (no
/// stability promise) for innet's tests, lab and fuzzers.
macro_rules! internal {
    ($($m:ident),* $(,)?) => {$(
        #[cfg(feature = "test-hooks")]
        #[doc(hidden)]
        pub mod $m;
        #[cfg(not(feature = "test-hooks"))]
        mod $m;
    )*};
}

mod assembly;
pub mod bootstrap;
mod comm;
pub mod cutover;
mod element;
pub mod layout;
pub mod policy;
mod sendmany;

internal!(
    dpu, endpoint, frames, handshake, hostalg, inbox, inc_socket, local, nic, probe, roles, shm,
    stages, tree, wire,
);

pub use bootstrap::{Bootstrap, BootstrapError, Discovery};
pub use comm::{
    Config, DEFAULT_PIPE, DEFAULT_SPIN, Error, Fallback, Mode, NodePlacement, PATIENCE_SHARE, Path,
    QUICK_LOSS_CALLS, Refusals, Report, explain_fail_cause,
};
pub use comm::{handle::Communicator, progress::Request};
pub use cutover::{Cutover, CutoverTable};
pub use element::{Element, Loc};
/// The crate of the half element types ([`half::f16`], [`half::bf16`]), at the version the
/// [`Element`] implementations are for.
pub use half;
pub use handshake::{GroupParams, HandshakeError};
pub use hostalg::Algorithm;
pub use innet_common::{
    proto::{Dtype, Op},
    reduce::ReduceError,
};
pub use layout::{Order, Strided};
pub use nic::TreeError;
pub use roles::{Grouping, Layout, LayoutError};
pub use stages::{CallStamps, Stage};
