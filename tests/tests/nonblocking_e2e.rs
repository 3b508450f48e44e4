//! The non-blocking allreduce end to end: ranks in namespaces, `innet daemon` on every
//! switch, several requests outstanding per communicator (one packet and several), a
//! blocking allreduce started among them, completion while the ranks compute. Every result
//! is checked against the host reference on every rank, and every collective must have gone
//! through the switches.

use std::time::{Duration, Instant};

use innet::loader::XdpMode;
use innet_client::{Grouping, Layout, Mode, Path, Report};
use innet_common::proto::{Dtype, Op};
use innet_lab::{
    daemons::{daemons_on, learn_hosts},
    job::{self, BYTES, checked_allreduce, run_job},
    topology::{Shape, Topology},
};

fn fabric() -> Topology {
    // A failing test shows what the client library logged.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("innet_client=debug")
        .with_test_writer()
        .try_init();
    let topo = Topology::new(Shape {
        tors: 2,
        hosts_per_tor: 2,
        sockets: 1,
        spines: 1,
        mode: XdpMode::Native,
        ..Shape::small()
    });
    learn_hosts(&topo);
    topo
}

const CASES: [(Op, Dtype); 4] = [
    (Op::Sum, Dtype::I32),
    (Op::Max, Dtype::F64),
    (Op::Bxor, Dtype::U16),
    (Op::Minloc, Dtype::F32),
];

/// Starts every case at every size at once, a blocking allreduce among them, computes,
/// then waits in reverse order; returns the reports of all of them.
fn outstanding_then_wait(layout: Layout) -> Vec<Vec<Report>> {
    let topo = fabric();
    let _daemons = daemons_on(&topo, &[]);
    run_job(
        &topo,
        layout,
        Mode::IncNode,
        |_| {},
        |comm| {
            let rank = comm.rank();
            let mut reqs = vec![];
            let mut reports = vec![];
            for (case, &(op, dtype)) in CASES.iter().enumerate() {
                for bytes in BYTES {
                    let count = job::count(op, dtype, bytes);
                    let buf = job::input(rank, case, op, dtype, count);
                    let want = job::expected(comm.size(), case, op, dtype, count);
                    let req = comm.iallreduce_bytes(buf, op, dtype).expect("started");
                    reqs.push((req, want, (op, dtype, count)));
                }
                if case == 1 {
                    // Runs after the requests started so far, before the later ones.
                    reports.push(checked_allreduce(comm, 99, Op::Sum, Dtype::I64, 3));
                    for (req, ..) in &reqs {
                        assert!(req.test(), "rank {rank}: a request started earlier is open");
                    }
                }
            }
            // Compute (sleep) without touching the requests: the progress thread finishes
            // them meanwhile.
            let t0 = Instant::now();
            while !reqs.iter().all(|(r, ..)| r.test()) {
                assert!(
                    t0.elapsed() < Duration::from_secs(20),
                    "rank {rank}: no progress"
                );
                std::thread::sleep(Duration::from_millis(2));
            }
            for (req, want, what) in reqs.into_iter().rev() {
                let (got, r) = req.wait();
                let r = r.unwrap_or_else(|e| panic!("rank {rank}: {what:?}: {e}"));
                assert_eq!(got, want, "rank {rank}: {what:?} ({r:?})");
                reports.push(r);
            }
            reports
        },
    )
}

fn assert_network(reports: &[Vec<Report>]) {
    for (rank, rs) in reports.iter().enumerate() {
        assert_eq!(rs.len(), 1 + CASES.len() * BYTES.len());
        for r in rs {
            assert_eq!(r.path, Path::Network(Grouping::Node), "rank {rank}: {r:?}");
            assert_eq!(r.fallback, None, "rank {rank}: {r:?}");
        }
    }
}

#[test]
fn outstanding_requests_of_four_nodes_complete_through_the_switches() {
    assert_network(&outstanding_then_wait(
        Layout::new(4, 1, 1).expect("layout"),
    ));
}

/// Two ranks per node: the node's ranks meet in shared memory, run by each rank's progress
/// thread, and the leader's progress thread takes the node's part through the switches.
#[test]
fn two_ranks_per_node_progress_through_shared_memory_and_the_switches() {
    assert_network(&outstanding_then_wait(
        Layout::new(8, 2, 1).expect("layout"),
    ));
}

/// Overlap: a rank that starts an allreduce and does something else for longer than the
/// collective takes (here: sleeps, leaving the CPU to the progress thread; the machine's 2
/// CPUs are shared by every rank) finds it done without having waited.
#[test]
fn a_started_allreduce_finishes_while_the_ranks_are_away() {
    let topo = fabric();
    let _daemons = daemons_on(&topo, &[]);
    let layout = Layout::new(4, 1, 1).expect("layout");
    let done_early = run_job(
        &topo,
        layout,
        Mode::IncNode,
        |_| {},
        |comm| {
            let rank = comm.rank() as i32;
            let mut early = 0;
            for k in 0..50 {
                // Start together, as after a barrier.
                checked_allreduce(comm, 7, Op::Sum, Dtype::I32, 1);
                let req = comm
                    .iallreduce(vec![rank + k; 16], Op::Sum)
                    .expect("started");
                std::thread::sleep(Duration::from_millis(5));
                early += usize::from(req.test());
                let (sum, r) = req.wait();
                assert_eq!(sum, vec![6 + 4 * k; 16], "rank {rank}: {r:?}");
                assert_eq!(r.expect("done").path, Path::Network(Grouping::Node));
            }
            early
        },
    );
    for (rank, early) in done_early.iter().enumerate() {
        assert!(
            *early >= 40,
            "rank {rank}: {early} of 50 done before the wait"
        );
    }
}
