//! `steady_allreduce`, the MPI program of a long-running job: MPI_Allreduce back to back,
//! its calls counted per 100 ms window from a wall-clock start. What the vanish and hostile
//! campaigns launch and read.

use std::{
    ffi::OsString,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use innet_lab::mpi::Flavour;

/// The program's name.
pub const STEADY_ALLREDUCE: &str = "steady_allreduce";

/// `steady_allreduce` of `flavour` running for `run`, as mpirun's program.
#[must_use]
pub fn steady_allreduce(flavour: Flavour, run: Duration) -> Vec<OsString> {
    vec![
        flavour.program(STEADY_ALLREDUCE).into(),
        "-t".into(),
        format!("{}", run.as_secs_f64()).into(),
    ]
}

/// The whole windows of `counts`: not the first or the last with calls (partial), nor the
/// empty ones the program prints after its end.
#[must_use]
pub fn whole_windows(counts: &[u64]) -> &[u64] {
    let end = counts.iter().rposition(|&c| c > 0).unwrap_or(0);
    counts.get(1..end).unwrap_or_default()
}

/// `steady_allreduce`'s output: its calls per 100 ms window from a wall-clock start, its
/// calls and wrong results.
pub struct Windows {
    pub start: SystemTime,
    pub counts: Vec<u64>,
    pub calls: u64,
    pub wrong: u64,
}

impl Windows {
    pub const WIDTH: Duration = Duration::from_millis(100);

    /// The program's output read, or `None` when it printed no start or no totals.
    #[must_use]
    pub fn parse(stdout: &str) -> Option<Self> {
        let start = stdout
            .lines()
            .find_map(|l| l.strip_prefix("start_epoch_ms "))?
            .trim()
            .parse()
            .ok()?;
        let counts: Vec<u64> = stdout
            .lines()
            .filter_map(|l| l.strip_prefix("window "))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
            .collect();
        let mut last = stdout
            .lines()
            .find_map(|l| l.strip_prefix("calls "))?
            .split_whitespace();
        let calls = last.next()?.parse().ok()?;
        let wrong = last.nth(1)?.parse().ok()?;
        Some(Self {
            start: UNIX_EPOCH + Duration::from_millis(start),
            counts,
            calls,
            wrong,
        })
    }

    /// The whole windows' counts: not the first or the last with calls (partial), nor the
    /// empty ones the program prints after its end.
    #[must_use]
    pub fn whole(&self) -> &[u64] {
        whole_windows(&self.counts)
    }

    /// The counts of the whole windows inside an attack spell, and of those wholly outside
    /// every spell.
    pub fn split(
        &self,
        inside: impl Fn(SystemTime, SystemTime) -> bool,
        outside: impl Fn(SystemTime, SystemTime) -> bool,
    ) -> (Vec<u64>, Vec<u64>) {
        let (mut under, mut quiet) = (vec![], vec![]);
        for (k, &c) in self.whole().iter().enumerate() {
            let k = k + 1;
            let from = self.start + Self::WIDTH * k as u32;
            let to = from + Self::WIDTH;
            if inside(from, to) {
                under.push(c);
            } else if outside(from, to) {
                quiet.push(c);
            }
        }
        (under, quiet)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_read_and_split_by_the_attack_spells() {
        let out = "start_epoch_ms 1000000\nwindow 0 5\nwindow 100 10\nwindow 200 20\n\
                   window 300 10\nwindow 400 3\nwindow 500 0\ncalls 48 wrong 0\n";
        let w = Windows::parse(out).expect("parsed");
        assert_eq!((w.calls, w.wrong), (48, 0));
        // Whole windows: not the first, not the last with calls, not the empty tail.
        assert_eq!(w.whole(), &[10, 20, 10]);
        let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(1_000_000 + ms);
        // One spell over 200–300 ms: that window is attacked, 100 and 300 are quiet.
        let (under, quiet) = w.split(
            |from, to| at(200) <= from && to <= at(300),
            |from, to| to <= at(200) || at(300) <= from,
        );
        assert_eq!((under, quiet), (vec![20], vec![10, 10]));
        assert!(Windows::parse("window 0 5\ncalls 5 wrong 0\n").is_none());
    }
}
