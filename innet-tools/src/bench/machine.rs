//! What a benchmark ran on: the report names the machine next to every number.

use std::process::Command;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Machine {
    pub cpu: String,
    pub cpus: usize,
    pub memory_gib: f64,
    pub kernel: String,
    pub commit: String,
    /// UTC, `date -u` format.
    pub date: String,
}

impl Machine {
    #[must_use]
    pub fn this() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map_or_else(|| "unknown".into(), |(_, m)| m.trim().to_owned());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let kib: f64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        Self {
            cpu,
            cpus: std::thread::available_parallelism().map_or(1, usize::from),
            memory_gib: (kib / (1024.0 * 1024.0) * 10.0).round() / 10.0,
            kernel: stdout(Command::new("uname").arg("-r")),
            commit: stdout(Command::new("git").args(["rev-parse", "--short", "HEAD"])),
            date: stdout(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"])),
        }
    }
}

impl Machine {
    /// One line for a report: CPU, size, kernel, commit, date.
    #[must_use]
    pub fn summary(&self) -> String {
        format!(
            "{} ({} CPUs, {} GiB, Linux {}), commit `{}`, {}",
            self.cpu, self.cpus, self.memory_gib, self.kernel, self.commit, self.date
        )
    }
}

fn stdout(cmd: &mut Command) -> String {
    cmd.output()
        .ok()
        .filter(|o| o.status.success())
        .map_or_else(
            || "unknown".into(),
            |o| String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        )
}
