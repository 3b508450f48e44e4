//! `BPF_PROG_TEST_RUN` tests share one loaded object per test binary (loading the ~100
//! programs takes seconds) and run its programs on frames.

use std::{net::Ipv4Addr, sync::Mutex, time::Duration};

use aya::{
    Ebpf,
    maps::{MapData, PerCpuHashMap},
    programs::{TestRun as _, TestRunOptions, Xdp},
};
use innet::{
    group_maps::{ChildSpec, GroupMaps, GroupSpec, Role},
    loader::{Sizing, load_switch},
};
use innet_common::{
    codec::{Addressing, data_header, encode},
    maps::{PORT_STATS, PROG_PASS},
    proto::{Dtype, Op, element_bytes},
    stats::PortStats,
};

use crate::require_root;

pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;
pub const XDP_REDIRECT: u32 = 4;
/// BPF_PROG_TEST_RUN runs XDP as if received on the loopback device.
pub const LO: u32 = 1;

/// The object with its group maps taken out (the programs keep using them), and beside it
/// the lab's object with its empty program loaded (`innet_pass`, the no-op baseline).
pub struct Loaded {
    pub ebpf: Ebpf,
    pub groups: GroupMaps,
    pub lab: Ebpf,
}

/// Runs `f` on the object in `slot`, loading it on first use; one test at a time.
pub fn with_loaded<R>(slot: &Mutex<Option<Loaded>>, f: impl FnOnce(&mut Loaded) -> R) -> R {
    let mut guard = slot
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    f(guard.get_or_insert_with(|| Loaded::switch(8)))
}

/// Installs `id` as a root TOR group (replacing an earlier one) whose children, given as
/// (address, rank), sit behind the test device.
pub fn install_root(
    groups: &mut GroupMaps,
    id: u32,
    children: impl Iterator<Item = (Ipv4Addr, u32)>,
) {
    let _ = groups.remove(id);
    groups
        .install(&GroupSpec {
            id,
            role: Role::Tor,
            parent: None,
            own_rank: 0,
            mrr: None,
            children: children
                .map(|(ip, rank)| ChildSpec {
                    ip,
                    ifindex: LO,
                    rank,
                })
                .collect(),
        })
        .unwrap_or_else(|e| panic!("install group {id:#x}: {e}"));
}

/// An INC data frame of group `id` from rank `from`, whole round `round` (its 24-bit PSN;
/// `req_id` is the low byte, as hosts send them), between the given (IPv4, MAC) addresses;
/// the element count follows from the body.
#[must_use]
pub fn data_frame(
    id: u32,
    from: u32,
    (src_ip, src_mac): (Ipv4Addr, [u8; 6]),
    (dst_ip, dst_mac): (Ipv4Addr, [u8; 6]),
    round: u32,
    (op, dtype): (Op, Dtype),
    body: &[u8],
) -> Vec<u8> {
    let addr = Addressing {
        src_ip,
        dst_ip,
        src_mac,
        dst_mac,
        psn: round & 0x00ff_ffff,
        ..Addressing::default()
    };
    let count = (body.len() / element_bytes(op, dtype)) as u16;
    encode(
        &addr,
        &data_header(id, from, op, dtype, round as u8, 0, count),
        body,
    )
}

/// `PORT_STATS` of a loaded object, summed over ports and CPUs.
#[must_use]
pub fn port_totals(ebpf: &Ebpf) -> PortStats {
    let map: PerCpuHashMap<&MapData, u32, PortStats> =
        PerCpuHashMap::try_from(ebpf.map(PORT_STATS).expect("map")).expect("typed map");
    let mut t = PortStats::default();
    for entry in &map {
        let (_, per_cpu) = entry.expect("read map");
        per_cpu.iter().for_each(|s| t.accumulate(s));
    }
    t
}

/// The lab's object with `innet_pass` loaded.
fn load_pass() -> Ebpf {
    let object = innet_objects::lab_object().expect("the lab's eBPF object");
    let mut lab = aya::EbpfLoader::new()
        .load(object)
        .expect("load the lab's object");
    let pass: &mut Xdp = lab
        .program_mut(PROG_PASS)
        .expect("innet_pass")
        .try_into()
        .expect("xdp");
    pass.load().expect("load innet_pass");
    lab
}

impl Loaded {
    /// Loads the switch's object with room for `capacity` groups and takes its group maps.
    #[must_use]
    pub fn switch(capacity: u32) -> Self {
        Self::sized(Sizing {
            capacity,
            ..Sizing::default()
        })
    }

    /// Loads the switch's object with its maps sized as `sizing` says.
    #[must_use]
    pub fn sized(sizing: Sizing) -> Self {
        require_root();
        let mut ebpf = load_switch(sizing).expect("load the programs");
        let groups = GroupMaps::take(&mut ebpf).expect("group maps");
        Self {
            ebpf,
            groups,
            lab: load_pass(),
        }
    }

    /// Runs program `prog` once on `frame`: its verdict and the frame it left.
    #[must_use]
    pub fn run(&self, prog: &str, frame: &[u8]) -> (u32, Vec<u8>) {
        let (verdict, _, out) = self.run_timed(prog, frame, 1);
        (verdict, out)
    }

    /// Runs program `prog` `repeat` times on `frame`: its verdict, the kernel's mean time
    /// per run, and the frame it left.
    #[must_use]
    pub fn run_timed(&self, prog: &str, frame: &[u8], repeat: u32) -> (u32, Duration, Vec<u8>) {
        let prog: &Xdp = self
            .ebpf
            .program(prog)
            .or_else(|| self.lab.program(prog))
            .expect("program")
            .try_into()
            .expect("xdp");
        let mut out = vec![0u8; frame.len() + 64];
        let r = prog
            .test_run(TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut out),
                repeat,
                ..TestRunOptions::new()
            })
            .expect("test_run");
        out.truncate(r.data_size_out as usize);
        (r.return_value, r.duration, out)
    }
}
