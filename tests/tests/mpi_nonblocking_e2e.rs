//! MPI's non-blocking collectives through innet: `nbc_check` (MPI_Iallreduce, MPI_Ireduce,
//! MPI_Ibcast, MPI_Ibarrier, several outstanding per communicator, completed by every
//! Test/Wait form while the ranks compute, results checked exactly) under `mpirun` with the
//! interposer, on a fabric of 2 TORs × 2 nodes and a SPINE with `innet daemon` on every
//! switch. The rank reports must show every call served through the switches.

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

fn nbc_check(flavour: Flavour, overlap: Option<u64>) -> Vec<OsString> {
    let mut p: Vec<OsString> = vec![flavour.program("nbc_check").into()];
    if let Some(n) = overlap {
        p.extend(["--overlap".into(), n.to_string().into()]);
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

/// The multi-node launch under OpenMPI, placement discovered, learning off; with OSU's
/// overlap measured at 4 … 256 B (printed: see docs/mpi.md for the numbers seen).
#[test]
fn nonblocking_collectives_run_through_innet_under_openmpi() {
    let (topo, _daemons) = mpi_fabric(true);
    let dir = Scratch::new("nbc-openmpi");
    let iterations = 300;
    let flavour = Flavour::OpenMpi;
    let out = MpiRun::new(flavour, RANKS, &nbc_check(flavour, Some(iterations)))
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

/// MPICH completes the generalized requests from innet's progress thread too; and with
/// `INNET_MPI_NONBLOCKING=0` the calls go to MPI, counted as such.
#[test]
fn nonblocking_collectives_under_mpich_and_switched_off() {
    let (topo, _daemons) = mpi_fabric(true);
    let dir = Scratch::new("nbc-mpich");
    let flavour = Flavour::Mpich;
    let out = MpiRun::new(flavour, RANKS, &nbc_check(flavour, None))
        .env(LEARN_VAR, "0")
        .innet(&topo, 1, &dir.0, &dir.reports())
        .run();
    assert!(
        stdout(&out).contains("checks passed on 4 ranks"),
        "{}",
        stdout(&out)
    );
    assert_served(&reports(&dir.reports(), RANKS), 0);

    let dir = Scratch::new("nbc-off");
    let flavour = Flavour::OpenMpi;
    let out = MpiRun::new(flavour, RANKS, &nbc_check(flavour, None))
        .env(LEARN_VAR, "0")
        .env("INNET_MPI_NONBLOCKING", "0")
        .innet(&topo, 1, &dir.0, &dir.reports())
        .run();
    assert!(
        stdout(&out).contains("checks passed on 4 ranks"),
        "{}",
        stdout(&out)
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
