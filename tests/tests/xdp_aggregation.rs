//! The switch data plane through BPF_PROG_TEST_RUN (tail calls included): children's
//! contributions go into a slot, the last one completes it, a retransmission after
//! completion is answered from the saved result with a rewritten, ICRC-valid frame. Every
//! op × integer type is checked against the host reference on random and edge values.

use std::{net::Ipv4Addr, sync::Mutex};

use aya::programs::{TestRun as _, TestRunOptions, Xdp};
use half::{bf16, f16};
use innet::{
    group_maps::{ChildSpec, GroupSpec, Role},
    loader::Sizing,
};
use innet_common::{
    codec::parse,
    group::{
        DEFAULT_WINDOW as WINDOW, PENDING_RESULT, SLOT_AGGREGATING, SLOT_COMPLETE, SLOT_EMPTY,
        SLOT_FOLDING,
    },
    maps::PROG_SWITCH,
    proto::{BTH_FLAG_RESULT, Dtype, MAX_PAYLOAD_BYTES, Op, element_bytes},
    reduce::{reduce_all, same_result},
    stats::GroupStats,
    validate::Verdict,
    wire::{PAYLOAD_OFFSET, is_handoff_mac},
};
use innet_lab::{
    Rng,
    bpf::{
        LO, Loaded, XDP_DROP, XDP_PASS, XDP_REDIRECT, XDP_TX, data_frame, install_root, with_loaded,
    },
};

type Switch = Loaded;

/// One loaded object serves every test, one test at a time.
static SWITCH: Mutex<Option<Switch>> = Mutex::new(None);

fn with_switch<R>(f: impl FnOnce(&mut Switch) -> R) -> R {
    with_loaded(&SWITCH, f)
}

fn child_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 9, 0, i as u8 + 1)
}

fn install(sw: &mut Switch, id: u32, n: usize) {
    install_root(&mut sw.groups, id, (0..n).map(|i| (child_ip(i), i as u32)));
}

/// Child `i`'s packet of whole round `round` (its PSN), addressed (ring) to child `i + 1`.
fn contribution(
    id: u32,
    i: usize,
    n: usize,
    round: u32,
    op: Op,
    dtype: Dtype,
    body: &[u8],
) -> Vec<u8> {
    let next = (i + 1) % n;
    data_frame(
        id,
        i as u32,
        (child_ip(i), [2, 0, 0, 0, 0, i as u8 + 1]),
        (child_ip(next), [2, 0, 0, 0, 0, next as u8 + 1]),
        round,
        (op, dtype),
        body,
    )
}

fn run(sw: &Switch, frame: &[u8]) -> (u32, Vec<u8>) {
    sw.run(PROG_SWITCH, frame)
}

fn stats(sw: &Switch, id: u32) -> GroupStats {
    sw.groups.get(id).expect("group").stats
}

/// Random bytes, with every fourth element an edge value (0, all ones, min, max).
fn body(rng: &mut Rng, op: Op, dtype: Dtype, count: usize) -> Vec<u8> {
    let size = element_bytes(op, dtype);
    let w = dtype.width();
    let mut b = vec![0u8; count * size];
    for e in b.chunks_exact_mut(size) {
        let r = rng.next_u64();
        let v = r.to_be_bytes();
        e[..w].copy_from_slice(&v[8 - w..]);
        match r % 16 {
            0 => e[..w].fill(0),
            1 => e[..w].fill(0xff),
            2 => {
                e[..w].fill(0);
                e[0] = 0x80;
            }
            3 => {
                e[..w].fill(0xff);
                e[0] = 0x7f;
            }
            _ => {}
        }
        if size > w {
            // Few distinct locations and values, so MINLOC/MAXLOC ties happen.
            e[w..].copy_from_slice(&((r >> 40) as i32 % 4).to_be_bytes());
            if r.is_multiple_of(3) {
                e[..w].fill(0);
            }
        }
    }
    b
}

/// The verdict of a packet that completes a round at the root, by its payload `body`: a
/// devmap broadcast (`XDP_REDIRECT`) for a frame in one buffer; a frame over one buffer
/// (`BPF_PROG_TEST_RUN` puts 3520 B in the first: a page less headroom and
/// `skb_shared_info`) goes up the stack (`XDP_PASS`), where the tc fan-out sends the
/// copies, since a devmap broadcast refuses multi-buffer frames.
fn broadcast_verdict(body: &[u8]) -> u32 {
    if PAYLOAD_OFFSET + body.len() + 4 > 3520 {
        XDP_PASS
    } else {
        XDP_REDIRECT
    }
}

/// The frame a test run returned; a result handed to the tc fan-out (a multi-buffer frame,
/// passed up the stack) must carry the hand-off mark as its destination MAC.
fn result_frame(action: u32, out: &[u8]) -> &[u8] {
    if action == XDP_PASS {
        let dst: [u8; 6] = out[..6].try_into().expect("a frame");
        assert!(
            is_handoff_mac(&dst),
            "a result passed to tc carries the mark: {dst:02x?}"
        );
    }
    out
}

/// One round: children 0..n send; all but the last are consumed, the last completes the
/// slot (broadcast, payload = result); child 0 retransmits and gets the result back.
fn round_trip(
    sw: &mut Switch,
    id: u32,
    n: usize,
    round: u32,
    op: Op,
    dtype: Dtype,
    bodies: &[Vec<u8>],
) {
    let expected = reduce_all(op, dtype, bodies).expect("reference");
    let what = format!("{op:?} {dtype:?} n={n} round {round}");
    for (i, b) in bodies.iter().enumerate() {
        let (action, out) = run(sw, &contribution(id, i, n, round, op, dtype, b));
        let out = result_frame(action, &out);
        if i + 1 < n {
            assert_eq!(action, XDP_DROP, "{what}: child {i} is consumed");
        } else {
            assert_eq!(
                action,
                broadcast_verdict(b),
                "{what}: the last child completes (broadcast)"
            );
            assert!(
                same_result(
                    op,
                    dtype,
                    &out[PAYLOAD_OFFSET..PAYLOAD_OFFSET + expected.len()],
                    &expected
                ),
                "{what}: result"
            );
        }
    }
    // A retransmission after completion is answered from the slot, addressed to the sender.
    let (action, out) = run(sw, &contribution(id, 0, n, round, op, dtype, &bodies[0]));
    assert_eq!(action, XDP_TX, "{what}: reply");
    let p =
        parse(&out).unwrap_or_else(|e| panic!("{what}: the reply is a valid RoCEv2 frame: {e}"));
    assert!(
        same_result(op, dtype, p.body, &expected),
        "{what}: reply carries the result"
    );
    assert!(matches!(p.verdict, Verdict::Data { .. }));
    assert_eq!(p.addr.dst_ip, child_ip(0), "{what}: reply goes to child 0");
    assert_eq!(
        p.addr.src_ip,
        child_ip(n - 1),
        "{what}: as its ring predecessor sent it"
    );
    assert_eq!(p.inc.req_id, round as u8);
    assert_eq!(
        p.bth.flags & BTH_FLAG_RESULT,
        BTH_FLAG_RESULT,
        "{what}: marked as a result"
    );
}

#[test]
fn every_op_and_type_matches_the_reference() {
    with_switch(|sw| {
        let id = 0x00a1_0001;
        install(sw, id, 3);
        let mut rng = Rng(0x5eed_0000_0000_0001);
        let mut round = 0u32;
        for op in Op::ALL {
            for dtype in Dtype::ALL.into_iter().filter(|d| op.defined_on(*d)) {
                let max = MAX_PAYLOAD_BYTES / element_bytes(op, dtype);
                for count in [1, 7, max] {
                    let bodies: Vec<Vec<u8>> =
                        (0..3).map(|_| body(&mut rng, op, dtype, count)).collect();
                    round_trip(sw, id, 3, round, op, dtype, &bodies);
                    round = round.wrapping_add(1);
                }
            }
        }
        let s = stats(sw, id);
        // Every op on 8 integer types, 6 ops on 2 float types, 4 on 2 half types, 3 counts
        // each.
        let rounds = (12 * 8 + 6 * 2 + 4 * 2) * 3;
        assert_eq!(s.completed, rounds, "{s:?}");
        assert_eq!(s.aggregated, rounds * 3);
        assert_eq!(s.replies, rounds);
        assert_eq!(s.duplicates, rounds);
        assert_eq!(s.rx, rounds * 4);
        assert_eq!(
            (s.stale, s.mismatch, s.not_member, s.unsupported),
            (0, 0, 0, 0)
        );
    });
}

#[test]
fn sixteen_children_and_thousands_of_rounds() {
    with_switch(|sw| {
        let id = 0x00a1_0002;
        install(sw, id, 16);
        let mut rng = Rng(0x5eed_0000_0000_0002);
        for r in 0..2000u32 {
            let (op, dtype) = [
                (Op::Sum, Dtype::I32),
                (Op::Max, Dtype::U64),
                (Op::Bxor, Dtype::U8),
            ][r as usize % 3];
            let bodies: Vec<Vec<u8>> = (0..16).map(|_| body(&mut rng, op, dtype, 32)).collect();
            round_trip(sw, id, 16, r, op, dtype, &bodies);
        }
        let s = stats(sw, id);
        assert_eq!(s.completed, 2000);
        assert_eq!(s.aggregated, 2000 * 16);
    });
}

#[test]
fn duplicates_stale_mismatch_and_strangers_never_touch_the_slot() {
    with_switch(|sw| {
        let id = 0x00a1_0003;
        install(sw, id, 3);
        let (op, dtype) = (Op::Sum, Dtype::I64);
        let b = |v: i64| innet_common::codec::encode_elements(dtype, &[v, v * 2], None);
        // Round 10: child 0 twice before completion — added once, second copy dropped.
        assert_eq!(
            run(sw, &contribution(id, 0, 3, 10, op, dtype, &b(1))).0,
            XDP_DROP
        );
        assert_eq!(
            run(sw, &contribution(id, 0, 3, 10, op, dtype, &b(1))).0,
            XDP_DROP
        );
        // Different op, type or count inside the round: rejected.
        assert_eq!(
            run(sw, &contribution(id, 1, 3, 10, Op::Max, dtype, &b(5))).0,
            XDP_DROP
        );
        assert_eq!(
            run(sw, &contribution(id, 1, 3, 10, op, Dtype::U64, &b(5))).0,
            XDP_DROP
        );
        assert_eq!(
            run(
                sw,
                &contribution(
                    id,
                    1,
                    3,
                    10,
                    op,
                    dtype,
                    &innet_common::codec::encode_elements(dtype, &[5], None)
                )
            )
            .0,
            XDP_DROP
        );
        // An op not defined on the type (bitwise AND of floats): no fold program exists,
        // so it never takes a slot.
        let floats = innet_common::codec::encode_elements(Dtype::F64, &[1, 2], None);
        assert_eq!(
            run(
                sw,
                &contribution(id, 1, 3, 11, Op::Band, Dtype::F64, &floats)
            )
            .0,
            XDP_DROP
        );
        assert_eq!(sw.groups.slot(id, 11).expect("slot").state, SLOT_EMPTY);
        // A stranger's packet: not a member.
        let mut stranger = contribution(id, 1, 3, 10, op, dtype, &b(100));
        stranger[26..30].copy_from_slice(&[10, 9, 9, 9]);
        assert_eq!(run(sw, &stranger).0, XDP_DROP);
        let before = sw.groups.slot(id, 10).expect("slot");
        assert_eq!(
            (before.arrived, before.bitmap),
            (1, 0b1),
            "only child 0 counted"
        );
        // Children 1 and 2 complete the round with 1 + 2 + 3.
        assert_eq!(
            run(sw, &contribution(id, 1, 3, 10, op, dtype, &b(2))).0,
            XDP_DROP
        );
        let (action, out) = run(sw, &contribution(id, 2, 3, 10, op, dtype, &b(3)));
        assert_eq!(action, XDP_REDIRECT);
        assert_eq!(&out[PAYLOAD_OFFSET..PAYLOAD_OFFSET + 16], &b(6)[..]);
        // Round 10 - WINDOW maps to the same slot but is older: stale.
        let older = 10u32.wrapping_sub(WINDOW) & 0x00ff_ffff;
        assert_eq!(
            run(sw, &contribution(id, 0, 3, older, op, dtype, &b(1))).0,
            XDP_DROP
        );
        // Round 10 + WINDOW takes the slot over; round 10's saved result is gone.
        assert_eq!(
            run(sw, &contribution(id, 0, 3, 10 + WINDOW, op, dtype, &b(7))).0,
            XDP_DROP
        );
        assert_eq!(
            run(sw, &contribution(id, 1, 3, 10, op, dtype, &b(2))).0,
            XDP_DROP,
            "stale now"
        );
        let s = stats(sw, id);
        assert_eq!(s.duplicates, 1, "{s:?}");
        assert_eq!(s.mismatch, 3, "{s:?}");
        assert_eq!(s.not_member, 1, "{s:?}");
        assert_eq!(s.unsupported, 1, "{s:?}");
        assert_eq!(s.stale, 2, "{s:?}");
        assert_eq!(s.completed, 1, "{s:?}");
        assert_eq!(s.aggregated, 4, "{s:?}");
    });
}

/// The kernel refuses a program past 1 M verified instructions, and loading the object
/// costs every attach (and every test fabric's switch) its verification time: each program
/// stays under a quarter of the limit and the object under 3 M in all. Payload loops run
/// under `bpf_loop`, walked once: before that, 8 KiB payloads took the emit program to
/// 942 k and the object to 18.2 M (20 s per attach).
#[test]
fn every_program_verifies_well_inside_the_kernels_limit() {
    with_switch(|sw| {
        let mut rows: Vec<(u32, String)> = sw
            .ebpf
            .programs()
            .map(|(name, p)| {
                let info = p.info().expect("program info");
                let insns = info
                    .verified_instruction_count()
                    .expect("kernel reports it");
                (insns, name.to_owned())
            })
            .collect();
        rows.sort();
        let total: u64 = rows.iter().map(|(n, _)| u64::from(*n)).sum();
        for (n, name) in &rows {
            println!("{n:>9} {name}");
        }
        println!("{total:>9} in all, {} programs", rows.len());
        let (most, name) = rows.last().expect("programs");
        assert!(*most < 250_000, "{name} verified {most} instructions");
        assert!(
            total < 3_000_000,
            "the object verified {total} instructions"
        );
    });
}

/// Payloads are copied outside the slot's lock, and the fold writes the slot's data: a
/// newer round never takes a slot while another CPU's copy is in flight or the round is
/// being folded (its packet is dropped as `busy` and its sender retransmits), and the last
/// input does not start the fold while an earlier one is still being copied in. The
/// in-between states are staged by writing the slot, as another CPU would leave it.
#[test]
fn a_slot_with_copies_in_flight_or_a_fold_is_not_taken_by_a_newer_round() {
    with_switch(|sw| {
        let id = 0x00a1_0005;
        install(sw, id, 3);
        let (op, dtype) = (Op::Sum, Dtype::I32);
        let b = |v: i64| innet_common::codec::encode_elements(dtype, &[v], None);
        let newer = 10 + WINDOW;
        assert_eq!(
            run(sw, &contribution(id, 0, 3, 10, op, dtype, &b(1))).0,
            XDP_DROP
        );
        // Child 1's contribution claimed, its copy still running on another CPU.
        let mut slot = sw.groups.slot(id, 10).expect("slot");
        (slot.bitmap, slot.arrived, slot.pending) = (0b11, 2, 0b10);
        sw.groups.write_slot(id, 10, &slot).expect("stage");
        assert_eq!(
            run(sw, &contribution(id, 0, 3, newer, op, dtype, &b(9))).0,
            XDP_DROP
        );
        // The last input settles, but child 1's copy is not in: no fold yet.
        assert_eq!(
            run(sw, &contribution(id, 2, 3, 10, op, dtype, &b(3))).0,
            XDP_DROP
        );
        let after = sw.groups.slot(id, 10).expect("slot");
        assert_eq!(
            (
                after.round,
                after.state,
                after.arrived,
                after.bitmap,
                after.pending
            ),
            (10, SLOT_AGGREGATING, 3, 0b111, 0b10),
            "the round keeps its slot and waits for child 1's copy"
        );
        // The fold running: a newer round still waits.
        let mut folding = after;
        (folding.pending, folding.state) = (0, SLOT_FOLDING);
        sw.groups.write_slot(id, 10, &folding).expect("stage");
        assert_eq!(
            run(sw, &contribution(id, 0, 3, newer, op, dtype, &b(9))).0,
            XDP_DROP
        );
        assert_eq!(sw.groups.slot(id, 10).expect("slot").round, 10);
        let s = stats(sw, id);
        assert_eq!((s.busy, s.evicted, s.completed), (2, 0, 0), "{s:?}");
        // Once the slot is settled, the newer round takes it over as before.
        let mut done = folding;
        done.state = SLOT_COMPLETE;
        sw.groups.write_slot(id, 10, &done).expect("stage");
        assert_eq!(
            run(sw, &contribution(id, 0, 3, newer, op, dtype, &b(9))).0,
            XDP_DROP
        );
        let taken = sw.groups.slot(id, newer as u8).expect("slot");
        assert_eq!((taken.psn, taken.arrived), (newer, 1));
    });
}

/// Attack (issue 44): contributions left in a slot by a round whose collective was
/// abandoned (no result, no new set-up) must not count for the round 256 later, which maps
/// to the same slot with the same `req_id`: the slot keeps the whole round (the PSN). A late
/// packet of the abandoned round is stale then, and a packet whose PSN and `req_id`
/// disagree is dropped as a mismatch.
#[test]
fn an_abandoned_rounds_contributions_never_complete_a_later_round() {
    with_switch(|sw| {
        let id = 0x00a1_0007;
        install(sw, id, 2);
        let (op, dtype) = (Op::Sum, Dtype::I64);
        let b = |v: i64| innet_common::codec::encode_elements(dtype, &[v, v * 2], None);
        // Round 7: child 0 only, then the collective is abandoned.
        assert_eq!(
            run(sw, &contribution(id, 0, 2, 7, op, dtype, &b(1))).0,
            XDP_DROP
        );
        // Round 7 + 256 (the same `req_id`): child 1 starts it afresh, not completing it.
        let later = 7 + 256;
        assert_eq!(
            run(sw, &contribution(id, 1, 2, later, op, dtype, &b(2))).0,
            XDP_DROP,
            "not completed with the abandoned round's data"
        );
        let slot = sw.groups.slot(id, 7).expect("slot");
        assert_eq!(
            (slot.psn, slot.arrived, slot.bitmap),
            (later, 1, 0b10),
            "only child 1 counted"
        );
        // Child 0's own contribution to it completes it with the right sum.
        let (action, out) = run(sw, &contribution(id, 0, 2, later, op, dtype, &b(5)));
        assert_eq!(action, XDP_REDIRECT);
        assert_eq!(&out[PAYLOAD_OFFSET..PAYLOAD_OFFSET + 16], &b(7)[..]);
        // A late packet of the abandoned round: stale, the result stays.
        assert_eq!(
            run(sw, &contribution(id, 1, 2, 7, op, dtype, &b(9))).0,
            XDP_DROP
        );
        let kept = sw.groups.slot(id, 7).expect("slot");
        assert_eq!((kept.psn, kept.state), (later, SLOT_COMPLETE));
        // A PSN that names another round than `req_id` (9): dropped, nothing counted.
        let before = sw.groups.slot(id, 9).expect("slot");
        // The BTH's PSN: after Ethernet, IPv4, UDP and the BTH's first 9 bytes.
        let bth_psn: usize = 14 + 20 + 8 + 9;
        let mut odd = contribution(id, 0, 2, 9, op, dtype, &b(1));
        odd[bth_psn + 2] = 10;
        assert_eq!(run(sw, &odd).0, XDP_DROP);
        let after = sw.groups.slot(id, 9).expect("slot");
        assert_eq!(
            (after.arrived, after.bitmap),
            (before.arrived, before.bitmap)
        );
        let s = stats(sw, id);
        assert_eq!((s.stale, s.mismatch, s.completed), (1, 1, 1), "{s:?}");
    });
}

/// A switch attached with `--window 64` keeps 64 rounds of a group apart: a round 16 (the
/// default window) later takes a slot of its own and leaves the earlier result to answer
/// retransmissions; only the round 64 later takes its slot over.
#[test]
fn a_wider_window_keeps_more_rounds_apart() {
    let window = 64u8;
    let mut sw = Loaded::sized(Sizing {
        capacity: 4,
        window: u32::from(window),
    });
    assert_eq!(sw.groups.window(), u32::from(window));
    let (id, op, dtype) = (0x00ab_cdef, Op::Sum, Dtype::I32);
    let b = |v: i64| innet_common::codec::encode_elements(dtype, &[v; 4], None);
    install(&mut sw, id, 2);
    let complete = |sw: &Switch, round: u32, v: i64| {
        assert_eq!(
            run(sw, &contribution(id, 0, 2, round, op, dtype, &b(v))).0,
            XDP_DROP
        );
        let (action, out) = run(sw, &contribution(id, 1, 2, round, op, dtype, &b(v)));
        assert_eq!(action, XDP_REDIRECT, "round {round} completes");
        assert_eq!(&out[PAYLOAD_OFFSET..PAYLOAD_OFFSET + 16], &b(2 * v)[..]);
    };
    complete(&sw, 3, 1);
    complete(&sw, 3 + WINDOW, 5);
    let kept = sw.groups.slot(id, 3).expect("slot");
    assert_eq!((kept.round, kept.state), (3, SLOT_COMPLETE), "round 3 kept");
    // Child 0 asks for round 3 again: answered from the saved result.
    let (action, out) = run(&sw, &contribution(id, 0, 2, 3, op, dtype, &b(1)));
    assert_ne!(action, XDP_DROP, "a retransmission of round 3 is answered");
    assert_eq!(&out[PAYLOAD_OFFSET..PAYLOAD_OFFSET + 16], &b(2)[..]);
    // Round 3 + 64 shares round 3's slot and, newer, takes it over.
    complete(&sw, 3 + u32::from(window), 7);
    assert_eq!(sw.groups.slot(id, 3).expect("slot").round, 3 + window);
    assert_eq!(stats(&sw, id).completed, 3);
}

#[test]
fn groups_are_isolated_and_capacity_is_enforced() {
    with_switch(|sw| {
        for id in 0x00b0_0001..0x00b0_0009 {
            let _ = sw.groups.remove(id);
        }
        let existing = sw.groups.list().expect("list").len();
        let cap = sw.groups.capacity() as usize;
        let ids: Vec<u32> = (0..(cap - existing) as u32)
            .map(|i| 0x00b0_0001 + i)
            .collect();
        for &id in &ids {
            install(sw, id, 2);
        }
        let err = sw.groups.install(&GroupSpec {
            id: 0x00b0_00ff - 1,
            role: Role::Tor,
            parent: None,
            own_rank: 0,
            mrr: None,
            children: vec![ChildSpec {
                ip: child_ip(0),
                ifindex: LO,
                rank: 0,
            }],
        });
        assert!(
            matches!(err, Err(innet::Error::CapacityFull { .. })),
            "{err:?}"
        );
        // Interleave two groups' contributions for the same round: each gets its own sum.
        let (g1, g2) = (ids[0], ids[1]);
        let one = |v: i64| innet_common::codec::encode_elements(Dtype::I32, &[v], None);
        assert_eq!(
            run(sw, &contribution(g1, 0, 2, 5, Op::Sum, Dtype::I32, &one(1))).0,
            XDP_DROP
        );
        assert_eq!(
            run(
                sw,
                &contribution(g2, 0, 2, 5, Op::Sum, Dtype::I32, &one(100))
            )
            .0,
            XDP_DROP
        );
        let (a1, o1) = run(sw, &contribution(g1, 1, 2, 5, Op::Sum, Dtype::I32, &one(2)));
        let (a2, o2) = run(
            sw,
            &contribution(g2, 1, 2, 5, Op::Sum, Dtype::I32, &one(200)),
        );
        assert_eq!((a1, a2), (XDP_REDIRECT, XDP_REDIRECT));
        assert_eq!(&o1[PAYLOAD_OFFSET..PAYLOAD_OFFSET + 4], &one(3)[..]);
        assert_eq!(&o2[PAYLOAD_OFFSET..PAYLOAD_OFFSET + 4], &one(300)[..]);
        // Removing frees the index for reuse.
        for &id in &ids {
            sw.groups.remove(id).expect("remove");
        }
        assert!(matches!(
            sw.groups.remove(ids[0]),
            Err(innet::Error::NoSuchGroup { .. })
        ));
    });
}

/// `xdp_md` for BPF_PROG_TEST_RUN's `ctx_in`: the frame spans `0..len` (the kernel takes
/// the length from `data_end`) and arrives on `ingress_ifindex`.
fn xdp_md(len: usize, ingress_ifindex: u32) -> [u8; 24] {
    let mut md = [0u8; 24];
    md[4..8].copy_from_slice(&(len as u32).to_ne_bytes());
    md[12..16].copy_from_slice(&ingress_ifindex.to_ne_bytes());
    md
}

fn run_on(sw: &Switch, frame: &[u8], ingress: u32) -> (u32, Vec<u8>) {
    let prog: &Xdp = sw
        .ebpf
        .program(PROG_SWITCH)
        .expect("program")
        .try_into()
        .expect("xdp");
    let mut out = vec![0u8; frame.len() + 64];
    let md = xdp_md(frame.len(), ingress);
    let r = prog
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ctx_in: Some(&md),
            ..TestRunOptions::new()
        })
        .expect("test_run");
    out.truncate(r.data_size_out as usize);
    (r.return_value, out)
}

/// A non-root TOR: the completing contribution goes up readdressed to the parent; a
/// retransmission while waiting resends it; the parent's result completes the slot and is
/// broadcast; a later retransmission gets the result as a reply.
#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario, step by step along a round's life"
)]
fn non_root_sends_up_resends_and_takes_the_result_from_its_parent() {
    use innet::group_maps::ParentSpec;
    use innet_lab::NetNs;
    let ns = NetNs::new("agg");
    ns.ip(&[
        "link", "add", "down0", "type", "veth", "peer", "name", "up0",
    ]);
    for dev in ["down0", "up0"] {
        ns.ip(&["link", "set", dev, "up"]);
    }
    let index = |dev: &str| -> u32 {
        let out = ns.ip(&["-j", "link", "show", dev]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ip -j");
        v[0]["ifindex"].as_u64().expect("ifindex") as u32
    };
    let (down, up) = (index("down0"), index("up0"));
    let parent_ip = Ipv4Addr::new(10, 9, 250, 1);
    let own_ip = Ipv4Addr::new(10, 9, 200, 1);
    with_switch(|sw| {
        let id = 0x00a1_0004;
        let _ = sw.groups.remove(id);
        let children = (0..2)
            .map(|i| ChildSpec {
                ip: child_ip(i),
                ifindex: down,
                rank: i as u32,
            })
            .collect();
        let parent = Some(ParentSpec {
            ifindex: up,
            own_mac: [2, 0, 0, 0, 0, 0xaa],
            own_ip,
            mac: [2, 0, 0, 0, 0, 0xbb],
            ip: parent_ip,
        });
        sw.groups
            .install(&GroupSpec {
                id,
                role: Role::Tor,
                parent,
                own_rank: 7,
                mrr: None,
                children,
            })
            .expect("install");
        let (op, dtype) = (Op::Sum, Dtype::U16);
        let enc = |v: &[i64]| innet_common::codec::encode_elements(dtype, v, None);
        ns.run(|| {
            assert_eq!(
                run_on(
                    sw,
                    &contribution(id, 0, 2, 3, op, dtype, &enc(&[1, 2])),
                    down
                )
                .0,
                XDP_DROP
            );
            let (action, out) = run_on(
                sw,
                &contribution(id, 1, 2, 3, op, dtype, &enc(&[10, 20])),
                down,
            );
            assert_eq!(action, XDP_REDIRECT, "the partial goes up");
            let p = parse(&out).expect("the up packet is a valid RoCEv2 frame");
            assert_eq!((p.addr.src_ip, p.addr.dst_ip), (own_ip, parent_ip));
            assert_eq!(
                (p.addr.src_mac, p.addr.dst_mac),
                ([2, 0, 0, 0, 0, 0xaa], [2, 0, 0, 0, 0, 0xbb])
            );
            assert_eq!(p.inc.src_rank(), 7);
            assert_eq!(p.body, &enc(&[11, 22])[..]);
            // Lost on the way up? A child's retransmission resends the partial.
            let (action, again) = run_on(
                sw,
                &contribution(id, 0, 2, 3, op, dtype, &enc(&[1, 2])),
                down,
            );
            assert_eq!(action, XDP_REDIRECT);
            assert_eq!(parse(&again).expect("valid").body, &enc(&[11, 22])[..]);
            // Attack on 3ad1361's window: the parent's result is being copied over the
            // partial on another CPU (PENDING_RESULT, staged). A retransmission then must
            // not resend the slot's half-overwritten data: it is dropped as a duplicate.
            let sent_up = sw.groups.slot(id, 3).expect("slot");
            let mut copying = sent_up;
            copying.pending |= PENDING_RESULT;
            sw.groups.write_slot(id, 3, &copying).expect("stage");
            let (action, _) = run_on(
                sw,
                &contribution(id, 0, 2, 3, op, dtype, &enc(&[1, 2])),
                down,
            );
            assert_eq!(action, XDP_DROP, "no resend while the result is copied in");
            sw.groups.write_slot(id, 3, &sent_up).expect("unstage");
            // The parent's final result (say 111, 222) arrives on the uplink.
            let mut from_parent = contribution(id, 0, 2, 3, op, dtype, &enc(&[111, 222]));
            from_parent[26..30].copy_from_slice(&parent_ip.octets());
            let (action, down_out) = run_on(sw, &from_parent, up);
            assert_eq!(action, XDP_REDIRECT, "broadcast to the children");
            assert_eq!(
                &down_out[PAYLOAD_OFFSET..PAYLOAD_OFFSET + 4],
                &enc(&[111, 222])[..]
            );
            // A child that lost the result retransmits and gets it from the slot.
            let (action, reply) = run_on(
                sw,
                &contribution(id, 1, 2, 3, op, dtype, &enc(&[10, 20])),
                down,
            );
            assert_eq!(action, XDP_TX);
            let p = parse(&reply).expect("valid reply");
            assert_eq!(p.body, &enc(&[111, 222])[..]);
            assert_eq!(p.addr.dst_ip, child_ip(1));
            // A result from anyone but the parent on the uplink is not accepted.
            let mut forged = contribution(id, 0, 2, 3, op, dtype, &enc(&[5, 5]));
            forged[26..30].copy_from_slice(&[10, 9, 9, 9]);
            assert_eq!(run_on(sw, &forged, up).0, XDP_DROP);
        });
        let s = stats(sw, id);
        assert_eq!(
            (
                s.aggregated,
                s.completed,
                s.sent_up,
                s.results_down,
                s.replies
            ),
            (2, 1, 2, 1, 1),
            "{s:?}"
        );
        assert_eq!((s.duplicates, s.not_member), (3, 1), "{s:?}");
        sw.groups.remove(id).expect("remove");
    });
}

/// Fraction bits and width of a float type.
fn float_format(dtype: Dtype) -> (u32, u32) {
    match dtype {
        Dtype::F16 => (10, 16),
        Dtype::BF16 => (7, 16),
        Dtype::F32 => (23, 32),
        _ => (52, 64),
    }
}

/// IEEE edge values of a float format, as bit patterns: signed zeros, the smallest and
/// largest subnormals and normals, one and its neighbours, infinities, quiet and
/// signalling NaNs.
fn float_edges(dtype: Dtype) -> Vec<u64> {
    let (frac, bits) = float_format(dtype);
    let sign = 1u64 << (bits - 1);
    let exp_max = (1u64 << (bits - 1 - frac)) - 1;
    let one = (exp_max >> 1) << frac;
    let frac_mask = (1u64 << frac) - 1;
    let inf = exp_max << frac;
    let pos = [
        0,
        1,
        frac_mask,
        1 << frac,
        one,
        one + 1,
        one - 1,
        inf - 1,
        inf,
        inf | 1 << (frac - 1),
        inf | 1,
    ];
    pos.iter().flat_map(|&v| [v, v | sign]).collect()
}

/// Bodies of two children whose element pairs are edge values, raw random bit patterns,
/// or operands of nearby exponents (where cancellation and rounding happen).
#[expect(
    clippy::many_single_char_names,
    reason = "a, b: the operands; w, r, e as above"
)]
fn float_pair_bodies(rng: &mut Rng, op: Op, dtype: Dtype, count: usize) -> [Vec<u8>; 2] {
    let (w, size) = (dtype.width(), element_bytes(op, dtype));
    let (frac, bits) = float_format(dtype);
    let mask = u64::MAX >> (64 - bits);
    let exp_mask = (mask >> (frac + 1)) << frac;
    let edges = float_edges(dtype);
    let mut out = [vec![0u8; count * size], vec![0u8; count * size]];
    for i in 0..count {
        let r = rng.next_u64();
        let (a, b) = match r % 4 {
            0 => (
                edges[(r >> 8) as usize % edges.len()],
                edges[(r >> 24) as usize % edges.len()],
            ),
            1 => (rng.next_u64() & mask, rng.next_u64() & mask),
            _ => {
                let a = rng.next_u64() & mask;
                let shift = ((r >> 8) % 5) << frac;
                let b =
                    (rng.next_u64() & mask & !exp_mask | (a & exp_mask)).wrapping_add(shift) & mask;
                (a, b)
            }
        };
        for (body, v) in out.iter_mut().zip([a, b]) {
            let e = &mut body[i * size..(i + 1) * size];
            e[..w].copy_from_slice(&v.to_be_bytes()[8 - w..]);
            if size > w {
                e[w..].copy_from_slice(&((r >> 40) as i32 % 4).to_be_bytes());
            }
        }
    }
    out
}

fn float_ops() -> impl Iterator<Item = (Op, Dtype)> {
    Op::ALL.into_iter().flat_map(|op| {
        [Dtype::F32, Dtype::F64, Dtype::F16, Dtype::BF16]
            .into_iter()
            .filter(move |d| op.defined_on(*d))
            .map(move |d| (op, d))
    })
}

/// Completes one round of `bodies` sent in `order` and returns the broadcast payload.
fn float_round(
    sw: &Switch,
    id: u32,
    round: u32,
    (op, dtype): (Op, Dtype),
    bodies: &[Vec<u8>],
    order: &[usize],
) -> Vec<u8> {
    let n = bodies.len();
    for (k, &i) in order.iter().enumerate() {
        let (action, out) = run(sw, &contribution(id, i, n, round, op, dtype, &bodies[i]));
        if k + 1 < n {
            assert_eq!(
                action, XDP_DROP,
                "{op:?} {dtype:?} round {round}: child {i} is stashed"
            );
        } else {
            assert_eq!(
                action,
                broadcast_verdict(&bodies[i]),
                "{op:?} {dtype:?} round {round}: the last completes"
            );
            let out = result_frame(action, &out);
            return out[PAYLOAD_OFFSET..PAYLOAD_OFFSET + bodies[0].len()].to_vec();
        }
    }
    unreachable!("order names every child")
}

/// Float pairs per op × type (`INNET_FLOAT_PAIRS`; the default adds up to over 10 million).
fn float_pairs() -> usize {
    std::env::var("INNET_FLOAT_PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

#[test]
fn float_ops_match_the_hosts_ieee_arithmetic_bit_for_bit() {
    with_switch(|sw| {
        let id = 0x00a1_0004;
        install(sw, id, 2);
        let mut rng = Rng(0x5eed_f10a_7000_0001);
        let mut round = 0u32;
        let mut total = 0usize;
        for (op, dtype) in float_ops() {
            let max = MAX_PAYLOAD_BYTES / element_bytes(op, dtype);
            let mut pairs = 0;
            while pairs < float_pairs() {
                let count = if round.is_multiple_of(16) {
                    1 + round as usize % max
                } else {
                    max
                };
                let bodies = float_pair_bodies(&mut rng, op, dtype, count);
                let want = reduce_all(op, dtype, &[&bodies[0], &bodies[1]]).expect("reference");
                let got = float_round(sw, id, round, (op, dtype), &bodies, &[1, 0]);
                if !same_result(op, dtype, &got, &want) {
                    let size = element_bytes(op, dtype);
                    let bad = (0..count)
                        .find(|&i| {
                            let r = i * size..(i + 1) * size;
                            !same_result(op, dtype, &got[r.clone()], &want[r])
                        })
                        .expect("a differing element");
                    let r = bad * size..(bad + 1) * size;
                    panic!(
                        "{op:?} {dtype:?} element {bad}: {:02x?} OP {:02x?} = {:02x?}, host {:02x?}",
                        &bodies[0][r.clone()],
                        &bodies[1][r.clone()],
                        &got[r.clone()],
                        &want[r]
                    );
                }
                pairs += count;
                round = round.wrapping_add(1);
            }
            total += pairs;
        }
        eprintln!("{total} float operand pairs, bit for bit");
        let s = stats(sw, id);
        assert_eq!(
            (s.stale, s.mismatch, s.unsupported, s.evicted),
            (0, 0, 0, 0),
            "{s:?}"
        );
    });
}

#[test]
fn float_rounds_do_not_depend_on_arrival_order() {
    with_switch(|sw| {
        let id = 0x00a1_0005;
        let n = 7;
        install(sw, id, n);
        let mut rng = Rng(0x5eed_f10a_7000_0002);
        let mut round = 0u32;
        let mut order_mattered = 0;
        for (op, dtype) in float_ops() {
            let count = 64;
            // Magnitudes far apart and of both signs, so the order of additions shows.
            let bodies: Vec<Vec<u8>> = (0..n)
                .map(|i| {
                    // binary16 reaches only 65504: magnitudes of one binade there.
                    let wide = dtype != Dtype::F16;
                    let vals: Vec<f64> = (0..count).map(|_| rng.order_sensitive(wide)).collect();
                    let mut b = Vec::new();
                    for (k, v) in vals.iter().enumerate() {
                        match dtype {
                            Dtype::F16 => b.extend_from_slice(&f16::from_f64(*v).to_be_bytes()),
                            Dtype::BF16 => b.extend_from_slice(&bf16::from_f64(*v).to_be_bytes()),
                            Dtype::F32 => b.extend_from_slice(&(*v as f32).to_be_bytes()),
                            _ => b.extend_from_slice(&v.to_be_bytes()),
                        }
                        if op.carries_location() {
                            b.extend_from_slice(&((i + k) as i32 % 3).to_be_bytes());
                        }
                    }
                    b
                })
                .collect();
            let in_child_order = reduce_all(op, dtype, &bodies).expect("reference");
            for _ in 0..6 {
                let mut order: Vec<usize> = (0..n).collect();
                for k in (1..n).rev() {
                    order.swap(k, rng.next_u64() as usize % (k + 1));
                }
                let as_arrived = reduce_all(
                    op,
                    dtype,
                    &order.iter().map(|&i| &bodies[i]).collect::<Vec<_>>(),
                )
                .expect("reference");
                order_mattered += usize::from(as_arrived != in_child_order);
                // A duplicate of the first arrival on the way changes nothing either.
                let got = float_round(sw, id, round, (op, dtype), &bodies, &order);
                assert_eq!(
                    got, in_child_order,
                    "{op:?} {dtype:?} arrival order {order:?}"
                );
                round = round.wrapping_add(1);
            }
        }
        assert!(
            order_mattered > 10,
            "the inputs must be ones where arrival order would change the result ({order_mattered})"
        );
    });
}
