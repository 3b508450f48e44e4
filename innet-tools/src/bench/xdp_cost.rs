//! What one packet costs in the XDP programs, through `BPF_PROG_TEST_RUN` (no NIC, no
//! namespaces): the kernel times the program runs itself, so no syscall is in the figures.
//!
//! Two methods, each with its own empty-program baseline on the same frame:
//! - `repeat`: one run with a repeat count, for the stateless cases (the empty program, the
//!   classifier on INC data of a group this switch does not hold);
//! - `per-frame`: aggregation changes state, so a repeated frame would be a duplicate. Each
//!   round's frames are distinct (child 0 opens the round, child 1 adds without completing,
//!   child 2 completes it at the root, which fans the result out through the devmap), each
//!   run once and timed by the kernel; the figures are averages over the rounds. Each
//!   completion's result is checked against the reference.

use std::{net::Ipv4Addr, time::Duration};

use aya::programs::ProgramInfo;
use innet_common::{
    maps::{PROG_AGG, PROG_EGRESS, PROG_EMIT, PROG_NIC, PROG_PASS, PROG_SWITCH},
    proto::{Dtype, Op},
    wire::PAYLOAD_OFFSET,
};

use super::{ProgramRow, ThroughputRow, XdpRow};
use innet_lab::bpf::{Loaded, XDP_DROP, XDP_PASS, XDP_REDIRECT, data_frame, install_root};

/// Payload sizes of the per-packet table: one element, a cache line, the switch paper's 256 B, a
/// full MTU-sized packet.
pub const PAYLOADS: [usize; 4] = [4, 64, 256, 1408];
/// Children per group in the per-frame cases: one opens, one adds, one completes.
const CHILDREN: usize = 3;
/// Group ids: the measured group, and a group the switch does not hold.
const GROUP: u32 = 0x00be_0001;
const UNKNOWN_GROUP: u32 = 0x00be_ffee;
/// Switch capacity: the throughput runs fill it. 256 groups × 16 slots of 8 KiB keep the
/// group maps under the loader's 1 GiB limit (1024 groups would take 2.4 GiB).
const CAPACITY: u32 = 256;

/// Run counts.
#[derive(Clone, Copy, Debug)]
pub struct Runs {
    /// Repeat count of the stateless cases.
    pub repeat: u32,
    /// Rounds of the per-frame cases (and of the throughput runs).
    pub rounds: u32,
    /// Group counts of the throughput runs.
    pub groups: &'static [usize],
}

/// The switch's object, loaded with room for `CAPACITY` groups.
pub struct Bench(Loaded);

fn child_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(0x0a09_0001 + i as u32)
}

/// `count` SUM elements of `dtype` (int32, float32, float64 or float16), each `v`,
/// big-endian.
fn elements(dtype: Dtype, v: usize, count: usize) -> Vec<u8> {
    let one: Vec<u8> = match dtype {
        Dtype::F16 => innet_client::half::f16::from_f64(v as f64)
            .to_be_bytes()
            .to_vec(),
        Dtype::F32 => (v as f32).to_be_bytes().to_vec(),
        Dtype::F64 => (v as f64).to_be_bytes().to_vec(),
        _ => (v as i32).to_be_bytes().to_vec(),
    };
    one.repeat(count)
}

/// Child `i`'s contribution of `round` to group `id`: `bytes` of int32 SUM, value `i + 1`.
fn contribution(id: u32, i: usize, round: u32, bytes: usize) -> Vec<u8> {
    typed_contribution(id, i, round, bytes, Dtype::I32)
}

/// As [`contribution`], of `dtype` elements.
fn typed_contribution(id: u32, i: usize, round: u32, bytes: usize, dtype: Dtype) -> Vec<u8> {
    let body = elements(dtype, i + 1, bytes / dtype.width());
    data_frame(
        id,
        i as u32,
        (child_ip(i), [2, 0, 0, 0, (i >> 8) as u8, i as u8]),
        (child_ip(i + 1), [2, 0, 0, 1, (i >> 8) as u8, i as u8]),
        round,
        (Op::Sum, dtype),
        &body,
    )
}

impl Bench {
    /// Loads every program (the switch's object, capacity `CAPACITY`).
    #[must_use]
    pub fn load() -> Self {
        Self(Loaded::switch(CAPACITY))
    }

    fn run(&self, prog: &str, frame: &[u8], repeat: u32) -> (u32, Duration, Vec<u8>) {
        self.0.run_timed(prog, frame, repeat)
    }

    /// Installs group `id` as a root TOR with `n` children (behind the test device).
    fn install(&mut self, id: u32, n: usize, first_child: usize) {
        let children = first_child..first_child + n;
        install_root(
            &mut self.0.groups,
            id,
            children.map(|i| (child_ip(i), i as u32)),
        );
    }

    /// The per-packet table: every case at every payload size of [`PAYLOADS`].
    pub fn per_packet(&mut self, runs: Runs) -> Vec<XdpRow> {
        let mut rows = vec![];
        for bytes in PAYLOADS {
            let frame = contribution(UNKNOWN_GROUP, 0, 0, bytes);
            rows.extend(self.passed_on(
                ["no-op (XDP_PASS)", "classifier (INC data, group not here)"],
                (&frame, bytes),
                runs,
            ));
            rows.extend(self.rounds(bytes, runs.rounds, Dtype::I32));
            for dtype in [Dtype::F32, Dtype::F64, Dtype::F16]
                .into_iter()
                .filter(|d| bytes >= d.width())
            {
                // The no-op row was measured with the int32 rounds.
                rows.extend(self.rounds(bytes, runs.rounds, dtype).into_iter().skip(1));
            }
        }
        // What innet costs the ordinary traffic a switch port carries: a full-size TCP frame.
        let tcp = tcp_frame(BYSTANDER_TCP_PAYLOAD);
        rows.extend(self.passed_on(
            [
                "no-op on a TCP frame (1514 B)",
                "classifier (bystander TCP, 1514 B)",
            ],
            (&tcp, BYSTANDER_TCP_PAYLOAD),
            runs,
        ));
        rows
    }

    /// A frame the switch passes on, through the empty program and then the classifier
    /// (its ratio to the empty program's run): the rows named `cases`.
    fn passed_on(&self, cases: [&str; 2], frame: (&[u8], usize), runs: Runs) -> [XdpRow; 2] {
        let noop = self.repeated(cases[0], PROG_PASS, frame, XDP_PASS, runs, None);
        let noop_ns = noop.ns_per_pkt;
        let classifier = self.repeated(cases[1], PROG_SWITCH, frame, XDP_PASS, runs, Some(noop_ns));
        [noop, classifier]
    }

    fn repeated(
        &self,
        case: &str,
        prog: &str,
        (frame, payload_bytes): (&[u8], usize),
        expect: u32,
        runs: Runs,
        noop_ns: Option<f64>,
    ) -> XdpRow {
        // The kernel's mean over the repeats (whole ns). Timed from userspace, the call took
        // milliseconds longer in all (measured), which the kernel's timer leaves out.
        let (verdict, per_run, _) = self.run(prog, frame, runs.repeat);
        let ns = per_run.as_nanos() as f64;
        row(
            case,
            prog,
            payload_bytes,
            "repeat",
            u64::from(runs.repeat),
            ns,
            noop_ns.unwrap_or(ns),
            u64::from(verdict != expect),
        )
    }

    /// The per-frame cases: `rounds` rounds of three children adding `dtype`s; the empty
    /// program runs on the same frames for the baseline. Float rounds stash each
    /// contribution and fold them in child order at the last one.
    fn rounds(&mut self, bytes: usize, rounds: u32, dtype: Dtype) -> Vec<XdpRow> {
        self.install(GROUP, CHILDREN, 0);
        let expected = elements(dtype, (1..=CHILDREN).sum(), bytes / dtype.width());
        let (mut noop, mut add, mut complete) =
            (Timer::default(), Timer::default(), Timer::default());
        for r in 0..rounds {
            let round = r;
            let frames: Vec<Vec<u8>> = (0..CHILDREN)
                .map(|i| typed_contribution(GROUP, i, round, bytes, dtype))
                .collect();
            let (v, t, _) = self.run(PROG_PASS, &frames[1], 1);
            noop.add(t, v != XDP_PASS);
            let (v, _, _) = self.run(PROG_SWITCH, &frames[0], 1);
            assert_eq!(v, XDP_DROP, "child 0 opens round {round}");
            let (v, t, _) = self.run(PROG_SWITCH, &frames[1], 1);
            add.add(t, v != XDP_DROP);
            let (v, t, out) = self.run(PROG_SWITCH, &frames[2], 1);
            let result_ok = out.get(PAYLOAD_OFFSET..PAYLOAD_OFFSET + bytes) == Some(&expected[..]);
            complete.add(t, v != XDP_REDIRECT || !result_ok);
        }
        let noop_ns = noop.mean_ns();
        let (add_case, complete_case) = if dtype.is_float() {
            (
                format!("{} SUM: stash, round not complete", dtype.name()),
                format!("{} SUM: fold 3 in order + fan-out (root)", dtype.name()),
            )
        } else {
            (
                "aggregate, round not complete".to_owned(),
                "aggregate, completing + fan-out (root)".to_owned(),
            )
        };
        [
            ("no-op (XDP_PASS)".to_owned(), PROG_PASS, noop),
            (add_case, PROG_SWITCH, add),
            (complete_case, PROG_SWITCH, complete),
        ]
        .into_iter()
        .map(|(case, prog, t)| {
            row(
                &case,
                prog,
                bytes,
                "per-frame",
                t.runs,
                t.mean_ns(),
                noop_ns,
                t.errors,
            )
        })
        .collect()
    }

    /// Rounds per second of one core with `groups` groups of 2 children, rounds interleaved
    /// across the groups (each round: one contribution opens, the other completes).
    pub fn throughput(&mut self, runs: Runs, payload: usize) -> Vec<ThroughputRow> {
        // The whole capacity is for the throughput groups.
        let _ = self.0.groups.remove(GROUP);
        let mut rows = vec![];
        for &groups in runs.groups {
            // Ids ending in 0xff are reserved (control packets' comm_id).
            let ids: Vec<u32> = (0x00c0_0000..)
                .filter(|id| id & 0xff != 0xff)
                .take(groups)
                .collect();
            for (g, &id) in ids.iter().enumerate() {
                self.install(id, 2, 2 * g);
            }
            let per_group = (runs.rounds as usize / groups).max(1);
            let mut t = Timer::default();
            for r in 0..per_group {
                for (g, &id) in ids.iter().enumerate() {
                    for (c, expect) in [(0, XDP_DROP), (1, XDP_REDIRECT)] {
                        let frame = contribution(id, 2 * g + c, r as u32, payload);
                        let (v, d, _) = self.run(PROG_SWITCH, &frame, 1);
                        t.add(d, v != expect);
                    }
                }
            }
            for &id in &ids {
                self.0.groups.remove(id).expect("remove a bench group");
            }
            let rounds = (per_group * groups) as u64;
            let secs = t.total_ns / 1e9;
            rows.push(ThroughputRow {
                groups,
                children: 2,
                payload_bytes: payload,
                rounds,
                rounds_per_sec: rounds as f64 / secs,
                mpps_per_core: t.runs as f64 / secs / 1e6,
                errors: t.errors,
            });
        }
        rows
    }

    /// Sizes and verifier instruction counts of the programs on the packet path.
    #[must_use]
    pub fn programs(&self) -> Vec<ProgramRow> {
        [
            PROG_SWITCH,
            PROG_AGG,
            "fold_sum_i32",
            "fold_minloc_i64",
            "fold_sum_f32",
            "fold_sum_f64",
            "fold_maxloc_f64",
            PROG_EMIT,
            PROG_EGRESS,
            PROG_NIC,
            PROG_PASS,
        ]
        .into_iter()
        .map(|name| {
            // `innet_pass`, the baseline, lives in the lab's object.
            let info: ProgramInfo = self
                .0
                .ebpf
                .program(name)
                .or_else(|| self.0.lab.program(name))
                .unwrap_or_else(|| panic!("{name}"))
                .info()
                .expect("program info");
            ProgramRow {
                name: name.into(),
                xlated_bytes: info.size_translated().unwrap_or(0),
                jited_bytes: info.size_jitted(),
                verified_insns: info.verified_instruction_count().unwrap_or(0),
            }
        })
        .collect()
    }
}

#[expect(
    clippy::too_many_arguments,
    reason = "one row's fields, named at each call"
)]
fn row(
    case: &str,
    prog: &str,
    payload_bytes: usize,
    method: &str,
    runs: u64,
    ns: f64,
    noop_ns: f64,
    errors: u64,
) -> XdpRow {
    XdpRow {
        case: case.into(),
        program: prog.into(),
        payload_bytes,
        method: method.into(),
        runs,
        ns_per_pkt: ns,
        mpps_per_core: 1e3 / ns,
        ratio_to_noop: ns / noop_ns,
        errors,
    }
}

/// Sums kernel-timed runs.
#[derive(Default)]
struct Timer {
    runs: u64,
    total_ns: f64,
    errors: u64,
}

impl Timer {
    fn add(&mut self, d: Duration, wrong: bool) {
        self.runs += 1;
        self.total_ns += d.as_nanos() as f64;
        self.errors += u64::from(wrong);
    }

    fn mean_ns(&self) -> f64 {
        self.total_ns / self.runs.max(1) as f64
    }
}

/// TCP payload of a full-size frame on a 1500 B MTU.
const BYSTANDER_TCP_PAYLOAD: usize = 1460;

/// An Ethernet/IPv4/TCP frame carrying `payload` bytes: ordinary traffic to innet.
fn tcp_frame(payload: usize) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 20 + 20 + payload];
    f[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((20 + 20 + payload) as u16).to_be_bytes());
    ip[8] = 64;
    ip[9] = 6; // TCP
    ip[12..16].copy_from_slice(&[10, 0, 0, 1]);
    ip[16..20].copy_from_slice(&[10, 0, 0, 2]);
    let sum = innet_common::codec::ipv4_checksum(ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    let tcp = &mut f[34..54];
    tcp[0..2].copy_from_slice(&5201u16.to_be_bytes());
    tcp[2..4].copy_from_slice(&40000u16.to_be_bytes());
    tcp[12] = 5 << 4; // data offset: 20 B
    tcp[13] = 0x10; // ACK
    f
}
