//! Floats and long messages end to end, on the campaign's wired fabric (2 TORs × 2 nodes × 2
//! sockets, 1 SPINE, switch and NIC daemons, 8 ranks):
//! - float sums whose value depends on the order of additions come back with the same bits
//!   on every rank and in every run, whatever the wires drop, duplicate or delay;
//! - float16 and bfloat16 SUM, PROD, MIN and MAX come back bit for bit as the reference
//!   computes them (exact inputs; MIN/MAX also on NaN, ∞, subnormals and signed zeros);
//! - a 16 MiB float64 allreduce streams through the switches under loss and is exact.

use std::{sync::Mutex, time::Duration};

use innet_client::{
    Communicator, Mode, Path,
    frames::swap_order,
    half::{bf16, f16},
};
use innet_common::{
    fault::{KIND_CONTRIBUTION, KIND_RESULT},
    proto::{Dtype, Op, element_bytes},
    reduce::{reduce_all, same_result},
};
use innet_lab::wire_faults::Faults;
use innet_lab::{
    Rng,
    job::{checked_allreduce, expected, input, run_job},
};
use innet_tools::campaign::{fabric::WiredFabric, loss::Place};

/// The two tests take turns: each builds a fabric of 8 ranks, daemons and wires on this
/// machine's 2 CPUs, and the first asserts that no rank falls back to the hosts under
/// faults, which a leader starved of CPU by the other test's 16 MiB stream can (seen once
/// in four runs of this file in one session: rank 0 fell back in `inc-socket`).
static ONE_FABRIC_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Elements whose sum depends on the order of additions: magnitudes 10⁻²⁰ … 10²⁰ of both
/// signs, different on every rank (native order).
fn hard_input(rank: usize, op: Op, dtype: Dtype, count: usize) -> Vec<u8> {
    let mut rng = Rng(0x5eed_0f10_a700_0000 + rank as u64);
    let mut out = Vec::with_capacity(count * element_bytes(op, dtype));
    for _ in 0..count {
        // Products of values near 1: wide magnitudes would overflow (binary16 always).
        let v = rng.order_sensitive(op != Op::Prod && dtype != Dtype::F16);
        match dtype {
            Dtype::F16 => out.extend_from_slice(&f16::from_f64(v).to_ne_bytes()),
            Dtype::BF16 => out.extend_from_slice(&bf16::from_f64(v).to_ne_bytes()),
            Dtype::F32 => out.extend_from_slice(&(v as f32).to_ne_bytes()),
            _ => out.extend_from_slice(&v.to_ne_bytes()),
        }
    }
    out
}

/// Every rank's results of `calls` allreduces of its [`hard_input`] in `mode`, and whether
/// every call went through the network.
fn run(
    fabric: &WiredFabric,
    mode: Mode,
    (op, dtype): (Op, Dtype),
    count: usize,
    calls: usize,
) -> Vec<(Vec<Vec<u8>>, bool)> {
    run_job(
        &fabric.topo,
        fabric.layout,
        mode,
        |cfg| {
            cfg.retry = Duration::from_millis(10);
            cfg.max_tries = 30;
        },
        |comm: &mut Communicator| {
            let send = hard_input(comm.rank(), op, dtype, count);
            let mut all_network = true;
            let results = (0..calls)
                .map(|_| {
                    let mut recv = vec![0u8; send.len()];
                    let r = comm
                        .allreduce_bytes(&send, &mut recv, op, dtype)
                        .unwrap_or_else(|e| panic!("rank {}: {e}", comm.rank()));
                    all_network &= matches!(r.path, Path::Network(_) | Path::NicTree);
                    recv
                })
                .collect();
            (results, all_network)
        },
    )
}

/// Sets `faults` on every host link and uplink.
fn set_everywhere(fabric: &WiredFabric, faults: Faults) {
    fabric.set(Place::Host, faults);
    fabric.set(Place::Uplink, faults);
}

/// Drops, duplicates and delays (reordering) on every host link and uplink.
fn storm(fabric: &WiredFabric, rate: f64) {
    set_everywhere(
        fabric,
        Faults {
            kinds: KIND_CONTRIBUTION | KIND_RESULT,
            drop: rate,
            duplicate: rate,
            delay: 2.0 * rate,
            delay_for: Duration::from_millis(3),
        },
    );
}

#[test]
fn float_results_do_not_depend_on_arrival_order_or_loss() {
    innet_lab::require_root();
    let _turn = ONE_FABRIC_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let fabric = WiredFabric::new();
    for mode in [Mode::IncNode, Mode::IncSocket, Mode::IncNic] {
        for (op, dtype) in [
            (Op::Sum, Dtype::F64),
            (Op::Sum, Dtype::F32),
            (Op::Prod, Dtype::F64),
            (Op::Sum, Dtype::F16),
            (Op::Sum, Dtype::BF16),
        ] {
            let count = 2 * 1408 / dtype.width() + 17; // three packets per leader
            set_everywhere(&fabric, Faults::default());
            let calm = run(&fabric, mode, (op, dtype), count, 3);
            let reference = calm[0].0[0].clone();
            let what = format!("{mode} {op:?} {dtype:?}");
            for (rank, (results, network)) in calm.iter().enumerate() {
                assert!(network, "{what}: rank {rank} fell back without faults");
                for r in results {
                    assert_eq!(r, &reference, "{what}: rank {rank} differs without faults");
                }
            }
            // The order matters for these inputs: rank order and reverse rank order differ.
            let wire: Vec<Vec<u8>> = (0..fabric.layout.size)
                .map(|r| {
                    let mut b = hard_input(r, op, dtype, count);
                    swap_order(op, dtype, &mut b);
                    b
                })
                .collect();
            let forward = reduce_all(op, dtype, &wire);
            let backward = reduce_all(op, dtype, &wire.iter().rev().collect::<Vec<_>>());
            assert_ne!(
                forward, backward,
                "{what}: inputs whose sum depends on the order"
            );
            let before = fabric.injected(Place::Host) + fabric.injected(Place::Uplink);
            storm(&fabric, 0.05);
            let stormy = run(&fabric, mode, (op, dtype), count, 20);
            let injected = fabric.injected(Place::Host) + fabric.injected(Place::Uplink) - before;
            assert!(injected > 0, "{what}: faults were injected");
            for (rank, (results, network)) in stormy.iter().enumerate() {
                assert!(network, "{what}: rank {rank} fell back under faults");
                for (call, r) in results.iter().enumerate() {
                    assert_eq!(
                        r, &reference,
                        "{what}: rank {rank}, call {call}: other bits under reordering and loss"
                    );
                }
            }
            eprintln!("{what}: 23 calls × 8 ranks, same bits, {injected} packets faulted");
        }
    }
    set_everywhere(&fabric, Faults::default());
}

/// Random half values (native order), a quarter of them IEEE edges: signed zeros, the
/// smallest subnormal, infinities, quiet and signalling NaNs.
fn half_edge_input(rank: usize, dtype: Dtype, count: usize) -> Vec<u8> {
    let mut rng = Rng(0x5eed_0f16_0000_0000 + rank as u64);
    let (inf, qnan) = if dtype == Dtype::F16 {
        (0x7c00, 0x7e00)
    } else {
        (0x7f80, 0x7fc0)
    };
    let edges: [u16; 7] = [0, 0x8000, 1, inf, 0x8000 | inf, qnan, inf | 1];
    (0..count)
        .flat_map(|_| {
            let r = rng.next_u64();
            let bits = if r.is_multiple_of(4) {
                edges[(r >> 8) as usize % edges.len()]
            } else {
                (r >> 16) as u16
            };
            bits.to_ne_bytes()
        })
        .collect()
}

#[test]
fn half_floats_through_the_switches_match_the_reference() {
    innet_lab::require_root();
    let _turn = ONE_FABRIC_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let fabric = WiredFabric::new();
    let cases: Vec<(Op, Dtype)> = [Dtype::F16, Dtype::BF16]
        .into_iter()
        .flat_map(|d| [Op::Sum, Op::Prod, Op::Min, Op::Max].map(|op| (op, d)))
        .collect();
    // One element, one packet's worth, three packets.
    let counts = [1, 700, 2 * 1408 / 2 + 17];
    for mode in [Mode::IncNode, Mode::IncSocket, Mode::IncNic] {
        let paths = run_job(
            &fabric.topo,
            fabric.layout,
            mode,
            |_| {},
            |comm: &mut Communicator| {
                let mut paths = vec![];
                for (k, &(op, dtype)) in cases.iter().enumerate() {
                    for (j, count) in counts.into_iter().enumerate() {
                        // Exact inputs: the reference's bits whatever the tree's order.
                        let case = k * counts.len() + j;
                        paths.push(checked_allreduce(comm, case, op, dtype, count).path);
                    }
                    if matches!(op, Op::Min | Op::Max) {
                        // MIN/MAX do not depend on the order: any bits, NaN's payload aside.
                        let count = counts[2];
                        let send = half_edge_input(comm.rank(), dtype, count);
                        let mut recv = vec![0u8; send.len()];
                        let r = comm
                            .allreduce_bytes(&send, &mut recv, op, dtype)
                            .unwrap_or_else(|e| panic!("rank {}: {e}", comm.rank()));
                        let wire = |mut b: Vec<u8>| {
                            swap_order(op, dtype, &mut b);
                            b
                        };
                        let parts: Vec<Vec<u8>> = (0..comm.size())
                            .map(|r| wire(half_edge_input(r, dtype, count)))
                            .collect();
                        let want = reduce_all(op, dtype, &parts).expect("reference");
                        assert!(
                            same_result(op, dtype, &wire(recv), &want),
                            "rank {}: {op:?} {dtype:?} on edge values",
                            comm.rank()
                        );
                        paths.push(r.path);
                    }
                }
                paths
            },
        );
        for (rank, p) in paths.iter().enumerate() {
            assert!(
                p.iter()
                    .all(|p| matches!(p, Path::Network(_) | Path::NicTree)),
                "{mode}: rank {rank} did not go through the network: {p:?}"
            );
        }
        eprintln!(
            "{mode}: {} half allreduces × {} ranks, the reference's bits",
            paths[0].len(),
            paths.len()
        );
    }
}

#[test]
fn sixteen_mib_of_float64_stream_through_the_switches_under_loss() {
    innet_lab::require_root();
    let _turn = ONE_FABRIC_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let fabric = WiredFabric::new();
    let (op, dtype) = (Op::Sum, Dtype::F64);
    let count = (16 << 20) / 8;
    let want = expected(fabric.layout.size, 0, op, dtype, count);
    fabric.set(
        Place::Host,
        Faults {
            kinds: KIND_CONTRIBUTION | KIND_RESULT,
            drop: 0.01,
            ..Faults::default()
        },
    );
    let reports = run_job(
        &fabric.topo,
        fabric.layout,
        Mode::IncNode,
        |cfg| cfg.timeout = Duration::from_mins(1),
        |comm: &mut Communicator| {
            let send = input(comm.rank(), 0, op, dtype, count);
            let mut recv = vec![0u8; send.len()];
            let r = comm
                .allreduce_bytes(&send, &mut recv, op, dtype)
                .unwrap_or_else(|e| panic!("rank {}: {e}", comm.rank()));
            (recv == want, r)
        },
    );
    let dropped = fabric.injected(Place::Host);
    fabric.set(Place::Host, Faults::default());
    assert!(dropped > 100, "packets were dropped: {dropped}");
    let resent: u32 = reports.iter().map(|(_, r)| r.retransmissions).sum();
    for (rank, (exact, r)) in reports.iter().enumerate() {
        assert!(exact, "rank {rank}: the 16 MiB result is wrong");
        assert!(matches!(r.path, Path::Network(_)), "rank {rank}: {r:?}");
    }
    assert!(resent > 0, "lost packets were resent");
    eprintln!("16 MiB float64 SUM over 8 ranks: exact, {dropped} packets dropped, {resent} resent");
}
