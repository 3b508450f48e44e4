//! innet's XDP programs. This file holds only the entry points: they classify, count and
//! return the verdict; everything else lives in one module per job.
#![no_std]
#![no_main]

mod classify;
mod maps;
mod parse;

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};
use innet_common::{stats::PortStats, validate::Class};

use crate::classify::classify;

/// Switch-port program: classifies every frame, counts it per ingress port, and (for now)
/// passes everything on to the stack and the bridge untouched.
#[xdp]
pub fn innet_switch(ctx: XdpContext) -> u32 {
    let class = classify(&ctx);
    let action = xdp_action::XDP_PASS;
    if let Some(stats) = maps::port_stats(ctx.ingress_ifindex() as u32) {
        // SAFETY: per-CPU value of this CPU; nothing else writes it while we run.
        let stats = unsafe { &mut *stats };
        record(stats, &ctx, class, action);
    }
    action
}

#[inline(always)]
fn record(stats: &mut PortStats, ctx: &XdpContext, class: Class, action: u32) {
    stats.rx_packets += 1;
    stats.rx_bytes += (ctx.data_end() - ctx.data()) as u64;
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
    match action {
        xdp_action::XDP_PASS => stats.xdp_pass += 1,
        xdp_action::XDP_DROP => stats.xdp_drop += 1,
        xdp_action::XDP_TX => stats.xdp_tx += 1,
        xdp_action::XDP_REDIRECT => stats.xdp_redirect += 1,
        _ => stats.xdp_aborted += 1,
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
