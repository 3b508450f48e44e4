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
        every_nth(
            &mut stats.results,
            &mut stats.results_dropped,
            cfg.drop_result_every,
        )
    } else {
        every_nth(
            &mut stats.contributions,
            &mut stats.contributions_dropped,
            cfg.drop_contribution_every,
        )
    };
    if drop {
        xdp_action::XDP_DROP
    } else {
        xdp_action::XDP_PASS
    }
}

/// Counts one more packet of a kind in `seen`; whether it is the `every`-th (0: never),
/// counted in `dropped`.
#[inline(always)]
fn every_nth(seen: &mut u64, dropped: &mut u64, every: u32) -> bool {
    *seen += 1;
    let hit = every > 0 && *seen % u64::from(every) == 0;
    *dropped += u64::from(hit);
    hit
}
