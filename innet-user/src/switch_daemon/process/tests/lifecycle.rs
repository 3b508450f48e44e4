//! A group set up through two levels, its bindings handed to the data path, its kill.

use super::*;

/// Refusals of the guards against hosts outside a job, all kinds together.
fn guards_fired(s: &innet_common::stats::DaemonStats) -> u64 {
    s.refused_comm_clash
        + s.refused_not_group_port
        + s.refused_extra_members
        + s.refused_port_groups
        + s.refused_port_bindings
        + s.refused_bad_path
        + s.host_port_contested
}

/// A set-up that plays by the rules, over two levels: the MRR under TOR, the NMRR under
/// TOR2, SPINE above both (TORs on its ports 1 and 2, each TOR's uplink on its port 9).
/// Every guard lets it through, and its kill frees it everywhere.
#[test]
fn a_two_level_set_up_installs_and_its_kill_frees_it() {
    let [mut t1, mut sp, mut t2] = two_levels();
    // The MRR's climb: up through TOR to SPINE, the top, and back down.
    let (c, route) = pkt(PacketKind::Query, MRR, NMRR, 1, false, climb(VICTIM))
        .at(&mut t1)
        .expect("up");
    assert_eq!(route, Route::Uplinks);
    let (c, route) = pkt(PacketKind::Query, MRR, NMRR, 1, false, c)
        .at(&mut sp)
        .expect("returned");
    assert_eq!(route, Route::Return);
    let (_, route) = pkt(PacketKind::Query, NMRR, MRR, UP, true, c)
        .at(&mut t1)
        .expect("down to the MRR");
    assert_eq!(route, Route::Port(1));
    assert_eq!(t1.reg.above.get(&SPINE), Some(&UP));
    // The NMRR's query: up through TOR2 and SPINE, down to the MRR.
    let (q, _) = pkt(PacketKind::Query, NMRR, MRR, 1, false, query(VICTIM))
        .at(&mut t2)
        .expect("up");
    let (q, route) = pkt(PacketKind::Query, NMRR, MRR, 2, false, q)
        .at(&mut sp)
        .expect("down");
    assert_eq!(route, Route::Port(1));
    let (q, _) = pkt(PacketKind::Query, NMRR, MRR, UP, true, q)
        .at(&mut t1)
        .expect("to the MRR");
    assert_eq!(
        q.path
            .hops()
            .iter()
            .map(|h| Ipv4Addr::from(h.ip()))
            .collect::<Vec<_>>(),
        [TOR2, SPINE]
    );
    // The notify: up the MRR's branch to SPINE, down to TOR2.
    let path = [(TOR, SPINE, 1), (SPINE, NONE, 2), (TOR2, SPINE, 1)];
    let (n, route) = pkt(
        PacketKind::Notify,
        MRR,
        NMRR,
        1,
        false,
        along(VICTIM, &path, 1),
    )
    .at(&mut t1)
    .expect("up");
    assert_eq!((n.fail_cause, route), (0, Route::Port(UP)));
    let (n, route) = pkt(PacketKind::Notify, MRR, NMRR, 1, false, n)
        .at(&mut sp)
        .expect("down");
    assert_eq!((n.fail_cause, route), (0, Route::Port(2)));
    let (n, route) = pkt(PacketKind::Notify, MRR, NMRR, UP, true, n)
        .at(&mut t2)
        .expect("to the NMRR");
    assert_eq!((n.fail_cause, route), (0, Route::Below));
    for f in [&t1.table, &sp.table, &t2.table] {
        assert!(f.groups.contains_key(&WIRE));
    }
    assert_eq!(sp.table.groups[&WIRE].0.children.len(), 2);
    for r in [&t1.reg, &sp.reg, &t2.reg] {
        assert_eq!(guards_fired(&r.stats), 0, "{:?}", r.stats);
    }
    // The kill follows the same path.
    let (k, _) = pkt(
        PacketKind::Kill,
        MRR,
        NMRR,
        1,
        false,
        along(VICTIM, &path, 1),
    )
    .at(&mut t1)
    .expect("up");
    let (k, _) = pkt(PacketKind::Kill, MRR, NMRR, 1, false, k)
        .at(&mut sp)
        .expect("down");
    pkt(PacketKind::Kill, MRR, NMRR, UP, true, k).at(&mut t2);
    for f in [&t1.table, &sp.table, &t2.table] {
        assert!(f.groups.is_empty());
    }
}

/// The data path's copy of the bindings (`HOST_PORTS`) learns every binding the control path
/// makes, and nothing it refuses: a spoofer's control packet from another port moves no one.
#[test]
fn bindings_are_handed_to_the_data_path_as_they_are_made() {
    let (opts, mut reg, mut table) = (tor(), Registry::default(), Fake::new(64));
    assert!(reg.take_binding_changes().is_empty());
    from_host(PacketKind::Query, EVE, EVE, 3, query(0x33 << 24 | 0x0abc))
        .through(&mut reg, &opts, &mut table);
    assert_eq!(reg.take_binding_changes(), vec![(EVE, Some(3))]);
    // The same address from another port: refused, the binding stays.
    from_host(PacketKind::Query, EVE, EVE, 4, query(0x33 << 24 | 0x0abd))
        .through(&mut reg, &opts, &mut table);
    assert!(reg.take_binding_changes().is_empty());
    assert!(reg.stats.refused_wrong_port > 0);
}
