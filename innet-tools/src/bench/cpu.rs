//! Where a goodput case's CPU goes: the machine's busy CPU time from `/proc/stat` and the
//! kernel's own timing of innet's XDP programs (`kernel.bpf_stats_enabled`, read through
//! `bpftool prog show -j`), as deltas over the case's timed calls.
//!
//! Both are machine-wide: every rank, switch and daemon of the fabric shares this
//! machine's CPUs, so the busy time is all of the fabric's work (and anything else the
//! machine ran meanwhile). The report divides them by the packets the leaders sent.

use std::{process::Command, time::Instant};

use serde::{Deserialize, Serialize};

pub use innet_lab::bpf_stats::{BpfStats, restore_now};

/// What one case cost the machine, over its timed calls (and the warm-up call before them,
/// which absorbs the first reading).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuCost {
    /// Allreduces inside the window.
    pub calls: usize,
    /// Wall-clock time of the window.
    pub wall_ns: u64,
    /// Busy CPU time of all CPUs (user + nice + system + irq + softirq), in `/proc/stat`'s
    /// ticks (10 ms at 100 Hz) turned into ns.
    pub busy_ns: u64,
    /// Its softirq part: where XDP on veth and the kernel's network path run.
    pub softirq_ns: u64,
    /// The kernel's run time of innet's XDP programs (`innet_*`), when it could be read.
    #[serde(default)]
    pub xdp_ns: Option<u64>,
    /// Their runs (one per packet per program it passes through).
    #[serde(default)]
    pub xdp_runs: Option<u64>,
}

/// The machine's counters at one moment.
pub struct Snapshot {
    at: Instant,
    /// (busy, softirq) ticks of all CPUs.
    cpu: Option<(u64, u64)>,
    /// (run time ns, runs) of innet's XDP programs.
    xdp: Option<(u64, u64)>,
}

impl Snapshot {
    /// Reads `/proc/stat` and, when `xdp`, the XDP programs' statistics.
    #[must_use]
    pub fn take(xdp: bool) -> Self {
        let xdp = if xdp { xdp_stats() } else { None };
        let cpu = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| cpu_ticks(&s));
        Self {
            at: Instant::now(),
            cpu,
            xdp,
        }
    }

    /// The cost from this snapshot to now, over `calls` allreduces; `None` when
    /// `/proc/stat` could not be read.
    #[must_use]
    pub fn cost(&self, calls: usize) -> Option<CpuCost> {
        let now = Self::take(self.xdp.is_some());
        let ((b0, s0), (b1, s1)) = (self.cpu?, now.cpu?);
        let tick = 1e9 / clock_ticks();
        let xdp = self
            .xdp
            .zip(now.xdp)
            .map(|((t0, r0), (t1, r1))| (t1.saturating_sub(t0), r1.saturating_sub(r0)));
        Some(CpuCost {
            calls,
            wall_ns: u64::try_from(now.at.duration_since(self.at).as_nanos()).unwrap_or(u64::MAX),
            busy_ns: ticks_ns(b1.saturating_sub(b0), tick),
            softirq_ns: ticks_ns(s1.saturating_sub(s0), tick),
            xdp_ns: xdp.map(|x| x.0),
            xdp_runs: xdp.map(|x| x.1),
        })
    }
}

#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    reason = "ticks of a few minutes in ns fit a u64"
)]
fn ticks_ns(ticks: u64, tick_ns: f64) -> u64 {
    (ticks as f64 * tick_ns) as u64
}

/// `/proc/stat`'s tick rate (USER_HZ).
fn clock_ticks() -> f64 {
    // SAFETY: sysconf only reads a constant of the C library.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 { hz as f64 } else { 100.0 }
}

/// (busy, softirq) ticks from `/proc/stat`'s `cpu` line: busy is user + nice + system +
/// irq + softirq (idle, iowait and steal are not; guest time is already in user).
#[must_use]
pub fn cpu_ticks(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let [user, nice, system, _idle, _iowait, irq, softirq, ..] = f.as_slice() else {
        return None;
    };
    Some((user + nice + system + irq + softirq, *softirq))
}

/// Run time (ns) and runs summed over the loaded XDP programs named `innet_*`, from
/// `bpftool prog show -j` (which prints them only once the kernel has timed a run);
/// `None` when bpftool cannot be run or no such program is loaded.
fn xdp_stats() -> Option<(u64, u64)> {
    let out = Command::new("bpftool")
        .args(["prog", "show", "-j"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    xdp_totals(&serde_json::from_slice(&out.stdout).ok()?)
}

/// `xdp_stats`'s sum over `bpftool prog show -j`'s programs.
#[must_use]
pub fn xdp_totals(progs: &serde_json::Value) -> Option<(u64, u64)> {
    let ours: Vec<&serde_json::Value> = progs
        .as_array()?
        .iter()
        .filter(|p| {
            p["type"] == "xdp" && p["name"].as_str().is_some_and(|n| n.starts_with("innet_"))
        })
        .collect();
    if ours.is_empty() {
        return None;
    }
    let sum = |key: &str| ours.iter().filter_map(|p| p[key].as_u64()).sum::<u64>();
    Some((sum("run_time_ns"), sum("run_cnt")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_is_everything_but_idle_iowait_and_steal() {
        let stat = "cpu  100 5 40 9000 7 3 20 11 0 0\ncpu0 50 2 20 4500 3 1 10 5 0 0\n";
        assert_eq!(cpu_ticks(stat), Some((168, 20)));
        assert_eq!(cpu_ticks("intr 1 2 3\n"), None);
    }

    #[test]
    fn xdp_totals_are_innet_programs_only() {
        let progs = serde_json::json!([
            {"id": 1, "type": "xdp", "name": "innet_switch", "run_time_ns": 900, "run_cnt": 10},
            {"id": 2, "type": "xdp", "name": "innet_egress", "run_time_ns": 100, "run_cnt": 5},
            {"id": 3, "type": "xdp", "name": "innet_nic"},
            {"id": 4, "type": "xdp", "name": "other", "run_time_ns": 7, "run_cnt": 7},
            {"id": 5, "type": "cgroup_skb", "name": "innet_x", "run_time_ns": 7, "run_cnt": 7}
        ]);
        assert_eq!(xdp_totals(&progs), Some((1000, 15)));
        assert_eq!(xdp_totals(&serde_json::json!([])), None);
    }
}
