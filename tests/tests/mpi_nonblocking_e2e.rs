//! MPI's non-blocking collectives through innet: `nbc_check` (MPI_Iallreduce, MPI_Ireduce,
//! MPI_Ibcast, MPI_Ibarrier, several outstanding per communicator, completed by every
//! Test/Wait form while the ranks compute, results checked exactly) under `mpirun` with the
//! interposer, on a fabric of 2 TORs × 2 nodes and a SPINE with `innet daemon` on every
//! switch. The rank reports must show every call served through the switches. The
//! application's thread level is its own (`nbc_check --thread` checks what MPI provides and
//! `MPI_Query_thread` says): below `MPI_THREAD_MULTIPLE` innet's requests are completed in
//! the application's own test and wait calls, at it by innet's progress thread.

use std::ffi::OsString;

use innet_lab::mpi::{Flavour, MpiRun, Nodes, Scratch, mpi_fabric, reports};
use innet_mpi::{report::Summary, session::LEARN_VAR};

const RANKS: usize = 4;
/// nbc_check's rounds: 4 counts × 9 ways of completing × 2 rounds outstanding at once.
const ROUNDS: u64 = 4 * 9 * 2;
/// Its overlap runs: 7 sizes × 2 loops × (iterations + a tenth of warm-up).
fn overlap_calls(iterations: u64) -> u64 {
    7 * 2 * (iterations + iterations / 10)
}

/// `nbc_check`'s command line: overlap runs of `overlap` iterations (`sleep`: the compute
/// sleeps), started at thread level `thread` (`None`: `MPI_Init`).
fn nbc_check(
    flavour: Flavour,
    overlap: Option<u64>,
    sleep: bool,
    thread: Option<&str>,
) -> Vec<OsString> {
    let mut p: Vec<OsString> = vec![flavour.program("nbc_check").into()];
    if let Some(n) = overlap {
        p.extend(["--overlap".into(), n.to_string().into()]);
    }
    if sleep {
        p.push("--sleep".into());
    }
    if let Some(level) = thread {
        p.extend(["--thread".into(), level.into()]);
    }
    p
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every non-blocking call of `nbc_check` went through the switches: `iallreduce` calls
/// beyond its rounds' are the overlap runs'.
fn assert_served(reports: &[Summary], iallreduce: u64) {
    for r in reports {
        let served = |k: &str| r.served(k);
        assert_eq!(served("iallreduce"), 4 * ROUNDS + iallreduce, "{r:?}");
        for k in ["ireduce", "ibcast", "ibarrier"] {
            assert_eq!(served(k), ROUNDS, "rank {}: {k}: {r:?}", r.rank);
        }
        // The blocking allreduce started among them, once per round.
        assert!(served("allreduce") >= ROUNDS, "{r:?}");
        assert!(r.passed.is_empty(), "rank {}: handed to MPI: {r:?}", r.rank);
        assert_eq!(r.fallbacks, 0, "rank {}: {r:?}", r.rank);
        assert_eq!(r.host + r.local + r.nic_tree, 0, "rank {}: {r:?}", r.rank);
    }
}

/// The multi-node launch under OpenMPI, placement discovered, learning off, `MPI_Init`
/// (`MPI_THREAD_SINGLE`: every request completed in the application's calls); with OSU's
/// overlap measured at 4 … 256 B (printed: see docs/mpi.md for the numbers seen).
#[test]
fn nonblocking_collectives_run_through_innet_under_openmpi() {
    let (topo, _daemons) = mpi_fabric(true);
    let dir = Scratch::new("nbc-openmpi");
    let iterations = 300;
    let flavour = Flavour::OpenMpi;
    let out = MpiRun::new(
        flavour,
        RANKS,
        &nbc_check(flavour, Some(iterations), false, None),
    )
    .multi_node(Nodes::even(&topo, 1))
    .without_placement_file()
    .env(LEARN_VAR, "0")
    .env("INNET_MPI_REPORT", dir.reports())
    .run();
    let text = stdout(&out);
    assert!(text.contains("checks passed on 4 ranks"), "{text}");
    let overlaps: Vec<&str> = text.lines().filter(|l| l.starts_with("overlap")).collect();
    assert_eq!(overlaps.len(), 7, "{text}");
    eprintln!("{}", overlaps.join("\n"));
    assert_served(&reports(&dir.reports(), RANKS), overlap_calls(iterations));
}

/// MPICH at `MPI_THREAD_FUNNELED` (requests completed in the application's calls); OpenMPI
/// at `MPI_THREAD_MULTIPLE` (completed by innet's progress thread), with a compute that
/// sleeps in the overlap runs; and with `INNET_MPI_NONBLOCKING=0` the calls go to MPI,
/// counted as such, the thread level still the application's.
#[test]
fn nonblocking_collectives_at_every_thread_level_under_both_mpis_and_switched_off() {
    let (topo, _daemons) = mpi_fabric(true);
    let dir = Scratch::new("nbc-mpich");
    let flavour = Flavour::Mpich;
    let out = MpiRun::new(
        flavour,
        RANKS,
        &nbc_check(flavour, None, false, Some("funneled")),
    )
    .env(LEARN_VAR, "0")
    .innet(&topo, 1, &dir.0, &dir.reports())
    .run();
    let text = stdout(&out);
    assert!(text.contains("checks passed on 4 ranks"), "{text}");
    assert!(
        text.contains("thread level 1 provided, 1 queried"),
        "{text}"
    );
    assert_served(&reports(&dir.reports(), RANKS), 0);

    let dir = Scratch::new("nbc-multiple");
    let flavour = Flavour::OpenMpi;
    let iterations = 100;
    let args = nbc_check(flavour, Some(iterations), true, Some("multiple"));
    let out = MpiRun::new(flavour, RANKS, &args)
        .env(LEARN_VAR, "0")
        .innet(&topo, 1, &dir.0, &dir.reports())
        .run();
    let text = stdout(&out);
    assert!(text.contains("checks passed on 4 ranks"), "{text}");
    assert!(
        text.contains("thread level 3 provided, 3 queried"),
        "{text}"
    );
    eprintln!(
        "{}",
        text.lines()
            .filter(|l| l.starts_with("overlap"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_served(&reports(&dir.reports(), RANKS), overlap_calls(iterations));

    let dir = Scratch::new("nbc-off");
    let out = MpiRun::new(
        flavour,
        RANKS,
        &nbc_check(flavour, None, false, Some("serialized")),
    )
    .env(LEARN_VAR, "0")
    .env("INNET_MPI_NONBLOCKING", "0")
    .innet(&topo, 1, &dir.0, &dir.reports())
    .run();
    let text = stdout(&out);
    assert!(text.contains("checks passed on 4 ranks"), "{text}");
    assert!(
        text.contains("thread level 2 provided, 2 queried"),
        "{text}"
    );
    for r in reports(&dir.reports(), RANKS) {
        for k in ["iallreduce", "ireduce", "ibcast", "ibarrier"] {
            assert_eq!(r.served(k), 0, "{r:?}");
        }
        assert_eq!(r.passed("iallreduce/disabled"), 4 * ROUNDS, "{r:?}");
        assert_eq!(r.passed("ibarrier/disabled"), ROUNDS, "{r:?}");
        assert!(
            r.served("allreduce") >= ROUNDS,
            "blocking ones still served: {r:?}"
        );
    }
}
