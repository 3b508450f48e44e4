//! The attacks a host outside a group tries on the control plane, each stopped.

use super::*;

/// Issue 44 item 3: a query under another high byte of the victim's wire id, then a notify
/// with a crafted path, made the attacker one of the group's MRRs (`extend` pushed it before
/// `add_children` failed), and its kill was then accepted.
#[test]
fn an_attacker_cannot_become_a_groups_mrr_and_kill_it() {
    let (opts, mut reg, mut table) = (tor(), Registry::default(), Fake::new(64));
    victim_setup(&mut reg, &opts, &mut table);
    for high in [0x22, 0x11] {
        let comm = high << 24 | WIRE;
        from_host(PacketKind::Query, EVE, EVE, 3, query(comm)).through(&mut reg, &opts, &mut table);
        // Eve's notify names as many members as the TOR saw queries.
        from_host(
            PacketKind::Notify,
            EVE,
            EVE,
            3,
            along(comm, &[(TOR, NONE, 3)], 0),
        )
        .through(&mut reg, &opts, &mut table);
        from_host(
            PacketKind::Kill,
            EVE,
            EVE,
            3,
            along(comm, &[(TOR, NONE, 1)], 0),
        )
        .through(&mut reg, &opts, &mut table);
        assert!(
            table.groups.contains_key(&WIRE),
            "high byte {high:#x}: the attacker's kill freed the victim's group"
        );
        let members: Vec<Ipv4Addr> = table.groups[&WIRE]
            .0
            .children
            .iter()
            .map(|c| c.ip)
            .collect();
        assert!(
            !members.contains(&EVE),
            "the attacker became a member: {members:?}"
        );
    }
    assert!(!reg.installed[&WIRE].mrrs.iter().any(|(ip, _)| *ip == EVE));
    assert!(reg.stats.refused_comm_clash > 0, "{:?}", reg.stats);
    // Eve, had she been one of the group's MRRs (Socket mode), still adds no branch from a
    // port that is none of the group's.
    reg.setups.get_mut(&WIRE).expect("set-up").mrrs.push(EVE);
    let (n, _) = from_host(
        PacketKind::Notify,
        EVE,
        EVE,
        3,
        along(VICTIM, &[(TOR, NONE, 3)], 0),
    )
    .through(&mut reg, &opts, &mut table)
    .expect("on");
    assert_eq!(n.fail_cause, FAIL_REFUSED);
    assert_eq!(reg.stats.refused_not_group_port, 1, "{:?}", reg.stats);
    assert!(!reg.installed[&WIRE].mrrs.iter().any(|(ip, _)| *ip == EVE));
    // The victim's own kill still frees it.
    from_host(
        PacketKind::Kill,
        MRR,
        NMRR,
        1,
        along(VICTIM, &[(TOR, NONE, 2)], 0),
    )
    .through(&mut reg, &opts, &mut table);
    assert!(!table.groups.contains_key(&WIRE));
}

/// The join-before-notify attack: Eve knows the victim's wire id (and its whole
/// `true_comm_id`) before the job sets its group up, and queries under it first. Without
/// the job's set-up key she is left out of the group the notify installs, and counted.
#[test]
fn a_query_without_the_set_up_key_makes_no_member() {
    const KEY: u64 = 0x005e_c2e7;
    let (opts, mut reg, mut table) = (tor(), Registry::default(), Fake::new(64));
    let keyed = |mut c: ControlPayload, key: u64| {
        c.set_job_id(key);
        c
    };
    from_host(
        PacketKind::Query,
        EVE,
        MRR,
        3,
        keyed(query(VICTIM), KEY ^ 1),
    )
    .through(&mut reg, &opts, &mut table)
    .expect("a query of its own is passed on: the key is judged at the notify");
    from_host(PacketKind::Query, MRR, NMRR, 1, keyed(climb(VICTIM), KEY))
        .through(&mut reg, &opts, &mut table);
    from_host(PacketKind::Query, NMRR, MRR, 2, keyed(query(VICTIM), KEY))
        .through(&mut reg, &opts, &mut table);
    let (n, _) = from_host(
        PacketKind::Notify,
        MRR,
        NMRR,
        1,
        keyed(along(VICTIM, &[(TOR, NONE, 2)], 0), KEY),
    )
    .through(&mut reg, &opts, &mut table)
    .expect("the notify goes on");
    assert_eq!(n.fail_cause, 0, "the job's group installs");
    let mut members: Vec<Ipv4Addr> = table.groups[&WIRE]
        .0
        .children
        .iter()
        .map(|c| c.ip)
        .collect();
    members.sort();
    assert_eq!(members, vec![MRR, NMRR], "only the keyed members");
    assert_eq!(reg.stats.refused_wrong_key, 1, "{:?}", reg.stats);
}

/// One port cannot fill a set-up's members with spoofed addresses before the job's own
/// queries come: past its share they are refused, and the job's members still fit.
#[test]
fn one_port_holds_at_most_its_share_of_a_set_ups_members() {
    let (opts, mut reg, mut table) = (tor(), Registry::default(), Fake::new(64));
    let share = super::super::MAX_PENDING_PER_PORT;
    for i in 0..2 * share as u8 {
        let mut q = query(VICTIM);
        q.set_job_id(7);
        from_host(PacketKind::Query, Ipv4Addr::new(10, 0, 3, i + 1), MRR, 3, q)
            .through(&mut reg, &opts, &mut table);
    }
    assert_eq!(
        reg.stats.refused_extra_members, share as u64,
        "{:?}",
        reg.stats
    );
    victim_setup(&mut reg, &opts, &mut table);
    let members = &table.groups[&WIRE].0.children;
    assert_eq!(members.len(), 2, "the job's two members: {members:?}");
    assert_eq!(reg.stats.refused_wrong_key, share as u64, "{:?}", reg.stats);
}

/// Issue 44 item 6: `SETTING_UP` was marked before any check, so a refused packet silenced
/// the group's lost notices for 2 s.
#[test]
fn refused_packets_do_not_mark_a_group_setting_up() {
    let (opts, mut reg, mut table) = (tor(), Registry::default(), Fake::new(64));
    // A notify from a host no query went to.
    from_host(
        PacketKind::Notify,
        EVE,
        NMRR,
        3,
        along(VICTIM, &[(TOR, NONE, 2)], 0),
    )
    .through(&mut reg, &opts, &mut table);
    // A query from an address bound to another port.
    from_host(PacketKind::Query, NMRR, MRR, 2, query(0x0100_0001))
        .through(&mut reg, &opts, &mut table);
    table.marked.clear();
    from_host(PacketKind::Query, NMRR, MRR, 3, query(VICTIM)).through(&mut reg, &opts, &mut table);
    from_host(PacketKind::Query, EVE, MRR, 3, climb(VICTIM | 0x77))
        .through(&mut reg, &opts, &mut table);
    let mut prefilled = climb(0x0500_0005);
    prefilled.path.push(PathHop::seen(u32::from(SPINE), 1, 0));
    from_host(PacketKind::Query, EVE, MRR, 3, prefilled).through(&mut reg, &opts, &mut table);
    assert_eq!(
        table.marked,
        vec![VICTIM & 0xff_ffff | 0x77],
        "only the accepted climb"
    );
    // An accepted set-up marks its group.
    table.marked.clear();
    victim_setup(&mut Registry::default(), &opts, &mut table);
    assert!(table.marked.contains(&WIRE));
}

/// Issue 44 item 6: no per-port quota on a switch's groups: one host port installing its own
/// groups could take all of them.
#[test]
fn one_port_cannot_take_every_group_of_the_switch() {
    let (opts, mut reg, mut table) = (tor(), Registry::default(), Fake::new(8));
    let mut refused = 0;
    for i in 0..8u32 {
        let comm = 0x0300_0000 | (0x100 + i) << 8 | 1;
        from_host(PacketKind::Query, EVE, EVE, 3, climb(comm)).through(&mut reg, &opts, &mut table);
        let (n, _) = from_host(
            PacketKind::Notify,
            EVE,
            EVE,
            3,
            along(comm, &[(TOR, NONE, 1)], 0),
        )
        .through(&mut reg, &opts, &mut table)
        .expect("on");
        if n.fail_cause == FAIL_CAPACITY {
            refused += 1;
        }
    }
    assert!(refused > 0, "one port took all {} groups", table.capacity);
    assert!(reg.stats.refused_port_groups > 0);
    victim_setup(&mut reg, &opts, &mut table);
}

/// Issue 44 item 6: a full `bound` map made every control packet scan its 65,536 entries.
#[test]
fn a_full_binding_table_is_not_swept_on_every_packet() {
    let (opts, mut reg, mut table) = (tor(), Registry::default(), Fake::new(64));
    reg.ports(&opts);
    let now = std::time::Instant::now();
    for i in 0..super::super::MAX_BOUND_ADDRESSES as u32 {
        reg.bound
            .insert(Ipv4Addr::from(0x0a10_0000 + i), (1 + i % 3, now));
    }
    reg.bound_per_port.clear();
    for (port, _) in reg.bound.values() {
        *reg.bound_per_port.entry(*port).or_default() += 1;
    }
    for i in 0..200u32 {
        from_host(
            PacketKind::Query,
            Ipv4Addr::from(0x0a20_0000 + i),
            MRR,
            1 + i % 3,
            query(VICTIM),
        )
        .through(&mut reg, &opts, &mut table);
    }
    assert!(
        reg.stats.table_sweeps <= 1,
        "{} sweeps",
        reg.stats.table_sweeps
    );
}

/// A host's query or climb arrives with an empty path: a pre-filled one would make the TOR
/// learn a wrong uplink for a switch above when it comes back down.
#[test]
fn a_climb_with_a_pre_filled_path_cannot_poison_the_uplink_map() {
    let (opts, mut reg, mut table) = (tor(), Registry::default(), Fake::new(64));
    // The real SPINE2 sits behind uplink 8: a climb came back through it.
    let mut legit = climb(VICTIM);
    legit.path.push(PathHop::seen(u32::from(TOR), 1, 2));
    legit.path.push(PathHop::seen(u32::from(SPINE2), 1, 0));
    Packet {
        kind: PacketKind::Query,
        src: NMRR,
        dst: MRR,
        port: UP2,
        from_uplink: true,
        dst_is_local: true,
        body: legit,
    }
    .through(&mut reg, &opts, &mut table);
    assert_eq!(reg.above.get(&SPINE2), Some(&UP2));
    // Eve's climb names SPINE2 above this TOR before the TOR appends itself.
    let mut forged = climb(0x0200_0007);
    forged.path.push(PathHop::seen(u32::from(TOR), 1, 2));
    forged.path.push(PathHop::seen(u32::from(SPINE2), 1, 0));
    let up =
        from_host(PacketKind::Query, EVE, NMRR, 3, forged).through(&mut reg, &opts, &mut table);
    assert!(up.is_none(), "a host's climb with a path is refused");
    // What SPINE (behind uplink 9) would send back down had it gone up.
    forged.path.push(PathHop::seen(u32::from(TOR), 1, 2));
    forged.path.push(PathHop::seen(u32::from(SPINE), 1, 0));
    Packet {
        kind: PacketKind::Query,
        src: NMRR,
        dst: EVE,
        port: UP,
        from_uplink: true,
        dst_is_local: true,
        body: forged,
    }
    .through(&mut reg, &opts, &mut table);
    assert_eq!(
        reg.above.get(&SPINE2),
        Some(&UP2),
        "the uplink map was poisoned"
    );
    assert!(reg.stats.refused_bad_path > 0);
}

/// A notify's path must be one of a tree through this switch: a hop's parent is the next
/// hop up on the MRR's branch, the TOR is at an end, the path is symmetric.
#[test]
fn a_notify_path_that_is_no_tree_is_refused() {
    let (opts, mut reg, mut table) = (tor(), Registry::default(), Fake::new(64));
    // SPINE2 behind uplink 8, SPINE behind 9.
    for (spine, port) in [(SPINE2, UP2), (SPINE, UP)] {
        let mut back = climb(0x0200_0001);
        back.path.push(PathHop::seen(u32::from(TOR), 1, 2));
        back.path.push(PathHop::seen(u32::from(spine), 1, 0));
        Packet {
            kind: PacketKind::Query,
            src: NMRR,
            dst: EVE,
            port,
            from_uplink: true,
            dst_is_local: true,
            body: back,
        }
        .through(&mut reg, &opts, &mut table);
    }
    from_host(PacketKind::Query, EVE, TOR2, 3, climb(0x0200_0001))
        .through(&mut reg, &opts, &mut table);
    // Up to SPINE, but naming SPINE2 as the TOR's parent.
    let crafted = along(
        0x0200_0001,
        &[(TOR, SPINE2, 1), (SPINE, NONE, 2), (TOR2, SPINE, 1)],
        1,
    );
    let out =
        from_host(PacketKind::Notify, EVE, TOR2, 3, crafted).through(&mut reg, &opts, &mut table);
    assert!(out.is_none(), "{out:?}");
    assert!(!table.groups.contains_key(&0x01));
    assert_eq!(reg.stats.refused_bad_path, 1);
}

/// Issue 44 item 8: a spoofed query made a SPINE send a host's frames down another TOR.
#[test]
fn a_spoofed_query_cannot_move_a_host_at_a_spine() {
    let (opts, mut reg, mut table) = (spine(), Registry::default(), Fake::new(64));
    let up = |tor: Ipv4Addr, port: u32, src: Ipv4Addr, comm: u32| {
        let mut q = query(comm);
        q.path.push(PathHop::seen(u32::from(tor), 1, 1));
        q.set_tor1_ip(u32::from(tor));
        Packet {
            kind: PacketKind::Query,
            src,
            dst: MRR,
            port,
            from_uplink: false,
            dst_is_local: false,
            body: q,
        }
    };
    up(TOR, 1, NMRR, VICTIM).through(&mut reg, &opts, &mut table);
    assert_eq!(reg.down_to(NMRR), Route::Port(1));
    // Eve, under TOR2, with the NMRR's address.
    up(TOR2, 2, NMRR, 0x0200_0009).through(&mut reg, &opts, &mut table);
    assert_ne!(
        reg.down_to(NMRR),
        Route::Port(2),
        "the host was moved to Eve's TOR"
    );
    assert!(reg.stats.host_port_contested > 0);
}
