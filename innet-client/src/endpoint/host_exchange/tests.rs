//! The host exchange's requests to send again, against a peer on a loopback address of its
//! own that sends a step at the pace of a slow link, and a wire that records (with the
//! time) what the leader sends.

use std::{
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use innet_common::{
    codec::Addressing,
    proto::{Dtype, HOST_COMM_ID, Op},
};

use super::super::{Endpoint, HOST_PAYLOAD_BYTES, Peers, STEP_NACK};
use crate::{
    frames::{self, DataId},
    hostalg::{Exchange as _, Received},
    wire::Wire,
};

const JOB: u64 = 47;
const SEQ: u32 = 5;
/// The first wait before the leader asks again.
const RETRY: Duration = Duration::from_millis(20);
/// The peer's pace: a packet each 2 ms, a step of 40 packets taking four retries.
const PACE: Duration = Duration::from_millis(2);
const PACKETS: usize = 40;

/// What the leader sent, when.
#[derive(Default)]
struct Recording(Mutex<Vec<(Instant, Vec<u8>)>>);

impl Recording {
    /// When the leader asked for a step again.
    fn nacks(&self) -> Vec<Instant> {
        let sent = self.0.lock().unwrap();
        sent.iter()
            .filter(|(_, p)| frames::parse(p).is_some_and(|f| f.inc.req_id == STEP_NACK))
            .map(|(at, _)| *at)
            .collect()
    }
}

impl Wire for Recording {
    fn send(&self, _to: Ipv4Addr, payload: &[u8]) -> std::io::Result<()> {
        self.0
            .lock()
            .unwrap()
            .push((Instant::now(), payload.to_vec()));
        Ok(())
    }

    fn receive_until(
        &self,
        _deadline: Instant,
        _each: &mut dyn FnMut(&[u8], SocketAddr) -> bool,
    ) -> std::io::Result<bool> {
        Ok(false)
    }
}

fn ip(net: u8, k: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 78, net, 1 + k)
}

/// Leader 0 of two on a loopback socket of its own (`net` keeps tests apart).
fn leader(net: u8) -> (Endpoint, SocketAddr, Arc<Recording>) {
    let sock = UdpSocket::bind((ip(net, 0), 0)).expect("bind");
    let at = sock.local_addr().expect("address");
    let peers = Peers {
        me: 0,
        ip: ip(net, 0),
        pkey: frames::job_pkey(JOB),
        ips: Arc::new(vec![ip(net, 0), ip(net, 1)]),
    };
    let wire = Arc::new(Recording::default());
    let ep = Endpoint::on(
        Arc::new(sock),
        wire.clone(),
        peers,
        [0x00ab_cdef, 0],
        (Duration::ZERO, false),
    )
    .expect("endpoint");
    (ep, at, wire)
}

/// Packet `i` of leader 1's step 0 of collective [`SEQ`], as it sends it to leader 0.
fn packet(net: u8, i: usize, body: &[u8]) -> Vec<u8> {
    let addr = Addressing {
        pkey: frames::job_pkey(JOB),
        ..frames::addressing(ip(net, 1), ip(net, 0), i as u32, SEQ)
    };
    let id = DataId {
        src_rank: 1,
        op: Op::Sum,
        dtype: Dtype::U8,
        req_id: 0,
        pkt_index: i as u32,
    };
    frames::data(&addr, HOST_COMM_ID, id, body)
}

/// Leader 1 sends packets `which` of `message` to `to` at [`PACE`], then waits `pause` and
/// sends the rest; returns when it sent the last of `which`.
fn paced_peer(
    net: u8,
    to: SocketAddr,
    message: Vec<u8>,
    which: std::ops::Range<usize>,
    pause: Duration,
) -> thread::JoinHandle<Instant> {
    thread::spawn(move || {
        let sock = UdpSocket::bind((ip(net, 1), 0)).expect("bind");
        let per = frames::packet_bytes(Op::Sum, Dtype::U8, HOST_PAYLOAD_BYTES);
        let chunks: Vec<&[u8]> = message.chunks(per).collect();
        let mut last = Instant::now();
        for i in which.clone() {
            sock.send_to(&packet(net, i, chunks[i]), to).expect("send");
            last = Instant::now();
            thread::sleep(PACE);
        }
        thread::sleep(pause);
        for i in (0..chunks.len()).filter(|i| !which.contains(i)) {
            sock.send_to(&packet(net, i, chunks[i]), to).expect("send");
        }
        last
    })
}

fn message() -> Vec<u8> {
    let per = frames::packet_bytes(Op::Sum, Dtype::U8, HOST_PAYLOAD_BYTES);
    (0..per * PACKETS).map(|i| (i * 7) as u8).collect()
}

fn receive(ep: &mut Endpoint, len: usize) -> Vec<u8> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut x = ep.exchange(SEQ, (Op::Sum, Dtype::U8), len, deadline, RETRY);
    match x.recv(1, 0, len).expect("the step") {
        Received::Data(d) => d,
        Received::Final(_) => panic!("a final result, not the step"),
    }
}

#[test]
fn a_step_slower_than_the_retry_is_not_asked_for_while_it_arrives() {
    let (mut ep, at, wire) = leader(1);
    let message = message();
    let peer = paced_peer(1, at, message.clone(), 0..PACKETS, Duration::ZERO);
    assert_eq!(receive(&mut ep, message.len()), message);
    peer.join().expect("peer");
    // 40 packets at 2 ms: 80 ms, four times the retry. Timed from the step's start, the
    // leader asked at 20 and 60 ms for packets still on their way.
    assert_eq!(wire.nacks(), vec![], "no request while packets kept coming");
}

#[test]
fn a_step_whose_tail_is_lost_is_asked_for_once_its_packets_stop() {
    let (mut ep, at, wire) = leader(2);
    let message = message();
    // The last 10 packets come only 300 ms after the first 30 (as if lost, then resent).
    let peer = paced_peer(2, at, message.clone(), 0..30, Duration::from_millis(300));
    assert_eq!(receive(&mut ep, message.len()), message);
    let last_of_first_30 = peer.join().expect("peer");
    let nacks = wire.nacks();
    let first = *nacks.first().expect("the missing tail asked for");
    assert!(
        first >= last_of_first_30 + RETRY,
        "asked {:?} after the 30th packet: not before the retry passed without one",
        first.saturating_duration_since(last_of_first_30)
    );
}
