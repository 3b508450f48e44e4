//! CI's run of the benchmark plumbing (`innet-bench --smoke`): a tiny sweep on a 4-node
//! namespace fabric (every mode, 1 and 2 ranks per node, 2 sizes), osu_allreduce under
//! a multi-node mpirun over the fabric without the interposer, with it as a user switches it
//! on (learned cutover) and with it serving every size, LAMMPS and PETSc's CG under the
//! same launch with and without the interposer, the XDP cost cases and throughput with small counts, and a second of bystander
//! TCP through a bridge with and without innet, then one size on a fabric whose links are
//! shaped (`--link-rate`). Checks that every measurement is there and verified, that
//! every mode took its own path, and that the report and plots were written. No timing is
//! asserted: speed is what `cargo xtask bench` reports, not what a test checks.

use std::process::Command;

use innet_lab::{require_root, run, unique_id};
use innet_tools::bench::{Results, latency::iterations_for, tables};

#[test]
fn smoke_run_measures_every_case_and_writes_the_report() {
    require_root();
    let out = std::env::temp_dir().join(format!("innet-bench-smoke-{}", unique_id()));
    let _cleanup = Cleanup(out.clone());
    run(
        Command::new(innet_lab::workspace_bin("innet-bench", "innet-tools"))
            .args(["--smoke", "--rounds", "100", "--out"])
            .arg(&out),
    );
    let r: Results =
        serde_json::from_slice(&std::fs::read(out.join("bench.json")).expect("bench.json"))
            .expect("bench.json parses");

    // 4 nodes; 1 ppn: 5 modes (no Socket mode), 2 ppn: 6 modes; 2 sizes each.
    assert_eq!(r.latency.len(), (5 + 6) * 2, "{:#?}", r.latency);
    for row in &r.latency {
        assert_eq!(row.errors, 0, "{row:?}");
        assert_eq!(row.fallbacks, 0, "every mode runs its own path: {row:?}");
        assert_eq!(row.iterations, iterations_for(row.bytes, 20), "{row:?}");
        assert!(row.avg_us > 0.0 && row.p50_us <= row.p99_us, "{row:?}");
        let path = match row.mode.as_str() {
            "host-rd" => "host, rd",
            "host-ring" => "host, ring",
            "inc-node" => "network, node",
            "inc-socket" => "network, socket",
            "inc-nic" | "inc-dpu" => "nic tree",
            m => panic!("unexpected mode {m}"),
        };
        assert_eq!(row.path, path, "{row:?}");
        if row.mode != tables::BASELINE {
            assert!(tables::speedup(&r.latency, &row.mode, 4, row.ppn, row.bytes).is_some());
        }
    }
    // 4 payload sizes × (2 repeat + 3 per-frame) int32 cases, plus 2 per-frame cases per
    // float type wide enough for the payload (float32: 4 sizes, float64: 3, float16: 4), all
    // verdicts and results right.
    // … and a full-size bystander TCP frame through the empty program and the classifier.
    assert_eq!(r.xdp.len(), 4 * 5 + 2 * (4 + 3 + 4) + 2);
    assert_eq!(
        r.xdp.iter().filter(|x| x.case.starts_with("float")).count(),
        22
    );
    assert!(
        r.xdp.iter().all(|x| x.errors == 0 && x.ns_per_pkt > 0.0),
        "{:#?}",
        r.xdp
    );
    assert!(
        r.xdp
            .iter()
            .filter(|x| x.case.starts_with("no-op"))
            .all(|x| (x.ratio_to_noop - 1.0).abs() < 1e-9)
    );
    goodput(&r);
    mpi_over_the_fabric(&r, &out);
    stage_breakdown(&r);
    bystander_tcp(&r);
    applications(&r);
    barrier_and_overlap(&r);
    assert_eq!(r.throughput.len(), 2);
    assert!(r.throughput.iter().all(|t| t.errors == 0 && t.rounds > 0));
    assert!(
        r.programs
            .iter()
            .any(|p| p.name == "innet_switch" && p.verified_insns > 0)
    );

    // The tables' padding squeezed out: rows read `| a | b |`.
    let md = innet_tools::markdown::squeezed(
        &std::fs::read_to_string(out.join("report.md")).expect("report.md"),
    );
    for needle in [
        "## Headline",
        "### 4 nodes",
        "## XDP cost per packet",
        "## Long messages: goodput",
        "| bytes | mode | window ms | busy CPUs |",
        "## innet vs MPI over the same fabric",
        "## Cutover table",
        "## Where the time of a 4 B allreduce goes",
        "| inc-nic |",
        "## The tree on the DPUs",
        "## Bystander traffic",
        "### What skb mode costs innet",
        "## Applications under mpirun",
        "## What a barrier leaves behind",
        "## Non-blocking collectives behind computation",
    ] {
        assert!(md.contains(needle), "report.md lacks {needle:?}:\n{md}");
    }
    for plot in ["latency-4-nodes", "speedup-1ppn", "speedup-2ppn"] {
        for ext in ["svg", "png"] {
            let p = out.join(format!("{plot}.{ext}"));
            let len = std::fs::metadata(&p).map_or(0, |m| m.len());
            assert!(len > 1000, "{} is missing or empty", p.display());
        }
    }
    smoke_run_on_links_that_bind_checks_its_links();
}

/// The applications at 4 × 1: LAMMPS and PETSc's CG, four runs each (warm-up, plain,
/// with innet, plain again), every run finished with its loop's timing; innet served their
/// collectives without falling back; LAMMPS's thermo table is the same text either way.
fn applications(r: &Results) {
    use innet_tools::bench::apps::speeds;
    assert_eq!(r.apps.len(), 2 * 4, "{:#?}", r.apps);
    for row in &r.apps {
        assert_eq!(row.failed, None, "{row:?}");
        assert!(
            row.per_iteration_us > 0.0 && row.iterations == 50,
            "{row:?}"
        );
        assert!(!row.output.is_empty(), "{row:?}");
    }
    for row in r.apps.iter().filter(|r| r.innet) {
        assert!(row.served > 0 && row.fallbacks == 0, "{row:?}");
    }
    let s = speeds(&r.apps);
    assert_eq!(s.len(), 2, "{s:#?}");
    let lammps = s.iter().find(|x| x.app == "lammps").expect("lammps");
    assert!(lammps.identical, "thermo differs: {lammps:?}");
    let cg = s.iter().find(|x| x.app == "petsc-cg").expect("cg");
    assert!(cg.difference < 1e-12, "residuals far apart: {cg:?}");
}

/// Goodput: float64 SUM, host-ring, inc-node and inc-nic at 64 KiB and 1 MiB on 1500 B
/// links, then the in-network modes again on jumbo links (MTU 3506, one XDP buffer's 3392 B
/// payloads), then plain OpenMPI
/// over the fabric at each MTU, exact.
fn goodput(r: &Results) {
    assert_eq!(r.goodput.len(), 3 * 2 + 2 * 2 + 2 * 2, "{:#?}", r.goodput);
    let mpi: Vec<_> = r.goodput.iter().filter(|x| x.mode == "openmpi").collect();
    assert!(
        mpi.len() == 2 * 2 && mpi.iter().all(|x| x.failed.is_none() && x.avg_us > 0.0),
        "{mpi:#?}"
    );
    assert!(
        mpi.iter()
            .any(|x| x.mtu == innet_common::proto::VETH_XDP_MAX_MTU),
        "{mpi:#?}"
    );
    // Every innet case is profiled over its timed calls and the warm-up call before them;
    // the kernel timed the in-network modes' XDP programs.
    for row in r.goodput.iter().filter(|x| x.mode != "openmpi") {
        let cpu = row
            .cpu
            .as_ref()
            .unwrap_or_else(|| panic!("no profile: {row:?}"));
        assert_eq!(cpu.calls, row.iterations + 1, "{row:?}");
        assert!(cpu.wall_ns > 0 && cpu.softirq_ns <= cpu.busy_ns, "{row:?}");
        if row.mode.starts_with("inc-") {
            assert!(cpu.xdp_runs.is_some_and(|n| n > 0), "{row:?}");
        }
    }
    let jumbo: Vec<_> = r
        .goodput
        .iter()
        .filter(|x| x.mtu == innet_common::proto::VETH_XDP_MAX_MTU)
        .collect();
    assert_eq!(jumbo.len(), 2 * 2 + 2, "{jumbo:#?}");
    assert!(jumbo.iter().all(|x| x.mode != "host-ring"), "{jumbo:#?}");
    for row in &r.goodput {
        assert_eq!((row.errors, row.fallbacks), (0, 0), "{row:?}");
        assert_eq!(row.dtype, "float64", "{row:?}");
    }
}

/// TCP through a bridge without innet, with it natively and in skb mode: measured, and the
/// sending port as the kernel left it (a native program turns the veth peer's TSO off; the
/// programs' `xdp.frags` keeps its max MTU above what a single-buffer program allows).
fn bystander_tcp(r: &Results) {
    use innet_tools::bench::bystander::SETTINGS;
    // inc-node and host-rd at 4 B with the switches native, then in skb mode: exact, on
    // the network path.
    assert_eq!(r.switch_modes.len(), 2 * 2, "{:#?}", r.switch_modes);
    for m in &r.switch_modes {
        assert_eq!((m.row.errors, m.row.fallbacks), (0, 0), "{m:?}");
        assert!(m.row.failed.is_none() && m.row.avg_us > 0.0, "{m:?}");
    }
    assert_eq!(r.bystander.len(), SETTINGS.len(), "{:#?}", r.bystander);
    for (row, setting) in r.bystander.iter().zip(SETTINGS) {
        assert_eq!(row.setting, setting);
        assert!(row.failed.is_none() && row.gbit_s > 0.0, "{row:?}");
        let native = setting.ends_with("native");
        assert_eq!(row.sender_tso, !native, "{row:?}");
        assert!(
            row.sender_max_mtu > innet_common::proto::VETH_XDP_MAX_MTU as u64,
            "{row:?}"
        );
    }
}

/// The per-stage breakdown at 4 nodes: inc-node, inc-nic and inc-dpu, every traced call
/// lined up across the leaders, the terms adding up to the total, XDP seen running.
fn stage_breakdown(r: &Results) {
    assert_eq!(r.breakdown.len(), 3, "{:#?}", r.breakdown);
    for row in &r.breakdown {
        assert_eq!((row.errors, row.fallbacks), (0, 0), "{row:?}");
        assert_eq!(
            row.calls, 100,
            "every traced call has every leader's stamps: {row:?}"
        );
        let terms =
            row.library_us + row.wait_peers_us + row.network_us + row.wake_us + row.return_us;
        assert!(
            (terms - row.total_us).abs() < 1e-6 * row.total_us,
            "{row:?}"
        );
        assert!(
            row.total_us > 0.0 && row.network_us > 0.0 && row.send_us > 0.0,
            "{row:?}"
        );
        // Four contributions in, a result out per host at least.
        assert!(
            row.xdp_runs_per_call >= 4.0 && row.xdp_ns_per_run > 0.0,
            "{row:?}"
        );
    }
}

/// Removes the output directory, also when the test fails.
struct Cleanup(std::path::PathBuf);
impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// osu_allreduce under mpirun over the fabric (multi-node launch), OpenMPI, 4 nodes × 1:
/// plain (before and after the interposed runs), with the interposer as a user switches it on (no placement file, the learned
/// cutover) and with it serving every size; 2 sizes each, every run finished (a wrong
/// result aborts it); innet served the interposed ones, and the learned run says which way
/// each size took; the cutover table derived from the plain and innet-alone runs is written.
fn mpi_over_the_fabric(r: &Results, out: &std::path::Path) {
    assert_eq!(r.mpi.len(), 4 * 2, "{:#?}", r.mpi);
    for row in &r.mpi {
        assert_eq!(row.errors, 0, "{row:?}");
        assert_eq!(
            (
                row.transport.as_str(),
                row.launch.as_str(),
                row.nodes,
                row.ppn
            ),
            ("fabric", "multi-node", 4, 1)
        );
        assert!(row.avg_us > 0.0 && row.min_us <= row.max_us, "{row:?}");
        assert!(!row.placement_file, "{row:?}");
        match (row.innet, row.learned) {
            (false, _) => assert_eq!(row.served, 0, "{row:?}"),
            (true, false) => assert!(row.served > 0 && row.fallbacks == 0, "{row:?}"),
            // Every trial sends calls both ways; the decision is in the row.
            (true, true) => {
                assert!(
                    row.served > 0 && row.to_mpi > 0 && row.fallbacks == 0,
                    "{row:?}"
                );
                assert!(
                    matches!(row.way.as_deref(), Some("network" | "mpi")),
                    "{row:?}"
                );
            }
        }
    }
    if let Some(rule) = r.cutover.mpi.first() {
        let table =
            innet_client::CutoverTable::load(&out.join("cutover.toml")).expect("cutover.toml");
        assert_eq!(table.mpi, vec![*rule]);
    }
}

/// barrier_skew's rows and nbc_overlap's, every result right.
fn barrier_and_overlap(r: &Results) {
    assert_eq!(r.barrier.len(), 4, "{:#?}", r.barrier);
    for row in &r.barrier {
        assert_eq!(row.failed, None, "{row:?}");
        assert!(
            row.iterations == 50 && row.next_us > 0.0 && row.skew_us >= 0.0,
            "{row:?}"
        );
    }
    // nbc_overlap: 2 kinds × 4 runs × 5 sizes (4 … 64 B) × 2 computations, results right.
    assert_eq!(r.overlap.len(), 2 * 4 * 5 * 2, "{:#?}", r.overlap);
    for row in &r.overlap {
        assert_eq!((row.failed.as_deref(), row.wrong), (None, 0), "{row:?}");
        assert!(
            row.pure_us > 0.0
                && row.overall_us >= row.compute_us
                && row.iteration_us >= row.overall_us,
            "{row:?}"
        );
    }
}

/// The shaped fabric's plumbing (`--link-rate`): one size of `inc-node` and plain OpenMPI on
/// 4 nodes with every link at 100 Mbit/s. The links were checked with TCP both ways before
/// the runs (each direction near the rate, never above), every result is right, and each
/// case read its busiest link's use from the shaping queues (innet's goodput is bounded
/// by the link, so it cannot use more than the whole link). Shares and ratios are what
/// `cargo xtask bench` reports, not what a test checks. Run after the main smoke run, never
/// beside it: each bench run sets `kernel.bpf_stats_enabled` and restores it when done,
/// which would stop the other's XDP timing (CI run 25).
fn smoke_run_on_links_that_bind_checks_its_links() {
    let out = std::env::temp_dir().join(format!("innet-bench-shaped-{}", unique_id()));
    let _cleanup = Cleanup(out.clone());
    run(
        Command::new(innet_lab::workspace_bin("innet-bench", "innet-tools"))
            .args([
                "--no-latency",
                "--no-xdp",
                "--no-mpi",
                "--no-apps",
                "--no-barrier",
                "--no-overlap",
                "--no-breakdown",
                "--no-bystander",
                "--goodput-nodes",
                "4",
                "--goodput-sizes",
                "1048576",
                "--goodput-iterations",
                "5",
                "--goodput-modes",
                "inc-node",
                "--goodput-mtu",
                "1500",
                "--link-rate",
                "100mbit",
                "--out",
            ])
            .arg(&out),
    );
    let r: Results =
        serde_json::from_slice(&std::fs::read(out.join("bench.json")).expect("bench.json"))
            .expect("bench.json parses");
    let [fabric] = r.link_checks.as_slice() else {
        panic!("one fabric checked: {:#?}", r.link_checks);
    };
    let paths: Vec<&str> = fabric.checks.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "host 0 -> host 7",
            "host 7 -> host 0",
            "TOR 0 -> SPINE 0",
            "SPINE 0 -> TOR 0"
        ]
    );
    for c in &fabric.checks {
        let share = c.bps / fabric.rate_bps as f64;
        assert!((0.85..=1.02).contains(&share), "{c:?}");
    }
    let modes: Vec<&str> = r.goodput.iter().map(|g| g.mode.as_str()).collect();
    assert_eq!(modes, ["inc-node", "openmpi"], "{:#?}", r.goodput);
    for g in &r.goodput {
        assert_eq!(
            (g.errors, g.fallbacks, g.failed.as_ref()),
            (0, 0, None),
            "{g:?}"
        );
        assert_eq!(g.link_bps, Some(100_000_000), "{g:?}");
        let used = g
            .link_use
            .unwrap_or_else(|| panic!("no link reading: {g:?}"));
        assert!(used > 0.0 && used <= 1.05, "{g:?}");
        assert!(g.link_drops.is_some(), "{g:?}");
    }
    let md = innet_tools::markdown::squeezed(
        &std::fs::read_to_string(out.join("report.md")).expect("report.md"),
    );
    for needle in [
        "Every link of the fabric shaped to 100mbit",
        "Share of the link bound:",
        "The busiest link's use over each case",
        "The shaped links checked with TCP before the runs",
    ] {
        assert!(md.contains(needle), "report.md lacks {needle:?}:\n{md}");
    }
}
