//! What the attacker sends: the forged frames of each attack against a target group, in
//! bursts.

use super::{
    AtomicBool, Attack, COMM_TYPE_ALLREDUCE, ControlPath, ControlPayload, Duration, ETH_LEN,
    IPV4_LEN, Instant, Ipv4Addr, Ordering, PacketKind, PacketSocket, PathHop, PortStats,
    QNH_RESPONSE, STEP_FINAL, STEP_NACK, STEP_REGROUP, Switch, Topology, disguised, forged_control,
    forged_data, forged_host_frame, ifindex, installed, stats,
};

/// What the attacker knows of the job.
pub(super) struct Target {
    pub(super) id: u32,
    pub(super) members: Vec<Ipv4Addr>,
    pub(super) tor: Ipv4Addr,
    pub(super) pkey: u16,
    /// The attacker's own address.
    pub(super) me: Ipv4Addr,
}

/// Bursts a second, and forgeries per burst: 200 × 12 = 2,400 forgeries/s (the attack
/// tried on LAMMPS sent a burst every 5 ms), a rate that leaves the lab's 2 CPUs to the job,
/// so a row's speed shows what the frames do more than what sending them costs.
pub(super) const BURST_EVERY: Duration = Duration::from_millis(5);
pub(super) const ROUNDS_PER_BURST: usize = 4;

/// The forgeries of `attack` for round `r` (each one frame, or its fragments).
pub(super) fn forgeries(attack: Attack, t: &Target, r: u8) -> Vec<Vec<Vec<u8>>> {
    let Attack::Forgery(disguise) = attack else {
        return vec![];
    };
    // A stray contribution from leader 0 ("the group vanished"), and a result from leader
    // 0's address (where a switch's results come from) to every other member.
    let stray = (t.members[1], false);
    let results = t.members[1..].iter().map(|&m| (m, true));
    std::iter::once(stray)
        .chain(results)
        .enumerate()
        .map(|(k, (dst, result))| {
            let f = forged_data(t.id, t.members[0], dst, r, result);
            disguised(&f, disguise, u16::from(r) << 4 | k as u16)
        })
        .collect()
}

/// Queries per burst of [`Attack::ControlFlood`]: 40,000 a second while a spell lasts.
pub(super) const FLOOD_PER_BURST: usize = 200;

/// [`Attack::Hijack`]'s frames for `comm` (the job's wire id under another high byte): a
/// query to itself (so the attacker is the set-up's MRR), a notify naming its TOR with three
/// members, a kill.
pub(super) fn hijack(t: &Target, comm: u32) -> [(PacketKind, ControlPayload); 3] {
    let body = |hop: Option<u8>| {
        let mut c = ControlPayload {
            sup_comm_type: COMM_TYPE_ALLREDUCE,
            ..ControlPayload::default()
        };
        c.set_true_comm_id(comm);
        if let Some(children) = hop {
            let mut path = ControlPath::default();
            path.push(PathHop::in_tree(u32::from(t.tor), 0, children));
            c.path = path;
            c.query_notify_hop = QNH_RESPONSE;
        }
        c
    };
    [
        (PacketKind::Query, body(None)),
        (PacketKind::Notify, body(Some(3))),
        (PacketKind::Kill, body(Some(1))),
    ]
}

/// The attack runs in spells of this long, a quiet spell of the same length after each:
/// the job's speed under attack is compared with its speed in its own quiet spells, which
/// on a 2-CPU machine whose runs differ by tens of percent is the only steady reference.
pub(super) const SPELL: Duration = Duration::from_millis(500);

/// Leader 0's host frames for collective `seq` (each in turn: the attacker does not know
/// which collective the job is in) to every other leader: a regroup notice of generation
/// `u32::MAX`, a final result, a NACK of step 0.
pub(super) fn host_forgeries(t: &Target, seq: u32, spoofed: bool) -> Vec<Vec<Vec<u8>>> {
    let src = if spoofed { t.members[0] } else { t.me };
    let result = [0x55u8; 68];
    t.members[1..]
        .iter()
        .flat_map(|&dst| {
            [
                (STEP_REGROUP, &u32::MAX.to_le_bytes()[..]),
                (STEP_FINAL, &result[..]),
                (STEP_NACK, &[0u8][..]),
            ]
            .map(|(step, body)| {
                vec![forged_host_frame(
                    t.pkey,
                    (0, src),
                    dst,
                    (seq, step),
                    0,
                    body,
                )]
            })
        })
        .collect()
}

/// Sends `attack` in bursts every [`BURST_EVERY`], in spells, until `done`; the forgeries
/// sent and the spells (start, end). Runs in the attacker's namespace.
pub(super) fn attack_until(
    attack: Attack,
    t: &Target,
    done: &AtomicBool,
) -> (u64, Vec<(Instant, Instant)>) {
    let raw = PacketSocket::new().expect("packet socket");
    let eth0 = ifindex("eth0").expect("eth0");
    let emit = |pieces: &[Vec<u8>]| pieces.iter().all(|p| raw.send(eth0, p).is_ok());
    let by_round: Vec<Vec<Vec<Vec<u8>>>> = (0..=255u8).map(|r| forgeries(attack, t, r)).collect();
    let (mut sent, mut round, mut next_id) = (0u64, 0usize, 1u32);
    let mut spells = vec![];
    let attack_start = Instant::now();
    let mut spell_start = attack_start;
    while !done.load(Ordering::SeqCst) {
        let now = Instant::now();
        if now - spell_start >= 2 * SPELL {
            spells.push((spell_start, spell_start + SPELL));
            spell_start = now;
        }
        if now - spell_start >= SPELL {
            std::thread::sleep(BURST_EVERY);
            continue;
        }
        match attack {
            Attack::None => {}
            Attack::Forgery(_) => {
                for _ in 0..ROUNDS_PER_BURST {
                    for forgery in &by_round[round] {
                        sent += u64::from(emit(forgery));
                    }
                    round = (round + 1) % by_round.len();
                }
            }
            Attack::HostFrames { spoofed } => {
                // Around the collective the job is in, by its pace (about 10 a ms here).
                let guess = (attack_start.elapsed().as_millis() as u32).saturating_mul(10);
                for k in 0..2 {
                    let seq = (guess + (round as u32 * 2 + k) % 128).saturating_sub(64);
                    for forgery in host_forgeries(t, seq, spoofed) {
                        sent += u64::from(emit(&forgery));
                    }
                }
                round = (round + 1) % 64;
            }
            Attack::ControlFlood | Attack::PlainFlood => {
                for _ in 0..FLOOD_PER_BURST {
                    let mut q = ControlPayload::default();
                    q.set_true_comm_id(0x9900_0000 ^ next_id.wrapping_mul(2_654_435_761));
                    let mut f = forged_control(PacketKind::Query, (t.me, t.members[1]), 1, &q);
                    if attack == Attack::PlainFlood {
                        // UDP port 9 (discard), the UDP checksum off.
                        let udp = ETH_LEN + IPV4_LEN;
                        f[udp + 2..udp + 4].copy_from_slice(&9u16.to_be_bytes());
                        f[udp + 6..udp + 8].fill(0);
                    }
                    sent += u64::from(emit(&[f]));
                    next_id = next_id.wrapping_add(1);
                }
            }
            Attack::Hijack => {
                for _ in 0..ROUNDS_PER_BURST {
                    // Every high byte in turn: the job's own is refused as a late query.
                    let comm = (next_id % 0xff + 1) << 24 | t.id;
                    next_id = next_id.wrapping_add(1);
                    for (kind, frame) in hijack(t, comm) {
                        sent += u64::from(emit(&[forged_control(kind, (t.me, t.me), 3, &frame)]));
                    }
                }
            }
            Attack::WireIdScan => {
                for _ in 0..3 * ROUNDS_PER_BURST {
                    let f = forged_data(next_id, t.members[0], t.tor, 0, false);
                    sent += u64::from(emit(&[f]));
                    next_id = (next_id % 0x00ff_fffe) + 1;
                    // Ids ending in 0xff are control ids, no group's.
                    if next_id & 0xff == 0xff {
                        next_id += 1;
                    }
                }
            }
        }
        std::thread::sleep(BURST_EVERY);
    }
    let end = Instant::now().min(spell_start + SPELL);
    spells.push((spell_start, end));
    (sent, spells)
}

/// `not_member` of group `id`, summed over every switch that holds it.
pub(super) fn not_member(topo: &Topology, id: u32) -> u64 {
    topo.switches()
        .filter_map(|sw| installed(sw, id))
        .map(|g| g.stats.not_member)
        .sum()
}

/// The counters of port `ifindex` of `sw`.
pub(super) fn port_counters(sw: &Switch, ifindex: u32) -> PortStats {
    stats::read(&sw.pins.layout)
        .unwrap_or_default()
        .into_iter()
        .find(|p| p.ifindex == ifindex)
        .map(|p| p.total)
        .unwrap_or_default()
}

/// Every switch port's counters, summed.
pub(super) fn fabric_ports(topo: &Topology) -> PortStats {
    let mut sum = PortStats::default();
    for sw in topo.switches() {
        for p in stats::read(&sw.pins.layout).unwrap_or_default() {
            sum.accumulate(&p.total);
        }
    }
    sum
}

/// This process's resident memory (KiB): the ranks are its threads.
pub(super) fn own_rss_kib() -> u64 {
    innet_lab::daemons::rss_kib(std::process::id()).unwrap_or(0)
}
