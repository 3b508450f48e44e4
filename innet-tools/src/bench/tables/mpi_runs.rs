//! The MPI tables: the per-stage breakdown, innet against OpenMPI as users run it, and
//! the cutover table the run derived.

use super::*;

/// Where a 4 B allreduce's time goes, per shape and mode; with the interposer's own cost
/// where osu_allreduce ran at the same shape.
#[must_use]
pub fn breakdown_table(rows: &[BreakdownRow], mpi: &[MpiRow]) -> String {
    let mut s = String::from(
        "## Where the time of a 4 B allreduce goes\n\n\
         1 rank per node, int32 SUM, µs per call: the means of each leader's stamps \
         (`innet_client::stages`), lined up per call across the leaders, so the columns \
         from *library* to *return* add up to *total*. *library*: entry to the first packet \
         built (checks, node-local gather, framing); *wait peers*: until the slowest leader's \
         packet is built; *network*: from there to the first result (the send system call, \
         kernel stacks, veths, bridges, XDP); *wake*: the first result to this leader's; \
         *return*: result to return. In parentheses, parts of those: *framing* (of \
         *library*) and the *send* system call (the kernel carries the packet through the \
         veths and XDP inside it; `inc-nic`: the post's `BPF_PROG_TEST_RUN`). *blocked*: \
         waits per call that went to sleep in the kernel (the others spun). *XDP*: innet's \
         programs over the same calls (the kernel's run-time statistics), runs per call × ns \
         per run, and their sum. *interposer*: osu_allreduce with innet's interposer minus \
         the library's total at the same shape in this run (MPI's call path, the \
         interposer, a process per rank instead of a thread).\n\n",
    );
    let mut t = Table::aligned([
        ("nodes", Right),
        ("mode", Left),
        ("total", Right),
        ("library", Right),
        ("(framing)", Right),
        ("wait peers", Right),
        ("network", Right),
        ("(send)", Right),
        ("wake", Right),
        ("return", Right),
        ("blocked", Right),
        ("XDP runs × ns", Right),
        ("XDP µs", Right),
        ("interposer", Right),
    ]);
    let us = |x: f64| format!("{x:.1}");
    for r in rows {
        let interposer = mpi
            .iter()
            .find(|m| {
                m.is_alone()
                    && m.errors == 0
                    && (m.nodes, m.ppn, m.bytes) == (r.nodes, r.ppn, r.bytes)
            })
            .filter(|_| r.mode == "inc-node")
            .map_or_else(|| "–".into(), |m| format!("{:.1}", m.avg_us - r.total_us));
        t.row([
            r.nodes.to_string(),
            r.mode.clone(),
            us(r.total_us),
            us(r.library_us),
            us(r.framing_us),
            us(r.wait_peers_us),
            us(r.network_us),
            us(r.send_us),
            us(r.wake_us),
            us(r.return_us),
            format!("{:.2}", r.blocked_per_call),
            format!("{:.1} × {:.0}", r.xdp_runs_per_call, r.xdp_ns_per_run),
            us(r.xdp_runs_per_call * r.xdp_ns_per_run / 1e3),
            interposer,
        ]);
    }
    s += &t.to_string();
    s += "\n";
    for r in rows.iter().filter(|r| r.fallbacks + r.errors > 0) {
        let _ = writeln!(
            s,
            "{} nodes, {}: {} calls fell back (left out), {} wrong results.\n",
            r.nodes, r.mode, r.fallbacks, r.errors
        );
    }
    s
}

/// osu_allreduce under mpirun over the fabric, per shape and flavour: plain MPI, with the
/// interposer as a user switches it on (learned cutover), and with the interposer serving
/// every size, next to the library's own `inc-node` and `host-rd` at the same point of the
/// latency sweep.
#[must_use]
pub fn mpi_table(rows: &[MpiRow], latency: &[LatencyRow]) -> String {
    let mut s = String::from(
        "## innet vs MPI over the same fabric (osu_allreduce)\n\n\
         int32 SUM; the ranks' average of their mean latency, µs, each call timed alone with \
         a barrier after it (OSU's method). MPI runs as on a cluster (launch `multi-node`): \
         one daemon per node, the ranks of a node in its network namespace with its \
         hostname, shared memory within a node, TCP across the same bridges innet runs on \
         between nodes, yield when idle, no binding, the scheduler's autogroups off (each \
         line below a table gives the settings). *MPI* is unmodified MPI, the mean of a run \
         before and a run after the interposed ones (*before / after*: the two; runs drift \
         a few percent over minutes on this machine, and the mean keeps the drift from \
         favouring either side). *+ innet* \
         preloads innet's interposer and sets nothing else: no placement file, no cutover \
         table; it finds the placement and learns per size class whether innet or MPI is \
         faster (*way*: what it chose for that size). *+ innet, alone* serves every size \
         through the switches (`INNET_MPI_LEARN=0`). Gains are over *MPI* in the same run. \
         *library*: innet's client library at the same point of the latency sweep (ranks \
         as threads of one process).\n\n",
    );
    let mut shapes: Vec<(usize, usize, &str)> = rows
        .iter()
        .map(|r| (r.nodes, r.ppn, r.flavour.as_str()))
        .collect();
    shapes.sort_unstable();
    shapes.dedup();
    for (nodes, ppn, flavour) in shapes {
        let these: Vec<&MpiRow> = rows
            .iter()
            .filter(|r| (r.nodes, r.ppn, r.flavour.as_str()) == (nodes, ppn, flavour))
            .collect();
        let _ = writeln!(
            s,
            "### {nodes} nodes × {ppn} ({} ranks), {flavour}\n",
            nodes * ppn
        );
        s += &shape_table(rows, &these, latency, (nodes, ppn));
        s += "\n";
        if let Some(r) = these.first() {
            let _ = writeln!(s, "Launch `{}`: {}.", r.launch, r.settings);
        }
        s += &run_lines(&these);
        s += "\n";
    }
    s
}

/// One shape's table: per size, plain MPI, the interposer learning and serving alone (each
/// with its gain), and the library at the same point of the latency sweep.
fn shape_table(
    rows: &[MpiRow],
    these: &[&MpiRow],
    latency: &[LatencyRow],
    (nodes, ppn): (usize, usize),
) -> String {
    let mut t = Table::aligned([
        ("bytes", Right),
        ("MPI", Right),
        ("before / after", Right),
        ("+ innet", Right),
        ("way", Left),
        ("+ innet, alone", Right),
        ("library inc-node", Right),
        ("library host-rd", Right),
    ]);
    let find = |pick: fn(&MpiRow) -> bool, bytes: usize| {
        these
            .iter()
            .find(|r| pick(r) && r.bytes == bytes && r.errors == 0)
    };
    let us = |r: Option<&&MpiRow>| r.map_or("–".into(), |r| format!("{:.1}", r.avg_us));
    let measured: Vec<&MpiRow> = these.iter().copied().filter(|r| r.errors == 0).collect();
    for bytes in distinct(&measured, |r| r.bytes) {
        let before = find(|r| !r.innet && !r.again, bytes);
        let after = find(|r| !r.innet && r.again, bytes);
        let plain = before.or(after).and_then(|p| plain_us(rows, p));
        let gain = |i: Option<&&MpiRow>| match (i, plain) {
            (Some(i), Some(p)) => format!("{:.1} ({:.2}×)", i.avg_us, p / i.avg_us),
            (Some(i), None) => format!("{:.1}", i.avg_us),
            (None, _) => "–".into(),
        };
        let learned = find(|r| r.learned, bytes);
        t.row([
            bytes.to_string(),
            plain.map_or("–".into(), |p| format!("{p:.1}")),
            format!("{} / {}", us(before), us(after)),
            gain(learned),
            learned
                .and_then(|r| r.way.as_deref())
                .unwrap_or("–")
                .to_string(),
            gain(find(MpiRow::is_alone, bytes)),
            cell(latency, "inc-node", nodes * ppn, ppn, bytes),
            cell(latency, BASELINE, nodes * ppn, ppn, bytes),
        ]);
    }
    t.to_string()
}

/// One line per run of a shape (every row of a run carries its counts), and the failed.
pub(super) fn run_lines(these: &[&MpiRow]) -> String {
    let mut s = String::new();
    let first = these.iter().map(|r| r.bytes).min().unwrap_or(0);
    for r in these
        .iter()
        .filter(|r| r.innet && (r.bytes == first || r.errors > 0))
    {
        let _ = writeln!(
            s,
            "{}: {} collectives served through the switches on rank 0, {} given to MPI by \
             the cutover on rank 0, {} calls passed to MPI for other reasons or fell back \
             on all ranks{}.",
            r.run_name(),
            r.served,
            r.to_mpi,
            r.fallbacks,
            if r.errors > 0 {
                " (the run failed)"
            } else {
                ""
            }
        );
    }
    for r in these.iter().filter(|r| r.errors > 0) {
        let _ = writeln!(
            s,
            "✗ {}: mpirun failed (a wrong result aborts osu_allreduce).",
            r.run_name()
        );
    }
    s
}

/// The cutover table the run derived.
#[must_use]
pub fn cutover_table(t: &innet_client::CutoverTable) -> String {
    let s = String::from(
        "## Cutover table (written as cutover.toml)\n\n\
         Longest message innet serves; longer ones go to the host path, where they were \
         faster in this run (0: every size).\n\n",
    );
    let mut table = Table::numbers(["against", "nodes", "ppn", "network up to (B)"]);
    for (against, rules) in [
        ("MPI over the fabric", &t.mpi),
        ("host algorithms", &t.library),
    ] {
        for r in rules {
            table.row([
                against.to_string(),
                r.nodes.to_string(),
                r.ppn.to_string(),
                r.network_max_bytes.to_string(),
            ]);
        }
    }
    s + &table.to_string() + "\n"
}
