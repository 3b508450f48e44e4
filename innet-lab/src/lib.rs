//! innet's lab: a whole fabric emulated on one machine, and the tools that run on it.
//!
//! - the fabric: [`NetNs`] and [`veth`] (namespaces and wires that delete themselves),
//!   [`topology`] (hosts, TOR and SPINE bridges with innet's XDP on their ports, NICs and
//!   BlueField-style DPUs, fault injection on the wires), [`daemons`] (the switch, NIC and
//!   DPU daemons of a fabric), [`job`] (ranks of a job as threads, each in its node's
//!   namespace, every result checked), [`mpi`] (unmodified MPI programs whose ranks run in
//!   their node's namespace);
//! - [`bpf`]: the XDP programs loaded once and run on hand-made frames (`BPF_PROG_TEST_RUN`);
//! - the tools, each a binary of this crate: `innet-demo` (the README's main job),
//!   `innet-bench` ([`bench`]) and `innet-campaign` ([`campaign`]).
//!
//! Everything needs root. What a process builds is torn down when its guards drop, and on
//! Ctrl-C ([`tear_down_on_interrupt`]); a helper that cannot run panics, it never skips.

pub mod bench;
pub mod bpf;
pub mod campaign;
pub mod daemons;
pub mod job;
pub mod mpi;
mod netns;
mod support;
pub mod topology;

pub use netns::{NetNs, PinRoot, exit_torn_down, ip, run, tear_down_on_interrupt, veth};
pub use support::{
    Rng, hex, innet_bin, read_json, require_root, target_dir, unique_id, workspace_bin,
};
