//! The attacks against an MPI job (OpenMPI under the interposer), and what the campaign
//! tallies of a run: calls per second in and out of the attack, memory, wall-clock spells.

use super::{
    AtomicBool, AtomicU32, Attack, AttackPlan, Duration, Flavour, HostileRow, Instant, Job, MpiRun,
    Nodes, Ordering, STEADY_ALLREDUCE, SystemTime, Target, Windows, WiredFabric, attack_until,
    attacker, before_row, counted, evidence, new_row, not_member, reports, steady_allreduce,
    vanish, wait_for_install, why_off_the_network,
};

/// One attack on an MPI job ([`Job::Mpi`]): `steady_allreduce` counts its calls per 100 ms
/// window, and the windows inside the attack's spells are compared with those outside them
/// (the program prints the wall clock its windows start at). Calls off the network come
/// from the interposer's reports, set-ups from the group ids the first TOR held during the
/// run, the ranks' memory from their processes.
pub(super) fn run_one_mpi(fabric: &WiredFabric, attack: Attack, plan: &AttackPlan) -> HostileRow {
    let topo = &fabric.topo;
    let nodes = topo.hosts.len() / topo.shape.sockets - 1;
    let me = attacker(topo);
    let my_tor = &topo.tors[me.tor];
    let mut row = new_row(topo, attack, Job::Mpi);
    let dir = std::env::temp_dir().join(format!("innet-hostile-{}", innet_lab::unique_id()));
    let reports_dir = dir.join("reports");
    std::fs::create_dir_all(&reports_dir).expect("the scratch directory");
    let program = steady_allreduce(Flavour::OpenMpi, plan.run);
    let mpirun = MpiRun::new(Flavour::OpenMpi, nodes, &program)
        .multi_node(Nodes::uneven(topo, &vec![1; nodes]))
        .without_placement_file()
        .env(innet_mpi::session::LEARN_VAR, "0")
        .env("INNET_MPI_REPORT", &reports_dir);
    let old = vanish::groups_on(&topo.tors[0]);
    let before = before_row(topo, me);
    let child = mpirun.spawn_captured();
    let done = AtomicBool::new(false);
    let group_id = AtomicU32::new(0);
    let mut spells = vec![];
    let (out, peaks, groups) = std::thread::scope(|s| {
        let job = s.spawn(|| {
            let out = child.wait_with_output();
            done.store(true, Ordering::SeqCst);
            out
        });
        // Memory peaks, the group's counters, and every group the first TOR held.
        let sampler = s.spawn(|| {
            let (mut peaks, mut groups) = ((0, 0, 0), vec![]);
            while !done.load(Ordering::SeqCst) {
                peaks.0 = peaks.0.max(rss_of_processes(STEADY_ALLREDUCE));
                peaks.1 = peaks.1.max(fabric.state().1);
                let id = group_id.load(Ordering::SeqCst);
                if id != 0 {
                    peaks.2 = peaks.2.max(not_member(topo, id));
                }
                for g in vanish::groups_on(&topo.tors[0]) {
                    if !old.contains(&g) && !groups.contains(&g) {
                        groups.push(g);
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            (peaks, groups)
        });
        let group = vanish::new_group(&[&topo.tors[0]], &old, Duration::from_secs(30));
        if let Some((_, id)) = group {
            group_id.store(id, Ordering::SeqCst);
            wait_for_install(attack, my_tor, id);
            let target = Target {
                id,
                members: (0..nodes).map(|n| topo.host(n, 0).ip).collect(),
                tor: my_tor.ip,
                // Not known to the attacker, and not used by the attacks an MPI job faces.
                pkey: 0,
                me: me.ip,
            };
            (row.frames_sent, spells) = me.ns.run(|| attack_until(attack, &target, &done));
        }
        let (peaks, groups) = sampler.join().expect("the sampler");
        (job.join().expect("mpirun's waiter"), peaks, groups)
    });
    (row.ranks_rss_kib_peak, row.daemons_rss_kib_peak) = (peaks.0, peaks.1);
    row.counted = counted(attack, &evidence(topo, me, &before, peaks.2, 0));
    row.regroups = groups.len().saturating_sub(1) as u64;
    tally_mpi(&mut row, out, &spells, &reports_dir, nodes);
    // A row that fails keeps the interposer's reports for a look.
    if row.failed() {
        eprintln!(
            "{}: the interposer's reports are kept in {}",
            row.attack,
            dir.display()
        );
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    row
}

/// What an MPI job's run says: its exit and output (`steady_allreduce`'s windows), the
/// interposer's reports (calls off the network), the speed of the windows inside the
/// attack's spells against those outside.
pub(super) fn tally_mpi(
    row: &mut HostileRow,
    out: std::io::Result<std::process::Output>,
    spells: &[(Instant, Instant)],
    reports_dir: &std::path::Path,
    nodes: usize,
) {
    let out = match out {
        Ok(out) if out.status.success() => out,
        Ok(out) => {
            row.first_error = Some(vanish::first_lines(&out.stderr));
            return;
        }
        Err(e) => {
            row.first_error = Some(format!("mpirun: {e}"));
            return;
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let Some(windows) = Windows::parse(&stdout) else {
        row.first_error = Some("steady_allreduce printed no windows".into());
        return;
    };
    row.ran = true;
    (row.calls, row.wrong) = (windows.calls, windows.wrong);
    let summaries = reports(reports_dir, nodes);
    if let Some(first) = summaries.first() {
        let passed: u64 = first
            .passed
            .iter()
            .filter(|(k, _)| k.starts_with("allreduce/"))
            .map(|(_, n)| n)
            .sum();
        row.off_network = passed + summaries.iter().map(|s| s.fallbacks).sum::<u64>();
        if row.off_network > 0 {
            row.first_error = Some(why_off_the_network(&summaries));
        }
    }
    let spells = wall_clock(spells);
    let in_spell =
        |from: SystemTime, to: SystemTime| spells.iter().any(|&(a, b)| a <= from && to <= b);
    let outside =
        |from: SystemTime, to: SystemTime| spells.iter().all(|&(a, b)| to <= a || b <= from);
    let (under, quiet) = windows.split(in_spell, outside);
    set_speed(row, per_call_us(&under), per_call_us(&quiet));
    // The slowest whole 100 ms window (not the first or the last, partial), as the time
    // per call in it.
    row.slowest_call_ms = windows
        .whole()
        .iter()
        .map(|&c| {
            let ms = Windows::WIDTH.as_secs_f64() * 1e3;
            if c == 0 { ms } else { ms / c as f64 }
        })
        .fold(0.0, f64::max);
}

/// `spells` on the wall clock (what `steady_allreduce` prints), from one reading of both
/// clocks.
pub(super) fn wall_clock(spells: &[(Instant, Instant)]) -> Vec<(SystemTime, SystemTime)> {
    let (now, wall_now) = (Instant::now(), SystemTime::now());
    let wall = |at: Instant| {
        if at <= now {
            wall_now - (now - at)
        } else {
            wall_now + (at - now)
        }
    };
    spells.iter().map(|&(a, b)| (wall(a), wall(b))).collect()
}

/// The median window's time per call, µs (0 without windows).
pub(super) fn per_call_us(counts: &[u64]) -> f64 {
    let mut sorted = counts.to_vec();
    sorted.sort_unstable();
    match sorted.get(sorted.len() / 2) {
        Some(&c) if c > 0 => Windows::WIDTH.as_secs_f64() * 1e6 / c as f64,
        _ => 0.0,
    }
}

/// Resident memory of every process named `name`, summed (KiB).
pub(super) fn rss_of_processes(name: &str) -> u64 {
    // The kernel keeps 15 bytes of a process's name.
    let name = &name[..name.len().min(15)];
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == name)
        })
        .filter_map(innet_lab::daemons::rss_kib)
        .sum()
}

/// What the job's ranks saw: wrong results, calls off the network, regroups, and the speed
/// of the attacked spells against the quiet ones.
pub(super) fn tally(
    row: &mut HostileRow,
    out: &[(u64, Vec<vanish::Call>)],
    spells: &[(Instant, Instant)],
) {
    row.ran = true;
    row.wrong = out.iter().map(|(w, _)| *w).sum();
    // A collective counts as off the network when any rank ran it on the hosts.
    let calls = &out[0].1;
    row.calls = calls.len() as u64;
    row.off_network = (0..calls.len())
        .filter(|&k| {
            out.iter()
                .any(|(_, c)| c.get(k).is_some_and(|c| !c.network))
        })
        .count() as u64;
    row.regroups = calls.iter().filter(|c| c.regrouped.is_some()).count() as u64;
    let attacked = |c: &vanish::Call| spells.iter().any(|&(a, b)| c.start >= a && c.start < b);
    let (under, quiet): (Vec<_>, Vec<_>) = calls.iter().partition(|c| attacked(c));
    set_speed(row, median_us(&under), median_us(&quiet));
    row.slowest_call_ms = calls
        .iter()
        .map(|c| c.took.as_secs_f64() * 1e3)
        .fold(0.0, f64::max);
}

/// The row's median call under attack and in the quiet spells (µs), and its speed: the
/// quiet one over the attacked one (0 without attacked calls).
pub(super) fn set_speed(row: &mut HostileRow, attacked_us: f64, quiet_us: f64) {
    (row.median_call_us, row.quiet_median_call_us) = (attacked_us, quiet_us);
    row.speed = if attacked_us > 0.0 {
        quiet_us / attacked_us
    } else {
        0.0
    };
}

/// The median of `calls`' durations, µs (0 for none).
pub(super) fn median_us(calls: &[&vanish::Call]) -> f64 {
    let mut us: Vec<f64> = calls.iter().map(|c| c.took.as_secs_f64() * 1e6).collect();
    us.sort_by(f64::total_cmp);
    us.get(us.len() / 2).copied().unwrap_or(0.0)
}
