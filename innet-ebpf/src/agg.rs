//! Aggregation: one program (`innet_agg`, reached by tail call from `innet_switch`) takes a
//! contribution of any op and type into its slot, and decides what to send; a round whose
//! inputs are all in goes on to the fold program of its op × type (`fold_<op>_<type>`,
//! tail call `jump_fold`). Only the fold depends on the op and type: the kernel verifies the
//! slot's logic once, not once per pair (96 pairs made that 1.2 M of the object's 1.7 M
//! verified instructions, seconds of every attach).
//!
//! The slot's spin lock guards decisions only; payloads move outside it. Under the lock a
//! packet claims its copy (a bit in `pending`); the copy runs without the lock (one
//! `bpf_xdp_load_bytes` from the packet into its stash entry, or into the slot's data for
//! the parent's result); under the lock again the copy settles, and the settle that finds
//! every input in and no copy in flight starts the fold. A slot with copies in flight, or
//! being folded, is not taken by a newer round, so no copy lands in another round's slot.
//! Contributions are folded in input order once all are in (see `fold`): floats because
//! rounding makes order matter, integers the same way. No payload loop runs under the lock
//! (no helper may be called there, so it would be a bounded loop the verifier walks per
//! iteration: 8 KiB payloads made that 130 k verified instructions per program).

use core::ffi::c_void;

use aya_ebpf::{
    bindings::xdp_action,
    helpers::{bpf_loop, bpf_spin_lock, bpf_spin_unlock, bpf_xdp_load_bytes},
    programs::XdpContext,
};
use innet_common::{
    group::{
        ACT_BROADCAST, ACT_COMPLETE, ACT_DROP, ACT_REPLY, ACT_UP, Handoff, JUMP_EMIT, LOCAL_CHILD,
        MAX_CHILDREN, PENDING_RESULT, SLOT_AGGREGATING, SLOT_COMPLETE, SLOT_EMPTY, SLOT_FOLDING,
        SLOT_SENT_UP, Slot, TEMPLATE_LEN, bpf_spin_lock as Lock, jump_fold, stash_index,
    },
    proto::{LOC_BYTES, MAX_PAYLOAD_BYTES},
    softfloat,
    wire::{ETH_LEN, IPV4_LEN, IncHeader, PAYLOAD_OFFSET, UDP_LEN},
};

use crate::{
    arith::Arith,
    finish, fold,
    maps::{HANDOFF, JUMP, SLOTS, STASH, group_count},
    parse::{helper_len, ptr_at},
};

const INC_OFFSET: usize = PAYLOAD_OFFSET - core::mem::size_of::<IncHeader>();
/// The BTH's AckReq byte and 24-bit PSN, read as one big-endian word (the PSN masked out).
const BTH_PSN_WORD: usize = ETH_LEN + IPV4_LEN + UDP_LEN + 8;

/// How a packet relates to its slot, decided under the lock.
enum Outcome {
    Stale,
    Mismatch,
    /// A newer round's packet while the slot's copies or fold are in flight: dropped (its
    /// sender retransmits).
    Busy,
    Duplicate(u32),
    Done(u32),
    /// Every input is in: fold them, then do this.
    Fold(u32),
    /// The fold failed; the round is dropped from the slot.
    Evicted,
    /// The payload could not be read from the packet.
    Unreadable,
}

/// What a packet does once its slot decided: settle now, or copy its payload first (the
/// `pending` bit it claimed).
enum Claim {
    Now(Outcome),
    Copy(u32),
}

#[inline(always)]
fn lock(slot: *mut Slot) -> *mut aya_ebpf::bindings::bpf_spin_lock {
    // SAFETY: innet_common's bpf_spin_lock has the kernel's layout (one u32).
    unsafe { (&raw mut (*slot).lock).cast::<Lock>().cast() }
}

/// Whether round `r` is newer than the slot's round `s`, both whole 24-bit PSNs
/// (serial-number arithmetic mod 2^24).
#[inline(always)]
fn newer(r: u32, s: u32) -> bool {
    let d = r.wrapping_sub(s) & 0x00ff_ffff;
    d != 0 && d < 0x0080_0000
}

/// The aggregation program body: the slot decides under its lock ([`decide`]), a claimed
/// payload is copied outside it and settled ([`settle`]), a complete round goes to its fold
/// program ([`fold_round`]), any other outcome is counted ([`count`]) and the emit program
/// takes over.
#[inline(always)]
pub fn run(ctx: &XdpContext) -> u32 {
    let Some(handoff) = HANDOFF.get_ptr_mut(0) else {
        return xdp_action::XDP_ABORTED;
    };
    // SAFETY: this CPU's hand-off, written by innet_switch for this very packet.
    let handoff = unsafe { &mut *handoff };
    let Some(slot) = SLOTS.get_ptr_mut(handoff.slot) else {
        return xdp_action::XDP_ABORTED;
    };
    let Some(hdr) = ptr_at::<IncHeader>(ctx, INC_OFFSET) else {
        return xdp_action::XDP_DROP;
    };
    // SAFETY: bounds checked by ptr_at.
    let hdr = unsafe { &*hdr };
    let Some(psn) = ptr_at::<[u8; 4]>(ctx, BTH_PSN_WORD) else {
        return xdp_action::XDP_DROP;
    };
    // SAFETY: bounds checked by ptr_at.
    let psn = u32::from_be_bytes(unsafe { *psn }) & 0x00ff_ffff;
    if psn as u8 != hdr.req_id {
        // The slot is chosen by `req_id`, the round told by the PSN: hosts send them
        // alike, so a packet where they differ is forged or broken.
        group_count(handoff.index, |g| g.mismatch += 1);
        return finish(ctx, xdp_action::XDP_DROP);
    }
    let packet = Packet {
        psn,
        round: hdr.req_id,
        count: hdr.pkt_para_num(),
        op: handoff.op as u8,
        oper_and_type: hdr.oper_and_type,
    };
    let Some(len) = helper_len(handoff.payload_len as usize, MAX_PAYLOAD_BYTES) else {
        return finish(ctx, xdp_action::XDP_DROP);
    };

    // The template is written before the lock: a bounded copy of packet bytes, identical for
    // every retransmission of this child's packet, and guarded by `valid` under the lock.
    if handoff.from_parent == 0 && handoff.child < MAX_CHILDREN as u32 {
        save_template(ctx, slot, handoff.child as usize, handoff.dst_child as u8);
    }
    // The contribution's stash entry (a helper call, so looked up before the lock; a
    // parent's result has child index MAX_CHILDREN and never uses it).
    let Some(stash) = STASH.get_ptr_mut(stash_index(handoff.slot, handoff.child)) else {
        return finish(ctx, xdp_action::XDP_ABORTED);
    };

    unsafe { bpf_spin_lock(lock(slot)) };
    // SAFETY: the slot is ours while the lock is held.
    let (claim, evicted) = decide(unsafe { &mut *slot }, handoff, &packet);
    unsafe { bpf_spin_unlock(lock(slot)) };
    let outcome = match claim {
        Claim::Now(outcome) => outcome,
        Claim::Copy(bit) => {
            // SAFETY: the claimed bit makes this CPU the only writer of the destination
            // (the slot's data, or this input's stash entry) until it settles; both hold
            // MAX_PAYLOAD_BYTES >= len bytes, and the helper checks the packet side.
            let loaded = unsafe {
                let dst = if bit == PENDING_RESULT {
                    (*slot).data.as_mut_ptr()
                } else {
                    (*stash).bytes.as_mut_ptr()
                };
                bpf_xdp_load_bytes(ctx.ctx, PAYLOAD_OFFSET as u32, dst.cast(), len) == 0
            };
            unsafe { bpf_spin_lock(lock(slot)) };
            // SAFETY: the slot is ours while the lock is held.
            let outcome = settle(unsafe { &mut *slot }, handoff, bit, loaded);
            unsafe { bpf_spin_unlock(lock(slot)) };
            outcome
        }
    };
    if let Outcome::Fold(action) = outcome {
        if evicted {
            group_count(handoff.index, |g| g.evicted += 1);
        }
        handoff.action = action;
        // SAFETY: tail call with this program's own context.
        unsafe { JUMP.tail_call(ctx, jump_fold(packet.op, packet.oper_and_type)) };
        // No fold program for a pair the switch checked is defined: a broken load. The
        // round cannot complete here; free its slot (its inputs come again).
        unsafe { bpf_spin_lock(lock(slot)) };
        // SAFETY: the slot is ours while the lock is held.
        unsafe { (*slot).state = SLOT_EMPTY };
        unsafe { bpf_spin_unlock(lock(slot)) };
        group_count(handoff.index, |g| g.unsupported += 1);
        return finish(ctx, xdp_action::XDP_ABORTED);
    }
    emit(ctx, handoff, outcome, evicted)
}

/// The fold program body for `A`'s element type and op: folds the round [`run`] handed
/// over (its slot is `SLOT_FOLDING`, every input in), makes it the round's result
/// ([`finish_fold`]), counts it and hands the packet to the emit program.
#[inline(always)]
pub fn fold_round<A: Arith>(ctx: &XdpContext) -> u32 {
    let Some(handoff) = HANDOFF.get_ptr_mut(0) else {
        return xdp_action::XDP_ABORTED;
    };
    // SAFETY: this CPU's hand-off, written by innet_switch and innet_agg for this packet.
    let handoff = unsafe { &mut *handoff };
    let Some(slot) = SLOTS.get_ptr_mut(handoff.slot) else {
        return xdp_action::XDP_ABORTED;
    };
    let Some(len) = helper_len(handoff.payload_len as usize, MAX_PAYLOAD_BYTES) else {
        return finish(ctx, xdp_action::XDP_DROP);
    };
    let outcome = finish_fold::<A>(slot, handoff.slot, len, handoff.action);
    emit(ctx, handoff, outcome, false)
}

/// Counts `outcome` and tail-calls the emit program with its action (or drops the packet
/// when it ends here).
#[inline(always)]
fn emit(ctx: &XdpContext, handoff: &mut Handoff, outcome: Outcome, evicted: bool) -> u32 {
    let Some(action) = count(handoff, outcome, evicted) else {
        return finish(ctx, xdp_action::XDP_DROP);
    };
    handoff.action = action;
    handoff.exclude_ingress = handoff.from_parent;
    // SAFETY: tail call with this program's own context.
    unsafe { JUMP.tail_call(ctx, JUMP_EMIT) };
    finish(ctx, xdp_action::XDP_ABORTED)
}

/// What the slot compares a packet with.
struct Packet {
    /// The whole round: the 24-bit BTH PSN, whose low byte is `round`.
    psn: u32,
    round: u8,
    count: u16,
    /// `Op as u8`, checked defined on the type by `innet_switch`.
    op: u8,
    oper_and_type: u8,
}

/// The slot's decision on one packet, under its lock (no helper calls: inlined into the
/// locked region): an outcome now, or a claim on a payload copy. Also says whether an
/// unfinished older round was evicted.
#[inline(always)]
fn decide(s: &mut Slot, handoff: &Handoff, packet: &Packet) -> (Claim, bool) {
    let mut evicted = false;
    // The whole round (PSN) decides, not `req_id` alone. Attack: a collective abandoned
    // without a new set-up leaves contributions in its slots, and the round 256 later has
    // the same `req_id`: by it alone, the stale contributions would count for that round.
    if s.state == SLOT_EMPTY || newer(packet.psn, s.psn) {
        // Copies in flight and a fold write into this slot without the lock: the newer
        // round waits until they are done, or it would take a slot whose data and stash
        // are still being written for the old one.
        if s.pending != 0 || s.state == SLOT_FOLDING {
            return (Claim::Now(Outcome::Busy), false);
        }
        evicted = s.state == SLOT_AGGREGATING || s.state == SLOT_SENT_UP;
        s.round = packet.round;
        s.psn = packet.psn;
        s.state = SLOT_AGGREGATING;
        s.op = packet.op;
        s.dtype = packet.oper_and_type;
        s.count = packet.count;
        s.arrived = 0;
        s.bitmap = 0;
        let mut k = 0;
        while k < MAX_CHILDREN {
            s.templates[k].valid = 0;
            k += 1;
        }
    } else if s.psn != packet.psn {
        return (Claim::Now(Outcome::Stale), evicted);
    }
    if s.op != packet.op || s.dtype != packet.oper_and_type || s.count != packet.count {
        return (Claim::Now(Outcome::Mismatch), evicted);
    }
    if handoff.from_parent != 0 {
        // The final result from the parent: keep it, then fan it out. Again once it is in:
        // fan out the kept copy (the same result); while it is being copied in, or while
        // this switch still folds its own inputs, drop it (the parent resends).
        return match s.state {
            _ if s.pending & PENDING_RESULT != 0 => {
                (Claim::Now(Outcome::Duplicate(ACT_DROP)), evicted)
            }
            SLOT_COMPLETE => (Claim::Now(Outcome::Done(ACT_BROADCAST)), evicted),
            SLOT_FOLDING => (Claim::Now(Outcome::Busy), evicted),
            _ => {
                s.pending |= PENDING_RESULT;
                (Claim::Copy(PENDING_RESULT), evicted)
            }
        };
    }
    let bit = 1u32 << (handoff.child & 31);
    if s.bitmap & bit != 0 {
        let again = match s.state {
            SLOT_COMPLETE if handoff.child == LOCAL_CHILD => ACT_COMPLETE,
            SLOT_COMPLETE => ACT_REPLY,
            // The partial is resent from the slot's data, which the parent's result is
            // being copied over while PENDING_RESULT is set: a resend then would carry a
            // mix of both (the result follows at once).
            SLOT_SENT_UP if s.pending & PENDING_RESULT == 0 => ACT_UP,
            _ => ACT_DROP,
        };
        return (Claim::Now(Outcome::Duplicate(again)), evicted);
    }
    if s.state != SLOT_AGGREGATING {
        return (Claim::Now(Outcome::Stale), evicted);
    }
    s.bitmap |= bit;
    s.arrived += 1;
    s.pending |= bit;
    if let Some(t) = s.templates.get_mut(handoff.child as usize) {
        t.valid = 1;
    }
    (Claim::Copy(bit), evicted)
}

/// A claimed copy is done (`loaded`: the payload is in): under the lock again, what the
/// packet does now. The settle that leaves every input in and no copy in flight starts the
/// fold.
#[inline(always)]
fn settle(s: &mut Slot, handoff: &Handoff, bit: u32, loaded: bool) -> Outcome {
    s.pending &= !bit;
    if bit == PENDING_RESULT {
        if !loaded {
            return Outcome::Unreadable;
        }
        s.state = SLOT_COMPLETE;
        return Outcome::Done(ACT_BROADCAST);
    }
    if !loaded {
        // Not taken: a retransmission brings it again.
        s.bitmap &= !bit;
        s.arrived = s.arrived.saturating_sub(1);
        return Outcome::Unreadable;
    }
    // The parent's result may have completed the round meanwhile.
    if s.state != SLOT_AGGREGATING
        || u32::from(s.arrived) < handoff.expected
        || s.pending & !PENDING_RESULT != 0
    {
        return Outcome::Done(ACT_DROP);
    }
    s.state = SLOT_FOLDING;
    Outcome::Fold(if handoff.is_root != 0 {
        ACT_BROADCAST
    } else {
        ACT_UP
    })
}

/// Counts the outcome on the group; the action for the emit program, or `None` when the
/// packet ends here.
#[inline(always)]
fn count(handoff: &Handoff, outcome: Outcome, evicted: bool) -> Option<u32> {
    let index = handoff.index;
    let action = match outcome {
        Outcome::Stale => {
            group_count(index, |g| g.stale += 1);
            return None;
        }
        Outcome::Mismatch => {
            group_count(index, |g| g.mismatch += 1);
            return None;
        }
        Outcome::Busy => {
            group_count(index, |g| g.busy += 1);
            return None;
        }
        Outcome::Unreadable => {
            group_count(index, |g| g.unreadable += 1);
            return None;
        }
        Outcome::Evicted | Outcome::Fold(_) => {
            group_count(index, |g| g.evicted += 1);
            return None;
        }
        Outcome::Duplicate(a) => {
            group_count(index, |g| g.duplicates += 1);
            a
        }
        Outcome::Done(a) => {
            group_count(index, |g| {
                g.evicted += u64::from(evicted);
                if handoff.from_parent != 0 {
                    g.results_down += 1;
                } else {
                    g.aggregated += 1;
                    g.completed += u64::from(a != ACT_DROP);
                }
            });
            a
        }
    };
    (action != ACT_DROP).then_some(action)
}

/// Folds a round's stash into the slot's data (outside the lock: `bpf_loop` is a helper;
/// the slot is the folding CPU's until it says otherwise), then makes the fold the round's
/// result, or drops the round if the fold failed (its inputs come again).
#[inline(always)]
fn finish_fold<A: Arith>(slot: *mut Slot, index: u32, len: u32, action: u32) -> Outcome {
    // SAFETY: bitmap and count are fixed while the slot is folding.
    let (bitmap, count) = unsafe { ((*slot).bitmap, (*slot).count) };
    let folded = fold::fold::<A>(index, bitmap, u32::from(count), len);
    unsafe { bpf_spin_lock(lock(slot)) };
    // SAFETY: the slot is ours while the lock is held.
    let s = unsafe { &mut *slot };
    let outcome = if folded {
        s.state = if action == ACT_BROADCAST {
            SLOT_COMPLETE
        } else {
            SLOT_SENT_UP
        };
        Outcome::Done(action)
    } else {
        s.state = SLOT_EMPTY;
        Outcome::Evicted
    };
    unsafe { bpf_spin_unlock(lock(slot)) };
    outcome
}

/// Saves the packet's headers as child `child`'s template. One helper call: a plain copy
/// from the packet, whose alignment LLVM cannot know, becomes 84 byte loads and stores.
#[inline(always)]
fn save_template(ctx: &XdpContext, slot: *mut Slot, child: usize, dst_child: u8) {
    // SAFETY: the map value outlives the program; bounds of `child` checked by the caller.
    let t = unsafe { &mut (*slot).templates[child & (MAX_CHILDREN - 1)] };
    // SAFETY: the template holds TEMPLATE_LEN bytes; the helper checks the packet side.
    let loaded =
        unsafe { bpf_xdp_load_bytes(ctx.ctx, 0, t.bytes.as_mut_ptr().cast(), TEMPLATE_LEN as u32) };
    if loaded == 0 {
        t.dst_child = dst_child;
    }
}
