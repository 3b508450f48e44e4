//! Reading the OSU micro-benchmarks' output (7.x, `c/util/osu_util_mpi.c`): the title line
//! (`# OSU MPI Non-blocking Allreduce Latency Test v7.4`), then a header line naming the
//! columns (`# Size  Avg Latency(us) …`, or `# Overall(us) …` for `osu_ibarrier` and
//! `# Avg Latency(us) …` for `osu_barrier`, which have no size), then one line per size.
//! Columns are found by the header's names, so `-f` (full: min, max, iterations; for the
//! non-blocking ones compute, init, test, wait, min/max comm.), `-c` (a `Validation`
//! column) and tail latencies (`-z`) may be on or off.

use serde::{Deserialize, Serialize};

/// What a benchmark's output could not give.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    #[error(
        "no OSU header line (`# Size …`, `# Overall(us) …` or `# Avg Latency(us) …`) in the output"
    )]
    NoHeader,
    #[error("no data line after the header")]
    NoData,
    #[error("line {line:?}: {found} fields under a header of {expected}")]
    Fields {
        line: String,
        found: usize,
        expected: usize,
    },
    #[error("line {line:?}: {column} is {value:?}, not a number")]
    Number {
        line: String,
        column: String,
        value: String,
    },
    #[error(
        "no {0:?} column (blocking benchmarks need `Avg Latency(us)`, non-blocking ones `Pure Comm.(us)` and `Overlap(%)`, osu_latency `Latency (us)`, osu_bw `Bandwidth (MB/s)`)"
    )]
    Missing(&'static str),
}

/// One size of a benchmark's output, µs unless named otherwise.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Times {
    /// Message bytes (0 for `osu_ibarrier`).
    pub bytes: usize,
    /// The latency the targets compare: `Avg Latency(us)` of a blocking benchmark, the
    /// pure communication time (`Pure Comm.(us)`: the collective and its wait, nothing
    /// overlapped) of a non-blocking one; averaged over the ranks. `osu_latency`: its
    /// `Latency (us)`; `osu_bw`: the time a message's bytes take at its bandwidth
    /// (bytes ÷ MB/s), so that MPI µs / innet µs is innet's bandwidth over MPI's.
    pub latency_us: f64,
    /// `osu_bw`'s `Bandwidth (MB/s)`.
    #[serde(default)]
    pub bandwidth_mbs: Option<f64>,
    /// The ranks' least and largest (with `-f`).
    pub min_us: Option<f64>,
    pub max_us: Option<f64>,
    /// Timed iterations, when OSU prints them (blocking, `-f`).
    pub iterations: Option<u64>,
    /// Non-blocking: the overlapped call's total (init + compute + tests + wait).
    pub overall_us: Option<f64>,
    /// Non-blocking: the dummy computation OSU overlaps (sized to the pure latency).
    pub compute_us: Option<f64>,
    /// Non-blocking, `-f`: the collective's call, the `MPI_Test`s, the `MPI_Wait`.
    pub init_us: Option<f64>,
    pub test_us: Option<f64>,
    pub wait_us: Option<f64>,
    /// Non-blocking: OSU's overlap, `100 − (overall − compute) / pure × 100`, at least 0.
    pub overlap_pct: Option<f64>,
    /// With `-c`: whether OSU's validation passed.
    pub valid: Option<bool>,
}

/// A benchmark's output: its title (with the OSU version) and one [`Times`] per size.
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    /// `OSU MPI Non-blocking Allreduce Latency Test v7.4`.
    pub title: String,
    pub rows: Vec<Times>,
}

impl Output {
    /// The OSU version of the title (`7.4`).
    #[must_use]
    pub fn version(&self) -> Option<&str> {
        self.title.rsplit_once(" v").map(|(_, v)| v)
    }
}

/// Parses a benchmark's stdout (anything else MPI or the interposer prints is skipped
/// until the header; after it, every non-comment line must be a data line).
///
/// # Errors
/// No header, no data, or a data line that does not fit the header.
pub fn parse(stdout: &str) -> Result<Output, ParseError> {
    let mut lines = stdout.lines();
    let mut title = String::new();
    let header = loop {
        let l = lines.next().ok_or(ParseError::NoHeader)?;
        if l.starts_with("# OSU ") {
            l.trim_start_matches("# ").trim().clone_into(&mut title);
        } else if l.starts_with("# Size")
            || l.starts_with("# Overall(us)")
            || l.starts_with("# Avg Latency(us)")
        {
            break columns(l);
        }
    };
    let rows = lines
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| row(&header, l))
        .collect::<Result<Vec<_>, _>>()?;
    if rows.is_empty() {
        return Err(ParseError::NoData);
    }
    Ok(Output { title, rows })
}

/// A header's column names: separated by two or more spaces (names hold single ones).
fn columns(header: &str) -> Vec<String> {
    header
        .trim_start_matches('#')
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
        .collect()
}

fn row(header: &[String], line: &str) -> Result<Times, ParseError> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() != header.len() {
        return Err(ParseError::Fields {
            line: line.into(),
            found: fields.len(),
            expected: header.len(),
        });
    }
    let get = |name: &str| header.iter().position(|c| c == name).map(|i| fields[i]);
    let number = |name: &str| field::<f64>(line, name, get(name));
    let nonblocking = header.iter().any(|c| c == PURE);
    let whole = |name: &str| field::<u64>(line, name, get(name));
    let bytes = whole("Size")?.map_or(0, |b| usize::try_from(b).unwrap_or(usize::MAX));
    let bandwidth_mbs = number(BANDWIDTH)?;
    let latency_us = if nonblocking {
        number(PURE)?.ok_or(ParseError::Missing(PURE))?
    } else if let Some(mbs) = bandwidth_mbs {
        bytes as f64 / mbs.max(f64::MIN_POSITIVE) // MB/s is bytes per µs
    } else {
        number(AVG)?
            .or(number(LATENCY)?)
            .ok_or(ParseError::Missing(AVG))?
    };
    let overlap_pct = number("Overlap(%)")?;
    if nonblocking && overlap_pct.is_none() {
        return Err(ParseError::Missing("Overlap(%)"));
    }
    Ok(Times {
        bytes,
        latency_us,
        bandwidth_mbs,
        min_us: number("Min Latency(us)")?.or(number("Min Comm.(us)")?),
        max_us: number("Max Latency(us)")?.or(number("Max Comm.(us)")?),
        iterations: whole("Iterations")?,
        overall_us: number("Overall(us)")?,
        compute_us: number("Compute(us)")?,
        init_us: number("Coll. Init(us)")?,
        test_us: number("MPI_Test(us)")?,
        wait_us: number("MPI_Wait(us)")?,
        overlap_pct,
        valid: get("Validation").map(|v| v == "Pass"),
    })
}

/// `value` of `column` parsed, if the column is there.
fn field<T: std::str::FromStr>(
    line: &str,
    column: &str,
    value: Option<&str>,
) -> Result<Option<T>, ParseError> {
    value
        .map(|v| {
            v.parse::<T>().map_err(|_| ParseError::Number {
                line: line.into(),
                column: column.into(),
                value: v.into(),
            })
        })
        .transpose()
}

const AVG: &str = "Avg Latency(us)";
const LATENCY: &str = "Latency (us)";
const BANDWIDTH: &str = "Bandwidth (MB/s)";
const PURE: &str = "Pure Comm.(us)";

#[cfg(test)]
#[expect(
    clippy::float_cmp,
    reason = "OSU prints two decimals: the values parse exactly"
)]
mod tests {
    use super::*;

    // Real OSU 7.4 output (OpenMPI 4.1, 4 ranks), `-f`, as `innet-bench --osu` runs it.
    const IALLREDUCE: &str = include_str!("testdata/iallreduce.txt");
    const IBARRIER: &str = include_str!("testdata/ibarrier.txt");
    const IBCAST: &str = include_str!("testdata/ibcast.txt");
    const ALLGATHER: &str = include_str!("testdata/allgather.txt");
    const REDUCE_SCATTER_VALIDATED: &str = include_str!("testdata/reduce_scatter-validated.txt");
    // Point-to-point, 2 ranks on two nodes, OSU's own iterations.
    const LATENCY: &str = include_str!("testdata/latency.txt");
    const BW: &str = include_str!("testdata/bw.txt");

    #[test]
    fn barrier_has_one_row_under_its_latency_header() {
        // OSU 7.4's osu_barrier -f prints no size column.
        let text = "\n# OSU MPI Barrier Latency Test v7.4\n\
                    # Avg Latency(us)      Min Latency(us)      Max Latency(us)  Iterations\n\
                    161.02               150.10               170.33        200\n";
        let o = parse(text).unwrap();
        assert_eq!(o.rows.len(), 1);
        let r = &o.rows[0];
        assert_eq!(
            (r.bytes, r.latency_us, r.iterations),
            (0, 161.02, Some(200))
        );
    }

    #[test]
    fn point_to_point_rows_carry_latency_or_bandwidth() {
        let l = parse(LATENCY).unwrap();
        assert_eq!(l.title, "OSU MPI Latency Test v7.4");
        assert_eq!((l.rows[0].bytes, l.rows[0].latency_us), (1, 14.05));
        assert_eq!(l.rows.len(), 21);
        let b = parse(BW).unwrap();
        assert_eq!(b.title, "OSU MPI Bandwidth Test v7.4");
        let r = b.rows.iter().find(|r| r.bytes == 65_536).unwrap();
        assert_eq!(r.bandwidth_mbs, Some(553.71));
        // bytes ÷ MB/s: µs per message at that bandwidth.
        assert!((r.latency_us - 65_536.0 / 553.71).abs() < 1e-9);
    }

    #[test]
    fn nonblocking_rows_carry_pure_latency_overlap_and_the_parts() {
        let o = parse(IALLREDUCE).unwrap();
        assert_eq!(o.title, "OSU MPI Non-blocking Allreduce Latency Test v7.4");
        assert_eq!(o.version(), Some("7.4"));
        let sizes: Vec<usize> = o.rows.iter().map(|r| r.bytes).collect();
        assert_eq!(sizes, [4, 8, 16, 32, 64, 128, 256]);
        // 4  21.57  6.21  0.57  0.00  14.57  4.33  3.75  5.14  0.00
        let r = &o.rows[0];
        assert_eq!(r.overall_us, Some(21.57));
        assert_eq!(r.compute_us, Some(6.21));
        assert_eq!(r.init_us, Some(0.57));
        assert_eq!(r.test_us, Some(0.0));
        assert_eq!(r.wait_us, Some(14.57));
        assert_eq!(r.latency_us, 4.33);
        assert_eq!((r.min_us, r.max_us), (Some(3.75), Some(5.14)));
        assert_eq!(r.overlap_pct, Some(0.0));
        assert_eq!((r.iterations, r.valid), (None, None));
        let ibcast = parse(IBCAST).unwrap();
        assert_eq!(ibcast.rows.len(), 5);
        assert_eq!(ibcast.rows[4].bytes, 64);
        assert_eq!(ibcast.rows[4].max_us, Some(0.62));
    }

    #[test]
    fn ibarrier_has_one_row_without_a_size() {
        let o = parse(IBARRIER).unwrap();
        assert_eq!(o.title, "OSU MPI Non-blocking Barrier Latency Test v7.4");
        assert_eq!(o.rows.len(), 1);
        // 15.32  7.32  0.46  0.00  7.43  6.45  6.41  6.49  0.00
        let r = &o.rows[0];
        assert_eq!(
            (r.bytes, r.overall_us, r.latency_us),
            (0, Some(15.32), 6.45)
        );
        assert_eq!((r.wait_us, r.overlap_pct), (Some(7.43), Some(0.0)));
    }

    #[test]
    fn blocking_rows_carry_avg_min_max_iterations_and_validation() {
        let o = parse(ALLGATHER).unwrap();
        assert_eq!(o.title, "OSU MPI Allgather Latency Test v7.4");
        assert_eq!(o.rows.len(), 7);
        // 256  11.14  6.83  15.28  200
        let r = &o.rows[6];
        assert_eq!((r.bytes, r.latency_us), (256, 11.14));
        assert_eq!(
            (r.min_us, r.max_us, r.iterations),
            (Some(6.83), Some(15.28), Some(200))
        );
        assert_eq!((r.overlap_pct, r.overall_us, r.valid), (None, None, None));
        let v = parse(REDUCE_SCATTER_VALIDATED).unwrap();
        assert_eq!(v.rows.len(), 5);
        assert!(
            v.rows
                .iter()
                .all(|r| r.valid == Some(true) && r.iterations == Some(100))
        );
        assert_eq!(v.rows[0].latency_us, 2.17);
    }

    #[test]
    fn bad_output_is_a_clear_error() {
        assert_eq!(parse("mpirun noticed that …\n"), Err(ParseError::NoHeader));
        let head = "# OSU MPI Allgather Latency Test v7.4\n# Size       Avg Latency(us)\n";
        assert_eq!(parse(head), Err(ParseError::NoData));
        assert!(matches!(
            parse(&format!("{head}4  1.0  2.0\n")),
            Err(ParseError::Fields {
                found: 3,
                expected: 2,
                ..
            })
        ));
        assert!(matches!(
            parse(&format!("{head}4  n/a\n")),
            Err(ParseError::Number { .. })
        ));
        // A failed validation reads as such.
        let failed = REDUCE_SCATTER_VALIDATED.replacen("Pass", "Fail", 1);
        assert_eq!(parse(&failed).unwrap().rows[0].valid, Some(false));
    }
}
