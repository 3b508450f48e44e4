//! A long-running MPI program loses its group on the switches: `steady_allreduce` (4 nodes,
//! one rank each, the interposer preloaded, MPI's own traffic over the fabric) runs
//! allreduces back to back while the campaign deletes the job's group on a TOR (the next
//! contribution comes back unaggregated) or on the SPINE (the results stop coming: a
//! timeout). The program counts its calls per 100 ms window; the time the event cost is
//! the calls missing against the run's own steady rate.

use std::{
    ffi::OsString,
    time::{Duration, Instant},
};

use innet::group::GroupMaps;

use super::{VanishRow, fabric::Fabric};
use crate::{
    mpi::{Flavour, MpiRun, reports},
    topology::Switch,
};

/// Where the group is deleted (`Nowhere`: the control run, whose time lost is the
/// measure's noise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Where {
    Nowhere,
    Tor,
    Spine,
}

impl Where {
    pub const ALL: [Self; 3] = [Self::Nowhere, Self::Tor, Self::Spine];

    fn name(self) -> &'static str {
        match self {
            Self::Nowhere => "nothing (control run)",
            Self::Tor => "innet group del on a TOR",
            Self::Spine => "innet group del on the SPINE",
        }
    }

    fn switch(self, fabric: &Fabric) -> &Switch {
        match self {
            Self::Nowhere | Self::Tor => &fabric.topo.tors[0],
            Self::Spine => &fabric.topo.spines[0],
        }
    }
}

/// How long each run lasts.
const RUN: Duration = Duration::from_secs(6);
/// How long after the job's group appears it is deleted.
const AFTER: Duration = Duration::from_secs(2);

fn groups_on(sw: &Switch) -> Vec<u32> {
    GroupMaps::open(&sw.pins.layout)
        .and_then(|m| m.list())
        .map(|l| l.iter().map(|g| g.id).collect())
        .unwrap_or_default()
}

/// Waits (up to `limit`) until `sw` holds a group not in `old`; returns it.
fn new_group(sw: &Switch, old: &[u32], limit: Duration) -> Option<u32> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(g) = groups_on(sw).into_iter().find(|g| !old.contains(g)) {
            return Some(g);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

/// One run per place.
#[must_use]
pub fn run(fabric: &Fabric) -> Vec<VanishRow> {
    Where::ALL.iter().map(|&w| run_one(fabric, w)).collect()
}

fn run_one(fabric: &Fabric, place: Where) -> VanishRow {
    let topo = &fabric.topo;
    let flavour = Flavour::OpenMpi;
    let dir = std::env::temp_dir().join(format!("innet-vanish-{}", crate::unique_id()));
    let reports_dir = dir.join("reports");
    std::fs::create_dir_all(&reports_dir).expect("the scratch directory");
    let nodes = topo.hosts.iter().filter(|h| h.socket == 0).count();
    let program: Vec<OsString> = vec![
        flavour.program("steady_allreduce").into(),
        "-t".into(),
        format!("{}", RUN.as_secs_f64()).into(),
    ];
    let mpirun = MpiRun::new(flavour, nodes, &program)
        .over_fabric(topo, 1)
        .env(innet_mpi::session::LEARN_VAR, "0")
        .innet(topo, 1, &dir, &reports_dir);
    let child = mpirun
        .command()
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn mpirun");
    let sw = place.switch(fabric);
    let mut row = VanishRow {
        event: place.name().into(),
        control: place == Where::Nowhere,
        ..VanishRow::default()
    };
    if let Some(id) = new_group(sw, &[], Duration::from_secs(30))
        && !row.control
    {
        std::thread::sleep(AFTER);
        let deleted = GroupMaps::open(&sw.pins.layout).and_then(|mut m| m.remove(id));
        row.set_up_again = deleted.is_ok() && new_group(sw, &[id], RUN).is_some();
    }
    let out = child.wait_with_output().expect("mpirun");
    let stdout = String::from_utf8_lossy(&out.stdout);
    row.ran = out.status.success();
    if !row.ran {
        row.first_error = Some(
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .take(5)
                .collect::<Vec<_>>()
                .join(" / "),
        );
    }
    let windows: Vec<u64> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("window "))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect();
    if let Some(last) = stdout.lines().find_map(|l| l.strip_prefix("calls ")) {
        let mut it = last.split_whitespace();
        row.calls = it.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        row.wrong = it.nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    }
    (row.steady_calls_per_s, row.lost_ms, row.slowest_window) = lost_time(&windows);
    if row.ran {
        let summaries = reports(&reports_dir, nodes);
        row.served = summaries.iter().flat_map(|s| s.served.values()).sum();
        row.fallbacks = summaries.iter().map(|s| s.fallbacks).sum();
    }
    let _ = std::fs::remove_dir_all(&dir);
    row
}

/// From calls per 100 ms window: the steady rate (calls/s, the median full window), the
/// time lost against it (ms), and the fullest window's share of it that the slowest
/// window reached. The first and the last window are partial and left out.
#[must_use]
pub fn lost_time(windows: &[u64]) -> (f64, f64, f64) {
    let end = windows.iter().rposition(|&c| c > 0).unwrap_or(0);
    let full: Vec<u64> = windows.get(1..end).unwrap_or_default().to_vec();
    if full.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    let mut sorted = full.clone();
    sorted.sort_unstable();
    let median = sorted[sorted.len() / 2] as f64;
    if median == 0.0 {
        return (0.0, 0.0, 0.0);
    }
    let lost: f64 = full
        .iter()
        .map(|&c| (median - c as f64).max(0.0) / median * 100.0)
        .sum();
    let slowest = sorted[0] as f64 / median;
    (median * 10.0, lost, slowest)
}

#[cfg(test)]
mod tests {
    use super::lost_time;

    #[test]
    fn lost_time_counts_missing_calls_against_the_median_window() {
        // Partial first and last windows; one window at half speed, one empty.
        let w = [3, 100, 100, 50, 0, 100, 100, 7, 0];
        let (rate, lost, slowest) = lost_time(&w);
        assert!((rate - 1000.0).abs() < 1e-9);
        assert!((lost - 150.0).abs() < 1e-9, "{lost}");
        assert!(slowest.abs() < 1e-9);
    }
}
