//! The machine's tables: the bridge's bystander TCP and switch modes, the XDP cost per
//! packet, aggregation throughput and the programs' sizes.

use super::{BASELINE, ProgramRow, ThroughputRow, XdpRow};
use crate::markdown::{
    Align::{Left, Right},
    Table,
};

/// innet's latency with the switches' programs native and in skb mode, same run.
pub(super) fn switch_mode_table(rows: &[crate::bench::bystander::SwitchModeRow]) -> String {
    let s = String::from(
        "### What skb mode costs innet\n\n\
         4 nodes × 1 rank, int32 SUM, every result checked; the same fabric built twice in \
         this run, the switches' programs attached natively, then in skb mode. Average µs \
         (`†n`: fallbacks, `✗n`: wrong results):\n\n",
    );
    let mut t = Table::aligned([
        ("switches", Left),
        ("mode", Left),
        ("bytes", Right),
        ("avg µs", Right),
        ("p99 µs", Right),
        ("× host-rd", Right),
    ]);
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
        t.row([
            r.switch_mode.clone(),
            r.row.mode.clone(),
            r.row.bytes.to_string(),
            format!("{:.1}{marks}", r.row.avg_us),
            format!("{:.1}", r.row.p99_us),
            base.map_or("-".into(), |x| format!("{x:.2}×")),
        ]);
    }
    s + &t.to_string() + "\n"
}

/// TCP through a bridge with and without innet: every run, then the means and ratios.
pub(super) fn bystander_table(rows: &[crate::bench::bystander::BystanderRow]) -> String {
    let s = String::from(
        "## Bystander traffic (TCP through an innet bridge)\n\n\
         `iperf3` TCP between two hosts through a Linux bridge whose two veth ports run \
         innet (or nothing), the settings in turns within one run, a fresh bridge each time. \
         *sender TSO / max MTU*: the sending host's veth during the run (a veth turns TSO off \
         on its peer while a native XDP program is attached, whatever the program; \
         `xdp.frags` keeps its max MTU).\n\n",
    );
    let mut t = Table::aligned([
        ("MTU", Right),
        ("setting", Left),
        ("mean Gbit/s", Right),
        ("× without innet", Right),
        ("runs (Gbit/s)", Left),
        ("sender TSO", Left),
        ("sender max MTU", Right),
    ]);
    for (mtu, setting, mean, ratio) in crate::bench::bystander::summary(rows) {
        let runs: Vec<&crate::bench::bystander::BystanderRow> = rows
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
        t.row([
            mtu.to_string(),
            setting,
            format!("{mean:.2}"),
            format!("{ratio:.2}×"),
            each.join(", "),
            ok.map_or("-", |r| if r.sender_tso { "on" } else { "off" })
                .to_string(),
            ok.map_or(0, |r| r.sender_max_mtu).to_string(),
        ]);
    }
    for r in rows.iter().filter(|r| r.failed.is_some()) {
        if !crate::bench::bystander::summary(rows)
            .iter()
            .any(|(m, x, _, _)| *m == r.mtu && *x == r.setting)
        {
            t.row([
                r.mtu.to_string(),
                r.setting.clone(),
                "-".into(),
                "-".into(),
                format!("failed: {}", r.failed.as_deref().unwrap_or_default()),
                "-".into(),
                "-".into(),
            ]);
        }
    }
    s + &t.to_string() + "\n"
}

/// XDP cost per packet (BPF_PROG_TEST_RUN).
pub(super) fn xdp_table(rows: &[XdpRow]) -> String {
    let mut t = Table::aligned([
        ("case", Left),
        ("payload B", Right),
        ("method", Left),
        ("runs", Right),
        ("ns/pkt", Right),
        ("Mpps/core", Right),
        ("× no-op", Right),
        ("errors", Right),
    ]);
    for x in rows {
        t.row([
            x.case.clone(),
            x.payload_bytes.to_string(),
            x.method.clone(),
            x.runs.to_string(),
            format!("{:.1}", x.ns_per_pkt),
            format!("{:.2}", x.mpps_per_core),
            format!("{:.2}", x.ratio_to_noop),
            x.errors.to_string(),
        ]);
    }
    format!(
        "## XDP cost per packet (BPF_PROG_TEST_RUN)\n\n\
         `repeat`: one run with a repeat count (stateless cases); `per-frame`: one \
         kernel-timed run per distinct frame (aggregation changes state), averaged. Each \
         method has its own no-op baseline; `× no-op` divides by it.\n\n{t}\n"
    )
}

/// Aggregation throughput on one core.
pub(super) fn throughput_table(rows: &[ThroughputRow]) -> String {
    let header = [
        "groups",
        "children",
        "payload B",
        "rounds",
        "rounds/s",
        "Mpps",
        "errors",
    ];
    let mut t = Table::aligned(header.map(|h| (h, Right)));
    for x in rows {
        t.row([
            x.groups.to_string(),
            x.children.to_string(),
            x.payload_bytes.to_string(),
            x.rounds.to_string(),
            format!("{:.0}", x.rounds_per_sec),
            format!("{:.2}", x.mpps_per_core),
            x.errors.to_string(),
        ]);
    }
    format!("## Aggregation throughput (one core, kernel time)\n\n{t}\n")
}

/// Every program as the verifier sees it.
pub(super) fn programs_table(rows: &[ProgramRow]) -> String {
    let mut t = Table::numbers(["program", "xlated B", "jited B", "verified insns"]);
    for p in rows {
        t.row([
            format!("`{}`", p.name),
            p.xlated_bytes.to_string(),
            p.jited_bytes.to_string(),
            p.verified_insns.to_string(),
        ]);
    }
    format!("## Programs (verifier's view)\n\n{t}\n")
}
