//! The NIC role through BPF_PROG_TEST_RUN: a member's NIC takes its children's packets and
//! its host's post, sends the partial to its parent when all are in, resends on repeats,
//! hands results to the host through the completion array; the root multicasts the result.
//! Strangers never touch the slot; other traffic passes untouched.

use std::{net::Ipv4Addr, sync::Mutex};

use innet::group_maps::NicGroupSpec;
use innet_common::{
    codec::{encode_elements, parse},
    group::completion_stamp,
    maps::{PROG_NIC, PROG_NIC_POST},
    proto::{BTH_FLAG_RESULT, Dtype, MAX_PAYLOAD_BYTES, Op, element_bytes},
    reduce::{reduce_all, same_result},
    stats::GroupStats,
};
use innet_lab::{
    Rng,
    bpf::{LO, Loaded, XDP_DROP, XDP_PASS, XDP_REDIRECT, data_frame, with_loaded},
};
use innet_net::nic::{Tree, result_address};

type Nic = Loaded;

/// One loaded object serves every test, one test at a time.
static NIC: Mutex<Option<Nic>> = Mutex::new(None);

fn with_nic<R>(f: impl FnOnce(&mut Nic) -> R) -> R {
    with_loaded(&NIC, f)
}

fn member_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 8, 0, i as u8 + 1)
}

fn member_mac(i: usize) -> [u8; 6] {
    [2, 0, 0, 0, 8, i as u8 + 1]
}

/// Installs member `me` of a tree of `n` members with branch degree `degree`.
fn install(nic: &mut Nic, id: u32, n: usize, degree: usize, me: usize) -> Tree {
    let _ = nic.groups.remove(id);
    let tree = Tree::new(n, degree).unwrap();
    nic.groups
        .install_nic(&NicGroupSpec {
            id,
            ifindex: LO,
            own_mac: member_mac(me),
            own_ip: member_ip(me),
            own_rank: me as u32,
            parent: tree.parent(me).map(|p| (member_ip(p), member_mac(p))),
            root: member_ip(0),
            result: result_address(id),
            children: tree
                .children(me)
                .map(|c| (member_ip(c), c as u32))
                .collect(),
            dpu: None,
        })
        .expect("install");
    tree
}

/// Member `from`'s data packet of `round` to `to` (a child's packet to its parent, or a
/// host's post to itself).
fn packet(
    id: u32,
    from: usize,
    to: usize,
    round: u8,
    op: Op,
    dtype: Dtype,
    body: &[u8],
) -> Vec<u8> {
    packet_to(
        id,
        from,
        (member_ip(to), member_mac(to)),
        round,
        op,
        dtype,
        body,
    )
}

fn packet_to(
    id: u32,
    from: usize,
    (dst_ip, dst_mac): (Ipv4Addr, [u8; 6]),
    round: u8,
    op: Op,
    dtype: Dtype,
    body: &[u8],
) -> Vec<u8> {
    data_frame(
        id,
        from as u32,
        (member_ip(from), member_mac(from)),
        (dst_ip, dst_mac),
        u32::from(round),
        (op, dtype),
        body,
    )
}

fn wire(nic: &Nic, frame: &[u8]) -> (u32, Vec<u8>) {
    nic.run(PROG_NIC, frame)
}

fn post(nic: &Nic, frame: &[u8]) -> (u32, Vec<u8>) {
    nic.run(PROG_NIC_POST, frame)
}

fn stats(nic: &Nic, id: u32) -> GroupStats {
    nic.groups.get(id).expect("group").stats
}

/// The completion the host would read for `round`, if stamped.
fn completion(nic: &Nic, id: u32, round: u8) -> Option<Vec<u8>> {
    let c = nic.groups.completion(id, round).expect("completion");
    (c.stamp == completion_stamp(id, round)).then(|| c.data[..c.len as usize].to_vec())
}

#[test]
fn an_inner_member_sends_up_resends_and_hands_results_to_its_host() {
    with_nic(|nic| {
        // Member 1 of 7, degree 2: parent 0, children 3 and 4.
        let id = 0x00b1_0001;
        install(nic, id, 7, 2, 1);
        let (op, dtype, round) = (Op::Sum, Dtype::I64, 5);
        let b = |v: i64| encode_elements(dtype, &[v, -v, v * 1000], None);
        assert_eq!(
            post(nic, &packet(id, 1, 1, round, op, dtype, &b(1))).0,
            XDP_DROP
        );
        assert_eq!(
            wire(nic, &packet(id, 3, 1, round, op, dtype, &b(3))).0,
            XDP_DROP
        );
        // A stranger, and a member that is not a child here, change nothing.
        assert_eq!(
            wire(nic, &packet(id, 5, 1, round, op, dtype, &b(50))).0,
            XDP_DROP
        );
        let mut spoofed = packet(id, 3, 1, round, op, dtype, &b(60));
        spoofed[26..30].copy_from_slice(&[10, 8, 9, 9]);
        assert_eq!(wire(nic, &spoofed).0, XDP_DROP);
        assert_eq!(stats(nic, id).not_member, 2);
        let (action, out) = wire(nic, &packet(id, 4, 1, round, op, dtype, &b(4)));
        assert_eq!(
            action, XDP_REDIRECT,
            "the last contribution sends the partial up"
        );
        let up = parse(&out).expect("a valid RoCEv2 frame with a right ICRC");
        assert_eq!(up.body, &b(8)[..], "1 + 3 + 4");
        assert_eq!(
            (up.addr.src_ip, up.addr.dst_ip),
            (member_ip(1), member_ip(0))
        );
        assert_eq!(
            (up.addr.src_mac, up.addr.dst_mac),
            (member_mac(1), member_mac(0))
        );
        assert_eq!(up.inc.src_rank(), 1);
        assert_eq!(up.bth.flags & BTH_FLAG_RESULT, 0, "a partial is no result");
        assert_eq!(completion(nic, id, round), None, "nothing for the host yet");
        // A child's repeat, or the host's, sends the saved partial up again.
        let (action, out) = wire(nic, &packet(id, 3, 1, round, op, dtype, &b(3)));
        assert_eq!(action, XDP_REDIRECT);
        assert_eq!(parse(&out).unwrap().body, &b(8)[..]);
        let (action, out) = post(nic, &packet(id, 1, 1, round, op, dtype, &b(1)));
        assert_eq!(action, XDP_REDIRECT);
        assert_eq!(parse(&out).unwrap().body, &b(8)[..]);
        // The root's multicast result lands in the completion array, and goes no further.
        let result = packet_to(id, 0, result_address(id), round, op, dtype, &b(21));
        assert_eq!(wire(nic, &result).0, XDP_DROP);
        assert_eq!(completion(nic, id, round), Some(b(21)));
        // The host posting again gets its completion again; a child asking again is
        // answered with the result, addressed to it and marked as a result.
        assert_eq!(
            post(nic, &packet(id, 1, 1, round, op, dtype, &b(1))).0,
            XDP_DROP
        );
        let (action, out) = wire(nic, &packet(id, 4, 1, round, op, dtype, &b(4)));
        assert_eq!(action, XDP_REDIRECT);
        let reply = parse(&out).expect("valid reply");
        assert_eq!(reply.body, &b(21)[..]);
        assert_eq!(
            (reply.addr.src_ip, reply.addr.dst_ip),
            (member_ip(1), member_ip(4))
        );
        assert_eq!(reply.bth.flags & BTH_FLAG_RESULT, BTH_FLAG_RESULT);
        let s = stats(nic, id);
        assert_eq!((s.posted, s.aggregated, s.sent_up), (3, 3, 3), "{s:?}");
        assert_eq!(
            (s.results_down, s.completions, s.replies),
            (1, 2, 1),
            "{s:?}"
        );
        assert_eq!(s.duplicates, 4, "{s:?}");
        let slot = nic.groups.slot(id, round).unwrap();
        assert_eq!(slot.bitmap, 1 << 16 | 0b11, "children 0 and 1 and the host");
    });
}

#[test]
fn the_root_multicasts_every_op_and_type_exactly() {
    with_nic(|nic| {
        // The root of 4 members, degree 3: children 1, 2, 3.
        let id = 0x00b1_0002;
        let tree = install(nic, id, 4, 3, 0);
        let mut rng = Rng(0x5eed_0000_0000_0061);
        let mut round = 0u8;
        for op in Op::ALL {
            for dtype in Dtype::ALL.into_iter().filter(|d| op.defined_on(*d)) {
                let max = MAX_PAYLOAD_BYTES / element_bytes(op, dtype);
                for count in [1, max] {
                    let bodies: Vec<Vec<u8>> = (0..4)
                        .map(|_| {
                            let mut b = rng.bytes(count * element_bytes(op, dtype));
                            if op.carries_location() {
                                // Locations are MPI ints: keep them few, so ties happen.
                                for e in b.chunks_exact_mut(element_bytes(op, dtype)) {
                                    let w = dtype.width();
                                    let loc = i32::from(e[0] % 3);
                                    e[w..].copy_from_slice(&loc.to_be_bytes());
                                }
                            }
                            b
                        })
                        .collect();
                    let expected = reduce_all(op, dtype, &bodies).unwrap();
                    let what = format!("{op:?} {dtype:?} x{count}");
                    // Children first, then the host: the host's post completes the round.
                    for c in tree.children(0) {
                        let p = packet(id, c, 0, round, op, dtype, &bodies[c]);
                        assert_eq!(wire(nic, &p).0, XDP_DROP, "{what}");
                    }
                    let (action, out) = post(nic, &packet(id, 0, 0, round, op, dtype, &bodies[0]));
                    assert_eq!(action, XDP_REDIRECT, "{what}: sent to the group");
                    let r = parse(&out).unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert!(same_result(op, dtype, r.body, &expected), "{what}");
                    assert_eq!(r.addr.dst_ip, result_address(id).0);
                    assert_eq!(r.addr.dst_mac, result_address(id).1);
                    assert_eq!(r.addr.src_ip, member_ip(0));
                    assert_eq!(r.bth.flags & BTH_FLAG_RESULT, BTH_FLAG_RESULT);
                    let landed = completion(nic, id, round).expect("a completion");
                    assert!(same_result(op, dtype, &landed, &expected), "{what}");
                    // A child that lost the result asks again: answered by the root.
                    let (action, out) = wire(nic, &packet(id, 2, 0, round, op, dtype, &bodies[2]));
                    assert_eq!(action, XDP_REDIRECT, "{what}: reply");
                    let r = parse(&out).unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert!(same_result(op, dtype, r.body, &expected), "{what}");
                    assert_eq!(r.addr.dst_ip, member_ip(2), "{what}");
                    round = round.wrapping_add(1);
                }
            }
        }
        let s = stats(nic, id);
        // Every op on 8 integer types, 6 ops on 2 float types, 4 on 2 half types; 2 counts.
        let rounds = (12 * 8 + 6 * 2 + 4 * 2) * 2;
        assert_eq!(
            (s.completed, s.sent_down, s.completions),
            (rounds, rounds, rounds),
            "{s:?}"
        );
        assert_eq!(
            (s.stale, s.mismatch, s.not_member, s.unsupported),
            (0, 0, 0, 0)
        );
    });
}

#[test]
fn other_traffic_passes_and_a_post_outside_any_group_goes_nowhere() {
    with_nic(|nic| {
        let id = 0x00b1_0003;
        install(nic, id, 2, 1, 1);
        let (op, dtype) = (Op::Max, Dtype::U16);
        let body = encode_elements(dtype, &[7], None);
        // INC data of a group this NIC does not hold: for the host, untouched.
        let other = packet(0x00b1_0777, 0, 1, 0, op, dtype, &body);
        let (action, out) = wire(nic, &other);
        assert_eq!((action, out), (XDP_PASS, other.clone()));
        // A frame that is no INC at all.
        let mut arp = vec![0xffu8; 60];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(wire(nic, &arp), (XDP_PASS, arp.clone()));
        // Posting something that is not a contribution of an installed group.
        assert_eq!(post(nic, &other).0, XDP_DROP);
        assert_eq!(post(nic, &arp).0, XDP_DROP);
        // A leaf's post alone completes its part: straight up to the parent.
        let (action, out) = post(nic, &packet(id, 1, 1, 9, op, dtype, &body));
        assert_eq!(action, XDP_REDIRECT);
        let up = parse(&out).unwrap();
        assert_eq!((up.addr.dst_ip, up.body), (member_ip(0), &body[..]));
    });
}
