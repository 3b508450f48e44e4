//! innet's lab: a whole fabric emulated on one machine, for the tests and for the tools that
//! run on it (`innet-tools`: the demo, the benchmark, the reliability campaign).
//!
//! - the fabric: [`NetNs`] and [`veth`] (namespaces and wires that delete themselves),
//!   [`topology`] (hosts, TOR and SPINE bridges with innet's XDP on their ports, NICs and
//!   BlueField-style DPUs, fault injection on the wires, [`shaping`]: links that bind at a
//!   rate), [`daemons`] (the switch, NIC and
//!   DPU daemons of a fabric), [`job`] (ranks of a job as threads, each in its node's
//!   namespace, every result checked), [`mpi`] (unmodified MPI programs whose ranks run in
//!   their node's namespace);
//! - [`bpf`]: the XDP programs loaded once and run on hand-made frames (`BPF_PROG_TEST_RUN`);
//! - [`bpf_stats`]: the kernel's BPF run-time statistics, switched on for a measurement and
//!   put back, also on teardown.
//!
//! Everything needs root. What a process builds is torn down when its guards drop, and on
//! SIGINT (Ctrl-C), SIGTERM and SIGHUP ([`tear_down_on_signals`]); the daemons and helpers
//! it starts die with it ([`spawn_tied`], [`die_with_parent`]); and a run that was killed
//! outright is swept by the next one (its names begin with [`run_prefix`] of its pid, its
//! record lies in [`RUNS_DIR`]). A helper that cannot run panics, it never skips.
//!
//! A fabric, its daemons and a checked job, in a few lines (the demo is the long form):
//!
//! ```no_run
//! use innet_client::{Dtype, Layout, Mode, Op};
//! use innet_lab::{
//!     daemons::{daemons_on, learn_hosts},
//!     job::{expected, input, run_job},
//!     topology::{Shape, Topology},
//! };
//!
//! // Two TORs of two nodes under one SPINE, innet's XDP on every switch port.
//! let topo = Topology::new(Shape::small());
//! learn_hosts(&topo);
//! // `innet daemon` on every switch; dropped (stopped) before the fabric.
//! let _daemons = daemons_on(&topo, &[]);
//! let layout = Layout::new(4, 1, 1).expect("4 nodes of 1 rank");
//! let results = run_job(&topo, layout, Mode::IncNode, |_| {}, |comm| {
//!     let send = input(comm.rank(), 0, Op::Sum, Dtype::I32, 64);
//!     let mut recv = vec![0u8; send.len()];
//!     comm.allreduce_bytes(&send, &mut recv, Op::Sum, Dtype::I32).expect("allreduce");
//!     recv
//! });
//! assert!(results.iter().all(|r| *r == expected(4, 0, Op::Sum, Dtype::I32, 64)));
//! ```

pub mod bpf;
pub mod bpf_stats;
pub mod daemons;
pub mod job;
pub mod link_checks;
pub mod mpi;
mod netns;
mod runs;
pub mod shaping;
mod signals;
mod support;
mod teardown;
mod tied;
pub mod topology;
pub mod wire_faults;

pub use netns::{NetNs, PinRoot, ip, run, set_netns, veth};
pub use runs::{RUNS_DIR, start_time};
pub use signals::tear_down_on_signals;
pub use support::{
    Rng, hex, innet_bin, read_json, require_root, target_dir, unique_id, workspace_bin,
};
pub use teardown::exit_torn_down;
pub use teardown::run_prefix;
pub use tied::{die_with_parent, spawn_tied};
