//! The campaign's markdown report, from the JSON alone.

use std::fmt::Write as _;

use super::{ChurnRow, LossRow, Results};
use crate::markdown::{
    Align::{self, Left, Right},
    Table,
};
use innet_common::{group::DEFAULT_WINDOW, proto::STANDARD_MTU};

/// What must be zero: wrong results, hangs, failed calls, groups left behind.
#[must_use]
pub fn failures(r: &Results) -> Vec<String> {
    let mut out = vec![];
    for l in &r.loss {
        if l.wrong + l.hangs + l.errors > 0 {
            out.push(format!(
                "{} {} with {} {} on {}: {} wrong, {} hangs, {} errors ({})",
                l.collective,
                l.mode,
                l.fault,
                percent(l.rate),
                links(l),
                l.wrong,
                l.hangs,
                l.errors,
                l.first_error.as_deref().unwrap_or("-")
            ));
        }
    }
    for c in &r.churn {
        if c.wrong > 0 || c.groups_left > 0 {
            out.push(format!(
                "churn: {} wrong or failed allreduces, {} groups left behind",
                c.wrong, c.groups_left
            ));
        }
    }
    if let Some(s) = r.soak.last()
        && s.wrong + s.errors > 0
    {
        out.push(format!("soak: {} wrong, {} errors", s.wrong, s.errors));
    }
    for v in &r.vanish {
        if !v.ran || v.wrong > 0 || !(v.control || v.set_up_again) {
            out.push(format!(
                "{}: ran {}, {} wrong, set up again {} ({})",
                v.event,
                v.ran,
                v.wrong,
                v.set_up_again,
                v.first_error.as_deref().unwrap_or("-")
            ));
        }
    }
    for h in &r.hostile {
        if h.failed() {
            out.push(format!(
                "{}, {} ({} levels): ran {}, {} wrong, {} of {} calls off the network, {} {} ({})",
                h.attack,
                h.job,
                h.levels,
                h.ran,
                h.wrong,
                h.off_network,
                h.calls,
                h.counter,
                h.counted,
                h.first_error.as_deref().unwrap_or("-")
            ));
        }
    }
    out
}

/// The hostile rows: a table per fabric (nothing without rows).
fn hostile_table(r: &Results) -> String {
    if r.hostile.is_empty() {
        return String::new();
    }
    let mut md = String::from(
        "## A host outside the job attacks it

A job of one rank per node on every node but the last runs checked allreduces of 17 int32 \
         back to back: library ranks (threads of the campaign), then an unmodified MPI program \
         (`steady_allreduce`, OpenMPI's multi-node launch, innet's interposer preloaded, \
         learning off) that counts its calls per 100 ms window; the last node's host, beside a member on its TOR, attacks for the whole \
         run with a packet socket, any source address and the job's wire id, 2,400 \
         forgeries a second (the control floods: 40,000 queries a second, and the same frames \
         to a UDP port no one serves, which is what a flood at that rate costs the job on \
         the lab's 2 shared CPUs whatever innet does with it), in spells of 500 ms with a \
         quiet spell after each. Speed: the \
         median collective of the quiet spells over that of the attacked ones (MPI rows: the \
         median time per call of the 100 ms windows wholly inside the attack's spells and \
         wholly outside them; their slowest call is the slowest window's time per call). The \
         control row's spells send nothing: its speed is the measure's noise. The MPI job \
         faces no host-frame forgeries: they need its partition key, drawn at random at \
         `MPI_Init` and carried only by its own host frames; the interposer runs the library's \
         client code, attacked with the key known in the library rows. Set-ups of MPI rows: \
         group ids the first TOR held during the run, less the first. Memory: peaks of the process that \
         holds the ranks (threads; MPI: the rank processes together) and of all daemons \
         together. Each attack must leave 0 \
         wrong results and ≥ 99 % of the collectives on the network, and be named by its \
         counter.\n",
    );
    let mut levels: Vec<usize> = r.hostile.iter().map(|h| h.levels).collect();
    levels.dedup();
    for l in levels {
        let _ = write!(md, "\n### {l} switch levels\n\n{}", hostile_level(r, l));
    }
    md.push('\n');
    md
}

/// The hostile rows of one fabric.
fn hostile_level(r: &Results, levels: usize) -> Table {
    let mut t = Table::aligned([
        ("attack", Left),
        ("job", Left),
        ("ran", Left),
        ("wrong", Right),
        ("calls", Right),
        ("off the network", Right),
        ("regroups", Right),
        ("median call attacked / quiet", Right),
        ("speed", Right),
        ("slowest call", Right),
        ("forgeries sent", Right),
        ("named by", Left),
        ("counted", Right),
        ("ranks' RSS", Right),
        ("daemons' RSS", Right),
    ]);
    for h in r.hostile.iter().filter(|h| h.levels == levels) {
        t.row([
            h.attack.clone(),
            h.job.clone(),
            yes(h.ran).into(),
            h.wrong.to_string(),
            h.calls.to_string(),
            h.off_network.to_string(),
            h.regroups.to_string(),
            format!("{:.0} / {:.0} µs", h.median_call_us, h.quiet_median_call_us),
            format!("{:.2}×", h.speed),
            format!("{:.1} ms", h.slowest_call_ms),
            h.frames_sent.to_string(),
            if h.counter.is_empty() {
                "-".into()
            } else {
                h.counter.clone()
            },
            h.counted.to_string(),
            format!("{} MiB", h.ranks_rss_kib_peak / 1024),
            format!("{} MiB", h.daemons_rss_kib_peak / 1024),
        ]);
    }
    t
}

/// `yes`, or a bold `no` to stand out.
fn yes(ran: bool) -> &'static str {
    if ran { "yes" } else { "**no**" }
}

/// The faulty links of a row, with the fabric when it is the three-level one.
#[must_use]
pub fn links(l: &LossRow) -> String {
    if l.levels() == 3 {
        format!("{} (3 levels)", l.place)
    } else {
        l.place.clone()
    }
}

fn percent(rate: f64) -> String {
    format!("{} %", rate * 100.0)
}

/// Sums of a set of loss rows: (allreduces, wrong, hangs, errors, fallbacks, retransmissions,
/// faults injected).
#[must_use]
pub fn totals(rows: &[&LossRow]) -> [u64; 7] {
    let mut t = [0u64; 7];
    for r in rows {
        let v = [
            (r.calls * r.ranks) as u64,
            r.wrong as u64,
            r.hangs as u64,
            r.errors as u64,
            r.fallbacks as u64,
            r.retransmissions,
            r.faults_injected,
        ];
        for (a, b) in t.iter_mut().zip(v) {
            *a += b;
        }
    }
    t
}

/// The whole report.
#[must_use]
pub fn markdown(r: &Results) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# innet reliability campaign\n");
    let _ = writeln!(
        md,
        "Run on {}.\n\nSettings: `{}`\n",
        r.machine.summary(),
        if r.settings.is_empty() {
            "(defaults)"
        } else {
            &r.settings
        }
    );
    let (others, allreduces): (Vec<LossRow>, Vec<LossRow>) = r
        .loss
        .iter()
        .cloned()
        .partition(|l| l.collective != "allreduce");
    let (long, mixed): (Vec<LossRow>, Vec<LossRow>) =
        allreduces.into_iter().partition(|l| l.bytes > 0);
    if mixed.iter().any(|l| l.levels() == 3) {
        let _ = writeln!(
            md,
            "Rows marked *(3 levels)* ran on the three-level fabric: 2 pods × 2 TORs × 2 nodes × 2 sockets, 2 aggregation switches per pod, 2 cores, 16 ranks. Its level-1 uplinks join a TOR and an aggregation switch, its level-2 uplinks an aggregation switch and a core.\n"
        );
    }
    if !mixed.is_empty() {
        let mixed = Results {
            loss: mixed,
            ..Results::default()
        };
        md.push_str(&loss_summary(&mixed));
        md.push_str(&loss_tables(&mixed));
    }
    if !long.is_empty() {
        md.push_str(&long_table(&long));
    }
    if !others.is_empty() {
        md.push_str(&others_table(&others));
    }
    for c in &r.churn {
        let _ = writeln!(md, "## Churn\n\n{}", churn_table(c));
    }
    if !r.soak.is_empty() {
        let _ = writeln!(md, "## Soak\n\n{}", soak_table(r));
    }
    if !r.vanish.is_empty() {
        let _ = writeln!(
            md,
            "## A long-running MPI program loses its group

`steady_allreduce` (OpenMPI, 4 nodes × 1 rank, the interposer preloaded) runs allreduces of 17 int32 back to back for 6 s; 2 s after its group appears on the switch, the group is deleted there. Time lost: the calls missing against the run's own median 100 ms window; the control run (no event) shows the measure's noise.\n\n{}",
            vanish_table(r)
        );
    }
    md.push_str(&hostile_table(r));
    md
}

/// One churn run: its cycles, what went wrong and the daemons' memory.
fn churn_table(c: &ChurnRow) -> Table {
    let mut t = Table::aligned([
        ("cycles", Right),
        ("wrong or failed", Right),
        ("groups left", Right),
        ("daemons' RSS before → after (KiB)", Left),
        ("seconds", Right),
    ]);
    t.row([
        c.cycles.to_string(),
        c.wrong.to_string(),
        c.groups_left.to_string(),
        format!("{} → {}", c.daemon_rss_kib_start, c.daemon_rss_kib_end),
        format!("{:.0}", c.seconds),
    ]);
    t
}

/// The soak's samples: about a dozen spread over the run, and its last.
fn soak_table(r: &Results) -> Table {
    let header = [
        "seconds",
        "allreduces",
        "wrong",
        "errors",
        "groups installed",
        "daemons' RSS (KiB)",
    ];
    let mut t = Table::aligned(header.map(|h| (h, Right)));
    let step = (r.soak.len() / 12).max(1);
    for (i, s) in r.soak.iter().enumerate() {
        if i % step == 0 || i + 1 == r.soak.len() {
            t.row([
                format!("{:.0}", s.seconds),
                s.calls.to_string(),
                s.wrong.to_string(),
                s.errors.to_string(),
                s.groups_installed.to_string(),
                s.daemon_rss_kib.to_string(),
            ]);
        }
    }
    t
}

/// The group deleted under a running MPI program, and the control run.
fn vanish_table(r: &Results) -> Table {
    let mut t = Table::aligned([
        ("event", Left),
        ("ran", Left),
        ("wrong", Right),
        ("set up again", Left),
        ("calls", Right),
        ("steady calls/s", Right),
        ("time lost", Right),
        ("slowest window", Right),
        ("served / fell back", Left),
    ]);
    for v in &r.vanish {
        t.row([
            v.event.clone(),
            yes(v.ran).into(),
            v.wrong.to_string(),
            if v.control { "-" } else { yes(v.set_up_again) }.into(),
            v.calls.to_string(),
            format!("{:.0}", v.steady_calls_per_s),
            format!("{:.0} ms", v.lost_ms),
            format!("{:.0} %", v.slowest_window * 100.0),
            format!("{} / {}", v.served, v.fallbacks),
        ]);
    }
    t
}

/// The other collectives under loss: a row per (collective, place, fault, rate, mode).
fn others_table(rows: &[LossRow]) -> String {
    let md = String::from(
        "## Allgather, reduce-scatter and non-blocking allreduce under loss

Each rank cycles through the mixed cases as an allgather (its message gathered from every \
         rank), a reduce-scatter (its block of the reduction) or non-blocking allreduces \
         (three in flight, waited for oldest first); every result is checked against the \
         reference.\n\n",
    );
    let mut t = Table::aligned(
        [
            ("collective", Left),
            ("mode", Left),
            ("fault", Left),
            ("rate", Right),
            ("links", Left),
        ]
        .into_iter()
        .chain(OUTCOME_COLUMNS)
        .chain([("mean call", Right)]),
    );
    for l in rows {
        let mut cells = vec![
            l.collective.clone(),
            l.mode.clone(),
            l.fault.clone(),
            percent(l.rate),
            links(l),
        ];
        cells.extend(outcome_cells(l));
        cells.push(format!("{:.0} µs", l.avg_call_us));
        t.row(cells);
    }
    md + &t.to_string() + "\n"
}

/// One line per (place, fault): every mode and rate together.
/// Long messages under loss: goodput against the same mode's loss-free row.
fn long_table(rows: &[LossRow]) -> String {
    let md = String::from(
        "## A long message under loss

One message size per row, streamed through the \
         switches; goodput is bytes over the mean call time, and its share of the loss-free \
         row's (the target: at least 70 % at 1 % loss).\n\n",
    );
    let mut t = Table::aligned(
        [
            ("mode", Left),
            ("bytes", Right),
            ("window", Right),
            ("MTU", Right),
            ("fault", Left),
            ("rate", Right),
        ]
        .into_iter()
        .chain(OUTCOME_COLUMNS)
        .chain([("MB/s", Right), ("of loss-free", Right)]),
    );
    for l in rows {
        let mbps = l.bytes as f64 / l.avg_call_us;
        let clean = rows
            .iter()
            .find(|c| {
                (&c.mode, c.bytes, c.window, c.mtu) == (&l.mode, l.bytes, l.window, l.mtu)
                    && c.rate == 0.0
            })
            .map(|c| c.bytes as f64 / c.avg_call_us);
        let mut cells = vec![
            l.mode.clone(),
            l.bytes.to_string(),
            l.window.unwrap_or(DEFAULT_WINDOW).to_string(),
            l.mtu.unwrap_or(STANDARD_MTU).to_string(),
            l.fault.clone(),
            percent(l.rate),
        ];
        cells.extend(outcome_cells(l));
        cells.push(format!("{mbps:.1}"));
        cells.push(clean.map_or("–".into(), |c| format!("{:.0} %", mbps / c * 100.0)));
        t.row(cells);
    }
    md + &t.to_string() + "\n"
}

fn loss_summary(r: &Results) -> String {
    let mut t = Table::aligned([
        ("faulty links", Left),
        ("fault", Left),
        ("rates", Left),
        ("allreduces", Right),
        ("wrong", Right),
        ("hangs", Right),
        ("errors", Right),
        ("fallbacks", Right),
        ("retransmissions", Right),
        ("packets faulted", Right),
    ]);
    for (place, fault) in distinct(&r.loss, |l| (links(l), l.fault.clone())) {
        let rows: Vec<&LossRow> = r
            .loss
            .iter()
            .filter(|l| links(l) == place && l.fault == fault)
            .collect();
        let rates: Vec<String> = distinct(&r.loss, |l| percent(l.rate))
            .into_iter()
            .filter(|p| rows.iter().any(|l| percent(l.rate) == *p))
            .collect();
        let mut cells = vec![place, fault, rates.join(", ")];
        cells.extend(totals(&rows).map(|n| n.to_string()));
        t.row(cells);
    }
    let all: Vec<&LossRow> = r.loss.iter().collect();
    let sums = totals(&all);
    let mut cells = vec!["**all**".to_string(), String::new(), String::new()];
    cells.extend(sums[..4].iter().map(|n| format!("**{n}**")));
    cells.extend(sums[4..].iter().map(ToString::to_string));
    t.row(cells);
    format!("## Loss campaign: summary\n\n{t}\n")
}

/// Every row, one table per (place, fault).
fn loss_tables(r: &Results) -> String {
    let mut md = String::new();
    for (place, fault) in distinct(&r.loss, |l| (links(l), l.fault.clone())) {
        let rows: Vec<&LossRow> = r
            .loss
            .iter()
            .filter(|l| links(l) == place && l.fault == fault)
            .collect();
        let _ = writeln!(md, "## {fault} on {place}\n\n{}", fault_table(&rows));
        for l in rows.iter().filter(|l| !l.fallback_reasons.is_empty()) {
            let why: Vec<String> = l
                .fallback_reasons
                .iter()
                .map(|(why, n)| format!("{n} × `{why}`"))
                .collect();
            let _ = writeln!(
                md,
                "- {} at {}: fallbacks by reason: {}",
                l.mode,
                percent(l.rate),
                why.join(", ")
            );
        }
        if rows.iter().any(|l| !l.fallback_reasons.is_empty()) {
            md.push('\n');
        }
    }
    md
}

/// The loss rows of one (place, fault): a row per mode and rate.
fn fault_table(rows: &[&LossRow]) -> Table {
    let mut t = Table::aligned(
        [("mode", Left), ("rate", Right)]
            .into_iter()
            .chain(OUTCOME_COLUMNS)
            .chain([("avg call (µs)", Right), ("slowest call (ms)", Right)]),
    );
    for l in rows {
        let mut cells = vec![l.mode.clone(), percent(l.rate)];
        cells.extend(outcome_cells(l));
        cells.push(format!("{:.0}", l.avg_call_us));
        cells.push(format!("{:.1}", l.max_call_ms));
        t.row(cells);
    }
    t
}

/// The columns of [`outcome_cells`].
const OUTCOME_COLUMNS: [(&str, Align); 7] = [
    ("ranks × calls", Right),
    ("wrong", Right),
    ("hangs", Right),
    ("errors", Right),
    ("fallbacks", Right),
    ("retransmissions", Right),
    ("packets faulted", Right),
];

/// A loss row's cells from `ranks × calls` to `packets faulted`.
fn outcome_cells(l: &LossRow) -> [String; 7] {
    [
        format!("{} × {}", l.ranks, l.calls),
        l.wrong.to_string(),
        l.hangs.to_string(),
        l.errors.to_string(),
        l.fallbacks.to_string(),
        l.retransmissions.to_string(),
        l.faults_injected.to_string(),
    ]
}

/// Distinct keys in first-seen order.
fn distinct<K: PartialEq>(rows: &[LossRow], key: impl Fn(&LossRow) -> K) -> Vec<K> {
    let mut out: Vec<K> = vec![];
    for r in rows {
        let k = key(r);
        if !out.contains(&k) {
            out.push(k);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::{campaign::ChurnRow, markdown::squeezed};

    fn row(mode: &str, fault: &str, rate: f64, wrong: usize) -> LossRow {
        LossRow {
            collective: "allreduce".into(),
            mode: mode.into(),
            place: "host links".into(),
            fault: fault.into(),
            rate,
            ranks: 8,
            calls: 10,
            wrong,
            errors: 0,
            hangs: 0,
            fallbacks: 1,
            fallback_reasons: BTreeMap::new(),
            retransmissions: 5,
            faults_injected: 7,
            max_call_ms: 3.0,
            avg_call_us: 100.0,
            first_error: None,
            bytes: 0,
            window: None,
            mtu: None,
            levels: 0,
        }
    }

    #[test]
    fn a_long_message_row_shows_its_goodput_against_the_loss_free_one() {
        let clean = LossRow {
            bytes: 16 << 20,
            avg_call_us: 500_000.0,
            ..row("inc-node", "drop", 0.0, 0)
        };
        let lossy = LossRow {
            avg_call_us: 625_000.0,
            ..clean.clone()
        };
        let lossy = LossRow {
            rate: 0.01,
            ..lossy
        };
        // A wider window is compared with its own loss-free row.
        let clean64 = LossRow {
            window: Some(64),
            avg_call_us: 400_000.0,
            ..clean.clone()
        };
        let lossy64 = LossRow {
            rate: 0.01,
            avg_call_us: 500_000.0,
            ..clean64.clone()
        };
        let md = squeezed(&markdown(&Results {
            loss: vec![
                clean,
                lossy,
                clean64,
                lossy64,
                row("inc-node", "drop", 0.01, 0),
            ],
            ..Results::default()
        }));
        assert!(md.contains("| 16 | 1500 | drop | 0 % |"), "{md}");
        assert!(md.contains("| 33.6 | 100 % |"), "{md}");
        assert!(md.contains("| 26.8 | 80 % |"), "{md}");
        assert!(md.contains("| 64 | 1500 | drop | 1 % |"), "{md}");
        assert!(md.contains("| 41.9 | 100 % |"), "{md}");
        assert!(md.contains("| 33.6 | 80 % |"), "{md}");
        // The mixed row stays in the loss tables, not in the long-message one.
        let long = &md[md.find("## A long message").unwrap()..];
        assert_eq!(long.matches("| inc-node |").count(), 4, "{md}");
    }

    #[test]
    fn totals_and_failures_count_every_row() {
        let r = Results {
            loss: vec![
                row("inc-node", "drop", 0.01, 0),
                row("inc-nic", "drop", 0.2, 2),
                row("inc-node", "delay", 0.2, 0),
            ],
            churn: vec![ChurnRow {
                cycles: 10,
                wrong: 0,
                groups_left: 1,
                daemon_rss_kib_start: 1,
                daemon_rss_kib_end: 1,
                seconds: 1.0,
            }],
            ..Results::default()
        };
        let all: Vec<&LossRow> = r.loss.iter().collect();
        assert_eq!(totals(&all), [240, 2, 0, 0, 3, 15, 21]);
        let f = failures(&r);
        assert_eq!(f.len(), 2, "{f:?}");
        assert!(f[0].contains("inc-nic with drop 20 %"), "{f:?}");
        assert!(f[1].contains("1 groups left"), "{f:?}");
        let md = squeezed(&markdown(&r));
        assert!(
            md.contains("| host links | drop | 1 %, 20 % | 160 | 2 |"),
            "{md}"
        );
        assert!(md.contains("## delay on host links"), "{md}");
    }

    #[test]
    fn three_level_rows_name_their_links_and_fallback_reasons() {
        let mut up2 = LossRow {
            place: "level-2 uplinks".into(),
            levels: 3,
            ..row("inc-socket", "drop", 0.05, 0)
        };
        up2.fallback_reasons
            .insert("Timeout { tries: 7 }".into(), 1);
        let r = Results {
            loss: vec![row("inc-node", "drop", 0.05, 0), up2],
            ..Results::default()
        };
        let md = squeezed(&markdown(&r));
        assert!(md.contains("| host links | drop | 5 % | 80 |"), "{md}");
        assert!(
            md.contains("| level-2 uplinks (3 levels) | drop | 5 % | 80 |"),
            "{md}"
        );
        assert!(md.contains("## drop on level-2 uplinks (3 levels)"), "{md}");
        assert!(
            md.contains("- inc-socket at 5 %: fallbacks by reason: 1 × `Timeout { tries: 7 }`"),
            "{md}"
        );
    }
}
