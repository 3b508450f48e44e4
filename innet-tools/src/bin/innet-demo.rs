//! `cargo xtask demo`: the built-in fabric — 2 TOR bridge hosts × 4 nodes under one SPINE,
//! each node with two CPU sockets and a NIC per socket, each NIC behind an emulated
//! BlueField-style DPU, all in network namespaces, with `innet daemon` on every switch,
//! `innet daemon --role nic` on every node's first NIC and `innet daemon --role dpu` on its
//! DPU. A job of 32 ranks (4 per node, 2 per socket) joins one communicator per mode —
//! inc-node, inc-socket, inc-nic, inc-dpu, auto, host-rd, host-ring — and runs
//! allreduces of several sizes, int32 and float (float sums must come back with the
//! reference's exact bits), each checked on every rank against the host reference.
//! Prints a table and the switches' counters, then tears everything down (also on Ctrl-C
//! or failure).
//!
//! `--link-rate 200mbit` shapes every link, both ways, to that rate, every mode and OpenMPI
//! alike.
//!
//! `--levels 1` puts the 8 nodes under one TOR; `--levels 3` builds a three-tier Clos: 2
//! pods × 2 TORs × 2 nodes, `--aggs` aggregation switches per pod (2) and `--cores` cores
//! (2), with a daemon on every switch of every level.

use std::{path::PathBuf, time::Instant};

use clap::Parser;

use innet::loader::XdpMode;
use innet_client::{Layout, Mode};
use innet_common::proto::{Dtype, Op, element_bytes};
use innet_lab::{
    daemons::{daemons_on, dpu_daemons_on, learn_hosts, nic_daemons_on},
    job::{expected, input, path_name, run_job},
    shaping::LinkRate,
    topology::{Options, Switch, Topology, output},
};
use innet_tools::bench::{latency::Depth, mpi::plain_openmpi};

/// (op, type, bytes, iterations) per mode: the switch paper's small int32 sums, full packets and a
/// message of 12 packets, then float sums, up to a long float64 message.
const RUNS: [(Op, Dtype, usize, usize); 7] = [
    (Op::Sum, Dtype::I32, 4, 400),
    (Op::Sum, Dtype::I32, 256, 400),
    (Op::Sum, Dtype::I32, 1408, 300),
    (Op::Sum, Dtype::I32, 16 * 1024, 60),
    (Op::Sum, Dtype::F32, 256, 300),
    (Op::Sum, Dtype::F64, 1408, 200),
    (Op::Sum, Dtype::F64, 256 * 1024, 4),
];
/// Distinct inputs cycled through (the expected results are computed once each).
const CASES: usize = 4;
/// Timed calls per size of the OpenMPI baseline.
const MPI_ITERATIONS: usize = 100;

/// One mode's result at one of [`RUNS`].
struct Row {
    mode: Mode,
    run: usize,
    path: &'static str,
    avg_us: f64,
    fallbacks: usize,
    correct: usize,
}

/// OpenMPI's average µs for each of [`RUNS`] it has (int32 and float64 SUM), over the
/// demo's fabric with the demo's ranks, launched as on a cluster (one `orted` per node,
/// shared memory within a node, TCP between nodes); an error is printed, and its column
/// stays empty.
fn mpi_over_the_fabric(topo: &Topology, layout: Layout) -> Vec<Option<f64>> {
    let shape = (layout.size / layout.ranks_per_node, layout.ranks_per_node);
    let mut avg = vec![None; RUNS.len()];
    for (dtype, float64) in [(Dtype::I32, false), (Dtype::F64, true)] {
        let sizes: Vec<usize> = RUNS.iter().filter(|r| r.1 == dtype).map(|r| r.2).collect();
        match plain_openmpi(topo, shape, &sizes, MPI_ITERATIONS, float64) {
            Ok(rows) => {
                for (bytes, us) in rows {
                    if let Some(k) = RUNS.iter().position(|r| r.1 == dtype && r.2 == bytes) {
                        avg[k] = Some(us);
                    }
                }
            }
            Err(e) => eprintln!("OpenMPI over the fabric ({}) failed: {e}", dtype.name()),
        }
    }
    avg
}

/// The table: each mode's latency, its speed-up over `host-rd` and over OpenMPI over the
/// same fabric (above 1: faster), and whether every rank got the right result.
fn print_table(table: &[Row], mpi: &[Option<f64>], ranks: usize) {
    println!(
        "\n{:<11} {:<16} {:<13} {:>7} {:>6} {:>10} {:>9} {:>9} {:>8} {:>8}",
        "mode",
        "path",
        "op/type",
        "bytes",
        "iters",
        "avg µs",
        "× host-rd",
        "× OpenMPI",
        "fallback",
        "correct"
    );
    let ratio =
        |base: Option<f64>, avg: f64| base.map_or("-".to_owned(), |b| format!("{:.2}", b / avg));
    for r in table {
        let (op, dtype, bytes, iters) = RUNS[r.run];
        let host_rd = table
            .iter()
            .find(|x| x.mode == Mode::HostRd && x.run == r.run)
            .map(|x| x.avg_us);
        println!(
            "{:<11} {:<16} {:<13} {:>7} {:>6} {:>10.1} {:>9} {:>9} {:>8} {:>8}",
            r.mode.name(),
            r.path,
            format!("{}/{}", op.name(), dtype.name()),
            bytes,
            iters,
            r.avg_us,
            ratio(host_rd, r.avg_us),
            ratio(mpi[r.run], r.avg_us),
            r.fallbacks,
            if r.correct == iters * ranks {
                "yes".to_owned()
            } else {
                format!("{}/{}", r.correct, iters * ranks)
            }
        );
    }
    let mpi_line: Vec<String> = RUNS
        .iter()
        .zip(mpi)
        .filter_map(|(r, m)| {
            m.map(|us| format!("{}/{} {} B: {us:.1} µs", r.0.name(), r.1.name(), r.2))
        })
        .collect();
    println!(
        "OpenMPI, multi-node launch over the fabric: {}",
        mpi_line.join(", ")
    );
    println!(
        "({ranks} ranks; latency as rank 0 sees it; every rank is a thread of this one process, \
         OpenMPI's ranks are processes; all share {} CPUs)",
        std::thread::available_parallelism().map_or(1, usize::from)
    );
}

/// The demo's fabric.
#[derive(Parser)]
#[command(about = "innet demo: every mode on a namespace fabric of 8 nodes, then teardown")]
struct Cli {
    /// Switch levels: 1 (one TOR), 2 (2 TORs under a SPINE) or 3 (2 pods × 2 TORs under
    /// aggregation switches under cores)
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=3))]
    levels: u8,
    /// Aggregation switches per pod (3 levels)
    #[arg(long, default_value_t = 2)]
    aggs: usize,
    /// Core switches (3 levels)
    #[arg(long, default_value_t = 2)]
    cores: usize,
    /// Shape every link, both ways, to this rate (e.g. 200mbit), every mode and OpenMPI
    /// alike: the links bind, as a real cluster's do, rather than the machine's CPUs
    #[arg(long)]
    link_rate: Option<LinkRate>,
}

/// The fabric's switches, bottom up, named for their counters.
fn switches(topo: &Topology) -> Vec<(String, &Switch)> {
    let top = if topo.shape.levels == 3 {
        "CORE"
    } else {
        "SPINE"
    };
    let tors = topo
        .tors
        .iter()
        .enumerate()
        .map(|(t, s)| (format!("TOR {t}"), s));
    let aggs = topo.aggs.iter().enumerate().map(|(g, s)| {
        let (p, a) = (g / topo.shape.aggs, g % topo.shape.aggs);
        (format!("AGG {p}-{a}"), s)
    });
    let upper = topo
        .spines
        .iter()
        .enumerate()
        .map(|(c, s)| (format!("{top} {c}"), s));
    tors.chain(aggs).chain(upper).collect()
}

#[expect(
    clippy::too_many_lines,
    reason = "the demo reads top to bottom: fabric, jobs, table, counters, teardown"
)]
fn main() {
    let cli = Cli::parse();
    innet_lab::tear_down_on_signals("the demo");

    let innet = std::env::var_os("INNET_BIN").map_or_else(innet_lab::innet_bin, PathBuf::from);
    let fabric = Depth {
        levels: cli.levels.into(),
        pods: None,
        aggs: cli.aggs,
        cores: cli.cores,
    };
    let shape = fabric
        .shape(8)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_mode(XdpMode::Native);
    let above = match shape.levels {
        1 => String::new(),
        2 => format!(" + {} SPINE", shape.spines),
        _ => format!(
            " in {} pods, {} aggregation switches per pod, {} cores",
            shape.pods, shape.aggs, shape.spines
        ),
    };
    let links = cli
        .link_rate
        .map_or_else(String::new, |r| format!(", every link shaped to {r}"));
    println!(
        "building the fabric: {} TOR(s) × {} nodes (2 sockets, a NIC each, behind a DPU){above}{links} …",
        shape.tors, shape.hosts_per_tor
    );
    let topo = Topology::with(
        shape,
        Options {
            innet: true,
            dpus: true,
            link_rate: cli.link_rate,
            ..Options::default()
        },
    );
    learn_hosts(&topo);
    let daemons = daemons_on(&topo, &[]);
    println!("starting a NIC daemon on every node (NIC-triggered trees) …");
    let nic_daemons = nic_daemons_on(&topo, &[]);
    println!("starting a DPU daemon on every node's DPU (the same trees on the SmartNICs) …");
    // A node runs one job here: a few groups' maps are enough.
    let dpu_daemons = dpu_daemons_on(&topo, &["--capacity", "8"]);
    let layout = Layout::new(32, 4, 2).expect("layout");
    let answers: Vec<Vec<Vec<u8>>> = RUNS
        .iter()
        .map(|&(op, dtype, bytes, _)| {
            (0..CASES)
                .map(|c| expected(layout.size, c, op, dtype, bytes / element_bytes(op, dtype)))
                .collect()
        })
        .collect();

    println!("running one job of {} ranks per mode …", layout.size);
    let mut table = vec![];
    let mut all_ok = true;
    for mode in [
        Mode::IncNode,
        Mode::IncSocket,
        Mode::IncNic,
        Mode::IncDpu,
        Mode::Auto,
        Mode::HostRd,
        Mode::HostRing,
    ] {
        let rows = run_job(
            &topo,
            layout,
            mode,
            |_| {},
            |comm| {
                let mut rows = vec![];
                for (s, &(op, dtype, bytes, iters)) in RUNS.iter().enumerate() {
                    let count = bytes / element_bytes(op, dtype);
                    let inputs: Vec<Vec<u8>> = (0..CASES)
                        .map(|c| input(comm.rank(), c, op, dtype, count))
                        .collect();
                    let mut recv = vec![0u8; bytes];
                    let (mut correct, mut fallbacks, mut path) = (0, 0, None);
                    let start = Instant::now();
                    for i in 0..iters {
                        let r = comm
                            .allreduce_bytes(&inputs[i % CASES], &mut recv, op, dtype)
                            .unwrap_or_else(|e| panic!("rank {}: {e}", comm.rank()));
                        correct += usize::from(recv == answers[s][i % CASES]);
                        fallbacks += usize::from(r.fallback.is_some());
                        path = Some(r.path);
                    }
                    let avg = start.elapsed().as_secs_f64() * 1e6 / iters as f64;
                    rows.push((bytes, iters, avg, path, fallbacks, correct));
                }
                rows
            },
        );
        for (s, &(_, _, _, iters)) in RUNS.iter().enumerate() {
            let correct: usize = rows.iter().map(|r| r[s].5).sum();
            let fallbacks: usize = rows.iter().map(|r| r[s].4).sum();
            all_ok &= correct == iters * layout.size;
            table.push(Row {
                mode,
                run: s,
                path: rows[0][s].3.map_or("-", path_name),
                avg_us: rows[0][s].2,
                fallbacks,
                correct,
            });
        }
    }
    println!(
        "running unmodified OpenMPI over the same fabric (osu_allreduce; one orted per node, shared memory within a node, TCP between nodes) …"
    );
    let mpi = mpi_over_the_fabric(&topo, layout);
    print_table(&table, &mpi, layout.size);

    for (name, sw) in switches(&topo) {
        let mut cmd = sw.ns.command(innet.to_str().expect("utf-8 path"));
        cmd.args(["stats", "--pin-path"]).arg(sw.pins.layout.root());
        println!("\n{name}: innet stats\n{}", output(&mut cmd));
    }
    let node0 = topo.host(0, 0);
    let mut cmd = node0.ns.command(innet.to_str().expect("utf-8 path"));
    cmd.args(["stats", "--pin-path"])
        .arg(node0.pins.layout.root());
    println!(
        "\nnode 0's NIC (root of the inc-nic tree): innet stats\n{}",
        output(&mut cmd)
    );
    let dpu0 = node0.dpu.as_ref().expect("a DPU");
    let mut cmd = dpu0.ns.command(innet.to_str().expect("utf-8 path"));
    cmd.args(["stats", "--pin-path"])
        .arg(dpu0.pins.layout.root());
    println!(
        "\nnode 0's DPU (root of the inc-dpu tree): innet stats\n{}",
        output(&mut cmd)
    );
    drop(dpu_daemons);
    drop(nic_daemons);
    drop(daemons);
    drop(topo);
    println!("fabric torn down");
    assert!(all_ok, "some allreduces gave wrong results");
}
