//! Long messages: goodput against the hosts' ring and OpenMPI, and where the CPU goes.

use super::*;
use crate::bench::bound;
use innet_lab::shaping::LinkRate;

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
    if let Some(bps) = rows.iter().find_map(|r| r.link_bps) {
        let _ = writeln!(
            s,
            "Every link of the fabric shaped to {} in both directions (innet's modes, the \
             host algorithms and OpenMPI alike): the links bind, not the CPUs. Each case's \
             share of its bound follows its table: its goodput over the link's rate divided \
             by the bytes the algorithm must move over a host's link per byte of message \
             (in-network 1, the ring and OpenMPI 2(n−1)/n; frames' headers not counted).\n",
            LinkRate(bps)
        );
    }
    if let Some(loss) = rows.iter().find_map(|r| r.link_loss) {
        let _ = writeln!(
            s,
            "Every link also drops {}% of the INC data packets it carries, each way \
             (contributions, partials, results and the host algorithms' messages; plain \
             OpenMPI's TCP is not touched, so its column is loss-free).\n",
            loss * 100.0
        );
    }
    let counts = distinct(rows, |r| r.nodes);
    for &nodes in &counts {
        let these: Vec<LatencyRow> = rows.iter().filter(|r| r.nodes == nodes).cloned().collect();
        s += &goodput_table(&these);
        s += &bound_table(&these);
        s += &cpu_table(&these);
        let _ = writeln!(
            s,
            "![goodput vs size, {nodes} nodes]({}.svg)\n",
            crate::bench::plot::goodput_chart_name(&counts, nodes)
        );
    }
    s
}

/// Goodput (message bytes per second of an allreduce) per mode and size at one node count,
/// each in-network mode's ratio to `host-ring` and to plain OpenMPI at the same MTU, then
/// the data packets per second per leader.
#[must_use]
pub fn goodput_table(rows: &[LatencyRow]) -> String {
    let modes = goodput_modes(rows);
    let mut s = format!(
        "### {} nodes × {} rank per node\n\n",
        rows.first().map_or(0, |r| r.nodes),
        rows.first().map_or(0, |r| r.ppn),
    );
    s += &per_mode(rows, &modes, |x| goodput_cell(rows, x));
    s += "\nData packets each leader sends per second (thousands), from the packets one \
          allreduce takes (in-network: one per payload of the link's MTU, 1408 or 2944 B; \
          `host-ring`: its messages in 1408 B packets; MPI's TCP segments are not counted):\n\n";
    s += &per_mode(rows, &modes, packets_cell);
    s + "\n"
}

/// On a shaped fabric, each case's goodput as a share of its bound
/// ([`crate::bench::bound`]); nothing on an unshaped one.
fn bound_table(rows: &[LatencyRow]) -> String {
    if rows.iter().all(|r| r.link_bps.is_none()) {
        return String::new();
    }
    let modes = goodput_modes(rows);
    let share = |x: Option<&LatencyRow>| {
        x.filter(|x| x.failed.is_none() && x.avg_us > 0.0)
            .and_then(|x| {
                let bound = bound::goodput_bound(&x.mode, x.nodes, x.link_bps?)?;
                Some(x.bytes as f64 / (x.avg_us * 1e-6) / bound)
            })
            .map_or_else(|| "–".into(), |f| format!("{f:.2}"))
    };
    let used = |x: Option<&LatencyRow>| {
        x.filter(|x| x.failed.is_none())
            .and_then(|x| Some((x.link_use?, x.link_drops.unwrap_or(0))))
            .map_or_else(|| "–".into(), |(u, d)| format!("{u:.2} ({d} dropped)"))
    };
    let mut s = "Share of the link bound:\n\n".to_owned() + &per_mode(rows, &modes, share);
    if rows.iter().any(|r| r.link_use.is_some()) {
        s += "\nThe busiest link's use over each case (its bits over the time and the link's \
              rate, from the shaping queues' own counters; 1: a link that never idled), and \
              the frames every shaped queue dropped meanwhile (plain OpenMPI's: over its \
              whole mpirun, launch included):\n\n";
        s += &per_mode(rows, &modes, used);
    }
    s + "\n"
}

/// The goodput columns of `rows`, in order of appearance.
fn goodput_modes(rows: &[LatencyRow]) -> Vec<String> {
    let mut m: Vec<String> = vec![];
    for r in rows {
        if !m.contains(&r.goodput_label()) {
            m.push(r.goodput_label());
        }
    }
    m
}

/// A table of a row per size and a column per mode: `cell` of that size's row of the mode.
fn per_mode(
    rows: &[LatencyRow],
    modes: &[String],
    cell: impl Fn(Option<&LatencyRow>) -> String,
) -> String {
    let mut t = mode_table(modes);
    for bytes in distinct(rows, |x| x.bytes) {
        let of = |m: &String| {
            rows.iter()
                .find(|x| x.bytes == bytes && x.goodput_label() == *m)
        };
        let mut cells = vec![bytes.to_string()];
        cells.extend(modes.iter().map(|m| cell(of(m))));
        t.row(cells);
    }
    t.to_string()
}

/// Thousands of data packets a second one leader sends (failed or unknown: `–`).
fn packets_cell(x: Option<&LatencyRow>) -> String {
    x.filter(|x| x.failed.is_none())
        .and_then(|x| Some(packets_per_call(x)? as f64 / x.avg_us * 1e3))
        .map_or_else(|| "–".into(), |k| format!("{k:.1}"))
}

/// A goodput cell: MB/s of `x` (none: `–`), with an in-network mode's ratios to the
/// size's `host-ring` and to plain OpenMPI at its MTU.
fn goodput_cell(rows: &[LatencyRow], x: Option<&LatencyRow>) -> String {
    let Some(x) = x else {
        return "–".into();
    };
    if x.failed.is_some() {
        return "**failed**".into();
    }
    let ok = |r: &&LatencyRow| r.failed.is_none() && r.avg_us > 0.0;
    let mbps = x.bytes as f64 / x.avg_us;
    let base = rows
        .iter()
        .filter(ok)
        .find(|r| r.bytes == x.bytes && r.goodput_label() == GOODPUT_BASELINE)
        .filter(|_| x.mode != GOODPUT_BASELINE);
    let mut ratios = vec![];
    if let Some(b) = base {
        ratios.push(format!("{:.2}× ring", b.avg_us / x.avg_us));
    }
    let mpi = rows
        .iter()
        .filter(ok)
        .find(|p| p.mode == GOODPUT_MPI_MODE && (p.bytes, p.mtu) == (x.bytes, x.mtu));
    if let Some(p) = mpi.filter(|_| INC_MODES.contains(&x.mode.as_str())) {
        ratios.push(format!("{:.2}× MPI", p.avg_us / x.avg_us));
    }
    let ratios = if ratios.is_empty() {
        String::new()
    } else {
        format!(" ({})", ratios.join(", "))
    };
    format!("{mbps:.1}{ratios}{}", flags(x))
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
         Machine-wide: anything else the machine ran meanwhile counts too.\n\n",
    );
    let mut t = Table::aligned([
        ("bytes", Right),
        ("mode", Left),
        ("window ms", Right),
        ("busy CPUs", Right),
        ("k pkt/s per leader", Right),
        ("CPU ns/pkt", Right),
        ("softirq ns/pkt", Right),
        ("rest ns/pkt", Right),
        ("XDP ns/pkt", Right),
        ("XDP share", Right),
        ("XDP runs/pkt", Right),
    ]);
    let mut missing = vec![];
    for r in rows.iter().filter(|r| r.failed.is_none()) {
        if r.mode == GOODPUT_MPI_MODE {
            // Over its whole mpirun; its TCP segments are not counted (no per-packet cells).
            if let Some(c) = &r.cpu {
                let mut cells = vec![
                    r.bytes.to_string(),
                    r.goodput_label(),
                    format!("{:.1}", c.wall_ns as f64 / 1e6),
                    format!("{:.2}", c.busy_ns as f64 / c.wall_ns.max(1) as f64),
                ];
                cells.resize(11, "–".into());
                t.row(cells);
            }
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
        t.row([
            r.bytes.to_string(),
            r.goodput_label(),
            format!("{:.1}", c.wall_ns as f64 / 1e6),
            format!("{:.2}", c.busy_ns as f64 / c.wall_ns.max(1) as f64),
            format!("{:.1}", per_call as f64 / r.avg_us * 1e3),
            format!("{:.0}", ns(c.busy_ns)),
            format!("{:.0}", ns(c.softirq_ns)),
            format!("{:.0}", ns(c.busy_ns.saturating_sub(c.softirq_ns))),
            xdp.0,
            xdp.1,
            xdp.2,
        ]);
    }
    s += &t.to_string();
    if rows.iter().any(|r| r.mode == GOODPUT_MPI_MODE) {
        missing.push(format!(
            "`{GOODPUT_MPI_MODE}`: its window is its whole mpirun (launch and OSU's warm-up \
             included), and its TCP segments are not counted, so it has no per-packet cells"
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

/// TCP across each shaped fabric, both ways, before its runs; nothing when none was shaped.
#[must_use]
pub fn link_checks_table(fabrics: &[crate::bench::LinkChecks]) -> String {
    if fabrics.is_empty() {
        return String::new();
    }
    let mut t = Table::aligned([
        ("nodes", Right),
        ("levels", Right),
        ("path", Left),
        ("TCP Mbit/s", Right),
        ("share of the rate", Right),
    ]);
    for f in fabrics {
        for c in &f.checks {
            t.row([
                f.nodes.to_string(),
                f.levels.to_string(),
                c.path.clone(),
                format!("{:.1}", c.bps / 1e6),
                format!("{:.3}", c.bps / f.rate_bps.max(1) as f64),
            ]);
        }
    }
    format!(
        "The shaped links checked with TCP before the runs (one iperf3 flow, 3 s a \
         direction, on the fabric of the goodput sweep's first runs):\n\n{t}\n"
    )
}
