//! innet's XDP programs. This file holds only the entry points; each job lives in its own
//! module: `classify` (what is this frame), `dataplane` (which group, which child),
//! `agg` (add into the slot), `emit` (send results), `crc` (ICRC), `maps`. Operators load
//! this object; the lab's test programs are another (`lab.rs`).
//!
//! Program chain of an INC data packet:
//! `innet_switch` → tail call `innet_agg` (→ tail call `fold_<op>_<type>` when the round is
//! complete) → tail call `innet_emit` → broadcast through
//! the `PORTS` devmap, where `innet_egress` rewrites each copy for its port; a result that
//! spans several buffers (jumbo links) is passed to the stack instead, where `innet_fanout`
//! (tc ingress of the same port) sends the copies.
//!
//! Every program declares `xdp.frags` (the kernel wants one kind in a tail-call chain and a
//! devmap): a port keeps its MTU and jumbo frames pass whole. Headers always sit in the
//! first buffer, read directly; payloads of up to 8 KiB may span several, read and written
//! with `bpf_xdp_load_bytes`/`bpf_xdp_store_bytes`.
#![no_std]
#![no_main]

mod agg;
mod arith;
mod classify;
mod control;
mod crc;
mod dataplane;
mod elem;
mod emit;
mod fanout;
mod fold;
mod frag;
mod lost;
mod maps;
mod object;
mod parse;
mod template;

use aya_ebpf::{
    bindings::xdp_action,
    macros::{classifier, xdp},
    programs::{TcContext, XdpContext},
};
use innet_common::{
    proto::Op,
    softfloat::{BF16, F16, F32, F64},
    stats::PortStats,
    validate::{Class, Malformed},
};

use crate::classify::classify;

/// Switch-port program: classifies every frame and counts it per ingress port; INC data of
/// a group installed here goes to aggregation, malformed INC (fragments and other layouts
/// included) is dropped, everything else passes on untouched.
#[xdp(frags)]
pub fn innet_switch(ctx: XdpContext) -> u32 {
    let Some((class, stats)) = classify_and_count(&ctx) else {
        return xdp_action::XDP_PASS;
    };
    let verdict = match class {
        Class::IncData => dataplane::handle(&ctx, stats),
        Class::IncControl => control::hand_up(&ctx, stats),
        // Counted by reason already; passed on, it could reach a member unchecked.
        Class::Malformed(reason) => {
            if reason == Malformed::Fragment {
                frag::dropped_first(&ctx);
            }
            return count_verdict(stats, xdp_action::XDP_DROP);
        }
        Class::NonRoce if frag::of_dropped(&ctx) => {
            stats.later_fragments_dropped += 1;
            return count_verdict(stats, xdp_action::XDP_DROP);
        }
        // Ordinary traffic: counted on the counters already in hand (no second lookup).
        Class::NonRoce | Class::RoceOther => return count_verdict(stats, xdp_action::XDP_PASS),
    };
    if let Some(verdict) = verdict {
        return finish(&ctx, verdict);
    }
    finish(&ctx, xdp_action::XDP_PASS)
}

/// NIC-role program (host NIC port, or a DPU's representors): INC data of a NIC group
/// installed here is aggregated (children's contributions, and on a DPU the host's own
/// part from its port) or handed to the host (results); everything else passes on
/// untouched, control packets included (the host's library reads them), except a host's
/// setup request to its DPU, which goes to the DPU daemon.
#[xdp(frags)]
pub fn innet_nic(ctx: XdpContext) -> u32 {
    nic_entry(&ctx, false)
}

/// The host posts its own contribution through this program: attached to the NIC's post
/// port (a veth pair in the host's namespace, no address, no bridge), so no frame from the
/// wire reaches it.
#[xdp(frags)]
pub fn innet_nic_post(ctx: XdpContext) -> u32 {
    nic_entry(&ctx, true)
}

#[inline(always)]
fn nic_entry(ctx: &XdpContext, posted: bool) -> u32 {
    let Some((class, stats)) = classify_and_count(ctx) else {
        return xdp_action::XDP_PASS;
    };
    if let Class::Malformed(reason) = class {
        // Counted by reason already; the host must not take what the NIC could not check.
        if reason == Malformed::Fragment && !posted {
            frag::dropped_first(ctx);
        }
        return count_verdict(stats, xdp_action::XDP_DROP);
    }
    // The rest of a datagram dropped above would only fill the host's reassembly queue.
    if !posted && class == Class::NonRoce && frag::of_dropped(ctx) {
        stats.later_fragments_dropped += 1;
        return count_verdict(stats, xdp_action::XDP_DROP);
    }
    if !posted && !matches!(class, Class::IncData | Class::IncControl) {
        // Ordinary traffic: counted on the counters already in hand.
        return count_verdict(stats, xdp_action::XDP_PASS);
    }
    // On a DPU, what arrives from the host's port is the host's own (trusted) traffic.
    let from_host = !posted && maps::is_host_port(ctx.ingress_ifindex() as u32);
    if class == Class::IncData
        && let Some(verdict) = dataplane::handle_nic(ctx, stats, posted, from_host)
    {
        return finish(ctx, verdict);
    }
    // A host's request to its DPU goes to the DPU daemon.
    if class == Class::IncControl
        && from_host
        && control::is_dpu_setup(ctx)
        && let Some(verdict) = control::hand_up(ctx, stats)
    {
        return finish(ctx, verdict);
    }
    // A post that is no contribution of a group here goes nowhere.
    count_verdict(
        stats,
        if posted {
            xdp_action::XDP_DROP
        } else {
            xdp_action::XDP_PASS
        },
    )
}

/// Emits the result the aggregation program decided on (tail call target).
#[xdp(frags)]
pub fn innet_emit(ctx: XdpContext) -> u32 {
    emit::run(&ctx)
}

/// Answers INC data addressed to this switch for a group it does not hold with a
/// group-lost notice to its sender (tail call target `JUMP_LOST`).
#[xdp(frags)]
pub fn innet_lost(ctx: XdpContext) -> u32 {
    lost::run(&ctx)
}

/// Devmap egress program: rewrites each broadcast copy for the child behind its port.
#[xdp(frags, map = "devmap")]
pub fn innet_egress(ctx: XdpContext) -> u32 {
    emit::egress(&ctx)
}

/// tc ingress of every switch port: sends a multi-buffer result the emit program marked to
/// each child (a devmap broadcast refuses such frames); every other frame passes untouched.
#[classifier]
pub fn innet_fanout(ctx: TcContext) -> i32 {
    fanout::run(&ctx)
}

/// Classifies the frame and counts it on its ingress port; `None` only when the port's
/// counters cannot be had (more ports than the map holds).
#[inline(always)]
fn classify_and_count<'a>(ctx: &XdpContext) -> Option<(Class, &'a mut PortStats)> {
    let class = classify(ctx);
    let stats = maps::port_stats(ctx.ingress_ifindex() as u32)?;
    // SAFETY: per-CPU value of this CPU; nothing else writes it while we run.
    let stats = unsafe { &mut *stats };
    record_class(stats, ctx, class);
    Some((class, stats))
}

#[inline(always)]
fn record_class(stats: &mut PortStats, ctx: &XdpContext, class: Class) {
    stats.rx_packets += 1;
    // The whole frame: a jumbo frame spans several buffers (xdp.frags), of which the program
    // sees the first.
    // SAFETY: the helper reads the context the kernel passed in.
    stats.rx_bytes += unsafe { aya_ebpf::helpers::bpf_xdp_get_buff_len(ctx.ctx) };
    match class {
        Class::NonRoce => stats.non_roce += 1,
        Class::RoceOther => stats.roce_other += 1,
        Class::IncData => stats.inc_data += 1,
        Class::IncControl => stats.inc_control += 1,
        Class::Malformed(reason) => {
            stats.malformed += 1;
            *stats.reason_mut(reason) += 1;
        }
    }
}

/// Counts the verdict on the ingress port and returns it. Every program that ends a
/// packet's chain returns through here, so the verdict counters add up to `rx_packets`.
#[inline(always)]
pub(crate) fn finish(ctx: &XdpContext, action: u32) -> u32 {
    if let Some(stats) = maps::port_stats(ctx.ingress_ifindex() as u32) {
        // SAFETY: per-CPU value of this CPU.
        count_verdict(unsafe { &mut *stats }, action);
    }
    action
}

/// Counts `action` on the ingress port's counters already looked up, and returns it.
#[inline(always)]
fn count_verdict(stats: &mut PortStats, action: u32) -> u32 {
    match action {
        xdp_action::XDP_PASS => stats.xdp_pass += 1,
        xdp_action::XDP_DROP => stats.xdp_drop += 1,
        xdp_action::XDP_TX => stats.xdp_tx += 1,
        xdp_action::XDP_REDIRECT => stats.xdp_redirect += 1,
        _ => stats.xdp_aborted += 1,
    }
    action
}

/// Aggregation (tail call target `JUMP_AGG`): a contribution of any op and type into its
/// slot; a complete round goes on to its fold program.
#[xdp(frags)]
pub fn innet_agg(ctx: XdpContext) -> u32 {
    agg::run(&ctx)
}

/// One fold program per op × type, named `fold_<op>_<type>`, folding with `arith::$kind`
/// (`Int` or `Float`); userspace puts each into `JUMP` at `jump_fold(op, type)`
/// (`Op::defined_on` says which pairs exist: MPI defines SUM, PROD, MIN, MAX and the LOC
/// pairs on floats, no LOC pairs on the half types, no bitwise or logical ops).
macro_rules! folds {
    ($kind:ident: $($op:ident => [$($name:ident: $t:ty),*]),* $(,)?) => {$($(
        #[xdp(frags)]
        pub fn $name(ctx: XdpContext) -> u32 {
            agg::fold_round::<arith::$kind<$t, { Op::$op as u8 }>>(&ctx)
        }
    )*)*};
}

folds! {
    Float:
    Sum => [fold_sum_f32: F32, fold_sum_f64: F64, fold_sum_f16: F16, fold_sum_bf16: BF16],
    Prod => [fold_prod_f32: F32, fold_prod_f64: F64, fold_prod_f16: F16, fold_prod_bf16: BF16],
    Min => [fold_min_f32: F32, fold_min_f64: F64, fold_min_f16: F16, fold_min_bf16: BF16],
    Max => [fold_max_f32: F32, fold_max_f64: F64, fold_max_f16: F16, fold_max_bf16: BF16],
    Minloc => [fold_minloc_f32: F32, fold_minloc_f64: F64],
    Maxloc => [fold_maxloc_f32: F32, fold_maxloc_f64: F64],
}

folds! {
    Int:
    Sum => [fold_sum_i8: i8, fold_sum_i16: i16, fold_sum_i32: i32, fold_sum_i64: i64, fold_sum_u8: u8, fold_sum_u16: u16, fold_sum_u32: u32, fold_sum_u64: u64],
    Prod => [fold_prod_i8: i8, fold_prod_i16: i16, fold_prod_i32: i32, fold_prod_i64: i64, fold_prod_u8: u8, fold_prod_u16: u16, fold_prod_u32: u32, fold_prod_u64: u64],
    Min => [fold_min_i8: i8, fold_min_i16: i16, fold_min_i32: i32, fold_min_i64: i64, fold_min_u8: u8, fold_min_u16: u16, fold_min_u32: u32, fold_min_u64: u64],
    Max => [fold_max_i8: i8, fold_max_i16: i16, fold_max_i32: i32, fold_max_i64: i64, fold_max_u8: u8, fold_max_u16: u16, fold_max_u32: u32, fold_max_u64: u64],
    Band => [fold_band_i8: i8, fold_band_i16: i16, fold_band_i32: i32, fold_band_i64: i64, fold_band_u8: u8, fold_band_u16: u16, fold_band_u32: u32, fold_band_u64: u64],
    Bor => [fold_bor_i8: i8, fold_bor_i16: i16, fold_bor_i32: i32, fold_bor_i64: i64, fold_bor_u8: u8, fold_bor_u16: u16, fold_bor_u32: u32, fold_bor_u64: u64],
    Bxor => [fold_bxor_i8: i8, fold_bxor_i16: i16, fold_bxor_i32: i32, fold_bxor_i64: i64, fold_bxor_u8: u8, fold_bxor_u16: u16, fold_bxor_u32: u32, fold_bxor_u64: u64],
    Land => [fold_land_i8: i8, fold_land_i16: i16, fold_land_i32: i32, fold_land_i64: i64, fold_land_u8: u8, fold_land_u16: u16, fold_land_u32: u32, fold_land_u64: u64],
    Lor => [fold_lor_i8: i8, fold_lor_i16: i16, fold_lor_i32: i32, fold_lor_i64: i64, fold_lor_u8: u8, fold_lor_u16: u16, fold_lor_u32: u32, fold_lor_u64: u64],
    Lxor => [fold_lxor_i8: i8, fold_lxor_i16: i16, fold_lxor_i32: i32, fold_lxor_i64: i64, fold_lxor_u8: u8, fold_lxor_u16: u16, fold_lxor_u32: u32, fold_lxor_u64: u64],
    Minloc => [fold_minloc_i8: i8, fold_minloc_i16: i16, fold_minloc_i32: i32, fold_minloc_i64: i64, fold_minloc_u8: u8, fold_minloc_u16: u16, fold_minloc_u32: u32, fold_minloc_u64: u64],
    Maxloc => [fold_maxloc_i8: i8, fold_maxloc_i16: i16, fold_maxloc_i32: i32, fold_maxloc_i64: i64, fold_maxloc_u8: u8, fold_maxloc_u16: u16, fold_maxloc_u32: u32, fold_maxloc_u64: u64],
}
