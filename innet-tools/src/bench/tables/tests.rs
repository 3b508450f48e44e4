use super::*;
use crate::{bench::STANDARD_MTU, markdown::squeezed};

fn row(mode: &str, nodes: usize, ppn: usize, bytes: usize, avg_us: f64) -> LatencyRow {
    LatencyRow {
        mode: mode.into(),
        path: "-".into(),
        dtype: "int32".into(),
        nodes,
        ppn,
        ranks: nodes * ppn,
        bytes,
        iterations: 10,
        avg_us,
        p50_us: avg_us,
        p99_us: avg_us,
        errors: 0,
        fallbacks: 0,
        retransmissions: 0,
        failed: None,
        mtu: STANDARD_MTU,
        link_bps: None,
        link_loss: None,
        link_use: None,
        link_drops: None,
        window: None,
        levels: 2,
        cpu: None,
    }
}

#[test]
fn goodput_gives_each_element_type_its_own_column() {
    let typed = |dtype: &str, avg_us| LatencyRow {
        dtype: dtype.into(),
        ..row("inc-node", 4, 1, 1 << 20, avg_us)
    };
    let rows = [
        typed("float64", 8_000.0),
        typed("int64", 4_000.0),
        typed("int32", 2_000.0),
    ];
    let t = squeezed(&goodput_table(&rows));
    assert!(
        t.contains("| bytes | inc-node | inc-node (int64) | inc-node (int32) |"),
        "{t}"
    );
    assert!(t.contains("| 1048576 | 131.1 | 262.1 | 524.3 |"), "{t}");
}

#[test]
fn goodput_is_bytes_over_time_next_to_host_ring() {
    // The goodput sweep's type: float64 (another type would be named in the labels).
    let rows: Vec<LatencyRow> = [
        row("host-ring", 4, 1, 1 << 20, 10_000.0),
        row("inc-node", 4, 1, 1 << 20, 5_000.0),
    ]
    .into_iter()
    .map(|r| LatencyRow {
        dtype: "float64".into(),
        ..r
    })
    .collect();
    let t = squeezed(&goodput_table(&rows));
    assert!(
        t.contains("| 1048576 | 104.9 | 209.7 (2.00× ring) |"),
        "{t}"
    );
    // 1 MiB in 1408 B packets: the ring's 6 messages of 256 KiB take 187 each, 1122
    // per 10 ms call; the network's 745 per 5 ms call.
    assert!(t.contains("| 1048576 | 112.2 | 149.0 |"), "{t}");
}

/// A float64 goodput row at `mtu`.
fn gp(mode: &str, nodes: usize, mtu: usize, avg_us: f64) -> LatencyRow {
    LatencyRow {
        dtype: "float64".into(),
        mtu,
        ..row(mode, nodes, 1, 1 << 20, avg_us)
    }
}

#[test]
fn in_network_columns_are_ratios_to_openmpi_at_the_same_mtu_and_nodes() {
    let rows = vec![
        gp("host-ring", 4, STANDARD_MTU, 10_000.0),
        gp("inc-node", 4, STANDARD_MTU, 5_000.0),
        gp("inc-node", 4, 3506, 2_000.0),
        gp("openmpi", 4, STANDARD_MTU, 4_000.0),
        gp("openmpi", 4, 3506, 3_000.0),
        // Another node count: its own table, its own MPI.
        gp("host-ring", 16, STANDARD_MTU, 40_000.0),
        gp("inc-node", 16, STANDARD_MTU, 10_000.0),
        gp("openmpi", 16, STANDARD_MTU, 20_000.0),
    ];
    let md = squeezed(&goodput_section(&rows));
    assert!(
        md.contains(
            "| bytes | host-ring | inc-node | inc-node (MTU 3506) | openmpi | openmpi (MTU 3506) |"
        ),
        "{md}"
    );
    // inc-node at 1500 B: 10 ms / 5 ms ring, 4 ms / 5 ms MPI at 1500; at 3506 B: its
    // own MPI's 3 ms / 2 ms; OpenMPI itself only against the ring.
    assert!(
        md.contains(
            "| 1048576 | 104.9 | 209.7 (2.00× ring, 0.80× MPI) | 524.3 (5.00× ring, 1.50× MPI) \
             | 262.1 (2.50× ring) | 349.5 (3.33× ring) |"
        ),
        "{md}"
    );
    assert!(md.contains("### 16 nodes × 1 rank per node"), "{md}");
    assert!(
        md.contains("| 1048576 | 26.2 | 104.9 (4.00× ring, 2.00× MPI) | 52.4 (2.00× ring) |"),
        "{md}"
    );
    assert!(md.contains("](goodput.svg)") && md.contains("](goodput-16-nodes.svg)"));
}

#[test]
fn on_a_shaped_fabric_each_case_gets_its_share_of_the_link_bound() {
    // 200 Mbit/s: 25 MB/s a link. 1 MiB at 4 nodes: inc-node's bound is 25 MB/s (52.4 ms
    // a call at most 1 MiB/25 MB/s = 41.9 ms: 0.80), the ring's and OpenMPI's 25 / 1.5.
    let shaped = |mode, avg_us| LatencyRow {
        link_bps: Some(200_000_000),
        link_loss: None,
        link_use: None,
        link_drops: None,
        ..gp(mode, 4, STANDARD_MTU, avg_us)
    };
    let call = (1u64 << 20) as f64 / 25e6 * 1e6;
    let rows = vec![
        shaped("host-ring", call * 1.5 / 0.75),
        shaped("inc-node", call / 0.8),
        shaped("openmpi", call * 1.5 / 0.5),
    ];
    let md = squeezed(&goodput_section(&rows));
    assert!(md.contains("shaped to 200mbit in both directions"), "{md}");
    assert!(md.contains("Share of the link bound:"), "{md}");
    assert!(md.contains("| 1048576 | 0.75 | 0.80 | 0.50 |"), "{md}");
    // Unshaped rows: no such table.
    let plain = vec![gp("inc-node", 4, STANDARD_MTU, 5_000.0)];
    assert!(!goodput_section(&plain).contains("link bound"));
}

#[test]
fn where_the_cpu_goes_is_per_leader_packet_and_says_what_it_lacks() {
    let mut profiled = gp("inc-node", 4, STANDARD_MTU, 5_000.0);
    // 1 MiB of float64 in 1408 B packets: 745 a leader per call; 4 leaders × 10
    // calls = 29,800 packets.
    profiled.cpu = Some(crate::bench::cpu::CpuCost {
        calls: 10,
        wall_ns: 50_000_000,
        busy_ns: 89_400_000,
        softirq_ns: 29_800_000,
        xdp_ns: Some(5_960_000),
        xdp_runs: Some(89_400),
    });
    let mut unread = gp("host-ring", 4, STANDARD_MTU, 10_000.0);
    unread.cpu = Some(crate::bench::cpu::CpuCost {
        calls: 10,
        wall_ns: 100_000_000,
        busy_ns: 0,
        softirq_ns: 0,
        xdp_ns: None,
        xdp_runs: None,
    });
    let mut mpi = gp("openmpi", 4, STANDARD_MTU, 4_000.0);
    mpi.cpu = Some(crate::bench::cpu::CpuCost {
        calls: 10,
        wall_ns: 2_000_000_000,
        busy_ns: 1_500_000_000,
        softirq_ns: 500_000_000,
        xdp_ns: None,
        xdp_runs: None,
    });
    let rows = vec![
        profiled,
        unread,
        gp("inc-nic", 4, STANDARD_MTU, 6_000.0),
        mpi,
    ];
    let t = squeezed(&cpu_table(&rows));
    // 89.4 ms / 29,800 = 3000 ns, 1000 softirq, 2000 rest; XDP 200 ns, 7%, 3 runs.
    assert!(
        t.contains(
            "| 1048576 | inc-node | 50.0 | 1.79 | 149.0 | 3000 | 1000 | 2000 | 200 | 7% | 3.0 |"
        ),
        "{t}"
    );
    assert!(
        t.contains("| 1048576 | host-ring | 100.0 | 0.00 | 112.2 | 0 | 0 | 0 | not read | – | – |"),
        "{t}"
    );
    assert!(t.contains("inc-nic 1048576 B: not profiled"), "{t}");
    // MPI: busy CPUs over its whole mpirun, no per-packet cells.
    assert!(
        t.contains("| 1048576 | openmpi | 2000.0 | 0.75 | – | – | – | – | – | – | – |"),
        "{t}"
    );
    assert!(
        t.contains("`openmpi`: its window is its whole mpirun"),
        "{t}"
    );
    assert!(!t.contains("NaN") && !t.contains("inf"), "{t}");
}

#[test]
fn rows_without_a_profile_still_load() {
    let mut r = gp("inc-node", 4, STANDARD_MTU, 5_000.0);
    let mut json = serde_json::to_value(&r).expect("json");
    assert!(json.get("cpu").is_none(), "{json}");
    json.as_object_mut().expect("object").remove("levels");
    let back: LatencyRow = serde_json::from_value(json).expect("an old row");
    assert!(back.cpu.is_none());
    r.cpu = Some(crate::bench::cpu::CpuCost::default());
    let again: LatencyRow =
        serde_json::from_str(&serde_json::to_string(&r).expect("json")).expect("row");
    assert_eq!(again.cpu, r.cpu);
}

#[test]
fn speedups_are_ratios_to_host_rd_at_the_same_point() {
    let rows = vec![
        row("host-rd", 16, 1, 4, 300.0),
        row("inc-node", 16, 1, 4, 100.0),
        row("inc-node", 16, 2, 4, 50.0),
        row("host-rd", 4, 1, 4, 90.0),
    ];
    assert_eq!(speedup(&rows, "inc-node", 16, 1, 4), Some(3.0));
    // No baseline at 2 ppn: no speed-up rather than a wrong one.
    assert_eq!(speedup(&rows, "inc-node", 16, 2, 4), None);
    assert_eq!(headline(&rows), Some((16, 2)));
    let md = squeezed(&headline_table(&rows));
    assert!(md.contains("| 4 | n/a | n/a | 50.0 | n/a | n/a |"), "{md}");
}

#[test]
fn a_case_that_did_not_finish_is_a_row_with_its_error() {
    let mut failed = row("host-ring", 4, 1, 1 << 22, 0.0);
    failed.failed = Some("rank 2: 4194304 B: timed out".into());
    let rows = vec![row("inc-node", 4, 1, 1 << 22, 100.0), failed];
    let t = squeezed(&goodput_table(&rows));
    assert!(t.contains("**failed**"), "{t}");
    assert!(!t.contains("inf") && !t.contains("NaN"), "{t}");
    let f = failed_cases(&rows);
    assert!(
        f.contains("host-ring 4×1 4194304 B: rank 2: 4194304 B: timed out"),
        "{f}"
    );
    assert_eq!(failed_cases(&rows[..1]), "");
}

#[test]
fn report_marks_fallbacks_and_errors() {
    let mut bad = row("inc-nic", 4, 1, 4, 10.0);
    bad.fallbacks = 3;
    bad.errors = 1;
    let r = Results {
        latency: vec![row("host-rd", 4, 1, 4, 20.0), bad],
        ..Results::default()
    };
    let md = markdown(&r);
    assert!(md.contains("10.0 (2.00×) †3 ✗1"), "{md}");
}
