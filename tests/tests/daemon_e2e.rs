//! `innet daemon` on a TOR: it recovers the pinned programs, takes control packets from
//! XDP, fills in the query on its way to the MRR and re-sends it along the bridge's path;
//! SIGTERM gives control packets back to the fabric and removes every pin.

use std::time::Duration;

use innet::{loader::XdpMode, stats};
use innet_client::{
    handshake::{Collected, Notices},
    tree::Weigh,
};
use innet_common::{
    codec::{Addressing, encode_control, read},
    proto::{PacketKind, QNH_HOPS_MASK},
    wire::{BTH_LEN, ControlPayload, DETH_LEN, ETH_LEN, INC_LEN, IPV4_LEN, UDP_LEN},
};
use innet_lab::{
    daemons::{
        LAB_SETUP_KEY, control, daemons_on, installed, leader, learn_hosts, recv_control,
        spawn_daemon, spawn_daemon_with, wait_until,
    },
    topology::{Shape, Topology},
};

fn query() -> Vec<u8> {
    let mut p = ControlPayload::default();
    p.set_sup_allreduce_op(0xffff);
    p.set_sup_data_type(0xffff);
    p.set_sup_max_data_size(4096);
    p.set_true_comm_id(0x00c0_de01);
    let frame = encode_control(&Addressing::default(), PacketKind::Query, 1, &p);
    frame[ETH_LEN + IPV4_LEN + UDP_LEN..].to_vec()
}

fn received(buf: &[u8]) -> ControlPayload {
    read(&buf[BTH_LEN + DETH_LEN + INC_LEN..])
}

/// Every other host queries host 0 (rank = host index), which climbs and collects them.
fn queries_collected(
    topo: &Topology,
    socks: &[std::net::UdpSocket],
    comm: u32,
) -> (Vec<std::net::Ipv4Addr>, Collected) {
    let n = topo.hosts.len();
    for (rank, sock) in socks.iter().enumerate().skip(1) {
        let mut q = ControlPayload::default();
        q.set_true_comm_id(comm);
        q.set_global_group_size(n as u16);
        q.set_world_rank(rank as u32);
        q.set_sup_allreduce_op(0xffff);
        q.set_sup_data_type(0xffff);
        q.set_sup_max_data_size(1024);
        q.set_sup_window(u16::MAX);
        // The key the lab's leader (the MRR here) puts in its notifies.
        q.set_job_id(LAB_SETUP_KEY);
        sock.send_to(
            &control(PacketKind::Query, &q, rank as u32),
            (topo.hosts[0].ip, 4791),
        )
        .expect("send");
    }
    let nmrrs: Vec<_> = topo.hosts[1..].iter().map(|h| h.ip).collect();
    let heard = leader(topo, socks, 0)
        .collect(&nmrrs, comm)
        .expect("every query and a climb reach the MRR");
    (nmrrs, heard)
}

/// The hosts' side of the handshake: every NMRR queries the MRR (host 0), which chooses the
/// tree and sends each its notify. Returns the notices and each notify's `fail_cause` as
/// its NMRR received it.
fn handshake(topo: &Topology, socks: &[std::net::UdpSocket], comm: u32) -> (Notices, Vec<u8>) {
    let (nmrrs, heard) = queries_collected(topo, socks, comm);
    let leader = leader(topo, socks, 0);
    let base = leader.decide(&heard, comm, topo.hosts.len() as u16, None);
    let notices = leader.address(&base, &heard, &nmrrs, Weigh::ByLoad);
    leader.notify(&notices).expect("notify");
    let causes = (1..topo.hosts.len())
        .map(|rank| recv_control(&socks[rank], PacketKind::Notify, comm).fail_cause)
        .collect();
    (notices, causes)
}

#[test]
fn daemon_fills_in_queries_forwards_them_and_cleans_up() {
    let topo = Topology::new(Shape {
        tors: 1,
        hosts_per_tor: 2,
        sockets: 1,
        spines: 0,
        mode: XdpMode::Native,
        ..Shape::small()
    });
    let tor = &topo.tors[0];
    let socks = topo.sockets();
    let (nmrr, mrr) = (&topo.hosts[0], &topo.hosts[1]);

    let mut daemon = spawn_daemon(tor, "tor");

    // The NMRR's query crosses the TOR: one hop, TOR address, capabilities intersected.
    socks[0].send_to(&query(), (mrr.ip, 4791)).expect("send");
    let mut buf = [0u8; 512];
    let (n, from) = socks[1]
        .recv_from(&mut buf)
        .expect("the query reaches the MRR");
    assert_eq!(from.ip(), nmrr.ip);
    let q = received(&buf[..n]);
    assert_eq!(q.query_notify_hop & QNH_HOPS_MASK, 1);
    assert_eq!(q.tor1_ip(), u32::from(tor.ip));
    assert_eq!(q.sup_allreduce_op(), 0x0fff, "every op");
    assert_eq!(
        q.sup_data_type(),
        0x0fff,
        "every type: 8 integers, 4 floats"
    );
    assert_eq!(q.sup_max_data_size(), 1408);
    assert_eq!(q.true_comm_id(), 0x00c0_de01);
    let up: u64 = stats::read(&tor.pins.layout)
        .expect("stats")
        .iter()
        .map(|p| p.total.control_up)
        .sum();
    assert_eq!(up, 1);

    // SIGTERM: control packets pass again, programs and pins are gone.
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(daemon.0.id() as i32, libc::SIGTERM) };
    let status = daemon.0.wait().expect("wait");
    assert!(status.success(), "daemon exit: {status}");
    assert!(!tor.pins.path().exists(), "the daemon unpinned everything");
    socks[0].send_to(&query(), (mrr.ip, 4791)).expect("send");
    let (n, _) = socks[1]
        .recv_from(&mut buf)
        .expect("with no daemon, the query passes as is");
    assert_eq!(received(&buf[..n]).query_notify_hop, 0, "untouched");
}

/// Hosts create a group purely by control packets through 2 TORs and a SPINE, run rounds
/// through it, and tear it down: the MRR's climb and the queries bring back their ways up,
/// each notify its path; a notify or kill from a host that is not the MRR is ignored.
#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario: query, notify, rounds, kill, step by step"
)]
fn groups_come_and_go_by_query_notify_and_kill() {
    let topo = Topology::new(Shape {
        tors: 2,
        hosts_per_tor: 2,
        sockets: 1,
        spines: 1,
        mode: XdpMode::Native,
        ..Shape::small()
    });
    let socks = topo.sockets();
    let _daemons = daemons_on(&topo, &[]);
    learn_hosts(&topo);
    let comm = 0x5a00_c0de_u32;
    let wire = comm & 0x00ff_ffff;

    // Step 1: every NMRR queries the MRR; the MRR climbs. Each copy carries its way up.
    let (nmrrs, heard) = queries_collected(&topo, &socks, comm);
    let (t0, t1, spine) = (
        u32::from(topo.tors[0].ip),
        u32::from(topo.tors[1].ip),
        u32::from(topo.spines[0].ip),
    );
    let ips = |w: &Vec<innet_common::wire::PathHop>| {
        w.iter()
            .map(innet_common::wire::PathHop::ip)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        heard.own.iter().map(ips).collect::<Vec<_>>(),
        vec![vec![t0, spine]],
        "the climb"
    );
    assert_eq!(
        heard.ways[&nmrrs[0]].iter().map(ips).collect::<Vec<_>>(),
        vec![vec![t0]]
    );
    for far in &nmrrs[1..] {
        let ways = &heard.ways[far];
        assert_eq!(
            ways.iter().map(ips).collect::<Vec<_>>(),
            vec![vec![t1, spine]]
        );
        assert_eq!(ways[0][1].free(), 64, "the SPINE reports its free capacity");
    }

    // A notify from a host that is not the MRR installs nothing anywhere.
    let leader = leader(&topo, &socks, 0);
    let base = leader.decide(&heard, comm, 4, None);
    let notices = leader.address(&base, &heard, &nmrrs, Weigh::ByLoad);
    let forged = notices[2].1;
    socks[3]
        .send_to(
            &control(PacketKind::Notify, &forged, 3),
            (topo.hosts[1].ip, 4791),
        )
        .expect("send");
    std::thread::sleep(Duration::from_millis(300));
    for sw in [&topo.tors[0], &topo.tors[1], &topo.spines[0]] {
        assert!(installed(sw, wire).is_none(), "a forged notify is ignored");
    }

    // Step 2: the MRR answers every NMRR with its path through the tree.
    assert_eq!(base.fail_cause, 0);
    let far = &notices[1].1;
    assert_eq!(far.spine_ip(), spine, "rooted at the SPINE");
    assert_eq!(
        (far.path.n_hops, far.path.turn),
        (3, 1),
        "TOR 0, SPINE, TOR 1"
    );
    leader.notify(&notices).expect("notify");
    for (rank, sock) in socks.iter().enumerate().take(4).skip(1) {
        let n = recv_control(sock, PacketKind::Notify, comm);
        assert_eq!(n.fail_cause, 0, "every switch took the group");
        assert_eq!(
            n.query_notify_hop & QNH_HOPS_MASK,
            if rank == 1 { 1 } else { 3 }
        );
    }
    for (name, sw, kids, root) in [
        ("TOR 0", &topo.tors[0], 2, false),
        ("TOR 1", &topo.tors[1], 2, false),
        ("SPINE", &topo.spines[0], 2, true),
    ] {
        let g = installed(sw, wire).unwrap_or_else(|| panic!("{name} installed the group"));
        assert_eq!(usize::from(g.config.n_children), kids, "{name}");
        assert_eq!(g.config.is_root != 0, root, "{name}");
    }

    // Step 3: rounds through the group the handshake built.
    rounds(&topo, &socks, wire, 0, 50);

    // Step 4: a kill from an NMRR is ignored; the MRR's kill frees every switch.
    socks[1]
        .send_to(
            &control(
                PacketKind::Kill,
                &ControlPayload {
                    true_comm_id: comm.to_be_bytes(),
                    ..ControlPayload::default()
                },
                1,
            ),
            (topo.hosts[2].ip, 4791),
        )
        .expect("send");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        installed(&topo.tors[0], wire).is_some(),
        "a non-MRR kill changes nothing"
    );
    leader.kill(&notices).expect("kill");
    std::thread::sleep(Duration::from_millis(500));
    for (name, sw) in [
        ("TOR 0", &topo.tors[0]),
        ("TOR 1", &topo.tors[1]),
        ("SPINE", &topo.spines[0]),
    ] {
        assert!(installed(sw, wire).is_none(), "{name} freed the group");
    }
}

/// `count` allreduce rounds (SUM of u32) through group `wire`, checked on every host.
fn rounds(topo: &Topology, socks: &[std::net::UdpSocket], wire: u32, first: u8, count: u8) {
    let all: Vec<usize> = (0..topo.hosts.len()).collect();
    innet_lab::daemons::rounds(topo, socks, &all, wire, (first, count));
}

/// A daemon restarted with `--keep-state` keeps a running group working and still knows its
/// MRR (the kill frees it); a group nobody uses is collected after the idle timeout.
#[test]
fn restart_keeps_groups_and_idle_groups_are_collected() {
    let topo = Topology::new(Shape {
        tors: 2,
        hosts_per_tor: 2,
        sockets: 1,
        spines: 1,
        mode: XdpMode::Native,
        ..Shape::small()
    });
    let socks = topo.sockets();
    let gc = ["--idle-timeout", "3", "--keep-state"];
    let mut tor0 = spawn_daemon_with(&topo.tors[0], "tor", &gc);
    let _tor1 = spawn_daemon_with(&topo.tors[1], "tor", &gc);
    let _spine = spawn_daemon_with(&topo.spines[0], "spine", &gc);
    learn_hosts(&topo);
    let comm = 0x0100_a0b1_u32;
    let wire = comm & 0x00ff_ffff;
    let (notices, causes) = handshake(&topo, &socks, comm);
    assert_eq!(causes, vec![0, 0, 0]);
    rounds(&topo, &socks, wire, 0, 10);

    // Restart TOR 0's daemon; the data plane never stopped, the group keeps working.
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(tor0.0.id() as i32, libc::SIGTERM) };
    assert!(tor0.0.wait().expect("wait").success());
    assert!(
        installed(&topo.tors[0], wire).is_some(),
        "--keep-state keeps the group"
    );
    rounds(&topo, &socks, wire, 10, 10);
    tor0 = spawn_daemon_with(&topo.tors[0], "tor", &gc);
    rounds(&topo, &socks, wire, 20, 10);
    // The restarted daemon still knows the MRR: its kill frees TOR 0 as well.
    leader(&topo, &socks, 0).kill(&notices).expect("kill");
    for sw in [&topo.tors[0], &topo.tors[1], &topo.spines[0]] {
        wait_until("the kill frees the group", Duration::from_secs(5), || {
            installed(sw, wire).is_none()
        });
    }

    // A second group is created and then abandoned: collected everywhere within the timeout.
    let comm2 = 0x0100_a0b2_u32;
    assert_eq!(handshake(&topo, &socks, comm2).1, vec![0, 0, 0]);
    rounds(&topo, &socks, comm2 & 0x00ff_ffff, 0, 3);
    for sw in [&topo.tors[0], &topo.tors[1], &topo.spines[0]] {
        wait_until("idle collection", Duration::from_secs(15), || {
            installed(sw, comm2 & 0x00ff_ffff).is_none()
        });
    }
    drop(tor0);
}

/// 1000 groups created by query/notify and freed by kill leave the switch's capacity where
/// it started.
#[test]
fn thousand_create_kill_cycles_leak_no_capacity() {
    use innet_common::proto::QNH_RESPONSE;
    let topo = Topology::new(Shape {
        tors: 1,
        hosts_per_tor: 2,
        sockets: 1,
        spines: 0,
        mode: XdpMode::Native,
        ..Shape::small()
    });
    let socks = topo.sockets();
    let tor = &topo.tors[0];
    let _daemon = spawn_daemon_with(tor, "tor", &["--idle-timeout", "0", "--capacity", "4"]);
    innet_lab::run(topo.hosts[0].ns.command("ping").args([
        "-c",
        "1",
        "-W",
        "2",
        &topo.hosts[1].ip.to_string(),
    ]));
    let (mrr, nmrr) = (topo.hosts[0].ip, topo.hosts[1].ip);
    let maps = || innet::group_maps::GroupMaps::open(&tor.pins.layout).expect("maps");
    let capacity = maps().capacity();
    // A host port may have 1,000 control frames a second processed (bursts of 1,024): the
    // MRR's port sends a notify and a kill per cycle, so the cycles keep under its rate
    // (a faster loop is a flood, shed by design: hostile_e2e).
    let per_cycle = Duration::from_secs(2) / innet::switch_daemon::port_rate::FRAMES_PER_SECOND;
    let start = std::time::Instant::now();
    for cycle in 0..1000u32 {
        if let Some(wait) = (per_cycle * cycle).checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        let comm = 0x0200_0000 | (cycle << 8) | 0x01;
        let mut c = ControlPayload::default();
        c.set_true_comm_id(comm);
        c.set_global_group_size(2);
        c.set_world_rank(1);
        socks[1]
            .send_to(&control(PacketKind::Query, &c, 1), (mrr, 4791))
            .expect("send");
        // The query came through the TOR: its path, [TOR], is the notify's.
        let mut c = recv_control(&socks[0], PacketKind::Query, comm);
        c.query_notify_hop = QNH_RESPONSE;
        socks[0]
            .send_to(&control(PacketKind::Notify, &c, 0), (nmrr, 4791))
            .expect("send");
        assert_eq!(
            recv_control(&socks[1], PacketKind::Notify, comm).fail_cause,
            0,
            "cycle {cycle}"
        );
        assert!(
            installed(tor, comm & 0x00ff_ffff).is_some(),
            "cycle {cycle}: installed"
        );
        socks[0]
            .send_to(&control(PacketKind::Kill, &c, 0), (nmrr, 4791))
            .expect("send");
        let _ = recv_control(&socks[1], PacketKind::Kill, comm);
        assert!(
            installed(tor, comm & 0x00ff_ffff).is_none(),
            "cycle {cycle}: freed"
        );
    }
    let m = maps();
    assert_eq!(m.capacity(), capacity);
    assert!(m.list().expect("list").is_empty(), "no group left behind");
}

/// With two SPINEs, each remote NMRR's query (and the MRR's climb) reaches the MRR once per
/// SPINE, carrying that SPINE's free capacity; the MRR picks the least loaded one and the
/// group is served there.
#[test]
fn spine_choice_follows_load() {
    use innet::group_maps::{ChildSpec, GroupMaps, GroupSpec, Role};
    let topo = Topology::new(Shape {
        tors: 2,
        hosts_per_tor: 2,
        sockets: 1,
        spines: 2,
        mode: XdpMode::Native,
        ..Shape::small()
    });
    let socks = topo.sockets();
    // Load SPINE 0 with five groups of another job.
    let mut busy = GroupMaps::open(&topo.spines[0].pins.layout).expect("maps");
    for id in 1..=5u32 {
        let children = vec![ChildSpec {
            ip: std::net::Ipv4Addr::new(10, 99, 0, id as u8),
            ifindex: topo.spines[0].downlinks[0].ifindex,
            rank: 0,
        }];
        busy.install(&GroupSpec {
            id: 0x0077_0000 | (id << 8),
            role: Role::Spine,
            parent: None,
            own_rank: 0,
            mrr: None,
            children,
        })
        .expect("install");
    }
    let _daemons = daemons_on(&topo, &[]);
    learn_hosts(&topo);
    let comm = 0x0300_5c01_u32;
    let wire = comm & 0x00ff_ffff;
    // Each remote NMRR's query comes once per SPINE; the MRR's climb too.
    let (nmrrs, heard) = queries_collected(&topo, &socks, comm);
    let mut load = std::collections::HashMap::new();
    for way in heard.ways.values().flatten().chain(&heard.own) {
        if let Some(top) = way.get(1) {
            load.insert(top.ip(), top.free());
        }
    }
    assert_eq!(
        load.get(&u32::from(topo.spines[0].ip)),
        Some(&59),
        "{load:?}"
    );
    assert_eq!(
        load.get(&u32::from(topo.spines[1].ip)),
        Some(&64),
        "{load:?}"
    );
    for far in &nmrrs[1..] {
        assert_eq!(heard.ways[far].len(), 2, "one way up per SPINE");
    }
    assert_eq!(heard.own.len(), 2, "the climb comes back from each SPINE");
    let leader = leader(&topo, &socks, 0);
    let base = leader.decide(&heard, comm, 4, None);
    let notices = leader.address(&base, &heard, &nmrrs, Weigh::ByLoad);
    assert_eq!(
        notices[1].1.spine_ip(),
        u32::from(topo.spines[1].ip),
        "the least loaded SPINE"
    );
    leader.notify(&notices).expect("notify");
    for sock in &socks[1..4] {
        assert_eq!(recv_control(sock, PacketKind::Notify, comm).fail_cause, 0);
    }
    assert!(
        installed(&topo.spines[1], wire).is_some(),
        "served by SPINE 1"
    );
    assert!(
        installed(&topo.spines[0], wire).is_none(),
        "not by the busy SPINE 0"
    );
    rounds(&topo, &socks, wire, 0, 20);
    assert_eq!(
        installed(&topo.spines[1], wire)
            .expect("group")
            .stats
            .completed,
        20
    );
}

/// The library's handshake (`innet_client::handshake`): NMRRs join, the MRR creates the
/// group and it serves allreduces; a group whose type the switches cannot reduce comes back
/// with `fail_cause` and installs nothing.
#[test]
fn client_handshake_creates_groups_and_refuses_unsupported_ones() {
    use innet_client::handshake::{Want, random_group_id};
    use innet_common::proto::{Dtype, Op};
    let topo = Topology::new(Shape {
        tors: 2,
        hosts_per_tor: 2,
        sockets: 1,
        spines: 1,
        mode: XdpMode::Native,
        ..Shape::small()
    });
    let socks = topo.sockets();
    let _daemons = daemons_on(&topo, &[]);
    learn_hosts(&topo);
    let mrr = topo.hosts[0].ip;
    let nmrrs: Vec<std::net::Ipv4Addr> = topo.hosts[1..].iter().map(|h| h.ip).collect();
    let mrr_leader = || leader(&topo, &socks, 0);
    // The MRR kills the group along its notifies' paths; every switch frees it.
    let kill = |notices: &Notices, wire_id: u32| {
        mrr_leader().kill(notices).expect("kill");
        for sw in [&topo.tors[0], &topo.tors[1], &topo.spines[0]] {
            wait_until("the kill frees the group", Duration::from_secs(5), || {
                installed(sw, wire_id).is_none()
            });
        }
    };
    let setup = |comm: u32, want: Want| {
        std::thread::scope(|s| {
            let joins: Vec<_> = (1..4)
                .map(|rank| {
                    let socks = &socks;
                    let topo = &topo;
                    s.spawn(move || leader(topo, socks, rank).join(mrr, comm, 4).expect("join"))
                })
                .collect();
            let created = mrr_leader().create(&nmrrs, comm, want).expect("create");
            let joined: Vec<_> = joins
                .into_iter()
                .map(|j| j.join().expect("joiner"))
                .collect();
            (created, joined)
        })
    };

    let comm = random_group_id();
    let ((created, notices), joined) = setup(
        comm,
        Want {
            op: Op::Sum,
            dtype: Dtype::U32,
            packet_bytes: 16,
        },
    );
    assert!(created.in_network(), "{created:?}");
    assert_eq!(created.spine, topo.spines[0].ip);
    assert!(
        joined
            .iter()
            .all(|j| j.in_network() && j.wire_id == created.wire_id),
        "{joined:?}"
    );
    rounds(&topo, &socks, created.wire_id, 0, 10);
    kill(&notices, created.wire_id);

    // A float64 group is installed like any other: every switch folds floats.
    let comm2 = random_group_id();
    let ((created, notices), joined) = setup(
        comm2,
        Want {
            op: Op::Sum,
            dtype: Dtype::F64,
            packet_bytes: 64,
        },
    );
    assert!(created.in_network(), "{created:?}");
    assert!(
        joined
            .iter()
            .all(|j| j.in_network() && j.wire_id == created.wire_id),
        "{joined:?}"
    );
    for sw in [&topo.tors[0], &topo.tors[1], &topo.spines[0]] {
        wait_until(
            "the float group is installed",
            Duration::from_secs(5),
            || installed(sw, created.wire_id).is_some(),
        );
    }
    kill(&notices, created.wire_id);
}

/// A host learns its TOR from the TOR itself: the probe towards a host under another TOR
/// is answered by the first switch and goes no further; without daemons nobody answers.
#[test]
fn tors_answer_their_hosts_probes() {
    use innet_client::probe::tor_of;
    let topo = Topology::new(Shape {
        tors: 2,
        hosts_per_tor: 2,
        sockets: 1,
        spines: 1,
        mode: XdpMode::Native,
        ..Shape::small()
    });
    let probe = |from: usize, to: usize| {
        let (own, peer) = (topo.hosts[from].ip, topo.hosts[to].ip);
        topo.hosts[from]
            .ns
            .run(|| tor_of(own, peer).expect("probe"))
    };
    {
        let _daemons = daemons_on(&topo, &[]);
        learn_hosts(&topo);
        assert_eq!(probe(0, 2), Some(topo.tors[0].ip), "across the SPINE");
        assert_eq!(probe(3, 0), Some(topo.tors[1].ip));
        assert_eq!(probe(1, 0), Some(topo.tors[0].ip), "under the same TOR");
        let read = |sw: &innet_lab::topology::Switch| {
            stats::read_daemon(&sw.pins.layout).expect("daemon stats")
        };
        // The daemon publishes its counters right after sending the answer.
        wait_until(
            "the TORs count their answers",
            Duration::from_secs(2),
            || {
                (
                    read(&topo.tors[0]).probes_answered,
                    read(&topo.tors[1]).probes_answered,
                ) == (2, 1)
            },
        );
        let (t0, t1, spine) = (
            read(&topo.tors[0]),
            read(&topo.tors[1]),
            read(&topo.spines[0]),
        );
        assert_eq!(
            spine.control_handled, 0,
            "a probe stops at the first switch"
        );
        assert_eq!(t0.groups_installed + t1.groups_installed, 0);
    }
    assert_eq!(probe(0, 2), None, "no daemon, no answer");
}

/// `innet daemon --config FILE` with `bridge = "br0"`, as the systemd unit starts it: the
/// daemon runs on every port of the TOR's bridge and on no other, and SIGTERM detaches
/// them all.
#[test]
fn daemon_from_a_config_file_runs_on_every_port_of_the_bridge() {
    let topo = Topology::plain(Shape {
        tors: 1,
        hosts_per_tor: 2,
        sockets: 1,
        spines: 0,
        mode: XdpMode::Native,
        ..Shape::small()
    });
    let tor = &topo.tors[0];
    // A port of the TOR outside the bridge.
    let lone = innet_lab::NetNs::new("lone");
    innet_lab::veth(&tor.ns, "lone0", "10.78.0.1", &lone, "eth0", "10.78.0.2");
    let config = std::env::temp_dir().join(format!("innet-{}.toml", innet_lab::unique_id()));
    std::fs::write(
        &config,
        format!(
            "role = \"tor\"\nip = \"{}\"\nbridge = \"br0\"\npin_path = \"{}\"\n",
            tor.ip,
            tor.pins.path().display()
        ),
    )
    .expect("write the config");

    let mut cmd = tor
        .ns
        .command(innet_lab::innet_bin().to_str().expect("utf-8"));
    // INNET_PIN_PATH would win over the file's pin_path.
    cmd.args(["daemon", "--config"])
        .arg(&config)
        .env_remove("INNET_PIN_PATH")
        .env("RUST_LOG", "info");
    let mut daemon = innet_lab::daemons::spawn_logged(cmd);
    wait_until(
        "the daemon takes control packets",
        Duration::from_secs(30),
        || {
            if let Some(status) = daemon.0.try_wait().expect("try_wait") {
                let log = std::fs::read_to_string(&daemon.1).unwrap_or_default();
                panic!("the daemon exited ({status}):\n{log}");
            }
            innet_lab::daemons::control_enabled(tor)
        },
    );
    let _ = std::fs::remove_file(&config);

    let layout = &tor.pins.layout;
    let mut attached: Vec<String> = tor
        .ns
        .run(|| innet::loader::status(layout))
        .expect("status")
        .into_iter()
        .map(|p| {
            assert!(p.ifindex.is_some(), "{} is attached and present", p.ifname);
            p.ifname
        })
        .collect();
    attached.sort();
    let mut bridge_ports = tor.ports.clone();
    bridge_ports.sort();
    assert_eq!(attached, bridge_ports, "every port of br0, not lone0");

    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(daemon.0.id() as i32, libc::SIGTERM) };
    let status = daemon.0.wait().expect("wait");
    assert!(status.success(), "daemon exit: {status}");
    assert!(!tor.pins.path().exists(), "the daemon unpinned everything");
}
