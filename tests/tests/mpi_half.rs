//! MPICH's `MPIX_C_FLOAT16` through innet: `half_check` (built here with `mpicc.mpich`)
//! allreduces float16 with SUM, PROD, MIN and MAX on 4 ranks of a fabric of 2 TORs × 2 nodes
//! and a SPINE, and checks every element against its own reduction; the interposer's reports
//! show the switches served every call. Plain MPICH 4.0.2 aborts on these calls (a yaksa
//! pack assertion), so the program runs with the interposer only.

use std::{path::PathBuf, process::Command};

use innet_lab::mpi::{Flavour, MpiRun, Scratch, mpi_fabric, reports};
use innet_mpi::session::LEARN_VAR;

const RANKS: usize = 4;

#[test]
fn mpich_float16_allreduces_go_through_the_switches() {
    innet_lab::require_root();
    let dir = Scratch::new("mpi-half");
    let source =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../innet-mpi/programs/half_check.c");
    let program = dir.0.join("half_check-mpich");
    let built = Command::new("mpicc.mpich")
        .args(["-O2", "-g", "-Wall", "-Werror", "-o"])
        .arg(&program)
        .arg(&source)
        .status()
        .expect("mpicc.mpich");
    assert!(built.success(), "mpicc.mpich {}", source.display());

    let (topo, _daemons) = mpi_fabric(true);
    let out = MpiRun::new(Flavour::Mpich, RANKS, &[program.into()])
        .env(LEARN_VAR, "0")
        .innet(&topo, 1, &dir.0, &dir.reports())
        .run();
    let stdout = String::from_utf8_lossy(&out.stdout);
    // 4 ops × 3 counts, on each of the 4 ranks.
    assert!(
        stdout.contains("half_check: 48 float16 checks passed on 4 ranks"),
        "{stdout}"
    );
    for r in reports(&dir.reports(), RANKS) {
        // The 12 float16 allreduces and the count's int, all through the switches.
        assert_eq!(r.served("allreduce"), 12, "rank {}: {r:?}", r.rank);
        assert_eq!(r.passed("allreduce/datatype"), 0, "rank {}: {r:?}", r.rank);
        assert_eq!(
            (r.fallbacks, r.host + r.local),
            (0, 0),
            "rank {}: {r:?}",
            r.rank
        );
        assert!(r.network >= 12, "rank {}: {r:?}", r.rank);
    }
}
