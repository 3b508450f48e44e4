//! The markdown report of a run, from its [`Results`] alone: the headline table next to the
//! papers' published numbers, one speed-up table per node count (laid out like the switch paper's
//! Tables 4–6), the XDP cost per packet, aggregation throughput, program sizes, plots, and
//! every latency row.

use std::fmt::Write as _;

use innet_client::{frames::packet_bytes, hostalg::ring_messages};
use innet_common::proto::{DEFAULT_PAYLOAD_BYTES, Dtype, Op, element_bytes, payload_for_mtu};

pub use super::speedup::{BASELINE, INC_MODES, distinct, find, speedup};

mod goodput;
mod machine;
mod mpi_runs;

use crate::markdown::{
    Align::{Left, Right},
    Table,
};

use super::{
    LatencyRow, ProgramRow, Results, ThroughputRow, XdpRow,
    breakdown::BreakdownRow,
    mpi::{GOODPUT_MPI_MODE, MpiRow, plain_us},
};
pub use goodput::{
    GOODPUT_BASELINE, cpu_table, goodput_section, goodput_table, link_checks_table,
    packets_per_call,
};
use machine::{bystander_table, programs_table, switch_mode_table, throughput_table, xdp_table};
pub use mpi_runs::{breakdown_table, cutover_table, mpi_table};

/// Headline message sizes: the papers' small-message range.
pub const HEADLINE_MAX_BYTES: usize = 256;

/// The switch paper, 16 nodes, PPN 64 (µs: host, INC Node, INC Socket).
pub const SWITCH_PAPER_16_NODES: [(usize, f64, f64, f64); 3] = [
    (4, 23.98, 17.15, 15.96),
    (64, 33.85, 18.10, 16.91),
    (256, 53.73, 22.35, 22.34),
];

/// The headline point: the most nodes, and there the most ranks per node.
#[must_use]
pub fn headline(rows: &[LatencyRow]) -> Option<(usize, usize)> {
    let nodes = *distinct(rows, |r| r.nodes).last()?;
    let ppn = rows
        .iter()
        .filter(|r| r.nodes == nodes)
        .map(|r| r.ppn)
        .max()?;
    Some((nodes, ppn))
}

fn cell(rows: &[LatencyRow], mode: &str, nodes: usize, ppn: usize, bytes: usize) -> String {
    match (
        find(rows, mode, nodes, ppn, bytes),
        speedup(rows, mode, nodes, ppn, bytes),
    ) {
        (Some(r), Some(s)) if mode != BASELINE => {
            format!("{:.1} ({s:.2}×){}", r.avg_us, flags(r))
        }
        (Some(r), _) => format!("{:.1}{}", r.avg_us, flags(r)),
        (None, _) => "n/a".into(),
    }
}

/// Marks a row whose collectives fell back or gave wrong results.
fn flags(r: &LatencyRow) -> String {
    let mut s = String::new();
    if r.fallbacks > 0 {
        let _ = write!(s, " †{}", r.fallbacks);
    }
    if r.errors > 0 {
        let _ = write!(s, " ✗{}", r.errors);
    }
    if r.failed.is_some() {
        s.push_str(" **failed**");
    }
    s
}

/// The cases that did not finish, each with its error.
#[must_use]
pub fn failed_cases(rows: &[LatencyRow]) -> String {
    let mut s = String::new();
    for r in rows {
        if let Some(why) = &r.failed {
            let _ = writeln!(s, "- {} {}×{} {} B: {why}", r.mode, r.nodes, r.ppn, r.bytes);
        }
    }
    if s.is_empty() {
        return s;
    }
    format!("## Cases that did not finish\n\nTheir rows hold what was measured before.\n\n{s}\n")
}

/// The SmartNIC comparison at the most nodes with one rank per node, sizes up to 256 B:
/// `inc-dpu` (the tree on the DPUs) against `inc-nic` (on the hosts' NICs) and `host-rd`.
#[must_use]
pub fn dpu_table(rows: &[LatencyRow]) -> String {
    let Some(nodes) = rows
        .iter()
        .filter(|r| r.mode == "inc-dpu" && r.ppn == 1)
        .map(|r| r.nodes)
        .max()
    else {
        return String::new();
    };
    let s = format!(
        "## The tree on the DPUs

{nodes} nodes × 1 rank per node, average µs; `inc-dpu` / `inc-nic` \
         is the DPU's cost over the host NIC's (target ≤ 1.2), `{BASELINE}` / `inc-dpu` its \
         speed-up (target ≥ 2):\n\n"
    );
    let over_dpu = format!("{BASELINE} / inc-dpu");
    let header = [
        "bytes",
        BASELINE,
        "inc-nic",
        "inc-dpu",
        "inc-dpu / inc-nic",
        &over_dpu,
    ];
    let mut t = Table::aligned(header.map(|h| (h, Right)));
    for bytes in distinct(rows, |r| r.bytes)
        .into_iter()
        .filter(|&b| b <= HEADLINE_MAX_BYTES)
    {
        let avg = |m| find(rows, m, nodes, 1, bytes).map(|r| r.avg_us);
        let (Some(base), Some(nic), Some(dpu)) = (avg(BASELINE), avg("inc-nic"), avg("inc-dpu"))
        else {
            continue;
        };
        t.row([
            bytes.to_string(),
            format!("{base:.1}"),
            format!("{nic:.1}"),
            format!("{dpu:.1}"),
            format!("{:.2}", dpu / nic),
            format!("{:.2}×", base / dpu),
        ]);
    }
    s + &t.to_string() + "\n"
}

/// The headline tables: every size up to 256 B at the most nodes, with one rank per node
/// (the NIC paper's setting) and with the most ranks per node (the switch paper's).
#[must_use]
pub fn headline_table(rows: &[LatencyRow]) -> String {
    let Some((nodes, most)) = headline(rows) else {
        return "no latency measured\n".into();
    };
    let fewest = rows
        .iter()
        .filter(|r| r.nodes == nodes)
        .map(|r| r.ppn)
        .min()
        .unwrap_or(most);
    let mut s = String::new();
    for ppn in if fewest == most {
        vec![most]
    } else {
        vec![fewest, most]
    } {
        let _ = writeln!(
            s,
            "{nodes} nodes × {ppn} ranks per node, average µs (speed-up over `{BASELINE}` measured in the same run):\n"
        );
        s += &speedup_table(rows, nodes, ppn, |b| b <= HEADLINE_MAX_BYTES);
        s += "\n";
    }
    s
}

/// A table of a row per size: `bytes`, then a column per mode, all right-aligned.
fn mode_table(modes: &[impl std::fmt::Display]) -> Table {
    let mut header = vec!["bytes".to_string()];
    header.extend(modes.iter().map(ToString::to_string));
    Table::aligned(header.into_iter().map(|h| (h, Right)))
}

fn speedup_table(
    rows: &[LatencyRow],
    nodes: usize,
    ppn: usize,
    keep: impl Fn(usize) -> bool,
) -> String {
    let modes: Vec<&str> = [BASELINE, "host-ring"]
        .into_iter()
        .chain(INC_MODES)
        .collect();
    let mut t = mode_table(&modes);
    for bytes in distinct(rows, |r| r.bytes).into_iter().filter(|&b| keep(b)) {
        let mut cells = vec![bytes.to_string()];
        cells.extend(modes.iter().map(|m| cell(rows, m, nodes, ppn, bytes)));
        t.row(cells);
    }
    t.to_string()
}

/// The whole report.
#[must_use]
pub fn markdown(r: &Results) -> String {
    let mut s = String::from("# innet benchmark\n\n");
    let _ = writeln!(
        s,
        "Run on {}.\n\nSettings: `{}`\n",
        r.machine.summary(),
        r.settings
    );
    s += "Every rank is a thread of one process inside its node's network namespace; the \
          switches are Linux bridges in namespaces with innet's XDP programs on their ports, \
          and every node runs a NIC daemon. All ranks and all switches share this machine's \
          CPUs, so absolute latencies are far above a real cluster's; the speed-ups compare \
          modes measured side by side in the same run. `†n`: n collectives fell back to the \
          hosts; `✗n`: n wrong results (there should be none).\n\n";
    let all: Vec<LatencyRow> = r.latency.iter().chain(&r.goodput).cloned().collect();
    s += &failed_cases(&all);
    if !r.mpi.is_empty() {
        s += &mpi_table(&r.mpi, &r.latency);
    }
    if !r.osu.is_empty() {
        s += &super::osu::tables::markdown(&r.osu);
    }
    if !r.apps.is_empty() {
        s += &super::apps::tables::markdown(&r.apps);
    }
    if !r.overlap.is_empty() {
        s += &super::overlap::markdown(&r.overlap);
    }
    if !r.barrier.is_empty() {
        s += &super::barrier::markdown(&r.barrier);
    }
    if !r.cutover.mpi.is_empty() || !r.cutover.library.is_empty() {
        s += &cutover_table(&r.cutover);
    }
    if !r.breakdown.is_empty() {
        s += &breakdown_table(&r.breakdown, &r.mpi);
    }
    if !r.latency.is_empty() {
        s += &headline_section(&r.latency);
        s += &per_node_sections(&r.latency);
    }
    if !r.goodput.is_empty() {
        s += &goodput_section(&r.goodput);
        s += &link_checks_table(&r.link_checks);
    }
    if !r.bystander.is_empty() {
        s += &bystander_table(&r.bystander);
    }
    if !r.switch_modes.is_empty() {
        s += &switch_mode_table(&r.switch_modes);
    }
    if !r.xdp.is_empty() {
        s += &xdp_table(&r.xdp);
    }
    if !r.throughput.is_empty() {
        s += &throughput_table(&r.throughput);
    }
    if !r.programs.is_empty() {
        s += &programs_table(&r.programs);
    }
    if !r.latency.is_empty() || !r.goodput.is_empty() {
        s += &every_row_table(r.latency.iter().chain(&r.goodput));
    }
    s
}

/// The headline table and the papers' numbers beside it.
fn headline_section(latency: &[LatencyRow]) -> String {
    let mut s = String::new();
    s += "## Headline (the library against its own host algorithms)\n\n";
    s += &headline_table(latency);
    s += "\nThe switch paper (16 nodes, PPN 64, FPGA switches), µs host / INC Node / INC Socket:\n\n";
    s += &switch_paper_table();
    s += "\nThe NIC paper (16 nodes, 1 process per node, NIC offload, doubles 16–48 B): \
          1.71–1.91×; 2.71× at 256 nodes.\n\n";
    s += &dpu_table(latency);
    s
}

/// The switch paper's numbers, its speed-ups over its host column beside them.
fn switch_paper_table() -> String {
    let mut t = Table::aligned(["bytes", "host", "INC Node", "INC Socket"].map(|h| (h, Right)));
    for (b, h, n, k) in SWITCH_PAPER_16_NODES {
        t.row([
            b.to_string(),
            h.to_string(),
            format!("{n} ({:.2}×)", h / n),
            format!("{k} ({:.2}×)", h / k),
        ]);
    }
    t.to_string()
}

/// Latency and speed-up per node count and ranks per node, with the plots.
fn per_node_sections(latency: &[LatencyRow]) -> String {
    let mut s = String::new();
    s += "## Latency and speed-up per node count\n\n";
    for nodes in distinct(latency, |x| x.nodes) {
        let _ = writeln!(s, "### {nodes} nodes\n");
        let ppns: Vec<usize> = distinct(latency, |x| x.ppn)
            .into_iter()
            .filter(|&p| latency.iter().any(|x| x.nodes == nodes && x.ppn == p))
            .collect();
        for ppn in ppns {
            let _ = writeln!(
                s,
                "{ppn} ranks per node ({} ranks), average µs:\n",
                nodes * ppn
            );
            s += &speedup_table(latency, nodes, ppn, |_| true);
            s += "\n";
        }
        let _ = writeln!(
            s,
            "![latency vs size, {nodes} nodes](latency-{nodes}-nodes.svg)\n"
        );
    }
    for ppn in super::plot::common_ppns(latency) {
        let _ = writeln!(
            s,
            "![speed-up over host-rd vs nodes, {ppn} ranks per node](speedup-{ppn}ppn.svg)\n"
        );
    }
    s
}

/// Every latency and goodput row.
fn every_row_table<'a>(rows: impl Iterator<Item = &'a LatencyRow>) -> String {
    let mut t = Table::aligned([
        ("mode", Left),
        ("path", Left),
        ("nodes", Right),
        ("ppn", Right),
        ("bytes", Right),
        ("iterations", Right),
        ("avg µs", Right),
        ("p50 µs", Right),
        ("p99 µs", Right),
        ("errors", Right),
        ("fallbacks", Right),
        ("resent", Right),
    ]);
    for x in rows {
        t.row([
            x.label(),
            x.path.clone(),
            x.nodes.to_string(),
            x.ppn.to_string(),
            x.bytes.to_string(),
            x.iterations.to_string(),
            format!("{:.1}", x.avg_us),
            format!("{:.1}", x.p50_us),
            format!("{:.1}", x.p99_us),
            x.errors.to_string(),
            x.fallbacks.to_string(),
            x.retransmissions.to_string(),
        ]);
    }
    format!("## Every latency row\n\n{t}")
}

#[cfg(test)]
mod tests;
