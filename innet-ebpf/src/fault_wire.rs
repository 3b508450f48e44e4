//! The wire of test fabrics (`innet_fault`, tc ingress on both wire ports): forwards every
//! frame to the other port; drops, duplicates or delays INC data at the configured rates.

use aya_ebpf::{
    bindings::{BPF_NOEXIST, TC_ACT_OK, TC_ACT_SHOT},
    btf_maps::{HashMap, PerCpuHashMap, RingBuf},
    helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns, bpf_redirect, bpf_skb_load_bytes},
    macros::btf_map,
    programs::TcContext,
};
use innet_common::{
    fault::{
        DELAY_RING_BYTES, DELAYED_FRAME_MAX, DelayedFrame, FaultConfig, FaultStats,
        KIND_CONTRIBUTION, KIND_RESULT, PPM,
    },
    maps::MAX_PORTS,
    proto::BTH_FLAG_RESULT,
    validate::Class,
    wire::{ETH_LEN, IPV4_LEN, UDP_LEN},
};

use crate::{classify::classify, parse::helper_len};

/// Settings per wire port (written by the test harness).
#[btf_map]
static FAULT_CONFIG: HashMap<u32, FaultConfig, { MAX_PORTS as usize }> = HashMap::new();
/// What each wire port saw and did, per CPU.
#[btf_map]
static FAULT_STATS: PerCpuHashMap<u32, FaultStats, { MAX_PORTS as usize }> = PerCpuHashMap::new();
/// Frames held back (`DelayedFrame` records), for userspace to re-send when due.
#[btf_map]
static FAULT_DELAYED: RingBuf<(), DELAY_RING_BYTES> = RingBuf::new();

// `helper_len` masks lengths to 14 bits.
const _: () = assert!(DELAYED_FRAME_MAX <= 0x4000);

/// This CPU's counters of wire port `ifindex`, created zeroed on first use.
#[inline(always)]
fn fault_stats(ifindex: u32) -> Option<*mut FaultStats> {
    if let Some(p) = FAULT_STATS.get_ptr_mut(ifindex) {
        return Some(p);
    }
    // Another CPU may insert concurrently: NOEXIST makes that harmless, lookup again.
    let _ = FAULT_STATS.insert(ifindex, FaultStats::default(), u64::from(BPF_NOEXIST));
    FAULT_STATS.get_ptr_mut(ifindex)
}

const BTH_FLAGS: usize = ETH_LEN + IPV4_LEN + UDP_LEN + 1;

/// What happens to one frame.
enum Fate {
    Forward,
    Drop,
    Duplicate,
    Delay,
}

#[inline(always)]
pub fn run(ctx: &TcContext) -> i32 {
    // SAFETY: reading the skb's own ifindex field.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    // SAFETY: userspace-written config; read only.
    let Some(cfg) = (unsafe { FAULT_CONFIG.get(&ifindex) }) else {
        // Not a wire port: leave the frame to the stack.
        return TC_ACT_OK as i32;
    };
    let Some(stats) = fault_stats(ifindex) else {
        return forward(cfg);
    };
    // SAFETY: this CPU's copy.
    let stats = unsafe { &mut *stats };
    stats.frames += 1;
    // Direct packet access covers only the linear part: classify needs the headers there.
    let _ = ctx.pull_data(ctx.len());
    match fate(ctx, cfg, stats) {
        Fate::Forward => forward(cfg),
        Fate::Drop => {
            stats.dropped += 1;
            TC_ACT_SHOT as i32
        }
        Fate::Duplicate => {
            if ctx.clone_redirect(cfg.peer_ifindex, 0).is_ok() {
                stats.duplicated += 1;
            }
            forward(cfg)
        }
        Fate::Delay => {
            if hold(ctx, cfg) {
                stats.delayed += 1;
                TC_ACT_SHOT as i32
            } else {
                stats.delay_overflow += 1;
                forward(cfg)
            }
        }
    }
}

#[inline(always)]
fn forward(cfg: &FaultConfig) -> i32 {
    // SAFETY: plain helper call.
    unsafe { bpf_redirect(cfg.peer_ifindex, 0) as i32 }
}

/// One random draw decides; only INC data of the configured kinds is ever touched.
#[inline(always)]
fn fate(ctx: &TcContext, cfg: &FaultConfig, stats: &mut FaultStats) -> Fate {
    if classify(ctx) != Class::IncData {
        return Fate::Forward;
    }
    // A helper load: LLVM merges a second packet bounds check here into the classifier's
    // earlier ones, in a form the verifier refuses.
    let Ok(flags) = ctx.load::<u8>(BTH_FLAGS) else {
        return Fate::Forward;
    };
    let kind = if flags & BTH_FLAG_RESULT != 0 {
        stats.results += 1;
        KIND_RESULT
    } else {
        stats.contributions += 1;
        KIND_CONTRIBUTION
    };
    if cfg.kinds & kind == 0 {
        return Fate::Forward;
    }
    // SAFETY: plain helper call.
    let draw = unsafe { bpf_get_prandom_u32() } % PPM;
    if draw < cfg.drop_ppm {
        Fate::Drop
    } else if draw < cfg.drop_ppm + cfg.duplicate_ppm {
        Fate::Duplicate
    } else if draw < cfg.drop_ppm + cfg.duplicate_ppm + cfg.delay_ppm {
        Fate::Delay
    } else {
        Fate::Forward
    }
}

/// Copies the frame to the delay ring for userspace to send when due. `false`: ring full
/// or frame too long.
#[inline(always)]
fn hold(ctx: &TcContext, cfg: &FaultConfig) -> bool {
    let Some(n) = helper_len(ctx.len() as usize, DELAYED_FRAME_MAX) else {
        return false;
    };
    let Some(mut entry) = FAULT_DELAYED.reserve_untyped::<DelayedFrame>(0) else {
        return false;
    };
    let rec = entry.as_mut_ptr();
    // SAFETY: rec points at reserved ring memory of size_of::<DelayedFrame>(); n ≤ its frame.
    let ok = unsafe {
        (*rec).ifindex = cfg.peer_ifindex;
        (*rec).len = n;
        (*rec).due_ns = bpf_ktime_get_ns() + u64::from(cfg.delay_us) * 1000;
        bpf_skb_load_bytes(ctx.skb.skb.cast(), 0, (&raw mut (*rec).frame).cast(), n) == 0
    };
    if ok {
        entry.submit(0);
    } else {
        entry.discard(0);
    }
    ok
}
