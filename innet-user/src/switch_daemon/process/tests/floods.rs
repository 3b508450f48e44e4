//! Floods of queries under fresh wire ids: what a daemon remembers of set-ups stays bounded,
//! and no flood forgets another job's set-up between its query and its notify.

use super::*;
use crate::switch_daemon::process::{MAX_QUERIED, SETUP_GRACE};

/// Ages every remembered set-up past the grace, as if the flood had lasted that long.
fn age_setups(reg: &mut Registry) {
    for order in reg.setup_order.values_mut() {
        for (_, at) in order.iter_mut() {
            *at = at
                .checked_sub(SETUP_GRACE)
                .expect("a clock older than the grace");
        }
    }
}

/// Queries of `n` fresh groups from the attacker, from `first` on.
fn fresh_queries(first: u32, n: usize) -> impl Iterator<Item = ControlPayload> {
    (first..first + n as u32).map(|i| query(0x0100_0000 | (0x1000 + i) << 8 | 1))
}

/// Issue 44 item 6: one host's queries flushed the 4096-entry `queried` list for everybody;
/// now a port that floods forgets its own set-ups only, and only those past the grace.
#[test]
fn a_query_flood_from_one_port_forgets_only_its_own_old_set_ups() {
    let (opts, mut reg, mut table) = (tor(), Registry::default(), Fake::new(64));
    from_host(PacketKind::Query, MRR, NMRR, 1, climb(VICTIM)).through(&mut reg, &opts, &mut table);
    from_host(PacketKind::Query, NMRR, MRR, 2, query(VICTIM)).through(&mut reg, &opts, &mut table);
    let mut flood = |reg: &mut Registry, first| {
        for q in fresh_queries(first, MAX_QUERIED) {
            from_host(PacketKind::Query, EVE, EVE, 3, q).through(reg, &opts, &mut table);
        }
    };
    // Within the grace the port keeps its share and refuses the rest.
    flood(&mut reg, 0);
    assert!(reg.stats.port_setups_refused > 0);
    assert_eq!(reg.stats.queries_forgotten, 0);
    // Past it, its own oldest go.
    age_setups(&mut reg);
    flood(&mut reg, MAX_QUERIED as u32);
    assert!(reg.setups.len() <= MAX_QUERIED);
    assert!(reg.stats.queries_forgotten > 0);
    let (n, _) = from_host(
        PacketKind::Notify,
        MRR,
        NMRR,
        1,
        along(VICTIM, &[(TOR, NONE, 2)], 0),
    )
    .through(&mut reg, &opts, &mut table)
    .expect("the victim's notify is still from its MRR");
    assert_eq!(n.fail_cause, 0);
    assert!(table.groups.contains_key(&WIRE));
}

/// CI at three levels: above a TOR the set-ups of all its hosts come on the TOR's port, and
/// one host's queries under fresh wire ids forgot a job's set-up there between its query
/// and its notify (`fail_cause` 2: the job ran on the hosts to its end). A set-up within
/// the grace is never forgotten; the flood's own past the port's share are refused.
#[test]
fn a_query_flood_through_a_tor_cannot_forget_a_set_up_above_it() {
    let [mut t1, mut sp, mut t2] = two_levels();
    // The victim's set-up, up to its notify: the MRR's climb through TOR (SPINE port 1), the
    // NMRR's query through TOR2 (SPINE port 2).
    let (c, _) = pkt(PacketKind::Query, MRR, NMRR, 1, false, climb(VICTIM))
        .at(&mut t1)
        .expect("up");
    let (c, _) = pkt(PacketKind::Query, MRR, NMRR, 1, false, c)
        .at(&mut sp)
        .expect("returned");
    pkt(PacketKind::Query, NMRR, MRR, UP, true, c).at(&mut t1);
    let (q, _) = pkt(PacketKind::Query, NMRR, MRR, 1, false, query(VICTIM))
        .at(&mut t2)
        .expect("up");
    let (q, _) = pkt(PacketKind::Query, NMRR, MRR, 2, false, q)
        .at(&mut sp)
        .expect("down");
    pkt(PacketKind::Query, NMRR, MRR, UP, true, q).at(&mut t1);
    // Then EVE, under TOR, floods: twice SPINE's share for TOR's port, each query as TOR
    // sends it on (a TOR with room for it: the flood may come from many hosts).
    let share = MAX_QUERIED / sp.opts.ifaces.len();
    for q in fresh_queries(0, 2 * share) {
        let (up, _) = pkt(PacketKind::Query, EVE, NMRR, 3, false, q)
            .through(&mut Registry::default(), &t1.opts, &mut Fake::new(64))
            .expect("TOR sends it up");
        pkt(PacketKind::Query, EVE, NMRR, 1, false, up).at(&mut sp);
    }
    // The victim's notify installs all the way.
    let path = [(TOR, SPINE, 1), (SPINE, NONE, 2), (TOR2, SPINE, 1)];
    let (n, _) = pkt(
        PacketKind::Notify,
        MRR,
        NMRR,
        1,
        false,
        along(VICTIM, &path, 1),
    )
    .at(&mut t1)
    .expect("up");
    let (n, _) = pkt(PacketKind::Notify, MRR, NMRR, 1, false, n)
        .at(&mut sp)
        .expect("down");
    assert_eq!(n.fail_cause, 0, "SPINE still knows the victim's set-up");
    let (n, _) = pkt(PacketKind::Notify, MRR, NMRR, UP, true, n)
        .at(&mut t2)
        .expect("to the NMRR");
    assert_eq!(n.fail_cause, 0);
    for f in [&t1.table, &sp.table, &t2.table] {
        assert!(f.groups.contains_key(&WIRE));
    }
    assert!(
        sp.reg.stats.port_setups_refused >= share as u64,
        "{:?}",
        sp.reg.stats
    );
    assert_eq!(sp.reg.stats.queries_forgotten, 0);
}

/// A port whose share shrank (more ports came up) can hold more set-ups than its share,
/// old and young: a new one forgets the old ones and is refused, and what it forgot leaves
/// `setups` too, or the daemon would hold it for ever outside every port's order.
#[test]
fn a_refused_set_up_leaves_no_forgotten_one_behind() {
    let mut reg = Registry::default();
    let now = std::time::Instant::now();
    let old = now
        .checked_sub(SETUP_GRACE)
        .expect("a clock older than the grace");
    let comms = [0x0100_0001, 0x0100_0002, 0x0100_0003, 0x0100_0004];
    for (k, comm) in comms.into_iter().enumerate() {
        assert!(
            reg.admit_setup(comm, 3),
            "room while the share is the whole table"
        );
        if k == 0 {
            reg.setup_order.get_mut(&3).expect("port 3")[0].1 = old;
        }
    }
    // Now a share of 2 for each port.
    reg.below_ports = MAX_QUERIED / 2;
    assert!(
        !reg.admit_setup(0x0100_0005, 3),
        "only young ones left: refused"
    );
    assert_eq!(reg.stats.port_setups_refused, 1);
    assert_eq!(reg.stats.port_setups_forgotten, 1);
    let ordered: Vec<u32> = reg
        .setup_order
        .values()
        .flatten()
        .map(|(w, _)| *w)
        .collect();
    let mut remembered: Vec<u32> = reg.setups.keys().copied().collect();
    remembered.sort_unstable();
    assert_eq!(remembered, ordered, "every remembered set-up has its place");
}
