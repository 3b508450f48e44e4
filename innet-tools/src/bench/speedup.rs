//! The latency rows' lookups and speed-ups against `host-rd`, measured in the same run:
//! what the report's tables and the plots both read.

use super::LatencyRow;

/// The modes whose speed-up over `host-rd` the tables show, in column order.
pub const INC_MODES: [&str; 4] = ["inc-node", "inc-socket", "inc-nic", "inc-dpu"];
/// The baseline every speed-up is measured against, in the same run.
pub const BASELINE: &str = "host-rd";

/// The row of (mode, nodes, ppn, bytes), if measured.
#[must_use]
pub fn find<'a>(
    rows: &'a [LatencyRow],
    mode: &str,
    nodes: usize,
    ppn: usize,
    bytes: usize,
) -> Option<&'a LatencyRow> {
    rows.iter()
        .find(|r| r.mode == mode && r.nodes == nodes && r.ppn == ppn && r.bytes == bytes)
}

/// `host-rd`'s average over `mode`'s at the same point: above 1, the mode is faster.
#[must_use]
pub fn speedup(
    rows: &[LatencyRow],
    mode: &str,
    nodes: usize,
    ppn: usize,
    bytes: usize,
) -> Option<f64> {
    let base = find(rows, BASELINE, nodes, ppn, bytes)?;
    let m = find(rows, mode, nodes, ppn, bytes)?;
    Some(base.avg_us / m.avg_us)
}

/// Sorted distinct values of a field.
pub fn distinct<R>(rows: &[R], f: impl Fn(&R) -> usize) -> Vec<usize> {
    let mut v: Vec<usize> = rows.iter().map(f).collect();
    v.sort_unstable();
    v.dedup();
    v
}
