//! The markdown report of a run, from its [`Results`] alone: the headline table next to the
//! papers' published numbers, one speed-up table per node count (laid out like the switch paper's
//! Tables 4–6), the XDP cost per packet, aggregation throughput, program sizes, plots, and
//! every latency row.

use std::fmt::Write as _;

use innet_client::{frames::packet_bytes, hostalg::ring_messages};
use innet_common::proto::{DEFAULT_PAYLOAD_BYTES, Dtype, Op, element_bytes, payload_for_mtu};

pub use super::speedup::{BASELINE, INC_MODES, distinct, find, speedup};
use super::{
    LatencyRow, ProgramRow, Results, ThroughputRow, XdpRow,
    breakdown::BreakdownRow,
    mpi::{GOODPUT_MPI_MODE, MpiRow, plain_us},
};

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
    let mut s = format!(
        "## The tree on the DPUs

{nodes} nodes × 1 rank per node, average µs; `inc-dpu` / `inc-nic` \
         is the DPU's cost over the host NIC's (target ≤ 1.2), `{BASELINE}` / `inc-dpu` its \
         speed-up (target ≥ 2):\n\n| bytes | {BASELINE} | inc-nic | inc-dpu | inc-dpu / inc-nic | \
         {BASELINE} / inc-dpu |\n|---:|---:|---:|---:|---:|---:|\n"
    );
    for bytes in distinct(rows, |r| r.bytes)
        .into_iter()
        .filter(|&b| b <= HEADLINE_MAX_BYTES)
    {
        let avg = |m| find(rows, m, nodes, 1, bytes).map(|r| r.avg_us);
        let (Some(base), Some(nic), Some(dpu)) = (avg(BASELINE), avg("inc-nic"), avg("inc-dpu"))
        else {
            continue;
        };
        let _ = writeln!(
            s,
            "| {bytes} | {base:.1} | {nic:.1} | {dpu:.1} | {:.2} | {:.2}× |",
            dpu / nic,
            base / dpu
        );
    }
    s + "\n"
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

/// A table's header after `| bytes |`: a column per mode, then the alignment row.
fn mode_columns(modes: &[impl std::fmt::Display]) -> String {
    let mut s = String::new();
    for m in modes {
        let _ = write!(s, " {m} |");
    }
    s + "\n|---:|" + &"---:|".repeat(modes.len()) + "\n"
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
    let mut s = String::from("| bytes |");
    s += &mode_columns(&modes);
    for bytes in distinct(rows, |r| r.bytes).into_iter().filter(|&b| keep(b)) {
        let _ = write!(s, "| {bytes} |");
        for m in &modes {
            let _ = write!(s, " {} |", cell(rows, m, nodes, ppn, bytes));
        }
        s += "\n";
    }
    s
}

/// innet's latency with the switches' programs native and in skb mode, same run.
fn switch_mode_table(rows: &[super::bystander::SwitchModeRow]) -> String {
    let mut s = String::from(
        "### What skb mode costs innet\n\n\
         4 nodes × 1 rank, int32 SUM, every result checked; the same fabric built twice in \
         this run, the switches' programs attached natively, then in skb mode. Average µs \
         (`†n`: fallbacks, `✗n`: wrong results):\n\n\
         | switches | mode | bytes | avg µs | p99 µs | × host-rd |\n\
         |---|---|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let base = rows
            .iter()
            .find(|b| {
                b.switch_mode == r.switch_mode
                    && b.row.mode == BASELINE
                    && b.row.bytes == r.row.bytes
            })
            .map(|b| b.row.avg_us / r.row.avg_us);
        let marks = format!(
            "{}{}",
            if r.row.fallbacks > 0 {
                format!(" †{}", r.row.fallbacks)
            } else {
                String::new()
            },
            if r.row.errors > 0 {
                format!(" ✗{}", r.row.errors)
            } else {
                String::new()
            }
        );
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.1}{marks} | {:.1} | {} |",
            r.switch_mode,
            r.row.mode,
            r.row.bytes,
            r.row.avg_us,
            r.row.p99_us,
            base.map_or("-".into(), |x| format!("{x:.2}×"))
        );
    }
    s += "\n";
    s
}

/// TCP through a bridge with and without innet: every run, then the means and ratios.
fn bystander_table(rows: &[super::bystander::BystanderRow]) -> String {
    let mut s = String::from(
        "## Bystander traffic (TCP through an innet bridge)\n\n\
         `iperf3` TCP between two hosts through a Linux bridge whose two veth ports run \
         innet (or nothing), the settings in turns within one run, a fresh bridge each time. \
         *sender TSO / max MTU*: the sending host's veth during the run (a veth turns TSO off \
         on its peer while a native XDP program is attached, whatever the program; \
         `xdp.frags` keeps its max MTU).\n\n\
         | MTU | setting | mean Gbit/s | × without innet | runs (Gbit/s) | sender TSO | sender max MTU |\n\
         |---:|---|---:|---:|---|---|---:|\n",
    );
    for (mtu, setting, mean, ratio) in super::bystander::summary(rows) {
        let runs: Vec<&super::bystander::BystanderRow> = rows
            .iter()
            .filter(|r| r.mtu == mtu && r.setting == setting)
            .collect();
        let each: Vec<String> = runs
            .iter()
            .map(|r| match &r.failed {
                Some(e) => format!("failed: {e}"),
                None => format!("{:.2}", r.gbit_s),
            })
            .collect();
        let ok = runs.iter().find(|r| r.failed.is_none());
        let _ = writeln!(
            s,
            "| {mtu} | {setting} | {mean:.2} | {ratio:.2}× | {} | {} | {} |",
            each.join(", "),
            ok.map_or("-", |r| if r.sender_tso { "on" } else { "off" }),
            ok.map_or(0, |r| r.sender_max_mtu)
        );
    }
    for r in rows.iter().filter(|r| r.failed.is_some()) {
        if !super::bystander::summary(rows)
            .iter()
            .any(|(m, x, _, _)| *m == r.mtu && *x == r.setting)
        {
            let _ = writeln!(
                s,
                "| {} | {} | - | - | failed: {} | - | - |",
                r.mtu,
                r.setting,
                r.failed.as_deref().unwrap_or_default()
            );
        }
    }
    s += "\n";
    s
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
    s += "\nThe switch paper (16 nodes, PPN 64, FPGA switches), µs host / INC Node / INC Socket:\n\n\
          | bytes | host | INC Node | INC Socket |\n|---:|---:|---:|---:|\n";
    for (b, h, n, k) in SWITCH_PAPER_16_NODES {
        let _ = writeln!(
            s,
            "| {b} | {h} | {n} ({:.2}×) | {k} ({:.2}×) |",
            h / n,
            h / k
        );
    }
    s += "\nThe NIC paper (16 nodes, 1 process per node, NIC offload, doubles 16–48 B): \
          1.71–1.91×; 2.71× at 256 nodes.\n\n";
    s += &dpu_table(latency);
    s
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

/// XDP cost per packet (BPF_PROG_TEST_RUN).
fn xdp_table(rows: &[XdpRow]) -> String {
    let mut s = String::new();
    s += "## XDP cost per packet (BPF_PROG_TEST_RUN)\n\n\
          `repeat`: one run with a repeat count (stateless cases); `per-frame`: one \
          kernel-timed run per distinct frame (aggregation changes state), averaged. Each \
          method has its own no-op baseline; `× no-op` divides by it.\n\n\
          | case | payload B | method | runs | ns/pkt | Mpps/core | × no-op | errors |\n\
          |---|---:|---|---:|---:|---:|---:|---:|\n";
    for x in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.1} | {:.2} | {:.2} | {} |",
            x.case,
            x.payload_bytes,
            x.method,
            x.runs,
            x.ns_per_pkt,
            x.mpps_per_core,
            x.ratio_to_noop,
            x.errors
        );
    }
    s += "\n";
    s
}

/// Aggregation throughput on one core.
fn throughput_table(rows: &[ThroughputRow]) -> String {
    let mut s = String::new();
    s += "## Aggregation throughput (one core, kernel time)\n\n\
          | groups | children | payload B | rounds | rounds/s | Mpps | errors |\n\
          |---:|---:|---:|---:|---:|---:|---:|\n";
    for t in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.0} | {:.2} | {} |",
            t.groups,
            t.children,
            t.payload_bytes,
            t.rounds,
            t.rounds_per_sec,
            t.mpps_per_core,
            t.errors
        );
    }
    s += "\n";
    s
}

/// Every program as the verifier sees it.
fn programs_table(rows: &[ProgramRow]) -> String {
    let mut s = String::new();
    s += "## Programs (verifier's view)\n\n| program | xlated B | jited B | verified insns |\n\
          |---|---:|---:|---:|\n";
    for p in rows {
        let _ = writeln!(
            s,
            "| `{}` | {} | {} | {} |",
            p.name, p.xlated_bytes, p.jited_bytes, p.verified_insns
        );
    }
    s += "\n";
    s
}

/// Every latency and goodput row.
fn every_row_table<'a>(rows: impl Iterator<Item = &'a LatencyRow>) -> String {
    let mut s = String::new();
    s += "## Every latency row\n\n\
          | mode | path | nodes | ppn | bytes | iterations | avg µs | p50 µs | p99 µs | errors | fallbacks | resent |\n\
          |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for x in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {} | {} | {} |",
            x.label(),
            x.path,
            x.nodes,
            x.ppn,
            x.bytes,
            x.iterations,
            x.avg_us,
            x.p50_us,
            x.p99_us,
            x.errors,
            x.fallbacks,
            x.retransmissions
        );
    }
    s
}

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
         interposer, a process per rank instead of a thread).\n\n\
         | nodes | mode | total | library | (framing) | wait peers | network | (send) | \
         wake | return | blocked | XDP runs × ns | XDP µs | interposer |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
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
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | \
             {:.1} × {:.0} | {:.1} | {interposer} |",
            r.nodes,
            r.mode,
            r.total_us,
            r.library_us,
            r.framing_us,
            r.wait_peers_us,
            r.network_us,
            r.send_us,
            r.wake_us,
            r.return_us,
            r.blocked_per_call,
            r.xdp_runs_per_call,
            r.xdp_ns_per_run,
            r.xdp_runs_per_call * r.xdp_ns_per_run / 1e3,
        );
    }
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
            "### {nodes} nodes × {ppn} ({} ranks), {flavour}\n\n\
             | bytes | MPI | before / after | + innet | way | + innet, alone | library inc-node | library host-rd |\n\
             |---:|---:|---:|---:|---|---:|---:|---:|",
            nodes * ppn
        );
        let find = |pick: fn(&MpiRow) -> bool, bytes: usize| {
            these
                .iter()
                .find(|r| pick(r) && r.bytes == bytes && r.errors == 0)
        };
        let measured: Vec<&MpiRow> = these.iter().copied().filter(|r| r.errors == 0).collect();
        for bytes in distinct(&measured, |r| r.bytes) {
            let before = find(|r| !r.innet && !r.again, bytes);
            let after = find(|r| !r.innet && r.again, bytes);
            let plain = before.or(after).and_then(|p| plain_us(rows, p));
            let us = |r: Option<&&MpiRow>| r.map_or("–".into(), |r| format!("{:.1}", r.avg_us));
            let _ = write!(
                s,
                "| {bytes} | {} | {} / {} |",
                plain.map_or("–".into(), |p| format!("{p:.1}")),
                us(before),
                us(after)
            );
            let gain = |i: Option<&&MpiRow>| match (i, plain) {
                (Some(i), Some(p)) => format!(" {:.1} ({:.2}×) |", i.avg_us, p / i.avg_us),
                (Some(i), None) => format!(" {:.1} |", i.avg_us),
                (None, _) => " – |".into(),
            };
            let learned = find(|r| r.learned, bytes);
            s += &gain(learned);
            let _ = write!(
                s,
                " {} |",
                learned.and_then(|r| r.way.as_deref()).unwrap_or("–")
            );
            s += &gain(find(MpiRow::is_alone, bytes));
            let _ = writeln!(
                s,
                " {} | {} |",
                cell(latency, "inc-node", nodes * ppn, ppn, bytes),
                cell(latency, BASELINE, nodes * ppn, ppn, bytes)
            );
        }
        s += "\n";
        if let Some(r) = these.first() {
            let _ = writeln!(s, "Launch `{}`: {}.", r.launch, r.settings);
        }
        s += &run_lines(&these);
        s += "\n";
    }
    s
}

/// One line per run of a shape (every row of a run carries its counts), and the failed.
fn run_lines(these: &[&MpiRow]) -> String {
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
    let mut s = String::from(
        "## Cutover table (written as cutover.toml)\n\n\
         Longest message innet serves; longer ones go to the host path, where they were \
         faster in this run (0: every size).\n\n| against | nodes | ppn | network up to (B) |\n\
         |---|---:|---:|---:|\n",
    );
    for (against, rules) in [
        ("MPI over the fabric", &t.mpi),
        ("host algorithms", &t.library),
    ] {
        for r in rules {
            let _ = writeln!(
                s,
                "| {against} | {} | {} | {} |",
                r.nodes, r.ppn, r.network_max_bytes
            );
        }
    }
    s + "\n"
}

/// The baseline of the goodput table: the host algorithm for long messages.
pub const GOODPUT_BASELINE: &str = "host-ring";

/// The goodput section: per node count the goodput table, the packets per second per
/// leader, where the CPU goes, and the chart.
#[must_use]
pub fn goodput_section(rows: &[LatencyRow]) -> String {
    let dtype = rows.first().map_or("", |r| r.dtype.as_str());
    let mut s = format!(
        "## Long messages: goodput\n\n{dtype} SUM (a column naming another type adds that \
         type), 1 rank per node; MB/s of message per \
         allreduce (bytes / average time). Each in-network column's ratios, measured in the \
         same run: `ring`, to `{GOODPUT_BASELINE}` (the host algorithm for long messages); \
         `MPI`, to plain `{GOODPUT_MPI_MODE}` over the same fabric with the same links' MTU \
         (its own column at that MTU).\n\n"
    );
    let counts = distinct(rows, |r| r.nodes);
    for &nodes in &counts {
        let these: Vec<LatencyRow> = rows.iter().filter(|r| r.nodes == nodes).cloned().collect();
        s += &goodput_table(&these);
        s += &cpu_table(&these);
        let _ = writeln!(
            s,
            "![goodput vs size, {nodes} nodes]({}.svg)\n",
            super::plot::goodput_chart_name(&counts, nodes)
        );
    }
    s
}

/// Goodput (message bytes per second of an allreduce) per mode and size at one node count,
/// each in-network mode's ratio to `host-ring` and to plain OpenMPI at the same MTU, then
/// the data packets per second per leader.
#[must_use]
pub fn goodput_table(rows: &[LatencyRow]) -> String {
    let modes: Vec<String> = {
        let mut m: Vec<String> = vec![];
        for r in rows {
            if !m.contains(&r.goodput_label()) {
                m.push(r.goodput_label());
            }
        }
        m
    };
    let mut s = format!(
        "### {} nodes × {} rank per node\n\n| bytes |",
        rows.first().map_or(0, |r| r.nodes),
        rows.first().map_or(0, |r| r.ppn),
    );
    s += &mode_columns(&modes);
    let ok = |x: &&LatencyRow| x.failed.is_none() && x.avg_us > 0.0;
    for bytes in distinct(rows, |x| x.bytes) {
        let _ = write!(s, "| {bytes} |");
        let base = rows
            .iter()
            .filter(ok)
            .find(|x| x.bytes == bytes && x.goodput_label() == GOODPUT_BASELINE)
            .map(|x| x.avg_us);
        for m in &modes {
            match rows
                .iter()
                .find(|x| x.bytes == bytes && x.goodput_label() == *m)
            {
                Some(x) if x.failed.is_some() => s += " **failed** |",
                Some(x) => {
                    let mbps = x.bytes as f64 / x.avg_us;
                    let mut ratios = vec![];
                    if let Some(b) = base.filter(|_| x.mode != GOODPUT_BASELINE) {
                        ratios.push(format!("{:.2}× ring", b / x.avg_us));
                    }
                    let mpi = rows
                        .iter()
                        .filter(ok)
                        .find(|p| p.mode == GOODPUT_MPI_MODE && (p.bytes, p.mtu) == (bytes, x.mtu));
                    if let Some(p) = mpi.filter(|_| INC_MODES.contains(&x.mode.as_str())) {
                        ratios.push(format!("{:.2}× MPI", p.avg_us / x.avg_us));
                    }
                    let ratios = if ratios.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", ratios.join(", "))
                    };
                    let _ = write!(s, " {mbps:.1}{ratios}{} |", flags(x));
                }
                None => s += " – |",
            }
        }
        s += "\n";
    }
    s += "\nData packets each leader sends per second (thousands), from the packets one \
          allreduce takes (in-network: one per payload of the link's MTU, 1408 or 2944 B; \
          `host-ring`: its messages in 1408 B packets; MPI's TCP segments are not counted):\n\n\
          | bytes |";
    s += &mode_columns(&modes);
    for bytes in distinct(rows, |x| x.bytes) {
        let _ = write!(s, "| {bytes} |");
        for m in &modes {
            let row = rows
                .iter()
                .find(|x| x.bytes == bytes && x.goodput_label() == *m);
            match row
                .filter(|x| x.failed.is_none())
                .and_then(|x| Some((x, packets_per_call(x)?)))
            {
                Some((x, packets)) => {
                    let _ = write!(s, " {:.1} |", packets as f64 / x.avg_us * 1e3);
                }
                None => s += " – |",
            }
        }
        s += "\n";
    }
    s + "\n"
}

/// Where the CPU goes at one node count: per case, the machine's busy CPU time over the
/// timed calls per data packet the leaders sent, softirq and the rest, and innet's XDP
/// time per packet (the kernel's own timing). Cells that could not be read say so.
#[must_use]
pub fn cpu_table(rows: &[LatencyRow]) -> String {
    let mut s = String::from(
        "Where the CPU goes: the machine's busy CPU time over each case's timed calls (all \
         CPUs, `/proc/stat`: user + nice + system + irq + softirq, 10 ms ticks), per data \
         packet the leaders sent (the packets above × leaders × calls); *softirq* is where \
         XDP on veth and the kernel's network path run, *rest* the ranks, daemons and \
         system calls. *XDP* is the kernel's run time of innet's XDP programs \
         (`kernel.bpf_stats_enabled` on for the sweep), per packet and as a share of the \
         busy CPU; *XDP runs* per packet counts each program a packet passes through. \
         Machine-wide: anything else the machine ran meanwhile counts too.\n\n\
         | bytes | mode | window ms | busy CPUs | k pkt/s per leader | CPU ns/pkt | softirq ns/pkt | rest ns/pkt | XDP ns/pkt | XDP share | XDP runs/pkt |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut missing = vec![];
    for r in rows.iter().filter(|r| r.failed.is_none()) {
        if r.mode == GOODPUT_MPI_MODE {
            continue;
        }
        let Some(c) = &r.cpu else {
            missing.push(format!("{} {} B: not profiled", r.goodput_label(), r.bytes));
            continue;
        };
        let Some(per_call) = packets_per_call(r) else {
            missing.push(format!(
                "{} {} B: packets unknown",
                r.goodput_label(),
                r.bytes
            ));
            continue;
        };
        let packets = (per_call * r.nodes * c.calls) as f64;
        let ns = |x: u64| x as f64 / packets;
        let xdp = c.xdp_ns.map_or_else(
            || ("not read".into(), "–".into(), "–".into()),
            |x| {
                let share = if c.busy_ns > 0 {
                    format!("{:.0}%", 100.0 * x as f64 / c.busy_ns as f64)
                } else {
                    "–".into()
                };
                let runs = c.xdp_runs.map_or("–".into(), |n| format!("{:.1}", ns(n)));
                (format!("{:.0}", ns(x)), share, runs)
            },
        );
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} | {:.2} | {:.1} | {:.0} | {:.0} | {:.0} | {} | {} | {} |",
            r.bytes,
            r.goodput_label(),
            c.wall_ns as f64 / 1e6,
            c.busy_ns as f64 / c.wall_ns.max(1) as f64,
            per_call as f64 / r.avg_us * 1e3,
            ns(c.busy_ns),
            ns(c.softirq_ns),
            ns(c.busy_ns.saturating_sub(c.softirq_ns)),
            xdp.0,
            xdp.1,
            xdp.2,
        );
    }
    if rows.iter().any(|r| r.mode == GOODPUT_MPI_MODE) {
        missing.push(format!(
            "`{GOODPUT_MPI_MODE}`: not profiled (one mpirun times every size, and its TCP \
             segments are not counted)"
        ));
    }
    if !missing.is_empty() {
        let _ = writeln!(s, "\nLeft out: {}.", missing.join("; "));
    }
    s + "\n"
}

/// Data packets one leader sends in one allreduce of `r`'s size, where innet knows it.
#[must_use]
pub fn packets_per_call(r: &LatencyRow) -> Option<usize> {
    let dtype = Dtype::from_name(&r.dtype)?;
    let elem = element_bytes(Op::Sum, dtype);
    let per = |payload: usize| packet_bytes(Op::Sum, dtype, payload);
    match r.mode.as_str() {
        "inc-node" | "inc-socket" | "inc-nic" | "inc-dpu" => {
            Some(r.bytes.div_ceil(per(payload_for_mtu(r.mtu))))
        }
        GOODPUT_BASELINE => Some(
            ring_messages(r.bytes, elem, r.nodes, 0)
                .iter()
                .map(|b| b.div_ceil(per(DEFAULT_PAYLOAD_BYTES)))
                .sum(),
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::STANDARD_MTU;

    fn row(mode: &str, nodes: usize, ppn: usize, bytes: usize, avg_us: f64) -> LatencyRow {
        LatencyRow {
            mode: mode.into(),
            path: "-".into(),
            dtype: "int32".into(),
            nodes,
            ppn,
            ranks: nodes * ppn,
            bytes,
            iterations: 10,
            avg_us,
            p50_us: avg_us,
            p99_us: avg_us,
            errors: 0,
            fallbacks: 0,
            retransmissions: 0,
            failed: None,
            mtu: STANDARD_MTU,
            window: None,
            levels: 2,
            cpu: None,
        }
    }

    #[test]
    fn goodput_gives_each_element_type_its_own_column() {
        let typed = |dtype: &str, avg_us| LatencyRow {
            dtype: dtype.into(),
            ..row("inc-node", 4, 1, 1 << 20, avg_us)
        };
        let rows = [
            typed("float64", 8_000.0),
            typed("int64", 4_000.0),
            typed("int32", 2_000.0),
        ];
        let t = goodput_table(&rows);
        assert!(
            t.contains("| bytes | inc-node | inc-node (int64) | inc-node (int32) |"),
            "{t}"
        );
        assert!(t.contains("| 1048576 | 131.1 | 262.1 | 524.3 |"), "{t}");
    }

    #[test]
    fn goodput_is_bytes_over_time_next_to_host_ring() {
        // The goodput sweep's type: float64 (another type would be named in the labels).
        let rows: Vec<LatencyRow> = [
            row("host-ring", 4, 1, 1 << 20, 10_000.0),
            row("inc-node", 4, 1, 1 << 20, 5_000.0),
        ]
        .into_iter()
        .map(|r| LatencyRow {
            dtype: "float64".into(),
            ..r
        })
        .collect();
        let t = goodput_table(&rows);
        assert!(
            t.contains("| 1048576 | 104.9 | 209.7 (2.00× ring) |"),
            "{t}"
        );
        // 1 MiB in 1408 B packets: the ring's 6 messages of 256 KiB take 187 each, 1122
        // per 10 ms call; the network's 745 per 5 ms call.
        assert!(t.contains("| 1048576 | 112.2 | 149.0 |"), "{t}");
    }

    /// A float64 goodput row at `mtu`.
    fn gp(mode: &str, nodes: usize, mtu: usize, avg_us: f64) -> LatencyRow {
        LatencyRow {
            dtype: "float64".into(),
            mtu,
            ..row(mode, nodes, 1, 1 << 20, avg_us)
        }
    }

    #[test]
    fn in_network_columns_are_ratios_to_openmpi_at_the_same_mtu_and_nodes() {
        let rows = vec![
            gp("host-ring", 4, STANDARD_MTU, 10_000.0),
            gp("inc-node", 4, STANDARD_MTU, 5_000.0),
            gp("inc-node", 4, 3506, 2_000.0),
            gp("openmpi", 4, STANDARD_MTU, 4_000.0),
            gp("openmpi", 4, 3506, 3_000.0),
            // Another node count: its own table, its own MPI.
            gp("host-ring", 16, STANDARD_MTU, 40_000.0),
            gp("inc-node", 16, STANDARD_MTU, 10_000.0),
            gp("openmpi", 16, STANDARD_MTU, 20_000.0),
        ];
        let md = goodput_section(&rows);
        assert!(
            md.contains(
                "| bytes | host-ring | inc-node | inc-node (MTU 3506) | openmpi | openmpi (MTU 3506) |"
            ),
            "{md}"
        );
        // inc-node at 1500 B: 10 ms / 5 ms ring, 4 ms / 5 ms MPI at 1500; at 3506 B: its
        // own MPI's 3 ms / 2 ms; OpenMPI itself only against the ring.
        assert!(
            md.contains(
                "| 1048576 | 104.9 | 209.7 (2.00× ring, 0.80× MPI) | 524.3 (5.00× ring, 1.50× MPI) \
                 | 262.1 (2.50× ring) | 349.5 (3.33× ring) |"
            ),
            "{md}"
        );
        assert!(md.contains("### 16 nodes × 1 rank per node"), "{md}");
        assert!(
            md.contains("| 1048576 | 26.2 | 104.9 (4.00× ring, 2.00× MPI) | 52.4 (2.00× ring) |"),
            "{md}"
        );
        assert!(md.contains("](goodput.svg)") && md.contains("](goodput-16-nodes.svg)"));
    }

    #[test]
    fn where_the_cpu_goes_is_per_leader_packet_and_says_what_it_lacks() {
        let mut profiled = gp("inc-node", 4, STANDARD_MTU, 5_000.0);
        // 1 MiB of float64 in 1408 B packets: 745 a leader per call; 4 leaders × 10
        // calls = 29,800 packets.
        profiled.cpu = Some(super::super::cpu::CpuCost {
            calls: 10,
            wall_ns: 50_000_000,
            busy_ns: 89_400_000,
            softirq_ns: 29_800_000,
            xdp_ns: Some(5_960_000),
            xdp_runs: Some(89_400),
        });
        let mut unread = gp("host-ring", 4, STANDARD_MTU, 10_000.0);
        unread.cpu = Some(super::super::cpu::CpuCost {
            calls: 10,
            wall_ns: 100_000_000,
            busy_ns: 0,
            softirq_ns: 0,
            xdp_ns: None,
            xdp_runs: None,
        });
        let rows = vec![
            profiled,
            unread,
            gp("inc-nic", 4, STANDARD_MTU, 6_000.0),
            gp("openmpi", 4, STANDARD_MTU, 4_000.0),
        ];
        let t = cpu_table(&rows);
        // 89.4 ms / 29,800 = 3000 ns, 1000 softirq, 2000 rest; XDP 200 ns, 7%, 3 runs.
        assert!(
            t.contains(
                "| 1048576 | inc-node | 50.0 | 1.79 | 149.0 | 3000 | 1000 | 2000 | 200 | 7% | 3.0 |"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "| 1048576 | host-ring | 100.0 | 0.00 | 112.2 | 0 | 0 | 0 | not read | – | – |"
            ),
            "{t}"
        );
        assert!(t.contains("inc-nic 1048576 B: not profiled"), "{t}");
        assert!(t.contains("`openmpi`: not profiled"), "{t}");
        assert!(!t.contains("NaN") && !t.contains("inf"), "{t}");
    }

    #[test]
    fn rows_without_a_profile_still_load() {
        let mut r = gp("inc-node", 4, STANDARD_MTU, 5_000.0);
        let mut json = serde_json::to_value(&r).expect("json");
        assert!(json.get("cpu").is_none(), "{json}");
        json.as_object_mut().expect("object").remove("levels");
        let back: LatencyRow = serde_json::from_value(json).expect("an old row");
        assert!(back.cpu.is_none());
        r.cpu = Some(super::super::cpu::CpuCost::default());
        let again: LatencyRow =
            serde_json::from_str(&serde_json::to_string(&r).expect("json")).expect("row");
        assert_eq!(again.cpu, r.cpu);
    }

    #[test]
    fn speedups_are_ratios_to_host_rd_at_the_same_point() {
        let rows = vec![
            row("host-rd", 16, 1, 4, 300.0),
            row("inc-node", 16, 1, 4, 100.0),
            row("inc-node", 16, 2, 4, 50.0),
            row("host-rd", 4, 1, 4, 90.0),
        ];
        assert_eq!(speedup(&rows, "inc-node", 16, 1, 4), Some(3.0));
        // No baseline at 2 ppn: no speed-up rather than a wrong one.
        assert_eq!(speedup(&rows, "inc-node", 16, 2, 4), None);
        assert_eq!(headline(&rows), Some((16, 2)));
        let md = headline_table(&rows);
        assert!(md.contains("| 4 | n/a | n/a | 50.0 | n/a | n/a |"), "{md}");
    }

    #[test]
    fn a_case_that_did_not_finish_is_a_row_with_its_error() {
        let mut failed = row("host-ring", 4, 1, 1 << 22, 0.0);
        failed.failed = Some("rank 2: 4194304 B: timed out".into());
        let rows = vec![row("inc-node", 4, 1, 1 << 22, 100.0), failed];
        let t = goodput_table(&rows);
        assert!(t.contains("**failed**"), "{t}");
        assert!(!t.contains("inf") && !t.contains("NaN"), "{t}");
        let f = failed_cases(&rows);
        assert!(
            f.contains("host-ring 4×1 4194304 B: rank 2: 4194304 B: timed out"),
            "{f}"
        );
        assert_eq!(failed_cases(&rows[..1]), "");
    }

    #[test]
    fn report_marks_fallbacks_and_errors() {
        let mut bad = row("inc-nic", 4, 1, 4, 10.0);
        bad.fallbacks = 3;
        bad.errors = 1;
        let r = Results {
            latency: vec![row("host-rd", 4, 1, 4, 20.0), bad],
            ..Results::default()
        };
        let md = markdown(&r);
        assert!(md.contains("10.0 (2.00×) †3 ✗1"), "{md}");
    }
}
