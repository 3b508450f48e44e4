//! `cargo xtask bench`: what innet costs and what it saves, measured the way the papers behind it did (docs/architecture.md, Terms).
//!
//! - [`latency`]: osu_allreduce-style sweeps on namespace fabrics — every mode, node count,
//!   ranks per node and size in one run, so every speed-up is a ratio to `host-rd` measured
//!   side by side;
//! - [`xdp_cost`]: the XDP programs' cost per packet through `BPF_PROG_TEST_RUN`, as a ratio
//!   to an empty program, and the rounds per second one core aggregates with many groups;
//! - [`cpu`]: where a goodput case's CPU goes (busy CPU, XDP time per packet);
//! - [`bystander`]: TCP through a bridge host with and without innet on its ports;
//! - [`osu`]: the real OSU micro-benchmarks under mpirun, with and without innet;
//! - [`apps`]: whole applications (LAMMPS, PETSc's CG) under mpirun, with and without innet;
//! - [`barrier`]: how far apart a barrier releases the ranks and what MPI's next call costs;
//! - [`side_by_side`]: the four runs per shape those two share, and their result lines;
//! - [`tables`] and [`plot`]: the markdown report and the plots, from the JSON alone (so a
//!   committed run can be re-rendered).

pub mod apps;
pub mod barrier;
pub mod bound;
pub mod breakdown;
pub mod bystander;
pub mod cpu;
pub mod latency;
pub mod machine;
pub mod mpi;
pub mod osu;
pub mod overlap;
pub mod plot;
pub mod side_by_side;
pub mod speedup;
pub mod tables;
pub mod xdp_cost;

use serde::{Deserialize, Serialize};

/// TCP across one shaped fabric, both ways ([`innet_lab::link_checks::check_links`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LinkChecks {
    pub nodes: usize,
    pub levels: usize,
    /// The links' rate, bits per second.
    pub rate_bps: u64,
    pub checks: Vec<innet_lab::link_checks::LinkCheck>,
}

/// Everything one `cargo xtask bench` run measured: the JSON file's content.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Results {
    pub machine: machine::Machine,
    /// The command line's settings, as the report prints them.
    pub settings: String,
    pub latency: Vec<LatencyRow>,
    /// Long messages (float64 SUM): goodput next to `host-ring`.
    #[serde(default)]
    pub goodput: Vec<LatencyRow>,
    /// On a shaped fabric: TCP across the first goodput sweep's fabric of each node count,
    /// both ways, before its runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub link_checks: Vec<LinkChecks>,
    /// osu_allreduce under mpirun, with and without the interposer.
    #[serde(default)]
    pub mpi: Vec<mpi::MpiRow>,
    /// The real OSU benchmarks under mpirun, with and without the interposer.
    #[serde(default)]
    pub osu: Vec<osu::OsuRow>,
    /// Whole applications under mpirun, with and without the interposer.
    #[serde(default)]
    pub apps: Vec<apps::AppRow>,
    /// `barrier_skew` under mpirun, with and without the interposer.
    #[serde(default)]
    pub barrier: Vec<barrier::BarrierRow>,
    /// `nbc_overlap` under mpirun, with and without the interposer.
    #[serde(default)]
    pub overlap: Vec<overlap::OverlapRow>,
    /// The cutover table this run's numbers call for (also written as `cutover.toml`).
    #[serde(default)]
    pub cutover: innet_client::CutoverTable,
    /// Where the time of a 4 B allreduce goes, per stage.
    #[serde(default)]
    pub breakdown: Vec<breakdown::BreakdownRow>,
    /// TCP through a bridge with and without innet on its ports.
    #[serde(default)]
    pub bystander: Vec<bystander::BystanderRow>,
    /// innet's own latency with the switches' programs native and in skb mode.
    #[serde(default)]
    pub switch_modes: Vec<bystander::SwitchModeRow>,
    pub xdp: Vec<XdpRow>,
    pub throughput: Vec<ThroughputRow>,
    pub programs: Vec<ProgramRow>,
}

/// One allreduce latency measurement: every rank ran `iterations` timed allreduces after a
/// warm-up; each result was checked against the host reference.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LatencyRow {
    pub mode: String,
    /// The path the collectives took (`network, node`, `nic tree`, `host, rd` …).
    pub path: String,
    /// The element type (SUM of it).
    #[serde(default = "int32")]
    pub dtype: String,
    pub nodes: usize,
    pub ppn: usize,
    pub ranks: usize,
    pub bytes: usize,
    pub iterations: usize,
    /// Mean over every rank's iterations (osu_allreduce's "Avg Latency").
    pub avg_us: f64,
    /// Percentiles over every rank's iterations.
    pub p50_us: f64,
    pub p99_us: f64,
    /// Results that differed from the reference (over all ranks).
    pub errors: usize,
    /// Collectives that ran on the hosts although the mode asked for the network.
    pub fallbacks: usize,
    /// Data packets the leaders sent again because a result was late (timed iterations).
    #[serde(default)]
    pub retransmissions: u64,
    /// Why the case did not finish (the first rank's error), if it did not: the row then
    /// holds what was measured before.
    #[serde(default)]
    pub failed: Option<String>,
    /// MTU of every link of the fabric.
    #[serde(default = "standard_mtu")]
    pub mtu: usize,
    /// The rate every link was shaped to, both ways, in bits per second (`None`: not
    /// shaped; the CPUs bound the run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_bps: Option<u64>,
    /// The share of INC data packets every link dropped, each way (`None`: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_loss: Option<f64>,
    /// On a shaped fabric, the busiest link's bits over the case's time and the rate (1: a
    /// link that never idled), and the frames every shaped port dropped meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_use: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_drops: Option<u64>,
    /// Slots per group on the switches and NICs, when not the default.
    #[serde(default)]
    pub window: Option<u32>,
    /// Switch levels of the fabric (1–3; runs before levels were recorded had 2).
    #[serde(default = "two_levels")]
    pub levels: usize,
    /// The goodput sweep's profile of the case: the machine's busy CPU and innet's XDP
    /// time over the timed calls (`None`: not profiled, or it could not be read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<cpu::CpuCost>,
}

impl LatencyRow {
    /// The mode, with the MTU when the links carry jumbo frames and the window when the
    /// switches were attached with another than the default, and the element type when
    /// it is not the latency sweeps' int32.
    #[must_use]
    pub fn label(&self) -> String {
        self.label_besides("int32")
    }

    /// [`label`](Self::label) of a goodput row: the type named unless it is the sweep's
    /// float64.
    #[must_use]
    pub fn goodput_label(&self) -> String {
        self.label_besides("float64")
    }

    /// The label, naming the element type unless it is `usual`.
    fn label_besides(&self, usual: &str) -> String {
        let mut settings = vec![];
        if self.mtu != STANDARD_MTU {
            settings.push(format!("MTU {}", self.mtu));
        }
        if let Some(w) = self.window {
            settings.push(format!("window {w}"));
        }
        if self.dtype != usual {
            settings.push(self.dtype.clone());
        }
        if self.levels != 2 {
            let s = if self.levels == 1 { "" } else { "s" };
            settings.push(format!("{} level{s}", self.levels));
        }
        if settings.is_empty() {
            self.mode.clone()
        } else {
            format!("{} ({})", self.mode, settings.join(", "))
        }
    }
}

/// Every link's MTU unless a sweep says otherwise.
pub use innet_common::proto::STANDARD_MTU;

fn standard_mtu() -> usize {
    STANDARD_MTU
}

const fn two_levels() -> usize {
    2
}

fn int32() -> String {
    "int32".into()
}

/// The cost of one XDP program run on one kind of packet.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct XdpRow {
    pub case: String,
    pub program: String,
    /// INC payload bytes (int32 SUM elements × 4).
    pub payload_bytes: usize,
    /// `repeat`: one `BPF_PROG_TEST_RUN` with a repeat count (stateless cases only);
    /// `per-frame`: one run per distinct frame, each timed by the kernel, averaged.
    pub method: String,
    pub runs: u64,
    pub ns_per_pkt: f64,
    pub mpps_per_core: f64,
    /// `ns_per_pkt` over the empty program's, measured the same way on the same frame size.
    pub ratio_to_noop: f64,
    /// Verdicts or results that were not what the case expects.
    pub errors: u64,
}

/// Aggregation rounds one core completes with `groups` groups active at once.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ThroughputRow {
    pub groups: usize,
    pub children: usize,
    pub payload_bytes: usize,
    pub rounds: u64,
    /// Rounds per second of one core's XDP time (kernel-timed runs, no syscall overhead).
    pub rounds_per_sec: f64,
    pub mpps_per_core: f64,
    pub errors: u64,
}

/// The verifier's view of a program: translated and JIT-ed size, instructions it walked.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProgramRow {
    pub name: String,
    pub xlated_bytes: u32,
    pub jited_bytes: u32,
    pub verified_insns: u32,
}

/// Nearest-rank percentile `q` (0–100) of sorted `v`.
#[must_use]
#[expect(clippy::cast_sign_loss, reason = "q is a percentage, 0 to 100")]
pub fn percentile(sorted: &[f32], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q / 100.0) * sorted.len() as f64).ceil() as usize;
    f64::from(sorted[rank.clamp(1, sorted.len()) - 1])
}

impl Results {
    /// Wrong results or verdicts over every section.
    #[must_use]
    pub fn wrong(&self) -> usize {
        self.latency
            .iter()
            .chain(&self.goodput)
            .map(|r| r.errors)
            .sum::<usize>()
            + self.mpi.iter().map(|r| r.errors).sum::<usize>()
            + self.osu.iter().filter(|r| r.wrong()).count()
            + usize::try_from(overlap::wrong(&self.overlap)).unwrap_or(usize::MAX)
            + self.breakdown.iter().map(|r| r.errors).sum::<usize>()
            + self
                .switch_modes
                .iter()
                .map(|r| r.row.errors)
                .sum::<usize>()
            + self.xdp.iter().map(|r| r.errors as usize).sum::<usize>()
            + self
                .throughput
                .iter()
                .map(|r| r.errors as usize)
                .sum::<usize>()
    }

    /// Cases that did not finish over every section.
    #[must_use]
    pub fn failed(&self) -> usize {
        self.latency
            .iter()
            .chain(&self.goodput)
            .filter(|r| r.failed.is_some())
            .count()
            + self.bystander.iter().filter(|r| r.failed.is_some()).count()
            + self
                .switch_modes
                .iter()
                .filter(|r| r.row.failed.is_some())
                .count()
            + self.osu.iter().filter(|r| !r.failed.is_empty()).count()
            + self.apps.iter().filter(|r| r.failed.is_some()).count()
            + self.barrier.iter().filter(|r| r.failed.is_some()).count()
            + self.overlap.iter().filter(|r| r.failed.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    #[expect(clippy::float_cmp, reason = "percentiles are sample values, exactly")]
    fn nearest_rank_percentiles() {
        let v: Vec<f32> = (1..=100).map(|i| i as f32).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert!(percentile(&[], 50.0).is_nan());
    }
}
