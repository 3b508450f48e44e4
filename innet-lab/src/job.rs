//! Runs a job of ranks on a [`Topology`]: one thread per rank, each inside the namespace of
//! its node's port (its CPU socket's NIC in Socket layouts), each with its own
//! [`Communicator`]. Inputs are a pure function of (rank, case), so every rank can compute
//! the expected result itself.

use std::sync::atomic::{AtomicU64, Ordering};

use innet_client::{
    Communicator, Config, Layout, Mode, Path, Report,
    frames::swap_order,
    half::{bf16, f16},
};
use innet_common::{
    proto::{Dtype, Op, element_bytes},
    reduce::reduce_all,
};

use crate::topology::Topology;

/// A fresh job id (node-local socket names and the group id derive from it): the process
/// id in the top bits, so a Ctrl-C handler can find this process's socket files.
#[must_use]
pub fn job_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    u64::from(std::process::id()) << 40
        | (NEXT.fetch_add(1, Ordering::Relaxed) & 0xffff) << 24
        | u64::from(nanos) & 0xff_ffff
}

/// Runs `body` on every rank of a job of `layout` in `mode` on the fabric's first nodes
/// (after `tweak` adjusted each rank's config); returns each rank's output, in rank order.
/// Panics name the rank.
pub fn run_job<T: Send>(
    topo: &Topology,
    layout: Layout,
    mode: Mode,
    tweak: impl Fn(&mut Config) + Sync,
    body: impl Fn(&mut Communicator) -> T + Sync,
) -> Vec<T> {
    run_job_as(topo, job_id(), layout, mode, tweak, body)
}

/// [`run_job`] with the job id `job` (what a forger outside the job may know).
pub fn run_job_as<T: Send>(
    topo: &Topology,
    job: u64,
    layout: Layout,
    mode: Mode,
    tweak: impl Fn(&mut Config) + Sync,
    body: impl Fn(&mut Communicator) -> T + Sync,
) -> Vec<T> {
    // The job runs on the fabric's first nodes.
    let mut placement = topo.placement();
    placement.truncate(layout.size / layout.ranks_per_node);
    let per_socket = layout.ranks_per_node / layout.sockets_per_node.max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..layout.size)
            .map(|rank| {
                let node = rank / layout.ranks_per_node;
                let socket = if layout.sockets_per_node == topo.shape.sockets {
                    (rank % layout.ranks_per_node) / per_socket
                } else {
                    0
                };
                let host = topo.host(node, socket);
                let (placement, tweak, body) = (placement.clone(), &tweak, &body);
                s.spawn(move || {
                    host.ns.enter();
                    let mut cfg = Config::new(job, rank, layout, placement);
                    cfg.mode = mode;
                    tweak(&mut cfg);
                    let mut comm = Communicator::new(cfg)
                        .unwrap_or_else(|e| panic!("rank {rank}: joining: {e}"));
                    body(&mut comm)
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| h.join().unwrap_or_else(|_| panic!("rank {rank} panicked")))
            .collect()
    })
}

/// The input of `rank` for case `case`: `count` native-order elements (MINLOC/MAXLOC: value
/// and the rank as location). Values collide across ranks often, so ties are exercised.
#[must_use]
pub fn input(rank: usize, case: usize, op: Op, dtype: Dtype, count: usize) -> Vec<u8> {
    let w = dtype.width();
    let mut out = Vec::with_capacity(count * element_bytes(op, dtype));
    for i in 0..count {
        let v = (rank * 7 + i * 13 + case * 5) % 23;
        if dtype.is_float() {
            // Values every summation order gets exactly: small integers, and for PROD
            // powers of two (±1/2 … ±4; the half types ±1/2 … ±2, so that no order of a
            // product over dozens of ranks leaves binary16's range), so any tree shape must
            // give the reference's bits.
            let x = if op == Op::Prod {
                let big = if dtype.is_half() { 2.0 } else { 4.0 };
                let p = [1.0, -1.0, 2.0, 0.5, -2.0, big, 1.0, -0.5][v % 8];
                if (rank + i + case).is_multiple_of(5) {
                    1.0
                } else {
                    p
                }
            } else {
                v as f64 - 11.0
            };
            match dtype {
                Dtype::F16 => out.extend_from_slice(&f16::from_f64(x).to_ne_bytes()),
                Dtype::BF16 => out.extend_from_slice(&bf16::from_f64(x).to_ne_bytes()),
                Dtype::F32 => out.extend_from_slice(&(x as f32).to_ne_bytes()),
                _ => out.extend_from_slice(&x.to_ne_bytes()),
            }
        } else {
            // Small values keep PROD meaningful; logical ops see zeros.
            let be: Vec<u8> = (0..w)
                .map(|b| if b + 1 == w { v as u8 } else { 0 })
                .collect();
            let mut native = be;
            if cfg!(target_endian = "little") {
                native.reverse();
            }
            out.extend_from_slice(&native);
        }
        if op.carries_location() {
            out.extend_from_slice(&(rank as i32).to_ne_bytes());
        }
    }
    out
}

/// The expected allreduce of every rank's [`input`], native order.
#[must_use]
pub fn expected(size: usize, case: usize, op: Op, dtype: Dtype, count: usize) -> Vec<u8> {
    let to_wire = |mut b: Vec<u8>| {
        swap_order(op, dtype, &mut b);
        b
    };
    let parts: Vec<Vec<u8>> = (0..size)
        .map(|r| to_wire(input(r, case, op, dtype, count)))
        .collect();
    let result = reduce_all(op, dtype, &parts).expect("reference");
    to_wire(result)
}

/// How reports and tables name a collective's path.
#[must_use]
pub fn path_name(p: Path) -> &'static str {
    p.name()
}

/// One allreduce of case `case`, checked against the reference; returns its report.
pub fn checked_allreduce(
    comm: &mut Communicator,
    case: usize,
    op: Op,
    dtype: Dtype,
    count: usize,
) -> Report {
    let send = input(comm.rank(), case, op, dtype, count);
    let mut recv = vec![0u8; send.len()];
    let report = comm
        .allreduce_bytes(&send, &mut recv, op, dtype)
        .unwrap_or_else(|e| panic!("rank {}: {op:?}/{dtype:?} × {count}: {e}", comm.rank()));
    assert_eq!(
        recv,
        expected(comm.size(), case, op, dtype, count),
        "rank {}: {op:?}/{dtype:?} × {count} ({report:?})",
        comm.rank()
    );
    report
}

/// Message sizes of the sweeps: one element, one full packet, several packets.
pub const BYTES: [usize; 3] = [4, 1408, 4500];

/// Elements of `op`/`dtype` in about `bytes` bytes (at least one).
#[must_use]
pub fn count(op: Op, dtype: Dtype, bytes: usize) -> usize {
    (bytes / element_bytes(op, dtype)).max(1)
}

/// Every op × type MPI defines it on.
#[must_use]
pub fn all_cases() -> Vec<(Op, Dtype)> {
    Op::ALL
        .into_iter()
        .flat_map(|op| {
            Dtype::ALL
                .into_iter()
                .filter(move |d| op.defined_on(*d))
                .map(move |d| (op, d))
        })
        .collect()
}

/// Runs `cases` (op, type) at every size of [`BYTES`] in `mode`, each result checked;
/// returns each rank's reports.
pub fn sweep(
    topo: &Topology,
    layout: Layout,
    mode: Mode,
    tweak: impl Fn(&mut Config) + Sync,
    cases: &[(Op, Dtype)],
) -> Vec<Vec<Report>> {
    run_job(topo, layout, mode, tweak, |comm| {
        let mut reports = vec![];
        for (k, &(op, dtype)) in cases.iter().enumerate() {
            for (j, bytes) in BYTES.into_iter().enumerate() {
                let case = k * BYTES.len() + j;
                reports.push(checked_allreduce(
                    comm,
                    case,
                    op,
                    dtype,
                    count(op, dtype, bytes),
                ));
            }
        }
        reports
    })
}
