//! The campaign's fabrics: a small wired fabric with every daemon running, its fault knobs
//! per kind of link, and what it holds (groups, daemon memory) for churn and soak; and a
//! three-level one (TORs under aggregation switches under cores) for the loss settings.

use innet::{group_maps::GroupMaps, loader::XdpMode};
use innet_client::Layout;
use innet_common::fault::FaultStats;
use innet_lab::wire_faults::Faults;

use innet_lab::{
    daemons::{
        DaemonGuard, daemons_on, dpu_daemons_on, learn_hosts, nic_daemons_on, rss_kib, with_window,
    },
    topology::{Dir, Link, Options, Shape, Topology},
};

/// The fabric: 2 TORs × 2 nodes × 2 sockets under one SPINE, every link through a wire,
/// switch daemons on every switch and a NIC daemon on every node, and (for `inc-dpu`) each
/// NIC behind a DPU with a DPU daemon on the leaders' ones; 8 ranks (one per socket).
///
/// With [`Setting::three_levels`]: 2 pods × 2 TORs × 2 nodes × 2 sockets, 2 aggregation
/// switches per pod, 2 cores ([`THREE_LEVELS`]), every link through a wire, a switch daemon
/// on every switch and no NIC or DPU daemons (its modes are `inc-node` and `inc-socket`);
/// 16 ranks (one per socket).
pub struct WiredFabric {
    // Daemons stop before the fabric goes.
    daemons: Vec<DaemonGuard>,
    pub topo: Topology,
    pub layout: Layout,
}

/// What a fabric's links and switches are set to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Setting {
    /// Slots per group on every switch and NIC (`None`: the default window).
    pub window: Option<u32>,
    /// MTU of every link (`None`: 1500 B).
    pub mtu: Option<usize>,
    /// A DPU before every NIC (the host links' wires start at the DPUs' uplinks).
    pub dpus: bool,
    /// The three-level fabric ([`THREE_LEVELS`]) instead of the two-level one.
    pub three_levels: bool,
}

/// The three-level fabric's shape: 2 pods of 2 TORs of 2 nodes with 2 sockets each, 2
/// aggregation switches per pod, 2 cores. 32 wired links (16 host links, 8 TOR →
/// aggregation, 8 aggregation → core), kept small: attaching XDP costs time per port.
pub const THREE_LEVELS: Shape = Shape::three_level(2, 2, 2, 2, 2).with_sockets(2);

impl WiredFabric {
    /// The main fabric: every mode runs on it, `inc-dpu` included.
    #[must_use]
    pub fn new() -> Self {
        Self::with(Setting {
            dpus: true,
            ..Setting::default()
        })
    }

    #[must_use]
    pub fn with(setting: Setting) -> Self {
        let shape = if setting.three_levels {
            THREE_LEVELS
        } else {
            Shape::two_level(2, 2, 1).with_sockets(2)
        };
        let topo = Topology::with(
            shape.with_mode(XdpMode::Native),
            Options {
                innet: true,
                wires: true,
                mtu: setting.mtu,
                window: setting.window,
                dpus: setting.dpus,
                link_rate: None,
            },
        );
        learn_hosts(&topo);
        let daemons = with_window(setting.window, |extra| {
            let mut daemons = daemons_on(&topo, extra);
            if setting.three_levels {
                return daemons;
            }
            daemons.extend(nic_daemons_on(&topo, extra));
            if setting.dpus {
                daemons.extend(dpu_daemons_on(&topo, extra));
            }
            daemons
        });
        Self {
            daemons,
            layout: Layout::new(topo.hosts.len(), 2, 2).expect("layout"),
            topo,
        }
    }

    /// Groups installed on every switch and NIC, and the daemons' resident memory (KiB).
    #[must_use]
    pub fn state(&self) -> (usize, u64) {
        let pins = self.topo.switches().map(|s| &s.pins).chain(
            self.topo
                .hosts
                .iter()
                .filter(|h| h.socket == 0)
                .flat_map(|h| std::iter::once(&h.pins).chain(h.dpu.as_ref().map(|d| &d.pins))),
        );
        let groups = pins
            .filter_map(|p| GroupMaps::open(&p.layout).ok())
            .map(|m| m.list().map_or(0, |l| l.len()))
            .sum();
        let rss = self
            .daemons
            .iter()
            .map(|d| rss_kib(d.0.id()).unwrap_or(0))
            .sum();
        (groups, rss)
    }

    /// Switch levels: 2, or 3 for the three-level fabric.
    #[must_use]
    pub fn levels(&self) -> usize {
        self.topo.shape.levels
    }

    fn links(&self, place: Place) -> Vec<Link> {
        let mut links: Vec<Link> = self
            .topo
            .wires
            .as_ref()
            .expect("wired")
            .links()
            .filter(|l| {
                matches!(
                    (place, l),
                    (Place::Host, Link::Host(_))
                        | (Place::Uplink, Link::Uplink { .. })
                        | (Place::Uplink1, Link::Uplink { level: 1, .. })
                        | (Place::Uplink2, Link::Uplink { level: 2, .. })
                )
            })
            .collect();
        links.sort_unstable();
        assert!(!links.is_empty(), "no {} on this fabric", place.name());
        links
    }

    /// Sets `faults` on both directions of every link of `place`.
    pub fn set(&self, place: Place, faults: Faults) {
        let wires = self.topo.wires.as_ref().expect("wired");
        for link in self.links(place) {
            for dir in [Dir::Up, Dir::Down] {
                wires.set(link, dir, faults);
            }
        }
    }

    /// Every link of `place`, each direction, with its wire port's counters so far.
    #[must_use]
    pub fn counters(&self, place: Place) -> Vec<(Link, Dir, FaultStats)> {
        let wires = self.topo.wires.as_ref().expect("wired");
        self.links(place)
            .into_iter()
            .flat_map(|link| [Dir::Up, Dir::Down].map(|dir| (link, dir, wires.stats(link, dir))))
            .collect()
    }

    /// Packets dropped + duplicated + delayed so far on the links of `place`.
    pub fn injected(&self, place: Place) -> u64 {
        let wires = self.topo.wires.as_ref().expect("wired");
        let mut sum = FaultStats::default();
        for link in self.links(place) {
            for dir in [Dir::Up, Dir::Down] {
                sum.accumulate(&wires.stats(link, dir));
            }
        }
        sum.dropped + sum.duplicated + sum.delayed
    }
}

impl Default for WiredFabric {
    fn default() -> Self {
        Self::new()
    }
}

/// Which links are faulty.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Place {
    /// Every host's link to its TOR.
    Host,
    /// Every switch-to-switch link: a TOR's to the SPINE (2 levels), or both levels' (3).
    Uplink,
    /// The level-1 uplinks: TOR to SPINE (2 levels) or to aggregation switch (3 levels).
    Uplink1,
    /// The level-2 uplinks of a three-level fabric: aggregation switch to core.
    Uplink2,
}

impl Place {
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Host => "host links",
            Self::Uplink => "uplinks",
            Self::Uplink1 => "level-1 uplinks",
            Self::Uplink2 => "level-2 uplinks",
        }
    }
}
