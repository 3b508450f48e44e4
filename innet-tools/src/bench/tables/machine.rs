//! The machine's tables: the bridge's bystander TCP and switch modes, the XDP cost per
//! packet, aggregation throughput and the programs' sizes.

use super::*;

/// innet's latency with the switches' programs native and in skb mode, same run.
pub(super) fn switch_mode_table(rows: &[crate::bench::bystander::SwitchModeRow]) -> String {
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
pub(super) fn bystander_table(rows: &[crate::bench::bystander::BystanderRow]) -> String {
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
        let _ = writeln!(
            s,
            "| {mtu} | {setting} | {mean:.2} | {ratio:.2}× | {} | {} | {} |",
            each.join(", "),
            ok.map_or("-", |r| if r.sender_tso { "on" } else { "off" }),
            ok.map_or(0, |r| r.sender_max_mtu)
        );
    }
    for r in rows.iter().filter(|r| r.failed.is_some()) {
        if !crate::bench::bystander::summary(rows)
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

/// XDP cost per packet (BPF_PROG_TEST_RUN).
pub(super) fn xdp_table(rows: &[XdpRow]) -> String {
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
pub(super) fn throughput_table(rows: &[ThroughputRow]) -> String {
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
pub(super) fn programs_table(rows: &[ProgramRow]) -> String {
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
