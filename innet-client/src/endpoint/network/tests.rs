//! A leader's network collective without a fabric: its packets leave through a scripted
//! switch (a [`Wire`]) that answers each contribution with the round's result, as the
//! switches do, or loses, repeats, reorders or forges results; the results come back on a
//! loopback socket from the addresses a fabric would use (another leader's, a stranger's).

use std::{
    collections::HashMap,
    io,
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use innet_common::proto::{BTH_FLAG_RESULT, Dtype, INC_DEST_QP, Op};

use super::{Carrier, NetAbort, NetPlan};
use crate::{
    endpoint::{Endpoint, answer::Peers},
    frames::{self, DataId},
    stages::CallStamps,
    wire::Wire,
};

/// The group in use (its wire id), and another group's.
const WIRE_ID: u32 = 0x00ab_cdef;
const OTHER_GROUP: u32 = 0x0012_3456;
/// int32 elements per packet, and the packet's payload bytes.
const PER_PACKET: usize = 16;
const PACKET_BYTES: usize = 4 * PER_PACKET;

/// What the scripted switch does to the results, besides answering every contribution.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// The round's first contribution gets no result (lost on the way, either way).
    LoseFirst(u32),
    /// Every result goes out twice.
    Repeat,
    /// The result of each even round waits for the next round's (pairs swapped).
    SwapPairs,
    /// Before each result: the same result with a wrong payload from a host outside the
    /// tree, and one of another group from the peer leader's address.
    Forge,
    /// No result at all.
    Silent,
}

/// A switch below two leaders: leader 1 contributes what leader 0 does, so each round's
/// result is twice leader 0's contribution.
struct ScriptedSwitch {
    faults: Vec<Fault>,
    /// Leader 0's socket, where results go.
    leader: SocketAddr,
    /// Results leave from leader 1's address (a switch's results come from a leader's).
    from_peer: UdpSocket,
    /// A host outside the job.
    stranger: UdpSocket,
    /// Contributions received per round.
    sends: Mutex<HashMap<u32, u32>>,
    /// Where the leader addressed its packets.
    destinations: Mutex<Vec<Ipv4Addr>>,
    held: Mutex<Option<Vec<u8>>>,
}

impl ScriptedSwitch {
    fn new(net: u8, leader: SocketAddr, faults: &[Fault]) -> Self {
        let bind = |host| UdpSocket::bind((Ipv4Addr::new(127, 77, net, host), 0)).expect("bind");
        Self {
            faults: faults.to_vec(),
            leader,
            from_peer: bind(2),
            stranger: bind(9),
            sends: Mutex::default(),
            destinations: Mutex::default(),
            held: Mutex::default(),
        }
    }

    fn sends_of(&self, round: u32) -> u32 {
        self.sends.lock().unwrap().get(&round).copied().unwrap_or(0)
    }

    fn result(&self, round: u32, group: u32, body: &[u8]) -> Vec<u8> {
        let addr = frames::addressing(
            leader_ip(self.net(), 1),
            leader_ip(self.net(), 0),
            round,
            INC_DEST_QP,
        );
        let id = DataId {
            src_rank: 1,
            op: Op::Sum,
            dtype: Dtype::I32,
            req_id: round as u8,
            pkt_index: round,
        };
        let mut p = frames::data(&addr, group, id, body);
        p[1] |= BTH_FLAG_RESULT;
        p
    }

    fn net(&self) -> u8 {
        match self.leader {
            SocketAddr::V4(a) => a.ip().octets()[2],
            SocketAddr::V6(_) => unreachable!("IPv4 only"),
        }
    }

    fn answer(&self, contribution: &[u8]) {
        let f = frames::parse(contribution).expect("the leader sends INC frames");
        let round = f.bth.psn();
        let nth = {
            let mut sends = self.sends.lock().unwrap();
            let n = sends.entry(round).or_default();
            *n += 1;
            *n
        };
        let has = |f| self.faults.contains(&f);
        if has(Fault::Silent) || (nth == 1 && has(Fault::LoseFirst(round))) {
            return;
        }
        let doubled: Vec<u8> = f
            .body()
            .chunks_exact(4)
            .flat_map(|c| (2 * i32::from_le_bytes(c.try_into().unwrap())).to_le_bytes())
            .collect();
        let result = self.result(round, WIRE_ID, &doubled);
        if has(Fault::Forge) {
            let wrong = vec![0x5a; doubled.len()];
            self.stranger
                .send_to(&self.result(round, WIRE_ID, &wrong), self.leader)
                .unwrap();
            self.from_peer
                .send_to(&self.result(round, OTHER_GROUP, &wrong), self.leader)
                .unwrap();
        }
        let mut out = vec![result];
        if has(Fault::SwapPairs) {
            let mut held = self.held.lock().unwrap();
            if round.is_multiple_of(2) && held.is_none() {
                *held = Some(out.pop().unwrap());
            } else if let Some(earlier) = held.take() {
                out.push(earlier);
            }
        }
        for p in &out {
            for _ in 0..if has(Fault::Repeat) { 2 } else { 1 } {
                self.from_peer.send_to(p, self.leader).unwrap();
            }
        }
    }
}

impl Wire for ScriptedSwitch {
    fn send(&self, to: Ipv4Addr, payload: &[u8]) -> io::Result<()> {
        self.destinations.lock().unwrap().push(to);
        self.answer(payload);
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

/// Where the plan addresses the packets (what the switch sees as the destination).
const FIRST_HOP: Ipv4Addr = Ipv4Addr::new(127, 77, 0, 42);

fn leader_ip(net: u8, k: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 77, net, 1 + k)
}

/// Leader 0 of two on a loopback socket of its own (`net` keeps tests apart), sending
/// through a scripted switch.
fn leader(net: u8, faults: &[Fault]) -> (Endpoint, Arc<ScriptedSwitch>) {
    let sock = UdpSocket::bind((leader_ip(net, 0), 0)).expect("bind");
    let switch = Arc::new(ScriptedSwitch::new(net, sock.local_addr().unwrap(), faults));
    let peers = Peers {
        me: 0,
        ip: leader_ip(net, 0),
        pkey: frames::job_pkey(7),
        ips: Arc::new(vec![leader_ip(net, 0), leader_ip(net, 1)]),
    };
    let wire: Arc<dyn Wire + Send + Sync> = switch.clone();
    let ep = Endpoint::on(
        Arc::new(sock),
        wire,
        peers,
        [WIRE_ID, 0],
        (Duration::ZERO, false),
    )
    .expect("endpoint");
    (ep, switch)
}

fn plan(retry: Duration, max_tries: u32, patience: Duration) -> NetPlan<'static> {
    NetPlan {
        wire_id: WIRE_ID,
        carrier: Carrier::Switch { dst: FIRST_HOP },
        packet_bytes: PACKET_BYTES,
        in_flight: 8,
        pipe: 8,
        retry,
        max_tries,
        patience,
        drop_every: 0,
        native_result: false,
    }
}

/// A contribution of `packets` packets (wire order: little-endian int32).
fn contribution(packets: usize) -> Vec<u8> {
    (0..(packets * PER_PACKET) as i32)
        .flat_map(|v| (v * 3 - 1000).to_le_bytes())
        .collect()
}

fn doubled(c: &[u8]) -> Vec<u8> {
    c.chunks_exact(4)
        .flat_map(|x| (2 * i32::from_le_bytes(x.try_into().unwrap())).to_le_bytes())
        .collect()
}

/// Runs one allreduce of `packets` packets; its outcome and the buffer after it.
fn run(ep: &mut Endpoint, plan: &NetPlan<'_>, packets: usize) -> (Result<u32, NetAbort>, Vec<u8>) {
    let mut buf = contribution(packets);
    let r = ep.network_allreduce(
        0,
        (Op::Sum, Dtype::I32),
        plan,
        (&mut buf, None),
        &mut CallStamps::default(),
    );
    (r, buf)
}

/// Timers long enough that nothing here is resent by one.
fn patient() -> NetPlan<'static> {
    plan(Duration::from_secs(5), 4, Duration::from_secs(10))
}

#[test]
fn results_in_order_complete_the_collective_without_a_resend() {
    let (mut ep, switch) = leader(1, &[]);
    let (r, buf) = run(&mut ep, &patient(), 64);
    assert_eq!(r, Ok(0));
    assert_eq!(buf, doubled(&contribution(64)));
    assert!((0..64).all(|round| switch.sends_of(round) == 1));
    let destinations = switch.destinations.lock().unwrap();
    assert_eq!(destinations.len(), 64);
    assert!(
        destinations.iter().all(|d| *d == FIRST_HOP),
        "{destinations:?}"
    );
}

#[test]
fn a_lost_result_is_sent_again_on_evidence_not_on_its_timer() {
    let (mut ep, switch) = leader(2, &[Fault::LoseFirst(3)]);
    let start = Instant::now();
    let (r, buf) = run(&mut ep, &patient(), 32);
    assert_eq!(r, Ok(1), "one resend, on three later results");
    assert_eq!(buf, doubled(&contribution(32)));
    assert_eq!(switch.sends_of(3), 2);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "not the 5 s timer"
    );
}

#[test]
fn repeated_and_reordered_results_change_nothing() {
    let (mut ep, switch) = leader(3, &[Fault::Repeat, Fault::SwapPairs]);
    let (r, buf) = run(&mut ep, &patient(), 64);
    assert_eq!(r, Ok(0));
    assert_eq!(buf, doubled(&contribution(64)));
    assert!((0..64).all(|round| switch.sends_of(round) == 1));
}

#[test]
fn forged_results_are_refused_and_the_true_ones_taken() {
    let (mut ep, _switch) = leader(4, &[Fault::Forge]);
    let (r, buf) = run(&mut ep, &patient(), 16);
    assert_eq!(r, Ok(0));
    assert_eq!(buf, doubled(&contribution(16)), "no forged payload taken");
    let refused = ep.refusals();
    assert_eq!(refused.result_spoofed, 16, "{refused:?}");
    assert_eq!(refused.result_of_other_group, 16, "{refused:?}");
}

#[test]
fn a_network_that_answers_nothing_gives_up_after_its_tries_and_patience() {
    let (mut ep, switch) = leader(5, &[Fault::Silent]);
    let (retry, tries, patience) = (Duration::from_millis(1), 3, Duration::from_millis(30));
    let start = Instant::now();
    let (r, buf) = run(&mut ep, &plan(retry, tries, patience), 4);
    // Every try sent, and the patience gone since the first (resends go on until then).
    assert!(
        matches!(r, Err(NetAbort::Timeout { tries: t }) if t >= tries),
        "{r:?}"
    );
    assert!(start.elapsed() >= patience);
    assert_eq!(
        buf,
        contribution(4),
        "the contribution is intact for the hosts"
    );
    assert!(switch.sends_of(0) >= tries);
}
