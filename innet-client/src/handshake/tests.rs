//! The handshake over scripted wires: lost, repeated, reordered and forged frames, no
//! fabric.

use std::{
    cell::RefCell,
    collections::VecDeque,
    io,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
    time::{Duration, Instant},
};

use innet_common::{
    capabilities::Capabilities,
    proto::{PacketKind, ROCEV2_UDP_PORT},
    wire::ControlPayload,
};

use super::{Leader, Offer, Wire};
use crate::frames;

const ME: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const MRR: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 3);
const STRANGER: Ipv4Addr = Ipv4Addr::new(10, 9, 9, 9);
const COMM: u32 = 0x0012_3456;

/// Datagrams with their senders.
type Datagrams = Vec<(Vec<u8>, SocketAddr)>;

/// Datagrams to deliver, and what the other side answers to each frame sent.
struct Scripted {
    arriving: RefCell<VecDeque<(Vec<u8>, SocketAddr)>>,
    sent: RefCell<Vec<(Ipv4Addr, Vec<u8>)>>,
    /// Called with the number of frames sent so far (from 1): datagrams that arrive after.
    answer: Box<dyn Fn(usize) -> Datagrams>,
    /// Datagrams handed to `aside`.
    aside: RefCell<usize>,
}

impl Scripted {
    fn new(arriving: Datagrams, answer: impl Fn(usize) -> Datagrams + 'static) -> Self {
        Self {
            arriving: RefCell::new(arriving.into()),
            sent: RefCell::new(vec![]),
            answer: Box::new(answer),
            aside: RefCell::new(0),
        }
    }
}

impl Wire for Scripted {
    fn send(&self, to: Ipv4Addr, payload: &[u8]) -> io::Result<()> {
        self.sent.borrow_mut().push((to, payload.to_vec()));
        let n = self.sent.borrow().len();
        self.arriving.borrow_mut().extend((self.answer)(n));
        Ok(())
    }

    fn receive_until(
        &self,
        _deadline: Instant,
        each: &mut dyn FnMut(&[u8], SocketAddr) -> bool,
    ) -> io::Result<bool> {
        // Nothing queued: the deadline passes at once (the loss a test scripts).
        while let Some((d, from)) = self.arriving.borrow_mut().pop_front() {
            if each(&d, from) {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

fn at(ip: Ipv4Addr) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(ip, ROCEV2_UDP_PORT))
}

fn payload(comm: u32, window: u16) -> ControlPayload {
    let mut c = ControlPayload::default();
    c.set_true_comm_id(comm);
    c.set_sup_allreduce_op(0xffff);
    c.set_sup_data_type(0xffff);
    c.set_sup_max_data_size(1024);
    c.set_sup_window(window);
    c
}

fn frame(from: Ipv4Addr, kind: PacketKind, c: &ControlPayload) -> (Vec<u8>, SocketAddr) {
    (frames::control(from, ME, kind, 0, c), at(from))
}

fn leader<'a>(
    wire: &'a Scripted,
    aside: &'a dyn Fn(&[u8], SocketAddr),
    offer: Option<Offer>,
) -> Leader<'a> {
    Leader {
        sock: wire,
        ip: ME,
        rank: 1,
        timeout: Duration::from_millis(200),
        retry: Duration::from_millis(1),
        offer,
        payload: 1024,
        aside: Some(aside),
        key: 7,
    }
}

#[test]
fn an_nmrr_asks_again_after_a_loss_and_takes_only_its_groups_notify() {
    // The first query is lost (no answer); after the second, forged and foreign frames
    // come first, then the MRR's notify, twice.
    let wire = Scripted::new(vec![], |sent| match sent {
        2 => vec![
            (vec![0xde, 0xad, 0xbe, 0xef], at(STRANGER)),
            frame(STRANGER, PacketKind::Notify, &payload(COMM + 1, 8)),
            frame(MRR, PacketKind::Query, &payload(COMM, 8)),
            frame(MRR, PacketKind::Notify, &payload(COMM, 16)),
            frame(MRR, PacketKind::Notify, &payload(COMM, 16)),
        ],
        _ => vec![],
    });
    let aside = |_: &[u8], _: SocketAddr| *wire.aside.borrow_mut() += 1;
    let params = leader(&wire, &aside, None)
        .join(MRR, COMM, 2)
        .expect("joined");
    assert_eq!(params.true_comm_id, COMM);
    assert_eq!(params.window, 16, "the MRR's notify, not the forged one");
    let sent = wire.sent.borrow();
    assert_eq!(sent.len(), 2, "one query again after the loss");
    assert!(sent.iter().all(|(to, _)| *to == MRR));
    assert_eq!(
        *wire.aside.borrow(),
        3,
        "garbage, another group's notify, a query"
    );
    // The repeated notify stays queued for whoever reads next.
    assert_eq!(wire.arriving.borrow().len(), 1);
}

#[test]
fn an_nmrr_whose_mrr_never_answers_times_out() {
    let wire = Scripted::new(vec![], |_| vec![]);
    let aside = |_: &[u8], _: SocketAddr| {};
    let started = Instant::now();
    let err = leader(&wire, &aside, None).join(MRR, COMM, 2).unwrap_err();
    assert!(err.to_string().contains("notify"), "{err}");
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert!(
        wire.sent.borrow().len() > 2,
        "queries sent again until the deadline"
    );
}

#[test]
fn an_mrr_collects_each_member_once_whatever_the_order_and_ignores_strangers() {
    let nic = Offer {
        caps: Capabilities {
            ops: 0xffff,
            dtypes: 0xffff,
            max_data_size: 1024,
            window: 32,
        },
        fail_cause: 0,
    };
    // A NIC tree: no climb. A stranger's query, the peers' queries reordered and
    // repeated, one of them with a smaller window.
    let arriving = vec![
        frame(STRANGER, PacketKind::Query, &payload(COMM, 1)),
        frame(PEER, PacketKind::Query, &payload(COMM + 1, 2)),
        frame(PEER, PacketKind::Query, &payload(COMM, 8)),
        frame(PEER, PacketKind::Query, &payload(COMM, 8)),
        frame(MRR, PacketKind::Query, &payload(COMM, 16)),
    ];
    let wire = Scripted::new(arriving, |_| vec![]);
    let aside = |_: &[u8], _: SocketAddr| *wire.aside.borrow_mut() += 1;
    let heard = leader(&wire, &aside, Some(nic))
        .collect(&[PEER, MRR], COMM)
        .expect("every member's query");
    assert_eq!(
        heard.window, 8,
        "the smallest of the members', not the stranger's 1"
    );
    assert_eq!(heard.max_data_size, 1024);
    assert!(wire.sent.borrow().is_empty(), "no climb in a NIC tree");
    assert_eq!(*wire.aside.borrow(), 1, "another group's query went aside");
}
