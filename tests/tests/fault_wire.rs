//! The fault injector itself: two hosts under one plain TOR, the first host's link through
//! a wire. Each fault is checked against what the receiver got and the wire's own counters:
//! drops and duplicates add up exactly, delayed packets arrive late and out of order, only
//! the chosen kinds are touched, and other traffic passes byte for byte whatever the rates.

use std::{
    net::{SocketAddrV4, UdpSocket},
    time::Duration,
};

use innet::loader::XdpMode;
use innet_common::{
    fault::{FaultStats, KIND_CONTRIBUTION, KIND_RESULT},
    proto::{BTH_FLAG_RESULT, Dtype, Op},
};
use innet_lab::wire_faults::Faults;
use innet_lab::{
    daemons::learn_hosts,
    topology::{Dir, Link, Options, Shape, Topology, contribution},
};

const PACKETS: u32 = 4000;

fn fabric() -> Topology {
    let topo = Topology::with(
        Shape {
            tors: 1,
            hosts_per_tor: 2,
            sockets: 1,
            spines: 0,
            mode: XdpMode::Native,
            ..Shape::small()
        },
        Options {
            innet: false,
            wires: true,
            mtu: None,
            window: None,
            dpus: false,
            link_rate: None,
        },
    );
    learn_hosts(&topo);
    topo
}

/// An INC data packet carrying `seq` (as its body), a result when `result`.
fn packet(seq: u32, result: bool) -> Vec<u8> {
    let mut p = contribution(7, 0, 0, Op::Sum, Dtype::U32, &seq.to_le_bytes());
    if result {
        p[1] |= BTH_FLAG_RESULT;
    }
    p
}

/// Sends `packets` from host 0 to host 1's `port`, paced so the receiver keeps up, and
/// returns every payload host 1 received, in arrival order.
fn send_and_collect(topo: &Topology, port: u16, packets: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let to = SocketAddrV4::new(topo.hosts[1].ip, port);
    let rx = topo.hosts[1].ns.run(|| UdpSocket::bind(to).expect("bind"));
    rx.set_read_timeout(Some(Duration::from_millis(500)))
        .expect("timeout");
    // Every packet must arrive or be counted by the wire: a receiver the scheduler holds
    // back must not overflow a default-sized buffer (CI once lost 95 of 4,000 that way).
    let bytes: libc::c_int = 16 << 20;
    // SAFETY: setsockopt on a socket we own, with an int the size we pass.
    let set = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&rx),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&raw const bytes).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(
        set,
        0,
        "SO_RCVBUFFORCE: {}",
        std::io::Error::last_os_error()
    );
    let tx = topo.hosts[0]
        .ns
        .run(|| UdpSocket::bind((topo.hosts[0].ip, 0)).expect("bind"));
    std::thread::scope(|s| {
        let receiver = s.spawn(|| {
            let mut got = vec![];
            let mut buf = [0u8; 2048];
            while let Ok(n) = rx.recv(&mut buf) {
                got.push(buf[..n].to_vec());
            }
            got
        });
        for (i, p) in packets.iter().enumerate() {
            tx.send_to(p, to).expect("send");
            if i % 32 == 31 {
                std::thread::sleep(Duration::from_micros(500));
            }
        }
        receiver.join().expect("receiver")
    })
}

fn seq_of(payload: &[u8]) -> u32 {
    let body = innet_lab::topology::body_of(payload, 4);
    u32::from_le_bytes(body.try_into().expect("4 bytes"))
}

/// Runs `packets` through host 0's wire with `faults` and returns what arrived and what
/// the wire counted (the difference of its counters).
fn through(topo: &Topology, faults: Faults, packets: &[Vec<u8>]) -> (Vec<Vec<u8>>, FaultStats) {
    let wires = topo.wires.as_ref().expect("wired");
    let link = Link::Host(0);
    let before = wires.stats(link, Dir::Up);
    wires.set(link, Dir::Up, faults);
    let got = send_and_collect(topo, 4791, packets);
    wires.set(link, Dir::Up, Faults::default());
    (got, wires.stats(link, Dir::Up).since(&before))
}

/// `count / total` lies within `want ± 0.04` (binomial: several standard deviations).
fn assert_rate(what: &str, count: u64, total: u32, want: f64) {
    let rate = count as f64 / f64::from(total);
    assert!(
        (rate - want).abs() < 0.04,
        "{what}: {count} of {total} = {rate:.3}, want about {want}"
    );
}

#[test]
fn drops_duplicates_and_delays_add_up_and_touch_only_inc_data() {
    let topo = fabric();
    let contributions: Vec<_> = (0..PACKETS).map(|i| packet(i, false)).collect();

    // Drops: every packet either arrived or was counted as dropped.
    let drop = Faults {
        kinds: KIND_CONTRIBUTION,
        drop: 0.2,
        ..Faults::default()
    };
    let (got, s) = through(&topo, drop, &contributions);
    assert_eq!(s.contributions, u64::from(PACKETS), "{s:?}");
    assert_eq!(got.len() as u64 + s.dropped, u64::from(PACKETS), "{s:?}");
    assert_rate("dropped", s.dropped, PACKETS, 0.2);

    // Duplicates: every packet arrived, the duplicated ones twice.
    let dup = Faults {
        kinds: KIND_CONTRIBUTION,
        duplicate: 0.1,
        ..Faults::default()
    };
    let (got, s) = through(&topo, dup, &contributions);
    assert_eq!(got.len() as u64, u64::from(PACKETS) + s.duplicated, "{s:?}");
    assert_rate("duplicated", s.duplicated, PACKETS, 0.1);

    // Delays: every packet arrived, the delayed ones after later packets.
    let delay = Faults {
        kinds: KIND_CONTRIBUTION,
        delay: 0.1,
        delay_for: Duration::from_millis(3),
        ..Faults::default()
    };
    let (got, s) = through(&topo, delay, &contributions);
    assert_eq!(got.len() as u64, u64::from(PACKETS), "{s:?}");
    assert_eq!(s.delay_overflow, 0, "{s:?}");
    assert_rate("delayed", s.delayed, PACKETS, 0.1);
    let seqs: Vec<u32> = got.iter().map(|p| seq_of(p)).collect();
    let overtaken = seqs.windows(2).filter(|w| w[1] < w[0]).count();
    assert!(overtaken > 0, "delayed packets must arrive out of order");
    let mut sorted = seqs.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (0..PACKETS).collect::<Vec<_>>(),
        "every packet once"
    );
    assert!(
        topo.wires.as_ref().unwrap().injector.delayed_sent() >= s.delayed,
        "the delay line sent every held frame"
    );

    // Kinds: only results are dropped here, so every contribution arrives.
    let results_only = Faults {
        kinds: KIND_RESULT,
        drop: 1.0,
        ..Faults::default()
    };
    let (got, s) = through(&topo, results_only, &contributions[..500]);
    assert_eq!((got.len(), s.dropped), (500, 0), "{s:?}");
    let results: Vec<_> = (0..500).map(|i| packet(i, true)).collect();
    let (got, s) = through(&topo, results_only, &results);
    assert_eq!((got.len(), s.results, s.dropped), (0, 500, 500), "{s:?}");
}

#[test]
fn other_traffic_passes_byte_for_byte_at_any_rate() {
    let topo = fabric();
    let all = Faults {
        kinds: KIND_CONTRIBUTION | KIND_RESULT,
        drop: 1.0,
        ..Faults::default()
    };
    let wires = topo.wires.as_ref().expect("wired");
    wires.set(Link::Host(0), Dir::Up, all);
    // RoCEv2 that is not INC (no INC tag), and ordinary UDP on another port.
    let mut not_inc = packet(1, false);
    // The INC tag follows BTH and DETH.
    not_inc[20..24].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
    let plain: Vec<u8> = (0..=255).collect();
    for (port, payload) in [(4791, not_inc), (5000, plain)] {
        let sent = vec![payload; 200];
        let got = send_and_collect(&topo, port, &sent);
        assert_eq!(got, sent, "port {port}: every frame, unchanged");
    }
    let s = wires.stats(Link::Host(0), Dir::Up);
    assert_eq!((s.contributions, s.results, s.dropped), (0, 0, 0), "{s:?}");
    assert!(s.frames >= 400, "{s:?}");
}
