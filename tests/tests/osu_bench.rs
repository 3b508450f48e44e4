//! The bench's real-OSU section end to end (`innet-bench --osu`): OSU's own `osu_ibarrier`
//! and `osu_allgather` under the multi-node launch on a 4-node fabric, plain MPI before
//! and after, and MPI with innet's interposer, 2 sizes, 20 iterations. Checks that every
//! run finished and was read, that the rows pair both sides with the ratio and the
//! interposer's counts of the benchmark's collective, and that the report has the section.
//! No timing is asserted.
//!
//! OSU is in no registry CI reaches, so this test needs OSU built from a source tree you
//! provide (`cargo xtask osu --source PATH`): it is `#[ignore]`d, listed as ignored in
//! every run, and runs with `cargo test -p innet-tests --test osu_bench -- --ignored`.

use std::{path::PathBuf, process::Command};

use innet_lab::{require_root, run, unique_id};
use innet_tools::bench::Results;

/// Where `cargo xtask osu` puts the binaries.
fn osu_dir() -> PathBuf {
    let dir = innet_lab::target_dir()
        .parent()
        .expect("target/<profile> has a parent")
        .join("osu");
    for t in ["ibarrier", "allgather"] {
        let bin = dir.join("openmpi").join(format!("osu_{t}"));
        assert!(
            bin.is_file(),
            "{} is missing: build OSU with `cargo xtask osu --source PATH` (an unpacked \
             osu-micro-benchmarks-7.x tarball)",
            bin.display()
        );
    }
    dir
}

#[test]
#[ignore = "needs OSU built from its source: cargo xtask osu --source PATH, then --ignored"]
fn osu_section_runs_both_sides_and_counts_what_innet_served() {
    require_root();
    let osu = osu_dir();
    let out = std::env::temp_dir().join(format!("innet-bench-osu-{}", unique_id()));
    let _cleanup = Cleanup(out.clone());
    run(
        Command::new(innet_lab::workspace_bin("innet-bench", "innet-tools"))
            .args([
                "--no-latency",
                "--no-goodput",
                "--no-xdp",
                "--no-mpi",
                "--no-breakdown",
                "--no-bystander",
                "--osu-tests",
                "ibarrier,allgather",
                "--osu-shapes",
                "4x1",
                "--osu-sizes",
                "4:8",
                "--osu-iterations",
                "20",
                "--osu-warmup",
                "2",
                "--osu",
            ])
            .arg(&osu)
            .arg("--out")
            .arg(&out),
    );
    let r: Results =
        serde_json::from_slice(&std::fs::read(out.join("bench.json")).expect("bench.json"))
            .expect("bench.json parses");
    // ibarrier: one sizeless row; allgather: 4 and 8 B.
    let keys: Vec<(&str, usize)> = r.osu.iter().map(|x| (x.test.as_str(), x.bytes)).collect();
    assert_eq!(keys, [("ibarrier", 0), ("allgather", 4), ("allgather", 8)]);
    for row in &r.osu {
        assert!(row.failed.is_empty(), "{row:#?}");
        assert_eq!(
            (row.nodes, row.ppn, row.launch.as_str()),
            (4, 1, "multi-node")
        );
        assert!(row.osu_version.starts_with('7'), "{row:?}");
        let sides = [&row.mpi, &row.innet, &row.mpi_again];
        assert!(
            sides
                .iter()
                .all(|s| s.as_ref().is_some_and(|t| t.latency_us > 0.0)),
            "{row:#?}"
        );
        let (mpi, innet) = (row.mpi_us.unwrap(), row.innet.as_ref().unwrap().latency_us);
        assert!((row.ratio.unwrap() - mpi / innet).abs() < 1e-9, "{row:?}");
        // 22 warm-up and timed calls per size: the barrier's twice (pure, overlapped),
        // allgather's at 2 sizes.
        assert_eq!(row.calls, 2 * 22, "{row:?}");
        assert!(row.served + row.passed <= row.calls, "{row:?}");
        assert!(row.to_mpi <= row.passed, "{row:?}");
        if row.test == "ibarrier" {
            let t = row.innet.as_ref().unwrap();
            assert!(t.overlap_pct.is_some() && t.overall_us.is_some(), "{t:?}");
            assert!(row.target.is_some() && row.met.is_some(), "{row:?}");
        } else {
            // The gather targets are stated at 16 nodes × 1.
            assert_eq!((row.target.as_deref(), row.met), (None, None), "{row:?}");
        }
    }
    let md = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    for needle in [
        "## Real OSU micro-benchmarks",
        "### osu_ibarrier, 4 nodes × 1, openmpi",
        "### osu_allgather, 4 nodes × 1, openmpi",
        "`allgather` calls per rank",
    ] {
        assert!(md.contains(needle), "report.md lacks {needle:?}:\n{md}");
    }
    // Every run's output is kept beside the report.
    assert!(
        out.join("osu/allgather-openmpi-4x1-innet/stdout.txt")
            .is_file()
    );
}

/// Removes the output directory, also when the test fails.
struct Cleanup(PathBuf);
impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
