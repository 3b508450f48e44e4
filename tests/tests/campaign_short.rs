//! CI's short form of the reliability campaign (`cargo xtask campaign` runs the full one):
//! every mode under drops, duplicates and delays at 1 % and 20 % on the host links and on
//! the uplinks, 40 allreduces per rank and setting; on a three-level fabric (2 pods × 2
//! TORs × 2 nodes × 2 sockets, 2 aggregation switches per pod, 2 cores), `inc-node` and
//! `inc-socket` under each fault at 1 % on the host links, 5 % on the TOR–aggregation
//! uplinks and 20 % on the aggregation–core uplinks, 20 allreduces per rank and setting; a 16 MiB allreduce without loss and at
//! 1 % drops with 16 slots on 1500 B links and with 64 slots on 9000 B links, 3 per rank
//! and setting; allgather, reduce-scatter and non-blocking allreduce (`inc-node`, drops and
//! duplicates at 20 % on the host links and on the uplinks, 20 calls per rank and setting),
//! then 100 group churn cycles, then a
//! long-running MPI program whose group a TOR, then the SPINE, loses. The
//! campaign exits non-zero on any wrong result, hang, failed call or group left behind;
//! this test also reads its JSON and checks that every setting ran and faults were injected.

use innet_common::proto::JUMBO_MTU;
use innet_tools::campaign::run_built;

#[test]
fn short_campaign_has_no_wrong_result_hang_or_leak() {
    let (status, r) = run_built(&["all", "--short"]);
    assert!(status.success(), "the campaign failed: {status}");
    // 2 places × 3 faults × 2 rates × 6 modes, then 3 kinds of link × 3 faults × 2 modes
    // on the three-level fabric, 3 other collectives × 2 places × 2 faults, then 2 fabrics
    // × 2 rates of the long message.
    assert_eq!(r.loss.len(), 72 + 18 + 12 + 4, "every setting ran");
    for collective in ["allgather", "reduce_scatter_block", "iallreduce"] {
        let rows: Vec<_> = r
            .loss
            .iter()
            .filter(|l| l.collective == collective)
            .collect();
        assert_eq!(rows.len(), 4, "{collective}: 2 places × 2 faults");
        assert!(rows.iter().all(|l| l.mode == "inc-node"), "{rows:?}");
        let faulted: u64 = rows.iter().map(|l| l.faults_injected).sum();
        assert!(faulted > 0, "{collective} rows were faulted: {rows:?}");
    }
    let three: Vec<_> = r.loss.iter().filter(|l| l.levels == 3).collect();
    assert_eq!(three.len(), 18, "the three-level slice ran");
    for (place, rate) in [
        ("host links", 0.01),
        ("level-1 uplinks", 0.05),
        ("level-2 uplinks", 0.2),
    ] {
        let rows: Vec<_> = three.iter().filter(|l| l.place == place).collect();
        assert_eq!(rows.len(), 6, "{place}: 3 faults × 2 modes");
        for l in &rows {
            assert!((l.rate - rate).abs() < 1e-9, "{l:?}");
            assert_eq!(l.ranks, 16, "{l:?}");
        }
        let faulted: u64 = rows.iter().map(|l| l.faults_injected).sum();
        assert!(faulted > 0, "{place} were faulted: {rows:?}");
    }
    assert_eq!(
        r.loss.iter().filter(|l| l.mode == "inc-dpu").count(),
        12,
        "the DPU mode at every loss setting"
    );
    for l in &r.loss {
        assert_eq!((l.wrong, l.hangs, l.errors), (0, 0, 0), "{l:?}");
        let calls = match (l.bytes, l.levels) {
            _ if l.collective != "allreduce" => 20,
            (0, 3) => 20,
            (0, _) => 40,
            _ => 3,
        };
        assert_eq!(l.calls, calls, "{l:?}");
    }
    let long: Vec<_> = r.loss.iter().filter(|l| l.bytes == 16 << 20).collect();
    for (window, mtu) in [(None, None), (Some(64), Some(JUMBO_MTU))] {
        assert_eq!(
            long.iter()
                .filter(|l| (l.window, l.mtu) == (window, mtu))
                .count(),
            2,
            "window {window:?}, MTU {mtu:?}: {long:?}"
        );
    }
    let faulted: u64 = r.loss.iter().map(|l| l.faults_injected).sum();
    assert!(faulted > 1000, "faults were injected: {faulted}");
    assert_eq!(
        r.vanish.len(),
        3,
        "a control run, then a TOR and the SPINE lost the group"
    );
    for v in &r.vanish {
        assert!(v.ran && (v.control || v.set_up_again), "{v:?}");
        assert_eq!(v.wrong, 0, "{v:?}");
        assert!(v.calls > 100 && v.served > 0, "{v:?}");
    }
    let churn = &r.churn[0];
    assert_eq!(
        (churn.cycles, churn.wrong, churn.groups_left),
        (100, 0, 0),
        "{churn:?}"
    );
}
