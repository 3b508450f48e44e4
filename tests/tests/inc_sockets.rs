//! Communicators whose leaders share a host address: their INC sockets share UDP 4791 and
//! the `innet_inc_socket` sk_reuseport selector gives each one its own datagrams (data,
//! results, control and host-to-host), in one process and across processes (the other one
//! is `innet-inc-socket-peer`).

use std::{
    io::{BufRead as _, BufReader, Lines},
    net::{Ipv4Addr, UdpSocket},
    path::PathBuf,
    process::{Child, ChildStdout, Stdio},
    time::Duration,
};

use innet_client::{
    frames::{self, DataId},
    inc_socket::{self, IncSocket},
};
use innet_common::{
    demux::{comm_key, host_key},
    proto::{Dtype, HOST_COMM_ID, Op, PacketKind, ROCEV2_UDP_PORT},
    wire::ControlPayload,
};
use innet_lab::NetNs;

const HOST: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);

/// Two communicators: (true_comm_id, partition key).
const A: (u32, u16) = (0x5a_1001, 0x8a01);
const B: (u32, u16) = (0x77_2002, 0x8b02);
const C: (u32, u16) = (0x33_3003, 0x8c03);

fn namespace() -> NetNs {
    let ns = NetNs::new("incsock");
    ns.ip(&["addr", "add", &format!("{HOST}/32"), "dev", "lo"]);
    ns.ip(&["addr", "add", &format!("{PEER}/32"), "dev", "lo"]);
    ns
}

fn bind((comm, pkey): (u32, u16)) -> IncSocket {
    let s = inc_socket::bind(HOST, &[comm_key(comm), host_key(pkey)]).expect("bind");
    s.sock
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    s
}

/// Every kind of datagram of communicator `c`, as its peer sends it.
fn datagrams_of((comm, pkey): (u32, u16)) -> Vec<Vec<u8>> {
    let id = DataId {
        src_rank: 1,
        op: Op::Sum,
        dtype: Dtype::I32,
        req_id: 3,
        pkt_index: 0,
    };
    let addr = frames::addressing(PEER, HOST, 0, 7);
    let result = frames::data(&addr, comm & 0xff_ffff, id, &[1, 0, 0, 0]);
    let host = frames::data(
        &innet_common::codec::Addressing { pkey, ..addr },
        HOST_COMM_ID,
        id,
        &[2, 0, 0, 0],
    );
    let mut c = ControlPayload::default();
    c.set_true_comm_id(comm);
    let control = frames::control(PEER, HOST, PacketKind::Notify, 1, &c);
    vec![result, host, control]
}

fn received(sock: &UdpSocket) -> Vec<Vec<u8>> {
    let mut got = vec![];
    let mut buf = [0u8; 2048];
    while let Ok(n) = sock.recv(&mut buf) {
        got.push(buf[..n].to_vec());
    }
    got
}

fn send_all(datagrams: &[Vec<u8>]) {
    let peer = UdpSocket::bind((PEER, 0)).unwrap();
    for d in datagrams {
        peer.send_to(d, (HOST, ROCEV2_UDP_PORT)).unwrap();
    }
}

#[test]
fn two_communicators_on_one_address_each_get_their_own_datagrams() {
    let ns = namespace();
    ns.run(|| {
        let (a, b) = (bind(A), bind(B));
        assert!(a.share.is_some() && b.share.is_some(), "both shared");
        // Many rounds: a hash would split them; the selector never does.
        let rounds = 20;
        for _ in 0..rounds {
            send_all(&datagrams_of(A));
            send_all(&datagrams_of(B));
        }
        let (got_a, got_b) = (received(&a.sock), received(&b.sock));
        let want_a: Vec<Vec<u8>> = (0..rounds).flat_map(|_| datagrams_of(A)).collect();
        let want_b: Vec<Vec<u8>> = (0..rounds).flat_map(|_| datagrams_of(B)).collect();
        assert_eq!(got_a, want_a, "A's socket");
        assert_eq!(got_b, want_b, "B's socket");
        // A third communicator with one of A's keys is refused, and A keeps its datagrams.
        let clash = inc_socket::bind(HOST, &[comm_key(0x11_1111), host_key(A.1)]);
        let e = clash.err().expect("a key in use is refused");
        assert!(e.to_string().contains("uses key"), "{e}");
        send_all(&datagrams_of(A));
        assert_eq!(received(&a.sock), datagrams_of(A));
        // Once B is gone its key is free again, and A still gets its own.
        drop(b);
        let b2 = bind(B);
        send_all(&datagrams_of(B));
        send_all(&datagrams_of(A));
        assert_eq!(received(&b2.sock), datagrams_of(B));
        assert_eq!(received(&a.sock), datagrams_of(A));
        assert!(pin_dir().exists());
        drop((a, b2));
        assert!(!pin_dir().exists(), "the last socket removes its pins");
    });
}

#[test]
fn a_second_process_shares_the_address_and_gets_its_own_datagrams() {
    let ns = namespace();
    // The other process binds B's socket and prints what it receives.
    let (mut child, lines) = peer(&ns, B);
    ns.run(|| {
        let a = bind(A);
        send_all(&datagrams_of(B));
        send_all(&datagrams_of(A));
        assert_eq!(received(&a.sock), datagrams_of(A));
    });
    let got: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(child.wait().unwrap().success(), "the peer failed: {got:?}");
    let want: Vec<String> = datagrams_of(B).iter().map(|d| innet_lab::hex(d)).collect();
    assert_eq!(
        got, want,
        "the other process gets B's datagrams, and only those"
    );

    // A peer killed without unregistering leaves its keys behind, pointing at its dead
    // socket's index: the next binder of B takes them over and gets B's datagrams. Once
    // as the dead index's new owner, once from another index (the dead one probed free).
    for a_third_holds_an_index in [false, true] {
        ns.run(|| {
            let a = bind(A);
            let c = a_third_holds_an_index.then(|| bind(C));
            let (mut killed, _) = peer(&ns, B);
            killed.kill().unwrap();
            killed.wait().unwrap();
            drop(c);
            let b = bind(B);
            send_all(&datagrams_of(B));
            send_all(&datagrams_of(A));
            assert_eq!(received(&b.sock), datagrams_of(B));
            assert_eq!(received(&a.sock), datagrams_of(A));
        });
    }
}

/// `innet-inc-socket-peer` bound for `c` in `ns` (it has said `bound`), waiting for 3
/// datagrams; the rest of its output.
fn peer(ns: &NetNs, (comm, pkey): (u32, u16)) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut child = ns
        .command(env!("CARGO_BIN_EXE_innet-inc-socket-peer"))
        .args(["--ip", &HOST.to_string(), "--count", "3"])
        .args([
            "--comm",
            &format!("{comm:x}"),
            "--pkey",
            &format!("{pkey:x}"),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn innet-inc-socket-peer");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("bound"));
    (child, lines)
}

/// The selector's pin directory of [`HOST`] in this thread's namespace.
fn pin_dir() -> PathBuf {
    inc_socket::pin_dir(HOST).unwrap()
}
