//! `cargo xtask campaign`: the reliability campaign. An in-network reducer sits on the path
//! of everyone's traffic, so it is run under faults until the numbers say it never gives a
//! wrong result and never hangs:
//!
//! - [`loss`]: allreduces of every mode under drops, duplicates and delays (reordering) at
//!   several rates, on the host links or on the uplinks (the wire fault injector);
//! - [`churn`]: group create/kill cycles through the switch daemons, capacity and daemon
//!   memory sampled;
//! - [`soak`]: continuous allreduces for a long time, daemon memory and capacity sampled;
//! - [`vanish`]: a long-running MPI program whose group the switches lose, and the time
//!   that costs it;
//! - [`hostile`]: a host outside a running job attacks it, one attack per row;
//! - [`tables`]: the markdown tables, from the JSON alone;
//! - [`fabric`] and [`workload`]: the fabric they share and what every rank does;
//! - [`steady`]: the MPI program of a long-running job, and reading its output.

pub mod churn;
pub mod fabric;
pub mod hostile;
pub mod loss;
pub mod tables;
pub mod soak;
pub mod steady;
pub mod vanish;
pub mod workload;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::bench::machine::Machine;

/// Runs the built `innet-campaign` with `args` into a scratch directory (removed after);
/// its exit status and what its JSON says (tests' short forms).
///
/// # Panics
/// Not root, the binary missing, or no readable `campaign.json`.
#[must_use]
pub fn run_built(args: &[&str]) -> (std::process::ExitStatus, Results) {
    innet_lab::require_root();
    let bin = innet_lab::workspace_bin("innet-campaign", "innet-tools");
    let out = std::env::temp_dir().join(format!("innet-campaign-{}", innet_lab::unique_id()));
    let status = std::process::Command::new(&bin)
        .arg("--out")
        .arg(&out)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    let json = std::fs::read(out.join("campaign.json")).expect("campaign.json");
    let r: Results = serde_json::from_slice(&json).expect("campaign.json parses");
    let _ = std::fs::remove_dir_all(&out);
    (status, r)
}

/// Everything one campaign run observed: the JSON file's content.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Results {
    pub machine: Machine,
    /// The command line's settings.
    pub settings: String,
    pub loss: Vec<LossRow>,
    pub churn: Vec<ChurnRow>,
    pub soak: Vec<SoakRow>,
    #[serde(default)]
    pub vanish: Vec<VanishRow>,
    #[serde(default)]
    pub hostile: Vec<HostileRow>,
}

/// One loss setting: `calls` allreduces per rank in `mode` with `fault` at `rate` on
/// `place`, every result checked.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LossRow {
    /// The collective the row's ranks called (`allreduce` in older files).
    #[serde(default = "allreduce")]
    pub collective: String,
    pub mode: String,
    /// `host links` or `uplinks`; on the three-level fabric `host links`, `level-1
    /// uplinks` (TOR to aggregation switch) or `level-2 uplinks` (aggregation switch to core).
    pub place: String,
    /// `drop`, `duplicate` or `delay`.
    pub fault: String,
    /// Fraction of the INC data packets on each faulty link and direction.
    pub rate: f64,
    pub ranks: usize,
    /// Allreduces per rank.
    pub calls: usize,
    /// Results that differed from the reference (over all ranks).
    pub wrong: usize,
    /// Calls that returned an error (each within its bound).
    pub errors: usize,
    /// Calls that took longer than their bound (timeout + 1 s): must be 0.
    pub hangs: usize,
    /// Calls that ran on the hosts although the mode asked for the network.
    pub fallbacks: usize,
    /// The fallbacks by the reason the library recorded (`Timeout { tries: 7 }`, …).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fallback_reasons: BTreeMap<String, usize>,
    /// Data packets the leaders sent again.
    pub retransmissions: u64,
    /// What the wires did: packets dropped, duplicated, delayed.
    pub faults_injected: u64,
    /// Slowest call of any rank, in milliseconds.
    pub max_call_ms: f64,
    /// Mean call time, microseconds.
    pub avg_call_us: f64,
    /// The first error's text, if any.
    pub first_error: Option<String>,
    /// The message size when every call of the row reduces one message (the long-message
    /// rows); 0: the mixed cases.
    #[serde(default)]
    pub bytes: usize,
    /// Slots per group on the switches and NICs (the long-message rows; `None`: the default).
    #[serde(default)]
    pub window: Option<u32>,
    /// Link MTU (the long-message rows; `None`: 1500 B).
    #[serde(default)]
    pub mtu: Option<usize>,
    /// Switch levels of the fabric: 2, or 3 for the three-level one (0 in older files: 2).
    #[serde(default)]
    pub levels: usize,
}

fn allreduce() -> String {
    "allreduce".into()
}

impl LossRow {
    /// Switch levels of the row's fabric (older files did not say: 2).
    #[must_use]
    pub fn levels(&self) -> usize {
        self.levels.max(2)
    }
}

/// A churn run: group create/kill cycles through the switch daemons.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChurnRow {
    pub cycles: usize,
    /// Wrong or failed allreduces (one per rank and cycle).
    pub wrong: usize,
    /// Groups still installed on the switches and NICs at the end.
    pub groups_left: usize,
    /// Resident memory of all daemons together (KiB), before and after.
    pub daemon_rss_kib_start: u64,
    pub daemon_rss_kib_end: u64,
    pub seconds: f64,
}

/// A soak sample: after `seconds`, how many allreduces ran, wrong, and the switches' state.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SoakRow {
    pub seconds: f64,
    pub calls: usize,
    pub wrong: usize,
    pub errors: usize,
    pub groups_installed: usize,
    pub daemon_rss_kib: u64,
}

/// A long-running MPI program whose group a switch lost mid-run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct VanishRow {
    /// What happened to the group.
    pub event: String,
    /// The run without an event (its time lost is the measure's noise).
    #[serde(default)]
    pub control: bool,
    /// Whether `mpirun` exited 0.
    pub ran: bool,
    /// Whether a new group of the job was installed on that switch afterwards.
    pub set_up_again: bool,
    pub calls: u64,
    pub wrong: u64,
    /// The run's steady rate (median 100 ms window), calls per second.
    pub steady_calls_per_s: f64,
    /// Time lost against the steady rate over the whole run, milliseconds.
    pub lost_ms: f64,
    /// The slowest full window's rate as a fraction of the steady rate.
    pub slowest_window: f64,
    /// Collectives the interposer served through innet, and the ones that fell back.
    pub served: u64,
    pub fallbacks: u64,
    pub first_error: Option<String>,
}

/// A job attacked by a host outside it for the whole run ([`hostile`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct HostileRow {
    /// What the attacker did.
    pub attack: String,
    /// Who ran the attacked job ([`hostile::Job::name`]).
    #[serde(default)]
    pub job: String,
    /// Switch levels of the fabric (2 or 3).
    pub levels: usize,
    /// The run without an attack (its speed shows the measure's noise).
    pub control: bool,
    /// Whether every rank ran to the end.
    pub ran: bool,
    /// Rank 0's collectives, and every rank's wrong results.
    pub calls: u64,
    pub wrong: u64,
    /// Rank 0's collectives that ran on the hosts, and those that set the group up again.
    pub off_network: u64,
    pub regroups: u64,
    /// Rank 0's median collective under attack and in the run's quiet spells, and its
    /// slowest.
    pub median_call_us: f64,
    pub quiet_median_call_us: f64,
    pub slowest_call_ms: f64,
    /// The quiet spells' median over the attacked spells' (1: unharmed).
    pub speed: f64,
    /// Forgeries the attacker sent (a fragmented one counts once).
    pub frames_sent: u64,
    /// The counter that names the attack, and how much it rose during the run.
    pub counter: String,
    pub counted: u64,
    /// Peak resident memory of the process that holds the ranks (threads) and of all
    /// daemons together, KiB.
    pub ranks_rss_kib_peak: u64,
    pub daemons_rss_kib_peak: u64,
    pub first_error: Option<String>,
}

impl HostileRow {
    /// Whether the row misses the campaign's bar: it did not run to the end, a result was
    /// wrong, more than 1 % of the collectives left the network, or no counter named an
    /// attack that sent something.
    #[must_use]
    pub fn failed(&self) -> bool {
        let off_too_many = self.off_network * 100 > self.calls;
        let unnamed = !self.control && self.frames_sent > 0 && self.counted == 0;
        !self.ran || self.wrong > 0 || off_too_many || unnamed
    }
}
