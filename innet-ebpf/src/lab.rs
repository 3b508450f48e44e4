//! The lab's eBPF object, which operators never load: the test fabrics' wire with its fault
//! injector (`innet_fault`) and an empty XDP program (`innet_pass`), the benchmarks'
//! baseline and the wake-up that veth ports of a test wire need. `innet-lab` embeds it
//! (`innet_objects::lab_object`); the operators' object (`main.rs`) holds production
//! programs only.
#![no_std]
#![no_main]

mod classify;
mod fault_wire;
mod object;
mod parse;

use aya_ebpf::{
    bindings::xdp_action,
    macros::{classifier, xdp},
    programs::{TcContext, XdpContext},
};

/// The wire of a test fabric's link (tc ingress of both wire ports): forwards every frame
/// to the other port, dropping, duplicating or delaying INC data at the configured rates
/// (see `innet_common::fault`).
#[classifier]
pub fn innet_fault(ctx: TcContext) -> i32 {
    fault_wire::run(&ctx)
}

/// An XDP run with nothing in it: the benchmarks report every program's cost per packet
/// as a ratio to this one, and a test wire's ports run it so that a switch's `XDP_TX`
/// replies into them are delivered at once.
#[xdp(frags)]
pub fn innet_pass(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}
