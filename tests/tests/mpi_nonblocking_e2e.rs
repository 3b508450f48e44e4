//! MPI's non-blocking collectives through innet: `nbc_check` (MPI_Iallreduce, MPI_Ireduce,
//! MPI_Ibcast, MPI_Ibarrier, several outstanding per communicator, completed by every
//! Test/Wait form while the ranks compute, results checked exactly) under `mpirun` with the
//! interposer, on a fabric of 2 TORs × 2 nodes and a SPINE with `innet daemon` on every
//! switch. The rank reports must show every call served through the switches. The
//! application's thread level is its own (`nbc_check --thread` checks what MPI provides and
//! `MPI_Query_thread` says): below `MPI_THREAD_MULTIPLE` innet's requests are completed in
//! the application's own test and wait calls, at it by innet's progress thread. And
//! `nbc_overlap` with the learned cutover on: each non-blocking kind learns its own way on
//! its calls' start-to-completion times, the same on every rank.

use std::ffi::OsString;

use innet_lab::mpi::{Flavour, MpiRun, Nodes, Scratch, mpi_fabric, reports};
use innet_client::policy::Way;
use innet_mpi::{rank_report::Summary, session::LEARN_VAR};

const RANKS: usize = 4;
/// nbc_check's rounds: 4 counts × 9 ways of completing × 2 rounds outstanding at once.
const ROUNDS: u64 = 4 * 9 * 2;
/// `nbc_check`'s command line, started at thread level `thread` (`None`: `MPI_Init`).
fn nbc_check(flavour: Flavour, thread: Option<&str>) -> Vec<OsString> {
    let mut p: Vec<OsString> = vec![flavour.program("nbc_check").into()];
    if let Some(level) = thread {
        p.extend(["--thread".into(), level.into()]);
    }
    p
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every non-blocking call of `nbc_check` went through the switches.
fn assert_served(reports: &[Summary]) {
    for r in reports {
        let served = |k: &str| r.served(k);
        assert_eq!(served("iallreduce"), 4 * ROUNDS, "{r:?}");
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
/// (`MPI_THREAD_SINGLE`: every request completed in the application's calls). Then
/// `nbc_overlap` with the learned cutover on (spinning and sleeping computations, 4 … 64 B):
/// every result right, and each size class of `iallreduce` decided by its own trial, the
/// same way on every rank (printed: the overlap seen; the bench measures it, see
/// docs/mpi.md).
#[test]
fn nonblocking_collectives_run_through_innet_under_openmpi() {
    let (topo, _daemons) = mpi_fabric(true);
    let dir = Scratch::new("nbc-openmpi");
    let flavour = Flavour::OpenMpi;
    let out = MpiRun::new(flavour, RANKS, &nbc_check(flavour, None))
        .multi_node(Nodes::even(&topo, 1))
        .without_placement_file()
        .env(LEARN_VAR, "0")
        .env("INNET_MPI_REPORT", dir.reports())
        .run();
    let text = stdout(&out);
    assert!(text.contains("checks passed on 4 ranks"), "{text}");
    assert_served(&reports(&dir.reports(), RANKS));

    let dir = Scratch::new("nbc-overlap");
    let program: Vec<OsString> = [
        flavour.program("nbc_overlap").into(),
        "-k".into(),
        "iallreduce".into(),
        "-c".into(),
        "spin,sleep".into(),
        "-m".into(),
        "4:64".into(),
        "-i".into(),
        "60".into(),
    ]
    .into();
    let out = MpiRun::new(flavour, RANKS, &program)
        .multi_node(Nodes::even(&topo, 1))
        .without_placement_file()
        .env("INNET_MPI_REPORT", dir.reports())
        .run();
    let text = stdout(&out);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("nbc_overlap"))
        .collect();
    assert_eq!(lines.len(), 5 * 2, "{text}");
    assert!(lines.iter().all(|l| l.ends_with(" wrong=0")), "{text}");
    eprintln!("{}", lines.join("\n"));
    let all = reports(&dir.reports(), RANKS);
    let decisions = |r: &Summary| -> Vec<(u64, u64, Way)> {
        r.cutover
            .iter()
            .filter(|d| d.collective == "iallreduce")
            .map(|d| (d.communicator, d.max_bytes, d.way))
            .collect()
    };
    let first = decisions(&all[0]);
    let classes: Vec<u64> = first.iter().map(|d| d.1).collect();
    for class in [4, 8, 16, 32, 64] {
        assert!(
            classes.contains(&class),
            "no own decision at {class} B: {:?}",
            all[0]
        );
    }
    for r in &all {
        assert_eq!(decisions(r), first, "rank {}: {r:?}", r.rank);
        assert!(r.served("iallreduce") > 0, "{r:?}");
        assert!(
            r.passed("iallreduce/learning") > 0,
            "MPI's trial calls: {r:?}"
        );
    }
}

/// MPICH at `MPI_THREAD_FUNNELED` (requests completed in the application's calls); OpenMPI
/// at `MPI_THREAD_MULTIPLE` (completed by innet's progress thread); and with `INNET_MPI_NONBLOCKING=0` the calls go to MPI,
/// counted as such, the thread level still the application's.
#[test]
fn nonblocking_collectives_at_every_thread_level_under_both_mpis_and_switched_off() {
    let (topo, _daemons) = mpi_fabric(true);
    let dir = Scratch::new("nbc-mpich");
    let flavour = Flavour::Mpich;
    let out = MpiRun::new(flavour, RANKS, &nbc_check(flavour, Some("funneled")))
        .env(LEARN_VAR, "0")
        .innet(&topo, 1, &dir.0, &dir.reports())
        .run();
    let text = stdout(&out);
    assert!(text.contains("checks passed on 4 ranks"), "{text}");
    assert!(
        text.contains("thread level 1 provided, 1 queried"),
        "{text}"
    );
    assert_served(&reports(&dir.reports(), RANKS));

    let dir = Scratch::new("nbc-multiple");
    let flavour = Flavour::OpenMpi;
    let args = nbc_check(flavour, Some("multiple"));
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
    assert_served(&reports(&dir.reports(), RANKS));

    let dir = Scratch::new("nbc-off");
    let out = MpiRun::new(flavour, RANKS, &nbc_check(flavour, Some("serialized")))
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
