//! innet's Wireshark dissector (`tools/wireshark/innet.lua`) under tshark: every field it
//! shows, for `innet pcap`'s examples and for a capture of a live job, equals what the codec
//! reads from the same bytes.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use innet_client::{Layout, Mode};
use innet_common::{
    codec::parse_unverified,
    proto::{Dtype, Op},
    validate::Verdict,
    wire::ControlPayload,
};
use innet_lab::{
    daemons::{daemons_on, learn_hosts},
    innet_bin,
    job::{checked_allreduce, run_job},
    run,
    topology::{Shape, Topology},
    unique_id,
};

fn dissector() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/wireshark/innet.lua")
}

/// The INC header's fields, then the data body's, then the control body's.
const HEADER: [&str; 8] = [
    "innet.src_rank",
    "innet.kind",
    "innet.group",
    "innet.op",
    "innet.dtype",
    "innet.req_id",
    "innet.req_pkt_num",
    "innet.count",
];
const DATA: [&str; 4] = ["innet.int", "innet.uint", "innet.float", "innet.loc"];
const CONTROL: [&str; 23] = [
    "innet.ctl.sup_mpi_type",
    "innet.ctl.fail_cause",
    "innet.ctl.master_num",
    "innet.ctl.query_notify_hop",
    "innet.ctl.sup_comm_type",
    "innet.ctl.sup_allreduce_op",
    "innet.ctl.sup_data_type",
    "innet.ctl.sup_max_data_size",
    "innet.ctl.global_group_size",
    "innet.ctl.local_group_size",
    "innet.ctl.true_comm_id",
    "innet.ctl.ava_grp_num",
    "innet.ctl.dst_rank",
    "innet.ctl.tor1_ip",
    "innet.ctl.spine_ip",
    "innet.ctl.tor2_ip",
    "innet.ctl.job_id",
    "innet.ctl.c_id",
    "innet.ctl.world_rank",
    "innet.ctl.sup_window",
    "innet.ctl.rsv",
    "innet.path.n_hops",
    "innet.path.turn",
];

/// Every innet field tshark shows for each INC frame of `file`, in frame order (all
/// occurrences of a field joined by commas).
fn dissected(file: &Path) -> Vec<Vec<String>> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-X")
        .arg(format!("lua_script:{}", dissector().display()))
        .arg("-r")
        .arg(file)
        .args(["-Y", "innet", "-T", "fields", "-E", "separator=/t"])
        .args(["-E", "occurrence=a", "-E", "aggregator=,"]);
    for f in HEADER.iter().chain(&DATA).chain(&CONTROL) {
        cmd.args(["-e", f]);
    }
    String::from_utf8(run(&mut cmd).stdout)
        .expect("utf-8")
        .lines()
        .map(|l| l.split('\t').map(str::to_owned).collect())
        .collect()
}

/// A number as tshark prints it: decimal, `0x` hex, or a dotted IPv4 address.
fn number(s: &str) -> u64 {
    if let Some(hex) = s.strip_prefix("0x") {
        return u64::from_str_radix(hex, 16).unwrap_or_else(|e| panic!("{s}: {e}"));
    }
    if let Ok(ip) = s.parse::<std::net::Ipv4Addr>() {
        return u64::from(u32::from(ip));
    }
    s.parse().unwrap_or_else(|e| panic!("{s:?}: {e}"))
}

fn list(s: &str) -> Vec<&str> {
    if s.is_empty() {
        vec![]
    } else {
        s.split(',').collect()
    }
}

/// The control payload's fields in [`CONTROL`]'s order.
fn control_values(c: &ControlPayload) -> [u64; 23] {
    [
        u64::from(c.sup_mpi_type()),
        u64::from(c.fail_cause),
        u64::from(c.master_num),
        u64::from(c.query_notify_hop),
        u64::from(c.sup_comm_type),
        u64::from(c.sup_allreduce_op()),
        u64::from(c.sup_data_type()),
        u64::from(c.sup_max_data_size()),
        u64::from(c.global_group_size()),
        u64::from(c.local_group_size()),
        u64::from(c.true_comm_id()),
        u64::from(c.ava_grp_num()),
        u64::from(c.dst_rank()),
        u64::from(c.tor1_ip()),
        u64::from(c.spine_ip()),
        u64::from(c.tor2_ip()),
        u64::from_be_bytes(c.job_id),
        u64::from(u32::from_be_bytes(c.c_id)),
        u64::from(c.world_rank()),
        u64::from(u16::from_be_bytes(c.sup_window)),
        u64::from(u16::from_be_bytes(c.rsv)),
        u64::from(c.path.n_hops),
        u64::from(c.path.turn),
    ]
}

/// Checks tshark's `row` for `frame` against the codec; returns whether it was a data
/// frame (and of which op and type).
fn check(frame: &[u8], row: &[String]) -> Option<(Op, Dtype)> {
    // The ICRC is not the dissector's business: tests/icrc_capture.rs checks every captured
    // frame's ICRC on its own.
    let p = parse_unverified(frame).unwrap_or_else(|e| panic!("the codec reads the frame: {e}"));
    let h = &p.inc;
    let header = [
        u64::from(h.src_rank()),
        u64::from(h.data_flag),
        u64::from(h.group()),
        u64::from(h.op_code),
        u64::from(h.oper_and_type),
        u64::from(h.req_id),
        u64::from(h.req_pkt_num),
        u64::from(h.pkt_para_num()),
    ];
    for (k, want) in header.iter().enumerate() {
        assert_eq!(number(&row[k]), *want, "{}: {row:?}", HEADER[k]);
    }
    let data = &row[HEADER.len()..HEADER.len() + DATA.len()];
    let control = &row[HEADER.len() + DATA.len()..];
    if let Some(c) = p.control() {
        for (k, want) in control_values(&c).iter().enumerate() {
            assert_eq!(number(&control[k]), *want, "{}: {row:?}", CONTROL[k]);
        }
        assert!(data.iter().all(String::is_empty), "{row:?}");
        return None;
    }
    assert!(matches!(p.verdict, Verdict::Data { .. }), "{row:?}");
    assert!(control.iter().all(String::is_empty), "{row:?}");
    let (op, dtype) = (
        Op::from_u8(h.op_code).expect("op"),
        Dtype::from_u8(h.oper_and_type).expect("type"),
    );
    let w = dtype.width();
    let size = innet_common::proto::element_bytes(op, dtype);
    let (mut ints, mut uints, mut floats, mut locs) = (vec![], vec![], vec![], vec![]);
    for e in p.body.chunks_exact(size) {
        let mut be = [0u8; 8];
        be[8 - w..].copy_from_slice(&e[..w]);
        let raw = u64::from_be_bytes(be);
        match dtype {
            Dtype::F32 => floats.push(f64::from(f32::from_bits(raw as u32))),
            Dtype::F64 => floats.push(f64::from_bits(raw)),
            Dtype::F16 => floats.push(f64::from(half::f16::from_bits(raw as u16))),
            Dtype::BF16 => floats.push(f64::from(half::bf16::from_bits(raw as u16))),
            Dtype::I8 | Dtype::I16 | Dtype::I32 | Dtype::I64 => {
                // Sign-extend from the element's width.
                let shift = 64 - 8 * w as u32;
                ints.push(((raw << shift) as i64) >> shift);
            }
            _ => uints.push(raw),
        }
        if op.carries_location() {
            locs.push(i32::from_be_bytes(e[w..w + 4].try_into().expect("4 bytes")));
        }
    }
    let shown = |k: usize| list(&data[k]);
    assert_eq!(
        shown(0)
            .iter()
            .map(|s| s.parse::<i64>().expect("int"))
            .collect::<Vec<_>>(),
        ints,
        "innet.int: {row:?}"
    );
    assert_eq!(
        shown(1)
            .iter()
            .map(|s| s.parse::<u64>().expect("uint"))
            .collect::<Vec<_>>(),
        uints,
        "innet.uint: {row:?}"
    );
    let f: Vec<f64> = shown(2)
        .iter()
        .map(|s| s.parse::<f64>().expect("float"))
        .collect();
    assert_eq!(f.len(), floats.len(), "innet.float: {row:?}");
    for (a, b) in f.iter().zip(&floats) {
        assert!(
            (a - b).abs() <= 1e-9 * b.abs().max(1.0),
            "innet.float {a} vs {b}: {row:?}"
        );
    }
    assert_eq!(
        shown(3)
            .iter()
            .map(|s| s.parse::<i32>().expect("loc"))
            .collect::<Vec<_>>(),
        locs,
        "innet.loc: {row:?}"
    );
    Some((op, dtype))
}

#[test]
fn the_dissector_shows_every_field_of_innet_pcaps_examples() {
    let file = std::env::temp_dir().join(format!("innet-test-{}.pcap", unique_id()));
    run(Command::new(innet_bin()).arg("pcap").arg(&file));
    let frames = innet::pcap::read(&std::fs::read(&file).expect("pcap")).expect("pcap");
    let rows = dissected(&file);
    let _ = std::fs::remove_file(&file);
    assert_eq!(
        rows.len(),
        frames.len(),
        "every example is innet's: {rows:?}"
    );
    let data: Vec<_> = frames
        .iter()
        .zip(&rows)
        .filter_map(|(f, r)| check(f, r))
        .collect();
    assert_eq!(rows.len() - data.len(), 3, "query, notify, kill");
    assert!(data.contains(&(Op::Minloc, Dtype::I64)), "{data:?}");
}

/// Sends SIGINT to tshark so that it finishes its file.
fn interrupt(child: &std::process::Child) {
    // SAFETY: plain kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
}

#[test]
fn the_dissector_reads_a_live_jobs_packets_as_the_codec_does() {
    let topo = Topology::new(Shape::small());
    learn_hosts(&topo);
    let _daemons = daemons_on(&topo, &[]);
    let file = std::env::temp_dir().join(format!("innet-live-{}.pcap", unique_id()));
    let h = &topo.hosts[0];
    let mut capture =
        h.ns.command("tshark")
            .args(["-i", "eth0", "-F", "pcap", "-f", "udp port 4791", "-w"])
            .arg(&file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tshark");
    // tshark takes a moment to open the interface.
    innet_lab::daemons::wait_until("the capture file", Duration::from_secs(20), || {
        file.exists()
    });
    std::thread::sleep(Duration::from_millis(500));
    let cases = [
        (Op::Sum, Dtype::I32, 100),
        (Op::Sum, Dtype::F64, 40),
        (Op::Minloc, Dtype::I32, 10),
        (Op::Max, Dtype::U16, 30),
        (Op::Sum, Dtype::F32, 20),
        (Op::Prod, Dtype::F16, 20),
        (Op::Min, Dtype::BF16, 20),
    ];
    run_job(
        &topo,
        Layout::new(4, 1, 1).expect("layout"),
        Mode::IncNode,
        |_| {},
        |comm| {
            for (k, &(op, dtype, count)) in cases.iter().enumerate() {
                checked_allreduce(comm, k, op, dtype, count);
            }
        },
    );
    std::thread::sleep(Duration::from_millis(300));
    interrupt(&capture);
    let status = capture.wait().expect("tshark exits");
    assert!(
        status.success() || status.code().is_none(),
        "tshark: {status}"
    );
    let frames = innet::pcap::read(&std::fs::read(&file).expect("capture")).expect("pcap");
    let rows = dissected(&file);
    let _ = std::fs::remove_file(&file);
    assert_eq!(rows.len(), frames.len(), "every captured frame is innet's");
    let data: Vec<_> = frames
        .iter()
        .zip(&rows)
        .filter_map(|(f, r)| check(f, r))
        .collect();
    // The handshake's query and notify, and each case's contribution and result.
    assert!(rows.len() - data.len() >= 2, "control frames: {rows:?}");
    for &(op, dtype, _) in &cases {
        assert!(
            data.iter().filter(|&&d| d == (op, dtype)).count() >= 2,
            "{op:?}/{dtype:?}: its contribution and result: {data:?}"
        );
    }
}
