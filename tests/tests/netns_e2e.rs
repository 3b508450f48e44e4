//! End to end in network namespaces: `innet attach` (the real CLI) on a veth port, then real
//! traffic from another namespace — INC over UDP 4791, other RoCEv2, malformed INC, ping,
//! TCP, other UDP. Everything but the malformed INC (dropped and counted) must arrive intact
//! and the counters must match what was sent.

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream, UdpSocket},
    process::Command,
    time::Duration,
};

use innet_common::{
    codec::{Addressing, data_header, encode, encode_control, encode_elements},
    proto::{Dtype, Op, PacketKind},
    wire::{ControlPayload, ETH_LEN, IPV4_LEN, UDP_LEN},
};
use innet_lab::{NetNs, PinRoot, innet_bin, run, unique_id, veth};

const HOST_IP: &str = "10.201.0.1";
const PORT_IP: &str = "10.201.0.2";

/// The UDP payload (BTH … ICRC) of a frame built by the codec: the kernel adds the rest.
fn udp_payload(frame: &[u8]) -> Vec<u8> {
    frame[ETH_LEN + IPV4_LEN + UDP_LEN..].to_vec()
}

fn innet(ns: &NetNs, pins: &PinRoot, args: &[&str]) -> std::process::Output {
    let mut c = ns.command(innet_bin().to_str().expect("utf-8 path"));
    c.args(args).arg("--pin-path").arg(pins.path());
    c.output().expect("run innet")
}

fn innet_ok(ns: &NetNs, pins: &PinRoot, args: &[&str]) -> String {
    let out = innet(ns, pins, args);
    assert!(
        out.status.success(),
        "innet {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn counters(ns: &NetNs, pins: &PinRoot) -> serde_json::Value {
    let out = innet_ok(ns, pins, &["stats", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("stats --json is JSON");
    v["total"].clone()
}

#[expect(
    clippy::too_many_lines,
    reason = "one linear scenario: attach, send every kind of traffic, check, detach"
)]
fn end_to_end(mode: &str) {
    let host = NetNs::new("h");
    let switch = NetNs::new("s");
    let id = unique_id();
    let (host_if, port_if) = (format!("h{id}"), format!("s{id}"));
    veth(&host, &host_if, HOST_IP, &switch, &port_if, PORT_IP);
    let pins = PinRoot::new();

    // Clear errors first: unknown interface, then a good attach, then attaching twice.
    let out = innet(
        &switch,
        &pins,
        &["attach", "--iface", "nosuchif0", "--mode", mode],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no interface named `nosuchif0`"));
    innet_ok(
        &switch,
        &pins,
        &["attach", "--iface", &port_if, "--mode", mode],
    );
    let out = innet(&switch, &pins, &["attach", &port_if, "--mode", mode]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("already attached"),
        "{out:?}"
    );
    let status = innet_ok(&switch, &pins, &["status"]);
    assert!(status.lines().any(|l| l.starts_with(&port_if)), "{status}");
    let link = String::from_utf8(switch.ip(&["link", "show", &port_if]).stdout).expect("utf-8");
    assert!(
        link.contains(if mode == "native" {
            "xdp "
        } else {
            "xdpgeneric"
        }),
        "{link}"
    );

    // INC and other UDP 4791 traffic, received intact by a plain socket on the port side.
    let group = 0x00ab_cd01;
    let mut inc_data = vec![];
    for (round, (op, dtype)) in [
        (Op::Sum, Dtype::I32),
        (Op::Max, Dtype::U64),
        (Op::Minloc, Dtype::I16),
    ]
    .into_iter()
    .enumerate()
    {
        for pkt in 0..10u8 {
            let values: Vec<i64> = (0..16).map(|i| i64::from(pkt) * 100 + i).collect();
            let locs: Vec<i32> = (0..16).collect();
            let body = encode_elements(dtype, &values, op.carries_location().then_some(&locs[..]));
            let req_id = round as u8 * 10 + pkt;
            let hdr = data_header(group, 1, op, dtype, req_id, 0, 16);
            let addr = Addressing {
                psn: u32::from(req_id),
                ..Addressing::default()
            };
            inc_data.push(udp_payload(&encode(&addr, &hdr, &body)));
        }
    }
    let control: Vec<Vec<u8>> = [PacketKind::Query, PacketKind::Notify, PacketKind::Kill]
        .iter()
        .map(|&k| {
            udp_payload(&encode_control(
                &Addressing::default(),
                k,
                0,
                &ControlPayload::default(),
            ))
        })
        .collect();
    let mut bad_op = data_header(group, 1, Op::Sum, Dtype::U8, 0, 0, 4);
    bad_op.op_code = 77;
    let malformed = vec![udp_payload(&encode(&Addressing::default(), &bad_op, &[1, 2, 3, 4])); 3];
    let mut rc = inc_data[0].clone();
    rc[0] = 0x04; // RC SEND Only: RoCEv2, not ours
    let other_roce = vec![rc; 2];
    // Malformed INC is dropped at the port (it could otherwise reach a member unchecked).
    let passing_4791: Vec<Vec<u8>> = [&inc_data, &control, &other_roce]
        .into_iter()
        .flatten()
        .cloned()
        .collect();

    let receiver = switch.run(|| UdpSocket::bind((PORT_IP, 4791)).expect("bind 4791"));
    let plain_rx = switch.run(|| UdpSocket::bind((PORT_IP, 9000)).expect("bind 9000"));
    let tcp_rx = switch.run(|| TcpListener::bind((PORT_IP, 7000)).expect("listen"));
    host.run(|| {
        let s = UdpSocket::bind((HOST_IP, 0)).expect("bind");
        for p in malformed.iter().chain(&passing_4791) {
            s.send_to(p, (PORT_IP, 4791)).expect("send");
        }
        for i in 0..4u8 {
            s.send_to(&[i; 100], (PORT_IP, 9000)).expect("send");
        }
    });
    receiver
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut buf = [0u8; 2048];
    for (i, sent) in passing_4791.iter().enumerate() {
        let (n, _) = receiver
            .recv_from(&mut buf)
            .unwrap_or_else(|e| panic!("datagram {i} lost: {e}"));
        assert_eq!(&buf[..n], &sent[..], "datagram {i} arrives unchanged");
    }
    plain_rx
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    for i in 0..4u8 {
        let (n, _) = plain_rx.recv_from(&mut buf).expect("plain UDP arrives");
        assert_eq!(&buf[..n], &[i; 100]);
    }

    // Ping and a TCP transfer cross the same port unharmed.
    run(host
        .command("ping")
        .args(["-c", "3", "-i", "0.2", "-W", "2", PORT_IP]));
    let payload: Vec<u8> = (0..256 * 1024)
        .map(|i| u8::try_from(i * 7 % 251).expect("below 251"))
        .collect();
    let got = std::thread::scope(|s| {
        let rx = s.spawn(|| {
            let (mut conn, _) = tcp_rx.accept().expect("accept");
            let mut got = vec![];
            conn.read_to_end(&mut got).expect("read");
            got
        });
        host.run(|| {
            let mut c = TcpStream::connect((PORT_IP, 7000)).expect("connect");
            c.write_all(&payload).expect("write");
        });
        rx.join().expect("receiver")
    });
    assert_eq!(got, payload, "TCP stream intact");

    let c = counters(&switch, &pins);
    let n = |k: &str| {
        c[k].as_u64()
            .unwrap_or_else(|| panic!("counter {k} in {c}"))
    };
    assert_eq!(n("inc_data"), inc_data.len() as u64);
    assert_eq!(n("inc_control"), control.len() as u64);
    assert_eq!(n("malformed"), 3);
    assert_eq!(n("mal_bad_op"), 3);
    assert_eq!(n("roce_other"), 2);
    // 4 plain UDP + 3 echo requests + the TCP segments (at least 256 KiB / 64 KiB GSO + SYN
    // and FIN), plus whatever IPv6 neighbour discovery the kernel sends.
    assert!(n("non_roce") >= 4 + 3 + 6, "{c}");
    assert_eq!(
        n("rx_packets"),
        n("non_roce") + n("roce_other") + n("inc_data") + n("inc_control") + n("malformed")
    );
    assert_eq!(n("xdp_drop"), 3, "the malformed frames are dropped");
    assert_eq!(n("rx_packets"), n("xdp_pass") + 3, "everything else passes");
    assert_eq!(n("xdp_tx") + n("xdp_redirect") + n("xdp_aborted"), 0);

    // bpftool sees the pinned map with named fields.
    let dump = run(Command::new("bpftool")
        .args(["map", "dump", "pinned"])
        .arg(pins.path().join("maps/PORT_STATS")));
    let dump = String::from_utf8_lossy(&dump.stdout);
    for field in ["rx_packets", "inc_data", "mal_bad_op", "xdp_pass"] {
        assert!(
            dump.contains(field),
            "bpftool prints field {field}:\n{dump}"
        );
    }

    // Detach: the link goes, and with the last port the pins too.
    innet_ok(&switch, &pins, &["detach", &port_if]);
    let link = String::from_utf8(switch.ip(&["link", "show", &port_if]).stdout).expect("utf-8");
    assert!(!link.contains("xdp"), "{link}");
    assert!(!pins.path().exists(), "last detach unpins everything");
    let out = innet(&switch, &pins, &["detach", &port_if]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not attached"),
        "{out:?}"
    );
}

#[test]
fn native_mode_end_to_end() {
    end_to_end("native");
}

#[test]
fn skb_mode_end_to_end() {
    end_to_end("skb");
}

#[test]
fn programs_outlive_the_cli_and_keep_maps_works() {
    let switch = NetNs::new("k");
    let host = NetNs::new("j");
    let id = unique_id();
    let (a, b) = (format!("j{id}"), format!("k{id}"));
    veth(&host, &a, HOST_IP, &switch, &b, PORT_IP);
    let pins = PinRoot::new();
    innet_ok(&switch, &pins, &["attach", &b]);
    // The CLI has exited; the pinned link keeps the program running.
    run(host
        .command("ping")
        .args(["-c", "2", "-i", "0.2", "-W", "2", PORT_IP]));
    innet_ok(&switch, &pins, &["detach", "--all", "--keep-maps"]);
    let c = counters(&switch, &pins);
    assert!(c["rx_packets"].as_u64().expect("counter") >= 2, "{c}");
    assert!(pins.path().join("maps/PORT_STATS").exists());
}

#[test]
fn group_cli_installs_lists_shows_and_removes() {
    let switch = NetNs::new("g");
    let host = NetNs::new("f");
    let id = unique_id();
    let (a, b) = (format!("f{id}"), format!("g{id}"));
    veth(&host, &a, HOST_IP, &switch, &b, PORT_IP);
    let pins = PinRoot::new();
    // A window that is no power of two is refused before anything loads.
    let bad = innet(&switch, &pins, &["attach", &b, "--window", "12"]);
    let text = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && text.contains("window 12") && text.contains("power of two"),
        "{text}"
    );
    let attached = innet_ok(
        &switch,
        &pins,
        &["attach", &b, "--capacity", "2", "--window", "32"],
    );
    assert!(
        attached.contains("group maps for 2 groups x 32 slots") && attached.contains("float stash"),
        "the map memory is printed: {attached}"
    );
    let child = format!("{HOST_IP}@{b}#3");
    innet_ok(
        &switch,
        &pins,
        &[
            "group",
            "add",
            "0x00ab01",
            "--role",
            "tor",
            "--child",
            &child,
            "--parent",
            &b,
            "--parent-ip",
            "10.201.0.250",
            "--parent-mac",
            "02:00:00:00:00:fe",
            "--own-ip",
            PORT_IP,
        ],
    );
    // The own MAC is read in the switch's namespace (sysfs would show the root one).
    let out = switch.ip(&["-j", "link", "show", &b]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ip -j");
    let port_mac = v[0]["address"].as_str().expect("mac").to_owned();
    let show = innet_ok(&switch, &pins, &["group", "show", "0xab01"]);
    assert!(
        show.contains(&format!("own {PORT_IP} ({port_mac})")),
        "{show}"
    );
    assert!(
        show.contains("02:00:00:00:00:fe") && show.contains("rank 3"),
        "{show}"
    );
    innet_ok(
        &switch,
        &pins,
        &["group", "add", "7", "--role", "tor", "--child", &child],
    );
    let list: serde_json::Value =
        serde_json::from_str(&innet_ok(&switch, &pins, &["group", "list", "--json"]))
            .expect("json");
    assert_eq!(list["capacity"], 2);
    assert_eq!(list["window"], 32);
    assert_eq!(list["groups"].as_array().expect("groups").len(), 2);
    // Clear refusals: full switch, duplicate id, reserved id, unknown group.
    let err = |args: &[&str]| String::from_utf8(innet(&switch, &pins, args).stderr).expect("utf-8");
    assert!(err(&["group", "add", "8", "--role", "tor", "--child", &child]).contains("all taken"));
    assert!(
        err(&["group", "add", "7", "--role", "tor", "--child", &child])
            .contains("already installed")
    );
    innet_ok(&switch, &pins, &["group", "del", "7"]);
    assert!(
        err(&["group", "add", "0x1ff", "--role", "tor", "--child", &child]).contains("reserved")
    );
    assert!(err(&["group", "del", "7"]).contains("no group"));
    assert!(
        err(&[
            "group",
            "add",
            "9",
            "--role",
            "tor",
            "--child",
            "10.0.0.1@nosuchif"
        ])
        .contains("no interface named")
    );
}

/// A port built by hand as a new user would: a veth whose peer has neither XDP nor GRO
/// cannot take redirected frames (the kernel drops them after XDP returned). Attaching
/// natively says so and names the fix; once the peer has GRO, it is quiet.
#[test]
fn attach_says_when_redirected_frames_would_be_dropped_and_names_the_fix() {
    let switch = NetNs::new("rb");
    let host = NetNs::new("ra");
    let id = unique_id();
    let (port_if, host_if) = (format!("r{id}p"), format!("r{id}h"));
    veth(&switch, &port_if, PORT_IP, &host, &host_if, HOST_IP);
    let pins = PinRoot::new();
    let port = switch.run(|| innet_net::netdev::ifindex(&port_if).expect("ifindex"));
    let features = || switch.run(|| innet_net::netdev::xdp_features(port).expect("xdp-features"));
    assert_eq!(
        features() & innet_net::netdev::ACT_NDO_XMIT,
        0,
        "a veth whose peer has no NAPI"
    );

    let out = innet(&switch, &pins, &["attach", &port_if]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stderr);
    for needle in [
        port_if.as_str(),
        "dropped by the kernel",
        "ethtool -K <peer> gro on",
        "--mode skb",
    ] {
        assert!(said.contains(needle), "attach names {needle:?}:\n{said}");
    }
    innet_ok(&switch, &pins, &["detach", &port_if]);

    // The fix: GRO on the peer gives it NAPI.
    run(host.command("ethtool").args(["-K", &host_if, "gro", "on"]));
    assert_ne!(features() & innet_net::netdev::ACT_NDO_XMIT, 0);
    let out = innet(&switch, &pins, &["attach", &port_if]);
    assert!(out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!said.contains("dropped by the kernel"), "{said}");
    innet_ok(&switch, &pins, &["detach", &port_if]);
    // Generic XDP redirects through the stack: no warning either way.
    run(host.command("ethtool").args(["-K", &host_if, "gro", "off"]));
    let out = innet(&switch, &pins, &["attach", &port_if, "--mode", "skb"]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("dropped by the kernel"));
    innet_ok(&switch, &pins, &["detach", &port_if]);
}

/// The same hand-built port with traffic: a root switch whose two children sit behind
/// veths, one peer without NAPI. The kernel leaves that port out of the result's broadcast
/// without a trace; innet counts the lost copy on the port (`redirect_errors`) and `innet
/// stats` (text, JSON, Prometheus) names the fix; the other child gets its result. Once the
/// peer has GRO, stats shows the port ready, both children get the next result and nothing
/// more is counted.
#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one linear scenario: build, lose a copy, check every output, fix, check again"
)]
fn redirects_a_peer_cannot_take_are_counted_on_their_port_and_named() {
    const A_IP: &str = "10.202.0.1";
    const A_PORT_IP: &str = "10.202.0.2";
    const B_IP: &str = "10.203.0.1";
    const B_PORT_IP: &str = "10.203.0.2";
    let switch = NetNs::new("qs");
    let (a, b) = (NetNs::new("qa"), NetNs::new("qb"));
    let id = unique_id();
    let (pa, ha, pb, hb) = (
        format!("q{id}pa"),
        format!("q{id}ha"),
        format!("q{id}pb"),
        format!("q{id}hb"),
    );
    veth(&switch, &pa, A_PORT_IP, &a, &ha, A_IP);
    veth(&switch, &pb, B_PORT_IP, &b, &hb, B_IP);
    // A's peer can take redirected frames; B's, as every new veth, cannot.
    run(a.command("ethtool").args(["-K", &ha, "gro", "on"]));
    let pins = PinRoot::new();
    innet_ok(&switch, &pins, &["attach", &pa, &pb]);
    let group = 0x0000_ab02;
    let (child_a, child_b) = (format!("{A_IP}@{pa}#0"), format!("{B_IP}@{pb}#1"));
    innet_ok(
        &switch,
        &pins,
        &[
            "group", "add", "0xab02", "--role", "tor", "--child", &child_a, "--child", &child_b,
        ],
    );
    let sock_a = a.run(|| UdpSocket::bind((A_IP, 4791)).expect("bind 4791"));
    let sock_b = b.run(|| UdpSocket::bind((B_IP, 4791)).expect("bind 4791"));
    for s in [&sock_a, &sock_b] {
        s.set_read_timeout(Some(Duration::from_millis(1500)))
            .expect("timeout");
    }
    // One round: both children contribute, the root sends the sum to both.
    let round = |req_id: u8| {
        let values = |rank: i64| -> Vec<i64> { (0..16).map(|i| rank * 1000 + i).collect() };
        for (rank, sock, to) in [(0, &sock_a, A_PORT_IP), (1, &sock_b, B_PORT_IP)] {
            let hdr = data_header(group, rank, Op::Sum, Dtype::I32, req_id, 0, 16);
            let body = encode_elements(Dtype::I32, &values(i64::from(rank)), None);
            let addr = Addressing {
                psn: u32::from(req_id),
                ..Addressing::default()
            };
            let frame = encode(&addr, &hdr, &body);
            sock.send_to(&udp_payload(&frame), (to, 4791))
                .expect("send");
        }
        let sum: Vec<i64> = (0..16).map(|i| 1000 + 2 * i).collect();
        encode_elements(Dtype::I32, &sum, None)
    };
    // Whether the next datagram on `sock` carries `sum` (its INC body); `None`: nothing came.
    let carries = |sock: &UdpSocket, sum: &[u8]| {
        let mut buf = [0u8; 2048];
        sock.recv(&mut buf)
            .ok()
            .map(|n| buf[..n].windows(sum.len()).any(|w| w == sum))
    };
    let ports = |pins: &PinRoot| -> serde_json::Value {
        serde_json::from_str(&innet_ok(&switch, pins, &["stats", "--json"])).expect("json")
    };
    let port_of = |v: &serde_json::Value, name: &str| {
        v["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .find(|p| p["ifname"] == name)
            .unwrap_or_else(|| panic!("{name} in {v}"))
            .clone()
    };

    let sum = round(0);
    assert_eq!(carries(&sock_a, &sum), Some(true), "A gets the sum");
    assert_eq!(
        carries(&sock_b, &sum),
        None,
        "B's copy is dropped by the kernel"
    );
    let v = ports(&pins);
    let (jpa, jpb) = (port_of(&v, &pa), port_of(&v, &pb));
    assert_eq!(
        jpb["counters"]["redirect_errors"], 1,
        "B's lost copy: {jpb}"
    );
    assert_eq!(jpa["counters"]["redirect_errors"], 0, "{jpa}");
    assert_eq!(jpb["redirect_ready"], false, "{jpb}");
    let why = jpb["redirect_blocked"].as_str().expect("the reason");
    assert!(
        why.contains("ethtool -K <peer> gro on") && why.contains("--mode skb"),
        "{why}"
    );
    assert_eq!(jpa["redirect_ready"], true, "{jpa}");
    assert!(jpa["redirect_blocked"].is_null(), "{jpa}");
    for p in [&jpa, &jpb] {
        assert!(
            p["kernel_tx_dropped"].is_u64(),
            "the kernel's count is shown: {p}"
        );
    }
    let text = innet_ok(&switch, &pins, &["stats"]);
    assert!(
        text.contains(&format!(
            "warning: {pb}: 1 frames innet sent out of it were dropped by the kernel"
        )) && text.contains("ethtool -K <peer> gro on"),
        "{text}"
    );
    assert!(!text.contains(&format!("warning: {pa}")), "{text}");
    let prom = innet_ok(&switch, &pins, &["stats", "--prometheus"]);
    let sample = |family: &str, port: &str| {
        prom.lines()
            .find(|l| {
                l.starts_with(&format!("{family}{{")) && l.contains(&format!("port=\"{port}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_owned)
    };
    assert_eq!(
        sample("innet_port_redirect_ready", &pb).as_deref(),
        Some("0"),
        "{prom}"
    );
    assert_eq!(
        sample("innet_port_redirect_ready", &pa).as_deref(),
        Some("1"),
        "{prom}"
    );
    assert_eq!(
        sample("innet_port_redirect_errors_total", &pb).as_deref(),
        Some("1"),
        "{prom}"
    );

    // The fix: GRO on B's peer; stats sees it (and tells the programs). Both get the next
    // round's result; nothing more is lost.
    run(b.command("ethtool").args(["-K", &hb, "gro", "on"]));
    let v = ports(&pins);
    assert_eq!(port_of(&v, &pb)["redirect_ready"], true, "{v}");
    let sum = round(1);
    assert_eq!(carries(&sock_a, &sum), Some(true));
    assert_eq!(carries(&sock_b, &sum), Some(true), "B gets the sum now");
    let v = ports(&pins);
    assert_eq!(port_of(&v, &pb)["counters"]["redirect_errors"], 1, "{v}");
    let text = innet_ok(&switch, &pins, &["stats"]);
    assert!(!text.contains("warning:"), "{text}");
    innet_ok(&switch, &pins, &["detach", "--all"]);
}
