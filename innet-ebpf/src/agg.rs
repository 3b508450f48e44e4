//! Aggregation: one program per op × type (reached by tail call from `innet_switch`) takes
//! a contribution into its slot under the slot's spin lock, and decides what to send.
//! Integers are added in as they arrive (their ops are exact, so order cannot matter);
//! floats are stashed and folded in input order once all are in (see `fold`).

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
    wire::{IncHeader, PAYLOAD_OFFSET},
};

use crate::{
    elem::{Elem, FloatElem, carries_location, combine, combine_loc},
    finish, fold,
    maps::{HANDOFF, JUMP, MAX_FRAME, SCRATCH, SLOTS, STASH, group_count},
    parse::{helper_len, ptr_at},
};

/// How an aggregation program combines contributions.
pub trait Arith {
    /// Contributions are stashed and folded in input order once all are in (floats),
    /// instead of added into the slot as they arrive (integers).
    const FOLDS: bool;
    /// Adds `count` elements of `payload` into the slot's data (arrival order).
    fn accumulate(payload: &[u8; MAX_FRAME], s: &mut Slot, count: usize);
    /// Folds the stashed inputs `bitmap` of slot `slot` into this CPU's scratch.
    fn fold(slot: u32, bitmap: u32, count: u32) -> bool;
}

/// An integer op: exact, so contributions are added in as they arrive.
pub struct Int<T, const OP: u8>(core::marker::PhantomData<T>);

impl<T: Elem, const OP: u8> Arith for Int<T, OP> {
    const FOLDS: bool = false;
    #[inline(always)]
    fn accumulate(payload: &[u8; MAX_FRAME], s: &mut Slot, count: usize) {
        accumulate::<T, OP>(payload, s, count);
    }
    #[inline(always)]
    fn fold(_: u32, _: u32, _: u32) -> bool {
        false
    }
}

/// A float op: rounding makes order matter, so contributions are folded in input order.
pub struct Float<F, const OP: u8>(core::marker::PhantomData<F>);

impl<F: FloatElem, const OP: u8> Arith for Float<F, OP> {
    const FOLDS: bool = true;
    #[inline(always)]
    fn accumulate(_: &[u8; MAX_FRAME], _: &mut Slot, _: usize) {}
    #[inline(always)]
    fn fold(slot: u32, bitmap: u32, count: u32) -> bool {
        fold::fold::<F, OP>(slot, bitmap, count)
    }
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
pub fn run<A: Arith, const OP: u8>(ctx: &XdpContext) -> u32 {
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
    // A float contribution's stash entry (a helper call, so looked up before the lock; a
    // parent's result has child index MAX_CHILDREN and never uses it).
    let mut stash = core::ptr::null_mut();
    if A::FOLDS {
        match STASH.get_ptr_mut(stash_index(handoff.slot, handoff.child)) {
            Some(p) => stash = p,
            None => return finish(ctx, xdp_action::XDP_ABORTED),
        }
    }

    unsafe { bpf_spin_lock(lock(slot)) };
    // SAFETY: the slot is ours while the lock is held.
    let (outcome, evicted) =
        decide::<A, OP>(unsafe { &mut *slot }, handoff, &packet, payload, len, stash);
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
fn decide<A: Arith, const OP: u8>(
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
        s.op = OP;
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
    if s.op != OP || s.dtype != packet.oper_and_type || s.count != packet.count {
        return (Outcome::Mismatch, evicted);
    }
    if handoff.from_parent != 0 {
        // The final result from the parent: keep it, then fan it out.
        // SAFETY: the payload buffer and slot data, both 8-aligned, MAX_PAYLOAD_BYTES or
        // more.
        unsafe { copy_words(payload.as_ptr(), s.data.as_mut_ptr(), copy_len::<A>(len)) };
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
    if A::FOLDS {
        // SAFETY: a stash entry of this slot, guarded by its lock like the slot.
        unsafe {
            copy_words(
                payload.as_ptr(),
                (*stash).bytes.as_mut_ptr(),
                copy_len::<A>(len),
            );
        }
    } else if s.arrived == 0 {
        // SAFETY: the payload buffer and slot data, both 8-aligned, MAX_PAYLOAD_BYTES or
        // more.
        unsafe { copy_words(payload.as_ptr(), s.data.as_mut_ptr(), len as usize) };
    } else {
        A::accumulate(payload, s, usize::from(packet.count));
    }
    s.bitmap |= bit;
    s.arrived += 1;
    if let Some(t) = s.templates.get_mut(handoff.child as usize) {
        t.valid = 1;
    }
    if u32::from(s.arrived) < handoff.expected {
        return (Outcome::Done(ACT_DROP), evicted);
    }
    let is_root = handoff.is_root != 0;
    let action = if is_root { ACT_BROADCAST } else { ACT_UP };
    if A::FOLDS {
        s.state = SLOT_FOLDING;
        return (Outcome::Fold(action), evicted);
    }
    s.state = if is_root { SLOT_COMPLETE } else { SLOT_SENT_UP };
    (Outcome::Done(action), evicted)
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
    let folded = A::fold(index, bitmap, u32::from(count));
    let Some(scratch) = SCRATCH.get_ptr(0) else {
        return Outcome::Evicted;
    };
    unsafe { bpf_spin_lock(lock(slot)) };
    // SAFETY: the slot is ours while the lock is held.
    let s = unsafe { &mut *slot };
    let outcome = if folded && s.state == SLOT_FOLDING && s.round == round {
        // SAFETY: this CPU's scratch, written by the fold.
        unsafe {
            copy_words(
                (*scratch).bytes.as_ptr(),
                s.data.as_mut_ptr(),
                copy_len::<A>(len),
            );
        }
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

/// Bytes to copy of a `len`-byte payload. Float programs copy whole buffers: they have
/// three copies under locks, and loops bounded by `len` would make the verifier walk every
/// length of each (a constant bound is walked once).
#[inline(always)]
fn copy_len<A: Arith>(len: u32) -> usize {
    if A::FOLDS {
        MAX_PAYLOAD_BYTES
    } else {
        len as usize
    }
}

/// Copies `len` bytes (rounded up to whole words) of a payload into slot data, a stash
/// entry or the scratch buffer (first contribution, the parent's result, a float
/// contribution or fold), eight bytes at a time: packet buffer, slot data, stash and scratch
/// are 8-aligned, and `MAX_PAYLOAD_BYTES` is a multiple of 8 (bytes past `len` are never
/// sent as elements).
///
/// # Safety
/// `src` and `dst` are 8-aligned and hold at least `MAX_PAYLOAD_BYTES` bytes.
#[inline(always)]
pub(crate) unsafe fn copy_words(src: *const u8, dst: *mut u8, len: usize) {
    const WORD: usize = 8;
    const _: () = assert!(MAX_PAYLOAD_BYTES.is_multiple_of(WORD));
    let dst = dst.cast::<u64>();
    let src = src.cast::<u64>();
    let mut i = 0;
    while i * WORD < len && i < MAX_PAYLOAD_BYTES / WORD {
        // SAFETY: i < 176 words, inside both buffers (the caller's promise), both 8-aligned
        // (map values; offset 16 in the slot); volatile keeps LLVM from turning the loop
        // into a memcpy call, which BPF does not have.
        unsafe { core::ptr::write_volatile(dst.add(i), *src.add(i)) };
        i += 1;
    }
}

/// Adds `count` elements of the packet into the slot.
#[inline(always)]
fn accumulate<T: Elem, const OP: u8>(payload: &[u8; MAX_FRAME], s: &mut Slot, count: usize) {
    if !carries_location(OP) {
        accumulate_aligned::<T, OP>(payload, s, count);
        return;
    }
    let size = T::WIDTH + LOC_BYTES;
    let max = MAX_PAYLOAD_BYTES / size;
    let mut i = 0;
    while i < count && i < max {
        let off = i * size;
        if off + size > MAX_PAYLOAD_BYTES {
            return;
        }
        let acc = s.data.as_mut_ptr().wrapping_add(off);
        let p = payload.as_ptr().wrapping_add(off);
        // SAFETY: packet bounds and slot bounds checked just above.
        unsafe {
            let (a, b) = (T::load(acc), T::load(p));
            let la = i32::from_be_bytes(*(acc.add(T::WIDTH) as *const [u8; 4]));
            let lb = i32::from_be_bytes(*(p.add(T::WIDTH) as *const [u8; 4]));
            let (v, l) = combine_loc::<T, OP>(a, la, b, lb);
            v.store(acc);
            *(acc.add(T::WIDTH) as *mut [u8; 4]) = l.to_be_bytes();
        }
        i += 1;
    }
}

/// The value-only ops: element `i` sits at `i × WIDTH` in the 8-aligned slot data and
/// scratch buffer, so every access is aligned (one load, one byte swap). Elements go in
/// pairs: the verifier walks every iteration and keeps one pending branch per `count` test,
/// and a jumbo payload of bytes has too many for it one by one. When `count` is odd the
/// pair's second element lies past the message: it combines leftovers into slot bytes that
/// are never sent (results carry `count` elements; a round's first contribution is copied).
#[inline(always)]
fn accumulate_aligned<T: Elem, const OP: u8>(
    payload: &[u8; MAX_FRAME],
    s: &mut Slot,
    count: usize,
) {
    let max = MAX_PAYLOAD_BYTES / T::WIDTH;
    const { assert!(MAX_PAYLOAD_BYTES.is_multiple_of(16)) };
    let mut i = 0;
    while i < count && i + 1 < max {
        let off = i * T::WIDTH;
        let acc = s.data.as_mut_ptr().wrapping_add(off);
        let p = payload.as_ptr().wrapping_add(off);
        // SAFETY: off + 2 × WIDTH <= MAX_PAYLOAD_BYTES (i + 1 < max) inside both buffers;
        // aligned as above.
        unsafe {
            combine::<T, OP>(T::load_aligned(acc), T::load_aligned(p)).store_aligned(acc);
            let (acc, p) = (acc.add(T::WIDTH), p.add(T::WIDTH));
            combine::<T, OP>(T::load_aligned(acc), T::load_aligned(p)).store_aligned(acc);
        }
        i += 2;
    }
}
