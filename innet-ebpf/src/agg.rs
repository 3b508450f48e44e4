//! Aggregation: one program per op × type (reached by tail call from `innet_switch`) takes
//! a contribution into its slot under the slot's spin lock, and decides what to send.
//! Contributions are stashed whole and folded in input order once all are in (see `fold`):
//! floats because rounding makes order matter, integers because a fold under `bpf_loop` is
//! walked once by the verifier, while a combine loop under the lock (no helper calls there)
//! would be walked per element, too often for an 8 KiB payload of bytes.

use aya_ebpf::{
    bindings::xdp_action,
    helpers::{bpf_spin_lock, bpf_spin_unlock, bpf_xdp_load_bytes},
    programs::XdpContext,
};
use innet_common::{
    group::{
        ACT_BROADCAST, ACT_COMPLETE, ACT_DROP, ACT_REPLY, ACT_UP, Handoff, JUMP_EMIT, LOCAL_CHILD,
        MAX_CHILDREN, SLOT_AGGREGATING, SLOT_COMPLETE, SLOT_EMPTY, SLOT_FOLDING, SLOT_SENT_UP,
        Slot, Stash, TEMPLATE_LEN, bpf_spin_lock as Lock, stash_index,
    },
    proto::{LOC_BYTES, MAX_PAYLOAD_BYTES},
    softfloat,
    wire::{IncHeader, PAYLOAD_OFFSET},
};

use crate::{
    elem::{Elem, FloatElem, combine, combine_float, combine_loc},
    finish, fold,
    maps::{HANDOFF, JUMP, MAX_FRAME, SCRATCH, SLOTS, STASH, group_count},
    parse::{helper_len, ptr_at},
};

/// How an aggregation program combines one element of a contribution into its accumulator,
/// both in wire format (big-endian).
pub trait Arith {
    /// The op (`Op as u8`).
    const OP: u8;
    /// Bytes of one value; a MINLOC/MAXLOC element adds [`LOC_BYTES`] of location after it.
    const WIDTH: usize;
    /// Value-only elements one fold step takes (LOC pairs go one a step).
    const PER_STEP: u32;
    /// `acc = acc OP input` for one value-only element.
    ///
    /// # Safety
    /// Both point at `WIDTH` readable (and `acc` writable) bytes, aligned to `WIDTH`.
    unsafe fn combine_at(acc: *mut u8, input: *const u8);
    /// `acc = acc OP input` for one (value, location) pair.
    ///
    /// # Safety
    /// Both point at `WIDTH + LOC_BYTES` readable (and `acc` writable) bytes.
    unsafe fn combine_loc_at(acc: *mut u8, input: *const u8);
}

/// An integer op: exact, so the fold order does not change the result.
pub struct Int<T, const OP: u8>(core::marker::PhantomData<T>);

impl<T: Elem, const OP: u8> Arith for Int<T, OP> {
    const OP: u8 = OP;
    const WIDTH: usize = T::WIDTH;
    const PER_STEP: u32 = 8;
    #[inline(always)]
    unsafe fn combine_at(acc: *mut u8, input: *const u8) {
        // SAFETY: the caller's promise.
        unsafe {
            combine::<T, OP>(T::load_aligned(acc), T::load_aligned(input)).store_aligned(acc);
        }
    }
    #[inline(always)]
    unsafe fn combine_loc_at(acc: *mut u8, input: *const u8) {
        // SAFETY: the caller's promise.
        unsafe {
            let (a, b) = (T::load(acc), T::load(input));
            let (la, lb) = (load_loc(acc.add(T::WIDTH)), load_loc(input.add(T::WIDTH)));
            let (v, l) = combine_loc::<T, OP>(a, la, b, lb);
            v.store(acc);
            store_loc(acc.add(T::WIDTH), l);
        }
    }
}

/// A float op: rounding makes order matter, so contributions are folded in input order.
pub struct Float<F, const OP: u8>(core::marker::PhantomData<F>);

impl<F: FloatElem, const OP: u8> Arith for Float<F, OP> {
    const OP: u8 = OP;
    const WIDTH: usize = F::WIDTH;
    const PER_STEP: u32 = 4;
    #[inline(always)]
    unsafe fn combine_at(acc: *mut u8, input: *const u8) {
        // SAFETY: the caller's promise.
        unsafe {
            let v = combine_float::<F, OP>(F::load_aligned(acc), F::load_aligned(input));
            F::store_aligned(v, acc);
        }
    }
    #[inline(always)]
    unsafe fn combine_loc_at(acc: *mut u8, input: *const u8) {
        // SAFETY: the caller's promise.
        unsafe {
            let a = (F::load(acc), load_loc(acc.add(F::WIDTH)));
            let b = (F::load(input), load_loc(input.add(F::WIDTH)));
            let v = softfloat::select_loc::<F::Format>(
                OP == innet_common::proto::Op::Minloc as u8,
                a,
                b,
            );
            F::store(v.0, acc);
            store_loc(acc.add(F::WIDTH), v.1);
        }
    }
}

#[inline(always)]
unsafe fn load_loc(p: *const u8) -> i32 {
    // SAFETY: the caller's promise (4 readable bytes).
    i32::from_be_bytes(unsafe { *(p as *const [u8; LOC_BYTES]) })
}

#[inline(always)]
unsafe fn store_loc(p: *mut u8, loc: i32) {
    // SAFETY: the caller's promise (4 writable bytes).
    unsafe { *(p as *mut [u8; LOC_BYTES]) = loc.to_be_bytes() };
}

const INC_OFFSET: usize = PAYLOAD_OFFSET - core::mem::size_of::<IncHeader>();

/// How a packet relates to its slot, decided under the lock.
enum Outcome {
    Stale,
    Mismatch,
    Duplicate(u32),
    Done(u32),
    /// Float round: every input is stashed; fold them, then do this.
    Fold(u32),
    /// A float round lost its slot to a newer round while it was folded.
    Evicted,
}

#[inline(always)]
fn lock(slot: *mut Slot) -> *mut aya_ebpf::bindings::bpf_spin_lock {
    // SAFETY: innet_common's bpf_spin_lock has the kernel's layout (one u32).
    unsafe { (&raw mut (*slot).lock).cast::<Lock>().cast() }
}

/// Whether round `r` is newer than the slot's round `s` (serial-number arithmetic mod 256).
#[inline(always)]
fn newer(r: u8, s: u8) -> bool {
    let d = r.wrapping_sub(s);
    d != 0 && d < 128
}

/// The aggregation program body for `A`'s element type and op: the packet's payload is
/// copied out, its slot decides under the lock ([`decide`]), a float round is folded
/// outside it, the outcome is counted ([`count`]) and the emit program takes over.
#[inline(always)]
pub fn run<A: Arith>(ctx: &XdpContext) -> u32 {
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
    let packet = Packet {
        round: hdr.req_id,
        count: hdr.pkt_para_num(),
        oper_and_type: hdr.oper_and_type,
    };

    // The template is written before the lock: a bounded copy of packet bytes, identical for
    // every retransmission of this child's packet, and guarded by `valid` under the lock.
    if handoff.from_parent == 0 && handoff.child < MAX_CHILDREN as u32 {
        save_template(ctx, slot, handoff.child as usize, handoff.dst_child as u8);
    }
    let (payload, len) = match load_payload(ctx, handoff) {
        Ok(p) => p,
        Err(verdict) => return finish(ctx, verdict),
    };
    // The contribution's stash entry (a helper call, so looked up before the lock; a
    // parent's result has child index MAX_CHILDREN and never uses it).
    let Some(stash) = STASH.get_ptr_mut(stash_index(handoff.slot, handoff.child)) else {
        return finish(ctx, xdp_action::XDP_ABORTED);
    };

    unsafe { bpf_spin_lock(lock(slot)) };
    // SAFETY: the slot is ours while the lock is held.
    let (outcome, evicted) =
        decide::<A>(unsafe { &mut *slot }, handoff, &packet, payload, len, stash);
    unsafe { bpf_spin_unlock(lock(slot)) };
    let outcome = match outcome {
        Outcome::Fold(action) => finish_fold::<A>(slot, handoff.slot, packet.round, len, action),
        other => other,
    };

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
    round: u8,
    count: u16,
    oper_and_type: u8,
}

/// Copies the packet's payload into this CPU's scratch (before the lock: no helpers inside
/// it); the buffer and the length, or the verdict to give up with.
#[inline(always)]
fn load_payload(
    ctx: &XdpContext,
    handoff: &Handoff,
) -> Result<(&'static mut [u8; MAX_FRAME], u32), u32> {
    let Some(scratch) = SCRATCH.get_ptr_mut(0) else {
        return Err(xdp_action::XDP_ABORTED);
    };
    // SAFETY: this CPU's scratch buffer.
    let payload = unsafe { &mut (*scratch).bytes };
    let Some(len) = helper_len(handoff.payload_len as usize, MAX_PAYLOAD_BYTES) else {
        return Err(xdp_action::XDP_DROP);
    };
    // SAFETY: payload holds MAX_FRAME >= len bytes; the helper checks the packet side.
    if unsafe {
        bpf_xdp_load_bytes(
            ctx.ctx,
            PAYLOAD_OFFSET as u32,
            payload.as_mut_ptr().cast(),
            len,
        )
    } != 0
    {
        return Err(xdp_action::XDP_DROP);
    }
    Ok((payload, len))
}

/// The slot's decision on one packet, under its lock (no helper calls: inlined into the
/// locked region). Also says whether an unfinished older round was evicted.
#[inline(always)]
fn decide<A: Arith>(
    s: &mut Slot,
    handoff: &Handoff,
    packet: &Packet,
    payload: &[u8; MAX_FRAME],
    len: u32,
    stash: *mut Stash,
) -> (Outcome, bool) {
    let mut evicted = false;
    if s.state == SLOT_EMPTY || newer(packet.round, s.round) {
        evicted = s.state == SLOT_AGGREGATING || s.state == SLOT_SENT_UP;
        s.round = packet.round;
        s.state = SLOT_AGGREGATING;
        s.op = A::OP;
        s.dtype = packet.oper_and_type;
        s.count = packet.count;
        s.arrived = 0;
        s.bitmap = 0;
        let mut k = 0;
        while k < MAX_CHILDREN {
            s.templates[k].valid = 0;
            k += 1;
        }
    } else if s.round != packet.round {
        return (Outcome::Stale, evicted);
    }
    if s.op != A::OP || s.dtype != packet.oper_and_type || s.count != packet.count {
        return (Outcome::Mismatch, evicted);
    }
    if handoff.from_parent != 0 {
        // The final result from the parent: keep it, then fan it out.
        // SAFETY: the payload buffer and slot data, both 8-aligned, MAX_PAYLOAD_BYTES or
        // more.
        unsafe { copy_payload(payload.as_ptr(), s.data.as_mut_ptr(), len) };
        s.state = SLOT_COMPLETE;
        return (Outcome::Done(ACT_BROADCAST), evicted);
    }
    let bit = 1u32 << (handoff.child & 31);
    if s.bitmap & bit != 0 {
        let again = match s.state {
            SLOT_COMPLETE if handoff.child == LOCAL_CHILD => ACT_COMPLETE,
            SLOT_COMPLETE => ACT_REPLY,
            SLOT_SENT_UP => ACT_UP,
            _ => ACT_DROP,
        };
        return (Outcome::Duplicate(again), evicted);
    }
    if s.state != SLOT_AGGREGATING {
        return (Outcome::Stale, evicted);
    }
    // SAFETY: a stash entry of this slot, guarded by its lock like the slot.
    unsafe { copy_payload(payload.as_ptr(), (*stash).bytes.as_mut_ptr(), len) };
    s.bitmap |= bit;
    s.arrived += 1;
    if let Some(t) = s.templates.get_mut(handoff.child as usize) {
        t.valid = 1;
    }
    if u32::from(s.arrived) < handoff.expected {
        return (Outcome::Done(ACT_DROP), evicted);
    }
    let action = if handoff.is_root != 0 {
        ACT_BROADCAST
    } else {
        ACT_UP
    };
    s.state = SLOT_FOLDING;
    (Outcome::Fold(action), evicted)
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

/// Folds a float round's stash (outside the lock: `bpf_loop` is a helper) into this CPU's
/// scratch, then, if the slot still holds the round, makes the fold its result.
#[inline(always)]
fn finish_fold<A: Arith>(slot: *mut Slot, index: u32, round: u8, len: u32, action: u32) -> Outcome {
    // SAFETY: bitmap and count are fixed while the slot is folding this round; a newer round
    // that claims the slot meanwhile is caught below.
    let (bitmap, count) = unsafe { ((*slot).bitmap, (*slot).count) };
    let folded = fold::fold::<A>(index, bitmap, u32::from(count), len);
    let Some(scratch) = SCRATCH.get_ptr(0) else {
        return Outcome::Evicted;
    };
    unsafe { bpf_spin_lock(lock(slot)) };
    // SAFETY: the slot is ours while the lock is held.
    let s = unsafe { &mut *slot };
    let outcome = if folded && s.state == SLOT_FOLDING && s.round == round {
        // SAFETY: this CPU's scratch, written by the fold.
        unsafe { copy_payload((*scratch).bytes.as_ptr(), s.data.as_mut_ptr(), len) };
        s.state = if action == ACT_BROADCAST {
            SLOT_COMPLETE
        } else {
            SLOT_SENT_UP
        };
        Outcome::Done(action)
    } else {
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

/// Bytes `copy_payload` moves a step: 32 words, unrolled.
const COPY_BLOCK: usize = 256;
const _: () = assert!(MAX_PAYLOAD_BYTES.is_multiple_of(COPY_BLOCK));

/// Copies a `len`-byte payload (rounded up to whole 256 B blocks) into slot data, a stash
/// entry or the scratch buffer, eight bytes at a time: packet copy, slot data, stash and
/// scratch are 8-aligned map values of at least `MAX_PAYLOAD_BYTES` (bytes past `len` are
/// never sent as elements). The loop counts blocks in a variable of its own, dead after
/// the loop: the verifier then merges its exits, where a test on `len` (or a count shared
/// with the next copy) would leave one state per length to walk the rest of the program
/// with.
///
/// # Safety
/// `src` and `dst` are 8-aligned and hold at least `MAX_PAYLOAD_BYTES` bytes.
#[inline(always)]
pub(crate) unsafe fn copy_payload(src: *const u8, dst: *mut u8, len: u32) {
    const WORDS: usize = COPY_BLOCK / 8;
    // A fresh load: LLVM would otherwise share one block count among a program's copies,
    // and the count each loop exit narrowed would reach the next copy.
    // SAFETY: reads a local.
    let len = unsafe { core::ptr::read_volatile(&raw const len) };
    let blocks = (len as usize).div_ceil(COPY_BLOCK);
    let dst = dst.cast::<u64>();
    let src = src.cast::<u64>();
    let mut b = 0;
    while b < blocks && b < MAX_PAYLOAD_BYTES / COPY_BLOCK {
        let mut w = 0;
        while w < WORDS {
            // SAFETY: (b + 1) × COPY_BLOCK <= MAX_PAYLOAD_BYTES, inside both buffers (the
            // caller's promise), both 8-aligned; volatile keeps LLVM from turning the loop
            // into a memcpy call, which BPF does not have.
            unsafe {
                core::ptr::write_volatile(dst.add(b * WORDS + w), *src.add(b * WORDS + w));
            }
            w += 1;
        }
        b += 1;
    }
}
