//! What the bench's program-under-mpirun sections share (the applications, `barrier_skew`,
//! `nbc_overlap`): the four runs of a shape, side by side, which of them count, how a
//! failed one is told, and the one-line `key=value` results the programs print.

/// One run of a shape's four: a plain MPI run first, discarded (the first run of a launch
/// warms the fabric's ARP and TCP and the page cache: often several times slower), then
/// plain, + innet, plain again (innet is compared with the mean of the two plain runs
/// around it, so drift cancels).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Run {
    WarmUp,
    Plain,
    Innet,
    PlainAgain,
}

impl Run {
    pub const ALL: [Self; 4] = [Self::WarmUp, Self::Plain, Self::Innet, Self::PlainAgain];

    /// As the rows and reports name it.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::WarmUp => "MPI, warm-up (discarded)",
            Self::Plain => "MPI",
            Self::Innet => "+ innet",
            Self::PlainAgain => "MPI, again",
        }
    }

    /// Its scratch directory's suffix.
    #[must_use]
    pub const fn tag(self) -> &'static str {
        match self {
            Self::WarmUp => "warm-up",
            Self::Plain => "plain",
            Self::Innet => "innet",
            Self::PlainAgain => "plain-again",
        }
    }

    /// Whether the ranks preload innet's interposer.
    #[must_use]
    pub fn innet(self) -> bool {
        self == Self::Innet
    }
}

/// Whether a row of run `run` (its name) counts in a shape's means: finished, and not the
/// discarded warm-up.
#[must_use]
pub fn counts(run: &str, failed: bool) -> bool {
    !failed && run != Run::WarmUp.name()
}

/// Why an mpirun failed, for its row: the exit status and the last line of its stderr.
#[must_use]
pub fn mpirun_failed(out: &std::process::Output) -> String {
    format!(
        "mpirun: {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .last()
            .unwrap_or("")
    )
}

/// The report's lines for the runs that failed: each `what: failed: why`.
#[must_use]
pub fn failures<'a>(failed: impl IntoIterator<Item = (String, &'a str)>) -> String {
    use std::fmt::Write as _;
    failed
        .into_iter()
        .fold(String::new(), |mut s, (what, why)| {
            let _ = writeln!(s, "\n{what}: failed: {why}");
            s
        })
}

/// The value of `key` in a result line of `key=value` words.
#[must_use]
pub fn value<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_matches_whole_only() {
        let line = "x skew_us=1.5 skew_p50_us=1.0";
        assert_eq!(value(line, "skew_us"), Some("1.5"));
        assert_eq!(value(line, "skew_p50_us"), Some("1.0"));
        assert_eq!(value(line, "skew"), None);
    }
}
