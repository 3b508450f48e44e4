//! Structure-aware fuzzing of the switch program through BPF_PROG_TEST_RUN, with a group
//! installed and a round half done. Frames are valid INC data, control, foreign traffic
//! and random bytes, then mutated field by field (group, rank, op, type, count, round,
//! addresses, every length, the ICRC), truncated or extended. For each frame, the
//! userspace model (`codec::classify`) says what it is, and:
//!
//! - non-INC frames and rejected INC frames pass byte for byte unchanged;
//! - a rejected frame bumps exactly the counter of its reason;
//! - no frame but a member's valid contribution changes the group's slots;
//! - afterwards the round still completes with the right result.
//!
//! `INNET_FUZZ_ITERATIONS` runs it longer (default 20 000).

use std::net::Ipv4Addr;

use innet_common::{
    codec::{Addressing, Class, classify, encode_control},
    group::DEFAULT_WINDOW as WINDOW,
    maps::PROG_SWITCH,
    proto::{Dtype, Op, PacketKind},
    stats::PortStats,
    wire::{ControlPayload, ETH_LEN, IPV4_LEN, PAYLOAD_OFFSET, UDP_LEN},
};
use innet_lab::{
    Rng,
    bpf::{Loaded, XDP_DROP, XDP_PASS, data_frame, install_root, port_totals},
};

const GROUP: u32 = 0x4242;
const CHILDREN: usize = 4;
const ROUND: u32 = 5;
const COUNT: usize = 8;
const MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];

fn child_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 9, 0, i as u8 + 1)
}

/// Child `i`'s contribution to whole round `round`: elements `i + 1` … (int32, SUM).
fn contribution(i: usize, round: u32) -> Vec<u8> {
    let body: Vec<u8> = (0..COUNT)
        .flat_map(|e| ((i * 100 + e + 1) as i32).to_be_bytes())
        .collect();
    data_frame(
        GROUP,
        i as u32,
        (child_ip(i), MAC),
        (child_ip((i + 1) % CHILDREN), MAC),
        round,
        (Op::Sum, Dtype::I32),
        &body,
    )
}

/// Every slot of the group, as bytes (the spin lock word left out).
fn slots(sw: &Loaded) -> Vec<Vec<u8>> {
    (0..WINDOW as u8)
        .map(|r| {
            let s = sw.groups.slot(GROUP, r).expect("slot");
            // SAFETY: Slot is a repr(C) Pod; read as bytes only.
            let bytes =
                unsafe { std::slice::from_raw_parts((&raw const s).cast::<u8>(), size_of_val(&s)) };
            bytes[4..].to_vec()
        })
        .collect()
}

/// The seeds mutations start from.
fn seeds() -> Vec<Vec<u8>> {
    let mut arp = vec![0xff; 6];
    arp.extend_from_slice(&MAC);
    arp.extend_from_slice(&[0x08, 0x06]);
    arp.extend_from_slice(&[0; 28]);
    let mut query = ControlPayload::default();
    query.set_true_comm_id(GROUP);
    vec![
        contribution(2, ROUND),
        contribution(3, ROUND),
        contribution(0, ROUND.wrapping_add(1)),
        contribution(1, ROUND.wrapping_sub(3)),
        encode_control(&Addressing::default(), PacketKind::Query, 1, &query),
        arp,
    ]
}

/// Offsets worth hitting: every IPv4, UDP, BTH and INC header byte.
const HEADERS: std::ops::Range<usize> = ETH_LEN..PAYLOAD_OFFSET;

fn mutate(rng: &mut Rng, mut f: Vec<u8>) -> Vec<u8> {
    match rng.below(9) {
        // Another layout of the same frame (attacks that once skipped the member check):
        // VLAN tags, IPv4 options or fragment bits.
        8 => {
            if f.len() < ETH_LEN + IPV4_LEN {
                return f;
            }
            match rng.below(3) {
                0 => {
                    for _ in 0..=rng.below(5) {
                        let tpid: u16 = if rng.below(2) == 0 { 0x8100 } else { 0x88a8 };
                        let mut tag = tpid.to_be_bytes().to_vec();
                        tag.extend_from_slice(&(rng.below(2) as u16 * 7).to_be_bytes());
                        f.splice(12..12, tag);
                    }
                }
                1 => {
                    let words = 1 + rng.below(10);
                    f.splice(ETH_LEN + IPV4_LEN..ETH_LEN + IPV4_LEN, vec![1u8; 4 * words]);
                    f[ETH_LEN] = 0x45 + words as u8;
                    let total = u16::from_be_bytes([f[ETH_LEN + 2], f[ETH_LEN + 3]]);
                    let total = total.wrapping_add(4 * words as u16);
                    f[ETH_LEN + 2..ETH_LEN + 4].copy_from_slice(&total.to_be_bytes());
                }
                _ => {
                    let frag: u16 = [0x2000, 0x2001, 0x0001, 0x4000 | 0x2000][rng.below(4)];
                    f[ETH_LEN + 6..ETH_LEN + 8].copy_from_slice(&frag.to_be_bytes());
                }
            }
        }
        // A few header bytes.
        0..=2 => {
            for _ in 0..=rng.below(3) {
                let at = HEADERS.start + rng.below(HEADERS.len());
                if at < f.len() {
                    f[at] = rng.next_u64() as u8;
                }
            }
        }
        // A length field off by a little (IPv4 total length, UDP length).
        3 => {
            let at = if rng.below(2) == 0 {
                ETH_LEN + 2
            } else {
                ETH_LEN + IPV4_LEN + 4
            };
            if at + 2 <= f.len() {
                let v = u16::from_be_bytes([f[at], f[at + 1]]);
                let d = rng.below(9) as u16;
                let v = if rng.below(2) == 0 {
                    v.wrapping_add(d)
                } else {
                    v.wrapping_sub(d)
                };
                f[at..at + 2].copy_from_slice(&v.to_be_bytes());
            }
        }
        // The ICRC (the last four bytes) or a body byte.
        4 => {
            let at = f.len() - 1 - rng.below(4.min(f.len()));
            f[at] ^= 1 << rng.below(8);
        }
        // Truncated anywhere after the Ethernet header.
        5 => {
            let len = ETH_LEN + rng.below(f.len() - ETH_LEN + 1);
            f.truncate(len);
        }
        // Extended with junk.
        6 => {
            for _ in 0..=rng.below(64) {
                f.push(rng.next_u64() as u8);
            }
        }
        // Random bytes of a random length.
        _ => {
            let len = ETH_LEN + rng.below(200);
            f = (0..len).map(|_| rng.next_u64() as u8).collect();
            if rng.below(2) == 0 && f.len() > ETH_LEN + IPV4_LEN {
                // … that look like IPv4/UDP to port 4791.
                f[12..14].copy_from_slice(&[0x08, 0x00]);
                f[ETH_LEN] = 0x45;
                f[ETH_LEN + 9] = 17;
                if f.len() > ETH_LEN + IPV4_LEN + UDP_LEN {
                    f[ETH_LEN + IPV4_LEN + 2..ETH_LEN + IPV4_LEN + 4]
                        .copy_from_slice(&4791u16.to_be_bytes());
                }
            }
        }
    }
    f
}

/// Whether the model says this frame is a contribution the group may take: valid INC data
/// of the group from a member's address.
fn may_change_state(f: &[u8]) -> bool {
    if classify(f) != Class::IncData {
        return false;
    }
    let src = Ipv4Addr::new(
        f[ETH_LEN + 12],
        f[ETH_LEN + 13],
        f[ETH_LEN + 14],
        f[ETH_LEN + 15],
    );
    (0..CHILDREN).any(|i| child_ip(i) == src)
}

#[test]
fn no_mutated_frame_changes_group_state_unless_valid_and_every_rejection_is_counted() {
    let mut sw = Loaded::switch(4);
    install_root(
        &mut sw.groups,
        GROUP,
        (0..CHILDREN).map(|i| (child_ip(i), i as u32)),
    );
    // Round 5 half done: children 0 and 1 are in.
    for i in 0..2 {
        let (verdict, _) = sw.run(PROG_SWITCH, &contribution(i, ROUND));
        assert_ne!(verdict, XDP_PASS, "child {i}'s contribution is taken");
    }
    let iterations: usize = std::env::var("INNET_FUZZ_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let seeds = seeds();
    let mut rng = Rng(0xf0f0_1234_dead_beef);
    let mut state = slots(&sw);
    let (mut rejected, mut passed, mut taken) = (0, 0, 0);
    for i in 0..iterations {
        let frame = mutate(&mut rng, seeds[i % seeds.len()].clone());
        let model = classify(&frame);
        let before = port_totals(&sw.ebpf);
        let (verdict, out) = sw.run(PROG_SWITCH, &frame);
        let after = port_totals(&sw.ebpf).since(&before);
        assert_eq!(after.rx_packets, 1, "frame {i}: counted once");
        match model {
            Class::IncData if may_change_state(&frame) => {
                taken += 1;
                state = slots(&sw);
                continue;
            }
            Class::IncData | Class::IncControl => {}
            Class::Malformed(reason) => {
                rejected += 1;
                let mut want = PortStats::default();
                *want.reason_mut(reason) += 1;
                let got: Vec<_> = after
                    .fields()
                    .into_iter()
                    .filter(|(n, v)| n.starts_with("mal_") && *v > 0)
                    .collect();
                let want: Vec<_> = want
                    .fields()
                    .into_iter()
                    .filter(|(n, v)| n.starts_with("mal_") && *v > 0)
                    .collect();
                assert_eq!(got, want, "frame {i}: {frame:02x?}");
                assert_eq!(after.malformed, 1, "frame {i}");
            }
            Class::NonRoce | Class::RoceOther => passed += 1,
        }
        if let Class::Malformed(_) = model {
            // Passed on, it could reach a member that the data path never checked.
            assert_eq!(verdict, XDP_DROP, "frame {i} ({model:?}) is dropped");
        } else if after.later_fragments_dropped == 1 {
            // The rest of a datagram whose first fragment an earlier frame was (innet_switch
            // remembers it: `frag.rs`).
            assert_eq!(
                (model, verdict),
                (Class::NonRoce, XDP_DROP),
                "frame {i}: a later fragment of a dropped datagram is dropped"
            );
        } else if !matches!(model, Class::IncData) {
            assert_eq!(verdict, XDP_PASS, "frame {i} ({model:?}) passes");
            assert_eq!(out, frame, "frame {i} ({model:?}) leaves unchanged");
        }
        assert_eq!(
            slots(&sw),
            state,
            "frame {i} ({model:?}) changed the group: {frame:02x?}"
        );
    }
    eprintln!("{iterations} frames: {rejected} rejected, {passed} foreign, {taken} taken as valid");
    assert!(
        rejected > iterations / 10 && passed > iterations / 10,
        "the mutations reach every class"
    );

    // The group still works: a round newer than its slot's (by the window) completes with
    // the exact sum.
    let fresh = (sw.groups.slot(GROUP, 0).expect("slot").psn + WINDOW) & 0x00ff_ffff;
    for i in 0..CHILDREN {
        let _ = sw.run(PROG_SWITCH, &contribution(i, fresh));
    }
    let slot = sw.groups.slot(GROUP, fresh as u8).expect("slot");
    let want: Vec<u8> = (0..COUNT)
        .flat_map(|e| {
            (0..CHILDREN)
                .map(|i| (i * 100 + e + 1) as i32)
                .sum::<i32>()
                .to_be_bytes()
        })
        .collect();
    assert_eq!((slot.psn, slot.round), (fresh, fresh as u8));
    assert_eq!(
        &slot.data[..want.len()],
        &want[..],
        "the fresh round's result"
    );
}
