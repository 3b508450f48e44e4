//! Issue 32, the reply path at every level, end to end with switch daemons and the
//! library's handshake.
//!
//! On the campaign's wired fabric (2 TORs × 2 nodes × 2 sockets under 1 SPINE, 8 ranks in
//! inc-node) the results going down one uplink are dropped, so that TOR waits in `SENT_UP`
//! while its parent already completed the round. Its hosts' retransmissions make it send
//! its partial up again, and the parent answers from the slot's saved result (`replies` on
//! the parent), so no collective falls back to the hosts.
//!
//! On a three-level fabric (2 pods × 2 TORs × 2 nodes, 2 aggregation switches per pod, 2
//! cores; 8 ranks, one per node, a tree rooted at a core) the results are dropped on each
//! level in turn — going down the host links, the TORs' uplinks, the aggregation switches'
//! uplinks — and the parent at that level (a TOR, an aggregation switch, the core) answers
//! the repeated contributions or partials from its saved result.

use std::time::Duration;

use innet::group_maps::GroupMaps;
use innet_client::Layout;
use innet_client::{Communicator, Path};
use innet_common::{
    fault::KIND_RESULT,
    proto::{Dtype, Op},
    stats::GroupStats,
};
use innet_lab::wire_faults::Faults;
use innet_lab::{
    daemons::{installed, wait_until},
    job::run_job,
    topology::{Dir, Link, Switch, Topology},
};
use innet_tools::campaign::{
    fabric::{Setting, WiredFabric},
    vanish::Levels,
};

/// One fabric at a time (2 cores).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Every group's counters on `sw`, summed.
fn stats(sw: &Switch) -> GroupStats {
    let mut sum = GroupStats::default();
    if let Ok(list) = GroupMaps::open(&sw.pins.layout).and_then(|m| m.list()) {
        for g in list {
            sum.accumulate(&g.stats);
        }
    }
    sum
}

#[test]
fn a_lost_result_on_an_uplink_is_answered_by_the_parent() {
    innet_lab::require_root();
    let _serial = serial();
    let fabric = WiredFabric::with(Setting::default());
    let wires = fabric.topo.wires.as_ref().expect("wired");
    let link = Link::tor_up(1, 0);
    wires.set(
        link,
        Dir::Down,
        Faults {
            kinds: KIND_RESULT,
            drop: 0.3,
            ..Faults::default()
        },
    );
    let calls = 300;
    let spine = &fabric.topo.spines[0];
    let out = run_job(
        &fabric.topo,
        fabric.layout,
        innet_client::Mode::IncNode,
        |cfg| {
            cfg.retry = Duration::from_millis(2);
        },
        |comm: &mut Communicator| {
            let fell_back = checked_calls(comm, calls);
            // The group is still installed: its kill comes with the communicator's drop.
            let spine_stats = (comm.rank() == 0).then(|| stats(spine));
            (fell_back, spine_stats)
        },
    );
    let dropped = wires.stats(link, Dir::Down).dropped;
    wires.set(link, Dir::Down, Faults::default());
    let fallbacks: usize = out.iter().map(|(f, _)| f).sum();
    let spine_stats = out[0].1.expect("rank 0 read the SPINE");
    eprintln!(
        "{calls} calls × 8 ranks: {dropped} results dropped on the uplink, SPINE replies {}, \
         duplicates {}, fallbacks {fallbacks}",
        spine_stats.replies, spine_stats.duplicates
    );
    assert!(dropped > 10, "results were dropped: {dropped}");
    assert!(
        spine_stats.replies > 0,
        "the SPINE answered repeated partials: {spine_stats:?}"
    );
    assert_eq!(fallbacks, 0, "no collective fell back");
}

/// Where the results are dropped (going down), and the level of the switches that must
/// answer.
#[derive(Clone, Copy, Debug)]
enum Level {
    /// TOR → host: the TOR answers the hosts' repeated contributions.
    HostLinks,
    /// Aggregation switch → TOR: the aggregation switch answers the TORs' repeated partials.
    TorUplinks,
    /// Core → aggregation switch: the core answers.
    AggUplinks,
}

impl Level {
    fn links(self, topo: &Topology) -> Vec<Link> {
        let mut links: Vec<Link> = topo
            .wires
            .as_ref()
            .expect("wired")
            .links()
            .filter(|l| match (self, l) {
                (Self::HostLinks, Link::Host(_)) => true,
                (Self::TorUplinks, Link::Uplink { level, .. }) => *level == 1,
                (Self::AggUplinks, Link::Uplink { level, .. }) => *level == 2,
                _ => false,
            })
            .collect();
        links.sort_unstable();
        links
    }

    /// The level (1 TOR, 2 aggregation, 3 core) of the parents that must answer.
    const fn parent(self) -> usize {
        match self {
            Self::HostLinks => 1,
            Self::TorUplinks => 2,
            Self::AggUplinks => 3,
        }
    }
}

/// Group `wire`'s counters on the switches of `level`, summed.
/// `calls` allreduces (SUM of 3 int32) on `comm`, every result checked; how many did not
/// run in the network.
fn checked_calls(comm: &mut Communicator, calls: i32) -> usize {
    let n = comm.size() as i32;
    let mut fell_back = 0;
    for call in 0..calls {
        let send: Vec<u8> = (0..3)
            .flat_map(|k| (comm.rank() as i32 + k + call).to_ne_bytes())
            .collect();
        let mut recv = vec![0u8; send.len()];
        let r = comm
            .allreduce_bytes(&send, &mut recv, Op::Sum, Dtype::I32)
            .unwrap_or_else(|e| panic!("rank {}: {e}", comm.rank()));
        for k in 0..3 {
            let want = n * (n - 1) / 2 + n * (k + call);
            let got = i32::from_ne_bytes(
                recv[4 * usize::try_from(k).unwrap()..][..4]
                    .try_into()
                    .unwrap(),
            );
            assert_eq!(got, want, "rank {} call {call}", comm.rank());
        }
        if !matches!(r.path, Path::Network(_)) || r.fallback.is_some() {
            fell_back += 1;
        }
    }
    fell_back
}

fn level_stats(topo: &Topology, level: usize, wire: u32) -> GroupStats {
    let mut sum = GroupStats::default();
    for sw in topo.switches().filter(|s| s.level == level) {
        if let Some(g) = installed(sw, wire) {
            sum.accumulate(&g.stats);
        }
    }
    sum
}

#[test]
fn a_lost_result_is_answered_by_the_parent_at_every_level_of_three() {
    innet_lab::require_root();
    let _serial = serial();
    // The vanish campaign's fabric: 2 pods × 2 TORs × 2 nodes, 2 aggregation switches per
    // pod, 2 cores, wired, a daemon on every switch and node.
    let fabric = Levels::new();
    let topo = &fabric.topo;
    let wires = topo.wires.as_ref().expect("wired");
    let calls = 200;
    let mut failures = vec![];
    for level in [Level::HostLinks, Level::TorUplinks, Level::AggUplinks] {
        let links = level.links(topo);
        let faults = Faults {
            kinds: KIND_RESULT,
            drop: 0.3,
            ..Faults::default()
        };
        for &l in &links {
            wires.set(l, Dir::Down, faults);
        }
        let before: u64 = links
            .iter()
            .map(|&l| wires.stats(l, Dir::Down).dropped)
            .sum();
        let out = run_job(
            topo,
            Layout::new(8, 1, 1).expect("layout"),
            innet_client::Mode::IncNode,
            |cfg| {
                cfg.retry = Duration::from_millis(2);
            },
            |comm: &mut Communicator| {
                let fell_back = checked_calls(comm, calls);
                // The group is still installed: its kill comes with the MRR's drop.
                let seen = (comm.rank() == 0).then(|| {
                    let wire = comm.group().expect("a group").wire_id;
                    (wire, [1, 2, 3].map(|l| level_stats(topo, l, wire)))
                });
                (fell_back, seen)
            },
        );
        let dropped: u64 = links
            .iter()
            .map(|&l| wires.stats(l, Dir::Down).dropped)
            .sum::<u64>()
            - before;
        for &l in &links {
            wires.set(l, Dir::Down, Faults::default());
        }
        let fallbacks: usize = out.iter().map(|(f, _)| f).sum();
        let (wire, stats) = out[0].1.expect("rank 0 read the switches");
        let parent = stats[level.parent() - 1];
        eprintln!(
            "{level:?}: {calls} calls × 8 ranks, {} links, {dropped} results dropped; replies \
             TOR {} / aggregation {} / core {}; completed at the core {}; fallbacks {fallbacks}",
            links.len(),
            stats[0].replies,
            stats[1].replies,
            stats[2].replies,
            stats[2].completed,
        );
        if dropped <= 10 || parent.replies == 0 || fallbacks > 0 || stats[2].completed == 0 {
            failures.push(format!(
                "{level:?}: dropped {dropped}, parent replies {}, fallbacks {fallbacks}, \
                 core completed {} ({parent:?})",
                parent.replies, stats[2].completed
            ));
        }
        for sw in topo.switches() {
            wait_until(
                "the kill frees every level",
                Duration::from_secs(10),
                || installed(sw, wire).is_none(),
            );
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
