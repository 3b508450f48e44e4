//! The fault injector of test fabrics: drops every n-th INC contribution or result.

use aya_ebpf::{bindings::xdp_action, programs::XdpContext};
use innet_common::{
    proto::BTH_FLAG_RESULT,
    validate::Class,
    wire::{ETH_LEN, IPV4_LEN, UDP_LEN},
};

use crate::{
    classify::classify,
    maps::{FAULT_CONFIG, FAULT_STATS},
    parse::ptr_at,
};

const BTH_FLAGS: usize = ETH_LEN + IPV4_LEN + UDP_LEN + 1;

#[inline(always)]
pub fn run(ctx: &XdpContext) -> u32 {
    if classify(ctx) != Class::IncData {
        return xdp_action::XDP_PASS;
    }
    let (Some(cfg), Some(stats), Some(flags)) = (
        FAULT_CONFIG.get(0),
        FAULT_STATS.get_ptr_mut(0),
        ptr_at::<u8>(ctx, BTH_FLAGS),
    ) else {
        return xdp_action::XDP_PASS;
    };
    // SAFETY: this CPU's counters; bounds of `flags` checked by ptr_at.
    let (stats, result) = unsafe { (&mut *stats, *flags & BTH_FLAG_RESULT != 0) };
    let drop = if result {
        stats.results += 1;
        let every = u64::from(cfg.drop_result_every);
        let hit = every > 0 && stats.results % every == 0;
        stats.results_dropped += u64::from(hit);
        hit
    } else {
        stats.contributions += 1;
        let every = u64::from(cfg.drop_contribution_every);
        let hit = every > 0 && stats.contributions % every == 0;
        stats.contributions_dropped += u64::from(hit);
        hit
    };
    if drop {
        xdp_action::XDP_DROP
    } else {
        xdp_action::XDP_PASS
    }
}
