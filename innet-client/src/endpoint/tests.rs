//! The endpoint's checks on what it receives, and what it answers, without an INC socket:
//! `classify` and the regroup notices are fed crafted datagrams from chosen source
//! addresses, as a host outside the job (or a leader, for the genuine case) would send
//! them, and its answers are caught by a recording wire.

use std::{
    cell::RefCell,
    io,
    net::{Ipv4Addr, SocketAddr},
    sync::{Arc, atomic::Ordering::Relaxed},
    time::Instant,
};

use innet_common::{
    codec::Addressing,
    proto::{BTH_FLAG_RESULT, Dtype, HOST_COMM_ID, Op, ROCEV2_UDP_PORT},
};

use super::{
    Incoming, Notice, Peers, STEP_BYE, STEP_FINAL, STEP_NACK, STEP_REGROUP, Shared, classify,
};
use crate::{
    frames::{self, DataId},
    handshake::Wire,
};

/// What the leader sent, by destination: its answers.
#[derive(Default)]
struct Recording(RefCell<Vec<(Ipv4Addr, Vec<u8>)>>);

impl Recording {
    fn sent_to(&self) -> Vec<Ipv4Addr> {
        self.0.borrow().iter().map(|(to, _)| *to).collect()
    }
}

impl Wire for Recording {
    fn send(&self, to: Ipv4Addr, payload: &[u8]) -> io::Result<()> {
        self.0.borrow_mut().push((to, payload.to_vec()));
        Ok(())
    }

    fn receive_until(
        &self,
        _deadline: Instant,
        _each: &mut dyn FnMut(&[u8], SocketAddr) -> bool,
    ) -> io::Result<bool> {
        Ok(false)
    }
}

const JOB: u64 = 44;
/// The group in use (its wire id).
const WIRE_ID: u32 = 0x00ab_cdef;

fn leader_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 66, 0, 1 + i as u8)
}

/// A host outside the job.
fn outsider() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::new(127, 66, 9, 9), ROCEV2_UDP_PORT))
}

fn at(ip: Ipv4Addr) -> SocketAddr {
    SocketAddr::from((ip, ROCEV2_UDP_PORT))
}

/// Leader 0 of four, its wire (which records what it sends) and its shared state with
/// group [`WIRE_ID`] in use at generation 0.
fn leader0() -> (Recording, Peers, Shared) {
    let sock = Recording::default();
    let peers = Peers {
        me: 0,
        ip: leader_ip(0),
        pkey: frames::job_pkey(JOB),
        ips: Arc::new((0..4).map(leader_ip).collect()),
    };
    let shared = Shared::default();
    shared.wire_id.store(WIRE_ID, Relaxed);
    (sock, peers, shared)
}

/// A host packet as leader `from` sends it to leader 0.
fn host(from: u32, seq: u32, step: u8, psn: u32, body: &[u8]) -> Vec<u8> {
    let addr = Addressing {
        pkey: frames::job_pkey(JOB),
        ..frames::addressing(leader_ip(from as usize), leader_ip(0), psn, seq)
    };
    let id = DataId {
        src_rank: from,
        op: Op::Sum,
        dtype: Dtype::U8,
        req_id: step,
        pkt_index: psn,
    };
    frames::data(&addr, HOST_COMM_ID, id, body)
}

/// A data packet of the group in use, round `round`, as leader `from` sends it (a
/// contribution; with `result`, marked as a switch's result).
fn group_data(from: u32, round: u8, result: bool) -> Vec<u8> {
    let addr = frames::addressing(leader_ip(from as usize), leader_ip(0), u32::from(round), 0);
    let id = DataId {
        src_rank: from,
        op: Op::Sum,
        dtype: Dtype::I32,
        req_id: round,
        pkt_index: u32::from(round),
    };
    let mut p = frames::data(&addr, WIRE_ID, id, &[0, 0, 0, 7]);
    if result {
        p[1] |= BTH_FLAG_RESULT;
    }
    p
}

fn regroup(from: u32, generation: u32, seq: u32) -> Vec<u8> {
    host(from, seq, STEP_REGROUP, 0, &generation.to_le_bytes())
}

#[test]
fn a_regroup_notice_forged_from_outside_the_job_is_refused() {
    let (sock, peers, shared) = leader0();
    let forged = regroup(1, 1, 3);
    assert!(classify(&sock, &peers, &shared, &forged, outsider()).is_none());
    assert_eq!(*shared.notice.lock().unwrap(), None);
    assert_eq!(shared.refused.snapshot().host_frame_spoofed, 1);
    // The same notice from leader 1's address is taken.
    let e = classify(&sock, &peers, &shared, &forged, at(leader_ip(1)));
    assert!(matches!(e, Some(Incoming::Regroup)));
    assert_eq!(
        *shared.notice.lock().unwrap(),
        Some(Notice {
            generation: 1,
            seq: 3
        })
    );
}

#[test]
fn a_host_frame_claiming_another_leaders_rank_is_refused() {
    let (sock, peers, shared) = leader0();
    // Leader 2's address claiming to be leader 1 (a goodbye), and a rank beyond the job.
    let bye = host(1, 3, STEP_BYE, 0, &[0]);
    assert!(classify(&sock, &peers, &shared, &bye, at(leader_ip(2))).is_none());
    let beyond = host(9, 3, STEP_BYE, 0, &[0]);
    assert!(classify(&sock, &peers, &shared, &beyond, at(leader_ip(2))).is_none());
    assert_eq!(shared.refused.snapshot().host_frame_spoofed, 2);
    let e = classify(&sock, &peers, &shared, &bye, at(leader_ip(1)));
    assert!(matches!(e, Some(Incoming::Bye(1))));
}

#[test]
fn a_final_result_or_nack_forged_from_outside_the_job_is_refused() {
    let (sock, peers, shared) = leader0();
    for step in [STEP_FINAL, STEP_NACK, 0] {
        let f = host(2, 3, step, 0, &[1, 2, 3, 4]);
        assert!(classify(&sock, &peers, &shared, &f, outsider()).is_none());
        let e = classify(&sock, &peers, &shared, &f, at(leader_ip(2)));
        assert!(matches!(e, Some(Incoming::Host(_))));
    }
    assert_eq!(shared.refused.snapshot().host_frame_spoofed, 3);
}

#[test]
fn a_stray_contribution_forged_from_outside_the_job_is_refused() {
    let (sock, peers, shared) = leader0();
    let stray = group_data(1, 5, false);
    assert!(classify(&sock, &peers, &shared, &stray, outsider()).is_none());
    assert_eq!(shared.refused.snapshot().stray_spoofed, 1);
    let e = classify(&sock, &peers, &shared, &stray, at(leader_ip(3)));
    assert!(matches!(e, Some(Incoming::Stray { wire_id: WIRE_ID })));
}

#[test]
fn a_result_forged_from_outside_the_tree_is_refused() {
    let (sock, peers, shared) = leader0();
    let result = group_data(1, 5, true);
    assert!(classify(&sock, &peers, &shared, &result, outsider()).is_none());
    assert_eq!(shared.refused.snapshot().result_spoofed, 1);
    // Switches deliver results from the addresses of the job's leaders (the saved packet
    // addressed to the member, or its own turned around).
    let e = classify(&sock, &peers, &shared, &result, at(leader_ip(1)));
    assert!(matches!(e, Some(Incoming::Result(_))));
    // Under a DPU, results come from the DPU only.
    let dpu = Ipv4Addr::new(127, 66, 1, 1);
    shared.set_parent(Some(dpu));
    assert!(classify(&sock, &peers, &shared, &result, at(leader_ip(1))).is_none());
    assert!(matches!(
        classify(&sock, &peers, &shared, &result, at(dpu)),
        Some(Incoming::Result(_))
    ));
    assert_eq!(shared.refused.snapshot().result_spoofed, 2);
}

#[test]
fn results_of_another_group_are_not_kept() {
    let (sock, peers, shared) = leader0();
    let other = group_data(1, 5, true);
    shared.wire_id.store(WIRE_ID ^ 1, Relaxed);
    assert!(classify(&sock, &peers, &shared, &other, at(leader_ip(1))).is_none());
    // Nor with no group in use.
    shared.wire_id.store(0, Relaxed);
    assert!(classify(&sock, &peers, &shared, &other, at(leader_ip(1))).is_none());
    assert_eq!(shared.refused.snapshot().result_of_other_group, 2);
}

#[test]
fn a_regroup_notice_of_generation_u32_max_neither_panics_nor_wedges_the_job() {
    let (sock, peers, shared) = leader0();
    let forged = regroup(1, u32::MAX, 3);
    assert!(classify(&sock, &peers, &shared, &forged, at(leader_ip(1))).is_some());
    assert_eq!(*shared.notice.lock().unwrap(), None);
    assert_eq!(shared.refused.snapshot().regroup_out_of_range, 1);
    // The job's own next generation still goes through.
    classify(&sock, &peers, &shared, &regroup(1, 1, 3), at(leader_ip(1)));
    assert_eq!(shared.heard.load(Relaxed), 1);
}

#[test]
fn regroup_generations_beyond_a_small_leap_are_refused() {
    let (sock, peers, shared) = leader0();
    shared.generation.store(7, Relaxed);
    let leap = super::MAX_GENERATION_LEAP;
    classify(
        &sock,
        &peers,
        &shared,
        &regroup(2, 7 + leap + 1, 3),
        at(leader_ip(2)),
    );
    assert_eq!(shared.heard.load(Relaxed), 0);
    // Not the generation in use, nor an older one.
    classify(&sock, &peers, &shared, &regroup(2, 7, 3), at(leader_ip(2)));
    classify(&sock, &peers, &shared, &regroup(2, 6, 3), at(leader_ip(2)));
    assert_eq!(shared.heard.load(Relaxed), 0);
    classify(
        &sock,
        &peers,
        &shared,
        &regroup(2, 7 + leap, 3),
        at(leader_ip(2)),
    );
    assert_eq!(shared.heard.load(Relaxed), 7 + leap);
    assert_eq!(shared.refused.snapshot().regroup_out_of_range, 1);
}

#[test]
fn a_regroup_notice_for_a_collective_far_away_is_refused() {
    let (sock, peers, shared) = leader0();
    shared.note_seq(1000);
    // Far ahead: it would keep every collective until then on the hosts.
    classify(
        &sock,
        &peers,
        &shared,
        &regroup(1, 1, 1000 + 5000),
        at(leader_ip(1)),
    );
    // Far behind.
    classify(
        &sock,
        &peers,
        &shared,
        &regroup(1, 1, (1000u32.wrapping_sub(5000)) & 0xff_ffff),
        at(leader_ip(1)),
    );
    assert_eq!(*shared.notice.lock().unwrap(), None);
    assert_eq!(shared.refused.snapshot().regroup_out_of_range, 2);
    classify(
        &sock,
        &peers,
        &shared,
        &regroup(1, 1, 1001),
        at(leader_ip(1)),
    );
    assert_eq!(shared.heard.load(Relaxed), 1);
}

#[test]
fn announcing_a_loss_at_the_last_generation_does_not_overflow() {
    let (sock, peers, shared) = leader0();
    shared.generation.store(u32::MAX, Relaxed);
    shared.announce(&sock, &peers, 5);
    assert_eq!(*shared.notice.lock().unwrap(), None);
    shared.generation.store(4, Relaxed);
    shared.announce(&sock, &peers, 5);
    assert_eq!(shared.heard.load(Relaxed), 5);
}

#[test]
fn a_flood_during_a_set_up_keeps_at_most_the_backlog_cap() {
    let (_sock, _peers, shared) = leader0();
    let mut deferred = std::collections::VecDeque::new();
    for i in 0..crate::inbox::BACKLOG_MAX + 3 {
        super::defer(&mut deferred, &shared.refused, Incoming::Bye(i));
    }
    assert_eq!(deferred.len(), crate::inbox::BACKLOG_MAX);
    assert_eq!(shared.refused.snapshot().aside_full, 3);
}

#[test]
fn a_final_result_from_a_leader_not_asked_is_dropped() {
    use super::host_exchange::take_final;
    let (_sock, _peers, shared) = leader0();
    let mut pending = crate::assembly::Assembly::default();
    let file = |p: &mut crate::assembly::Assembly, from: u32, body: &[u8]| {
        let f = frames::parse(&host(from, 3, STEP_FINAL, 0, body)).unwrap();
        p.insert_packet(f, 1).unwrap();
    };
    // Leader 3 slips a final in while leader 0 waits for leader 1 and sent to leader 2.
    file(&mut pending, 3, &[6, 6, 6, 6]);
    let asked = |r: usize| r == 1 || r == 2;
    assert_eq!(
        take_final(&mut pending, (3, 4, 1400), asked, &shared.refused),
        None
    );
    assert_eq!(shared.refused.snapshot().final_from_unasked_rank, 1);
    assert_eq!(pending.held(), 0, "dropped, not kept");
    file(&mut pending, 2, &[1, 2, 3, 4]);
    let got = take_final(&mut pending, (3, 4, 1400), asked, &shared.refused);
    assert_eq!(got.as_deref(), Some(&[1u8, 2, 3, 4][..]));
}

#[test]
fn forged_nacks_are_answered_at_most_once_per_gap() {
    use std::time::{Duration, Instant};

    use super::host_exchange::Pacer;
    let mut pacer = Pacer::new(Duration::from_millis(10));
    let t = Instant::now();
    // A flood of NACKs for one step: the first is answered, the rest wait out the gap.
    let answered = (0..1000)
        .filter(|i| pacer.allow((1, 4u8), t + Duration::from_micros(*i)))
        .count();
    assert_eq!(answered, 1);
    // Another peer or step is paced on its own; after the gap, the peer is answered again.
    assert!(pacer.allow((2, 4), t));
    assert!(pacer.allow((1, 5), t));
    assert!(pacer.allow((1, 4), t + Duration::from_millis(10)));
    // Many keys: those older than the gap are forgotten, the table stays small.
    let later = t + Duration::from_secs(1);
    for k in 0..5000u16 {
        let at = later + Duration::from_millis(u64::from(k) * 20);
        assert!(pacer.allow((usize::from(k), 0), at));
    }
}

#[test]
fn a_late_peers_requests_bring_the_final_result_once_per_gap() {
    let (sock, peers, shared) = leader0();
    shared
        .finals
        .lock()
        .unwrap()
        .push_back((3, Op::Sum, Dtype::U8, Arc::new(vec![1; 4])));
    // Leader 2, late, sends three steps' first packets (or a host forges them).
    for step in 0..3 {
        let f = frames::parse(&host(2, 3, step, 0, &[0; 4])).unwrap();
        assert!(shared.answer_from_finals(&sock, &peers, &f));
    }
    assert_eq!(shared.refused.snapshot().resend_rate_limited, 2);
}

#[test]
fn a_regroup_notice_is_passed_on_to_every_other_leader_once() {
    let (wire, peers, shared) = leader0();
    let notice = regroup(1, 1, 3);
    assert!(matches!(
        classify(&wire, &peers, &shared, &notice, at(leader_ip(1))),
        Some(Incoming::Regroup)
    ));
    assert_eq!(wire.sent_to(), [leader_ip(1), leader_ip(2), leader_ip(3)]);
    // The same notice again (a repeat, or another leader passing it on): nothing more.
    classify(&wire, &peers, &shared, &notice, at(leader_ip(2)));
    assert_eq!(wire.0.borrow().len(), 3);
}

#[test]
fn a_late_peers_request_for_a_finished_collective_is_answered_at_a_pace() {
    let (wire, peers, shared) = leader0();
    let result = Arc::new(vec![5u8; 16]);
    shared
        .finals
        .lock()
        .unwrap()
        .push_back((9, Op::Sum, Dtype::U8, result));
    // Leader 2 still asks for collective 9 (its first packet of step 0).
    let ask = host(2, 9, 0, 0, &[1; 16]);
    assert!(classify(&wire, &peers, &shared, &ask, at(leader_ip(2))).is_none());
    assert_eq!(
        wire.sent_to(),
        [leader_ip(2)],
        "the final result, to the asker only"
    );
    // Asked again at once (a repeat, or forged requests at their rate): not sent again.
    assert!(classify(&wire, &peers, &shared, &ask, at(leader_ip(2))).is_none());
    assert_eq!(wire.0.borrow().len(), 1);
    assert_eq!(shared.refused.snapshot().resend_rate_limited, 1);
    // A collective this leader has not finished is the collective's, not answered.
    let running = host(2, 10, 0, 0, &[1; 16]);
    assert!(matches!(
        classify(&wire, &peers, &shared, &running, at(leader_ip(2))),
        Some(Incoming::Host(_))
    ));
    assert_eq!(wire.0.borrow().len(), 1);
}

#[test]
fn a_repeated_query_gets_its_notify_again_and_nobody_elses() {
    use innet_common::{proto::PacketKind, wire::ControlPayload};
    let (wire, peers, shared) = leader0();
    let mut notify = ControlPayload::default();
    notify.set_true_comm_id(77);
    shared.notify.lock().unwrap().push((leader_ip(1), notify));
    let query = |comm: u32, from: usize| {
        let mut q = ControlPayload::default();
        q.set_true_comm_id(comm);
        frames::control(
            leader_ip(from),
            leader_ip(0),
            PacketKind::Query,
            from as u32,
            &q,
        )
    };
    // NMRR 1 repeats its query (its notify was lost): the notify goes again, each time.
    for _ in 0..2 {
        assert!(classify(&wire, &peers, &shared, &query(77, 1), at(leader_ip(1))).is_none());
    }
    assert_eq!(wire.sent_to(), [leader_ip(1), leader_ip(1)]);
    // Another group's query, or a host this MRR notified nothing: no answer.
    classify(&wire, &peers, &shared, &query(78, 1), at(leader_ip(1)));
    classify(&wire, &peers, &shared, &query(77, 3), at(leader_ip(3)));
    classify(&wire, &peers, &shared, &query(77, 1), outsider());
    assert_eq!(wire.0.borrow().len(), 2);
}
