//! Churn: jobs that come and go. Each cycle creates a communicator on every rank (a group
//! on the switches or the NICs), runs one checked allreduce and tears the job down; the
//! modes alternate. The switches and NICs must hold no group afterwards and the daemons'
//! memory must stay flat.

use std::time::{Duration, Instant};

use indicatif::ProgressBar;

use super::{
    ChurnRow,
    fabric::WiredFabric,
    workload::{CASES, Collective, DEFAULT_BOUND, NETWORK_MODES, answers, calls},
};
use innet_lab::job::run_job;

/// `cycles` create/allreduce/kill cycles; the row counts wrong or failed allreduces.
#[must_use]
pub fn run(fabric: &WiredFabric, cycles: usize, progress: &ProgressBar) -> ChurnRow {
    let answers = answers(fabric.layout.size, Collective::Allreduce, &CASES);
    let start = Instant::now();
    let (_, rss_start) = fabric.state();
    let mut wrong = 0;
    for cycle in 0..cycles {
        let mode = NETWORK_MODES[cycle % NETWORK_MODES.len()];
        let tallies = run_job(
            &fabric.topo,
            fabric.layout,
            mode,
            |_| {},
            |comm| {
                calls(
                    comm,
                    1,
                    (Collective::Allreduce, &CASES),
                    &answers,
                    DEFAULT_BOUND,
                    |_, _| {},
                )
            },
        );
        wrong += tallies.iter().map(|t| t.wrong + t.errors).sum::<usize>();
        progress.inc(1);
    }
    // Kills travel as packets: give the last one a moment to land.
    std::thread::sleep(Duration::from_millis(500));
    let (groups_left, rss_end) = fabric.state();
    ChurnRow {
        cycles,
        wrong,
        groups_left,
        daemon_rss_kib_start: rss_start,
        daemon_rss_kib_end: rss_end,
        seconds: start.elapsed().as_secs_f64(),
    }
}
