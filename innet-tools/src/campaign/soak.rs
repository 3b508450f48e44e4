//! Soak: continuous allreduces for a long time. Jobs of every network mode run one after
//! another, each for a batch of checked calls; after each batch the switches' and NICs'
//! groups and the daemons' memory are sampled. Not in CI: `cargo xtask campaign soak`.

use std::time::{Duration, Instant};

use indicatif::ProgressBar;

use super::{
    SoakRow,
    fabric::WiredFabric,
    workload::{CASES, Collective, DEFAULT_BOUND, NETWORK_MODES, answers, calls},
};
use innet_lab::job::run_job;

/// Runs for `length`, `batch` calls per job; a row per job.
#[must_use]
pub fn run(
    fabric: &WiredFabric,
    length: Duration,
    batch: usize,
    progress: &ProgressBar,
) -> Vec<SoakRow> {
    let answers = answers(fabric.layout.size, Collective::Allreduce, &CASES);
    let start = Instant::now();
    let mut rows = vec![];
    let (mut total, mut wrong, mut errors) = (0, 0, 0);
    let mut job = 0;
    while start.elapsed() < length {
        let mode = NETWORK_MODES[job % NETWORK_MODES.len()];
        job += 1;
        let tallies = run_job(
            &fabric.topo,
            fabric.layout,
            mode,
            |_| {},
            |comm| {
                calls(
                    comm,
                    batch,
                    (Collective::Allreduce, &CASES),
                    &answers,
                    DEFAULT_BOUND,
                    |_, _| {},
                )
            },
        );
        total += batch * tallies.len();
        wrong += tallies.iter().map(|t| t.wrong).sum::<usize>();
        errors += tallies.iter().map(|t| t.errors).sum::<usize>();
        let (groups_installed, daemon_rss_kib) = fabric.state();
        rows.push(SoakRow {
            seconds: start.elapsed().as_secs_f64(),
            calls: total,
            wrong,
            errors,
            groups_installed,
            daemon_rss_kib,
        });
        progress.set_position(start.elapsed().as_secs().min(length.as_secs()));
        progress.set_message(format!("{total} allreduces, {wrong} wrong"));
    }
    rows
}
