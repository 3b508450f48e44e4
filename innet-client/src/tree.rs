//! The MRR's choice of a group's tree, from the ways up the fabric that its climb and its
//! NMRRs' queries took (each a list of switches from a TOR up, with their free capacity).
//!
//! The ways are read as the fabric's links up (so a lost copy of one costs nothing when its
//! links were seen on others). The root is a switch above every leader's TOR, at the lowest
//! level where one exists (a TOR when every leader hangs off it), the least loaded of those.
//! Each TOR then takes the least loaded of its ways up to the root that agrees with the
//! parents chosen so far (so every switch has one parent), preferring switches the tree
//! already has. The notify each NMRR gets names its path through the tree: up the
//! MRR's branch to where it meets the NMRR's, then down that branch; each hop with its
//! parent and its number of children.

use std::{
    collections::{BTreeSet, HashMap},
    net::Ipv4Addr,
};

use innet_common::{
    group::MAX_CHILDREN,
    wire::{ControlPath, MAX_LEVELS, PathHop},
};

/// One way up: the switches a query or climb crossed, its TOR first.
pub type Way = Vec<PathHop>;

/// Why no tree serves the group.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NoTree {
    #[error("no way up from {0}: its query or the MRR's climb crossed no innet switch")]
    NoWay(Ipv4Addr),
    #[error("no innet switch lies above every leader")]
    NoCommonSwitch,
    #[error("switch {switch} would have {children} children (at most {MAX_CHILDREN})")]
    TooManyChildren { switch: Ipv4Addr, children: usize },
}

/// The chosen tree: its root and the path of each NMRR's notify.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tree {
    pub root: Ipv4Addr,
    /// 1 when the root is a TOR.
    pub level: usize,
    pub paths: Vec<(Ipv4Addr, ControlPath)>,
}

/// How ways are weighed: by free capacity (Node mode) or by address alone (Socket mode,
/// whose MRRs each choose for their own NMRRs and must choose alike).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weigh {
    ByLoad,
    ByAddress,
}

/// Chooses the tree for an MRR with ways `own` and NMRRs with theirs.
///
/// # Errors
/// A leader without a way, no switch above them all, or a switch with too many children.
pub fn choose(
    mrr: Ipv4Addr,
    own: &[Way],
    nmrrs: &[(Ipv4Addr, Vec<Way>)],
    weigh: Weigh,
) -> Result<Tree, NoTree> {
    let leaders: Vec<(Ipv4Addr, &[Way])> = std::iter::once((mrr, own))
        .chain(nmrrs.iter().map(|(ip, w)| (*ip, w.as_slice())))
        .collect();
    // The fabric as the ways saw it: every link up, every switch's free capacity. Leaders
    // under one TOR share its ways (a query to an MRR under the same TOR never climbs), and
    // a way whose copy was lost is still found through the links the others crossed.
    let mut fabric = Ways::default();
    let mut tor_of: HashMap<Ipv4Addr, u32> = HashMap::new();
    for (ip, ways) in &leaders {
        let Some(tor) = ways.iter().find_map(|w| w.first()).map(PathHop::ip) else {
            return Err(NoTree::NoWay(*ip));
        };
        tor_of.insert(*ip, tor);
        for w in *ways {
            fabric.learn(w);
        }
    }
    let tors: BTreeSet<u32> = tor_of.values().copied().collect();
    let (root, level) = fabric.root(&tors, weigh).ok_or(NoTree::NoCommonSwitch)?;
    // The MRR's TOR first: its branch carries every notify.
    let mrr_tor = tor_of[&mrr];
    let order: Vec<u32> = std::iter::once(mrr_tor)
        .chain(tors.iter().copied().filter(|t| *t != mrr_tor))
        .collect();
    let mut parent_of: HashMap<u32, u32> = HashMap::new();
    let mut branch_of: HashMap<u32, Vec<u32>> = HashMap::new();
    for tor in order {
        let best = fabric
            .ways_up(tor, root, level)
            .into_iter()
            .filter(|w| {
                w.windows(2)
                    .all(|p| parent_of.get(&p[0]).is_none_or(|up| *up == p[1]))
            })
            .max_by_key(|w| fabric.weight(w, &parent_of, weigh))
            .ok_or(NoTree::NoCommonSwitch)?;
        for p in best.windows(2) {
            parent_of.insert(p[0], p[1]);
        }
        branch_of.insert(tor, best);
    }
    let children = count_children(&leaders, &tor_of, &parent_of)?;
    let hop = |ip: u32| {
        let n = children.get(&ip).copied().unwrap_or(0);
        PathHop::in_tree(ip, parent_of.get(&ip).copied().unwrap_or(0), n as u8)
    };
    let mine = &branch_of[&mrr_tor];
    let paths = nmrrs
        .iter()
        .map(|(ip, _)| {
            let theirs = &branch_of[&tor_of[ip]];
            let turn = (0..level)
                .find(|&i| mine[i] == theirs[i])
                .unwrap_or(level - 1);
            let mut path = ControlPath {
                turn: turn as u8,
                ..ControlPath::default()
            };
            for &s in mine[..=turn].iter().chain(theirs[..turn].iter().rev()) {
                path.push(hop(s));
            }
            (*ip, path)
        })
        .collect();
    Ok(Tree {
        root: Ipv4Addr::from(root),
        level,
        paths,
    })
}

/// The switches and links up that the ways crossed.
#[derive(Default)]
struct Ways {
    /// Each switch's parents (the switches a way went to next).
    up: HashMap<u32, BTreeSet<u32>>,
    /// Each switch's level (1: TOR) and smallest free capacity reported.
    level: HashMap<u32, usize>,
    free: HashMap<u32, u16>,
}

impl Ways {
    fn learn(&mut self, way: &[PathHop]) {
        for (i, h) in way.iter().enumerate() {
            self.level.entry(h.ip()).or_insert(i + 1);
            let free = self.free.entry(h.ip()).or_insert(h.free());
            *free = (*free).min(h.free());
            if let Some(next) = way.get(i + 1) {
                self.up.entry(h.ip()).or_default().insert(next.ip());
            }
        }
    }

    /// Every way from `tor` up to `root` at `level`.
    fn ways_up(&self, tor: u32, root: u32, level: usize) -> Vec<Vec<u32>> {
        let mut out = vec![];
        let mut stack = vec![vec![tor]];
        while let Some(way) = stack.pop() {
            let last = *way.last().unwrap_or(&tor);
            if way.len() == level {
                if last == root {
                    out.push(way);
                }
                continue;
            }
            for &next in self.up.get(&last).into_iter().flatten() {
                let mut longer = way.clone();
                longer.push(next);
                stack.push(longer);
            }
        }
        out
    }

    /// The root: at the lowest level where some switch is above every TOR, the one with the
    /// most free capacity (ties: the lowest address).
    fn root(&self, tors: &BTreeSet<u32>, weigh: Weigh) -> Option<(u32, usize)> {
        for level in 1..=MAX_LEVELS {
            let candidates: BTreeSet<u32> = self
                .level
                .iter()
                .filter(|(_, l)| **l == level)
                .map(|(s, _)| *s)
                .filter(|s| tors.iter().all(|t| !self.ways_up(*t, *s, level).is_empty()))
                .collect();
            let best = candidates.iter().copied().max_by_key(|&s| match weigh {
                Weigh::ByLoad => (
                    self.free.get(&s).copied().unwrap_or(0),
                    std::cmp::Reverse(s),
                ),
                Weigh::ByAddress => (0, std::cmp::Reverse(s)),
            });
            if let Some(root) = best {
                return Some((root, level));
            }
        }
        None
    }

    /// How good a way up is: its tightest free capacity above the TOR (by load), then how
    /// many of its switches the tree already has, then the lowest addresses.
    fn weight(
        &self,
        way: &[u32],
        in_tree: &HashMap<u32, u32>,
        weigh: Weigh,
    ) -> (u16, usize, std::cmp::Reverse<Vec<u32>>) {
        let free = match weigh {
            Weigh::ByLoad => way[1..]
                .iter()
                .map(|s| self.free.get(s).copied().unwrap_or(0))
                .min()
                .unwrap_or(u16::MAX),
            Weigh::ByAddress => 0,
        };
        let shared = way.iter().filter(|s| in_tree.contains_key(s)).count();
        (free, shared, std::cmp::Reverse(way.to_vec()))
    }
}

/// Children of every switch of the tree: its leaders (TORs) or the switches below.
fn count_children(
    leaders: &[(Ipv4Addr, &[Way])],
    tor_of: &HashMap<Ipv4Addr, u32>,
    parent_of: &HashMap<u32, u32>,
) -> Result<HashMap<u32, usize>, NoTree> {
    let mut children: HashMap<u32, usize> = HashMap::new();
    for (ip, _) in leaders {
        *children.entry(tor_of[ip]).or_default() += 1;
    }
    for parent in parent_of.values() {
        *children.entry(*parent).or_default() += 1;
    }
    match children.iter().find(|(_, n)| **n > MAX_CHILDREN) {
        Some((s, n)) => Err(NoTree::TooManyChildren {
            switch: Ipv4Addr::from(*s),
            children: *n,
        }),
        None => Ok(children),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(a: u8, b: u8) -> u32 {
        u32::from(Ipv4Addr::new(10, 77, a, b))
    }
    fn way(hops: &[(u32, u16)]) -> Way {
        hops.iter()
            .map(|&(s, free)| PathHop::seen(s, u32::from(free), 2))
            .collect()
    }
    fn host(t: u8, h: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, t, h)
    }
    fn ips(p: &ControlPath) -> Vec<u32> {
        p.hops().iter().map(PathHop::ip).collect()
    }

    /// Pods of 2 TORs (t) under 2 aggregation switches (a), both under 2 cores (c).
    fn ways_of(tor: u8, free: &dyn Fn(u32) -> u16) -> Vec<Way> {
        let pod = tor / 2;
        let t = ip(200, tor);
        let mut out = vec![];
        for a in [ip(220, pod * 2), ip(220, pod * 2 + 1)] {
            for c in [ip(250, 1), ip(250, 2)] {
                out.push(way(&[(t, free(t)), (a, free(a)), (c, free(c))]));
            }
        }
        out
    }

    #[test]
    fn one_tor_is_its_own_root() {
        let t = ip(200, 0);
        let own = ways_of(0, &|_| 10);
        let nmrrs = vec![
            (host(0, 2), ways_of(0, &|_| 10)),
            (host(0, 3), ways_of(0, &|_| 10)),
        ];
        let tree = choose(host(0, 1), &own, &nmrrs, Weigh::ByLoad).expect("tree");
        assert_eq!((u32::from(tree.root), tree.level), (t, 1));
        for (_, p) in &tree.paths {
            assert_eq!((ips(p), p.turn), (vec![t], 0));
            assert_eq!((p.hops[0].parent(), p.hops[0].children), (0, 3));
        }
    }

    #[test]
    fn one_pod_is_rooted_at_its_least_loaded_aggregation_switch() {
        let free = |s: u32| if s == ip(220, 1) { 50 } else { 10 };
        let own = ways_of(0, &free);
        let nmrrs = vec![(host(1, 1), ways_of(1, &free))];
        let tree = choose(host(0, 1), &own, &nmrrs, Weigh::ByLoad).expect("tree");
        assert_eq!((u32::from(tree.root), tree.level), (ip(220, 1), 2));
        let p = &tree.paths[0].1;
        assert_eq!(ips(p), vec![ip(200, 0), ip(220, 1), ip(200, 1)]);
        assert_eq!(p.turn, 1);
        assert_eq!(p.hops[0].parent(), ip(220, 1));
        assert_eq!((p.hops[1].parent(), p.hops[1].children), (0, 2));
        assert_eq!((p.hops[2].parent(), p.hops[2].children), (ip(220, 1), 1));
    }

    #[test]
    fn pods_meet_at_a_core_and_every_switch_has_one_parent() {
        let free = |s: u32| if s == ip(250, 2) { 40 } else { 10 };
        let own = ways_of(0, &free);
        let nmrrs: Vec<_> = [(1, 1), (1, 2), (2, 1), (3, 1)]
            .iter()
            .map(|&(t, h)| (host(t, h), ways_of(t, &free)))
            .collect();
        let tree = choose(host(0, 1), &own, &nmrrs, Weigh::ByLoad).expect("tree");
        assert_eq!((u32::from(tree.root), tree.level), (ip(250, 2), 3));
        let mut parent: HashMap<u32, u32> = HashMap::new();
        for (_, p) in &tree.paths {
            for h in p.hops() {
                let before = parent.insert(h.ip(), h.parent());
                assert!(
                    before.is_none_or(|b| b == h.parent()),
                    "one parent per switch"
                );
            }
        }
        // Same pod (TOR 1): up to the pod's aggregation switch and down again.
        let p = &tree.paths[0].1;
        assert_eq!(p.turn, 1);
        assert_eq!(ips(p).len(), 3);
        // Another pod: up to the core, down two levels.
        let p = &tree.paths[2].1;
        assert_eq!((p.turn, ips(p).len()), (2, 5));
        assert_eq!(p.hops[2].ip(), ip(250, 2));
        // TOR 0 has the MRR; TOR 1 two NMRRs; the core two pods.
        assert_eq!(tree.paths[0].1.hops[0].children, 1);
        assert_eq!(tree.paths[0].1.hops[2].children, 2);
        assert_eq!(tree.paths[2].1.hops[2].children, 2);
    }

    #[test]
    fn a_leader_without_a_way_or_a_common_switch_gets_no_tree() {
        let own = ways_of(0, &|_| 1);
        let none = choose(host(0, 1), &own, &[(host(1, 1), vec![])], Weigh::ByLoad);
        assert_eq!(none, Err(NoTree::NoWay(host(1, 1))));
        let apart = vec![way(&[(ip(200, 9), 1)])];
        let none = choose(host(0, 1), &own, &[(host(9, 1), apart)], Weigh::ByLoad);
        assert_eq!(none, Err(NoTree::NoCommonSwitch));
    }

    #[test]
    fn an_nmrr_beside_the_mrr_shares_its_tors_ways() {
        // Its query went straight to the MRR: only its TOR stamped it.
        let own = ways_of(0, &|_| 10);
        let nmrrs = vec![
            (host(0, 2), vec![way(&[(ip(200, 0), 10)])]),
            (host(2, 1), ways_of(2, &|_| 10)),
        ];
        let tree = choose(host(0, 1), &own, &nmrrs, Weigh::ByLoad).expect("tree");
        assert_eq!(tree.level, 3);
        let beside = &tree.paths[0].1;
        assert_eq!(
            (ips(beside).len(), beside.turn),
            (1, 0),
            "delivered by the TOR"
        );
        assert_eq!(beside.hops[0].children, 2, "the MRR and its neighbour");
        assert_ne!(beside.hops[0].parent(), 0, "the TOR is not the root");
    }

    #[test]
    fn a_lost_copy_is_found_through_the_links_others_crossed() {
        // TOR 1 lost its copy through aggregation switch 0 to core 1; every link of that
        // way was still seen, so its TOR joins aggregation switch 0 like the MRR's.
        let free = |s: u32| if s == ip(250, 1) { 20 } else { 10 };
        let mut theirs = ways_of(1, &free);
        theirs.retain(|w| !(w[1].ip() == ip(220, 0) && w[2].ip() == ip(250, 1)));
        let tree = choose(
            host(0, 1),
            &ways_of(0, &free),
            &[(host(1, 1), theirs)],
            Weigh::ByLoad,
        )
        .expect("tree");
        assert_eq!(u32::from(tree.root), ip(220, 0), "inside the pod");
        // Across pods, rooted at core 1: TOR 1 still finds aggregation switch 0.
        let mut lossy = ways_of(1, &free);
        lossy.retain(|w| w[1].ip() != ip(220, 0) || w[2].ip() != ip(250, 1));
        let nmrrs = vec![(host(1, 1), lossy), (host(2, 1), ways_of(2, &free))];
        let tree = choose(host(0, 1), &ways_of(0, &free), &nmrrs, Weigh::ByLoad).expect("tree");
        assert_eq!(u32::from(tree.root), ip(250, 1));
        let tor1 = tree.paths[0]
            .1
            .hops()
            .iter()
            .find(|h| h.ip() == ip(200, 1))
            .copied();
        assert_eq!(
            tor1.map(|h| h.parent()),
            Some(ip(220, 0)),
            "the MRR's aggregation switch"
        );
    }

    #[test]
    fn socket_mode_choices_ignore_load() {
        let a = |_: u32| 5;
        let b = |s: u32| if s == ip(250, 2) { 60 } else { 1 };
        let nm = |f: &dyn Fn(u32) -> u16| vec![(host(2, 1), ways_of(2, f))];
        let one = choose(host(0, 1), &ways_of(0, &a), &nm(&a), Weigh::ByAddress).expect("tree");
        let two = choose(host(0, 1), &ways_of(0, &b), &nm(&b), Weigh::ByAddress).expect("tree");
        assert_eq!(one.paths, two.paths);
        assert_eq!(u32::from(one.root), ip(250, 1));
    }
}
