//! CI's short form of the hostile campaign (`cargo xtask campaign hostile` runs the full
//! one): on a two-level and a three-level wired fabric, a host outside a running job of
//! library ranks forges contributions and results (plain, with IPv4 options, behind a VLAN
//! 0 tag, in fragments), scans wire ids, forges host-to-host frames (from a leader's
//! address and from its own), floods the control plane with queries (and, as the floor,
//! the same frames to a port no one serves) and tries to take the job's group over by its
//! wire id, one row each, 2 s per row; then the same but the host-frame forgeries against
//! an MPI job (`steady_allreduce`, the interposer preloaded). The campaign exits non-zero
//! on a wrong result, more than 1 % of the collectives off the network, or an attack that
//! no counter named; this test also reads its JSON and checks that every row ran.

use innet_tools::campaign::{
    hostile::{Attack, Job},
    run_built,
};

#[test]
fn short_hostile_campaign_keeps_the_job_exact_and_on_the_network() {
    let (status, r) = run_built(&["hostile", "--seconds", "2"]);
    assert!(status.success(), "the campaign failed: {status}");
    for levels in [2, 3] {
        let rows: Vec<_> = r.hostile.iter().filter(|h| h.levels == levels).collect();
        for job in [Job::Library, Job::Mpi] {
            let faced = Attack::ALL.iter().filter(|&&a| job.faces(a)).count();
            assert_eq!(
                rows.iter().filter(|h| h.job == job.name()).count(),
                faced,
                "{levels} levels: every attack on {} ran",
                job.name()
            );
        }
        for h in rows {
            assert!(h.ran && h.calls > 100, "{h:?}");
            assert_eq!(h.wrong, 0, "{h:?}");
            assert!(h.off_network * 100 <= h.calls, "{h:?}");
            if !h.control {
                assert!(
                    h.frames_sent > 0 && h.counted > 0,
                    "the attack ran and was named: {h:?}"
                );
            }
        }
    }
}
