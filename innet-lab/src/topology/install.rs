//! Groups installed by hand on a fabric's switches (the tests that run without daemons).

use super::{ChildSpec, GroupMaps, GroupSpec, NetNs, ParentSpec, Role, Switch, Topology};

impl Topology {
    /// Installs group `id` on every switch of the tree over the TORs `tors`: a single TOR
    /// is the root itself; at 2 levels the TORs sit under SPINE `spine`; at 3 levels each
    /// pod's TORs under its aggregation switch 0, rooted there when the group stays in one
    /// pod and under core `spine` otherwise ([`Topology::install_via`] picks another
    /// aggregation switch).
    pub fn install(&self, id: u32, tors: &[usize], spine: usize) {
        self.install_via(id, tors, 0, spine);
    }

    /// [`Topology::install`] through aggregation switch `agg` of every pod (3 levels).
    ///
    /// # Panics
    /// When a map refuses the group, or `tors` is empty.
    pub fn install_via(&self, id: u32, tors: &[usize], agg: usize, spine: usize) {
        assert!(!tors.is_empty(), "group {id:#x} spans no TOR");
        let mut pods: Vec<usize> = tors.iter().map(|&t| self.shape.pod_of(t)).collect();
        pods.dedup();
        let three = self.shape.levels == 3;
        // The TORs' parent index, and whether the aggregation switches have one.
        let tor_parent = (tors.len() > 1).then_some(if three { agg } else { spine });
        let agg_parent = pods.len() > 1;
        for &t in tors {
            let children = self
                .hosts_of(t)
                .map(|(rank, h)| ChildSpec {
                    ip: h.ip,
                    ifindex: h.tor_port,
                    rank: rank as u32,
                })
                .collect();
            put(&self.tors[t], id, Role::Tor, tor_parent, t, children);
        }
        if tors.len() == 1 {
            return;
        }
        // The switches one level up: (switch, its TORs in the group).
        let below = |sw: &Switch, tors: &mut dyn Iterator<Item = usize>| -> Vec<ChildSpec> {
            tors.map(|t| {
                let tor = &self.tors[t];
                ChildSpec {
                    ip: tor.ip,
                    ifindex: sw.port_to(tor.ip).expect("a link to the TOR").ifindex,
                    rank: t as u32,
                }
            })
            .collect()
        };
        if !three {
            let sp = &self.spines[spine];
            put(
                sp,
                id,
                Role::Spine,
                None,
                0,
                below(sp, &mut tors.iter().copied()),
            );
            return;
        }
        for &p in &pods {
            let sw = self.agg(p, agg);
            let mut in_pod = tors.iter().copied().filter(|&t| self.shape.pod_of(t) == p);
            let children = below(sw, &mut in_pod);
            put(
                sw,
                id,
                Role::Spine,
                agg_parent.then_some(spine),
                p,
                children,
            );
        }
        if agg_parent {
            let core = &self.spines[spine];
            let children = pods
                .iter()
                .map(|&p| {
                    let sw = self.agg(p, agg);
                    ChildSpec {
                        ip: sw.ip,
                        ifindex: core.port_to(sw.ip).expect("a link to the agg").ifindex,
                        rank: p as u32,
                    }
                })
                .collect();
            put(core, id, Role::Spine, None, 0, children);
        }
    }

    /// Removes group `id` from every switch that holds it.
    pub fn uninstall(&self, id: u32) {
        for sw in self.switches() {
            let _ = GroupMaps::open(&sw.pins.layout).expect("maps").remove(id);
        }
    }
}

/// Installs group `id` on `sw` with `role`, its parent behind uplink `parent` (`None`: the
/// root), sending up as rank `own_rank`.
pub(super) fn put(
    sw: &Switch,
    id: u32,
    role: Role,
    parent: Option<usize>,
    own_rank: usize,
    children: Vec<ChildSpec>,
) {
    let parent = parent.map(|k| {
        let up = &sw.uplinks[k];
        let [_, _, a, b] = sw.ip.octets();
        ParentSpec {
            ifindex: up.ifindex,
            own_mac: [2, 0xaa, a, b, 0, k as u8],
            own_ip: sw.ip,
            mac: up.peer_mac,
            ip: up.peer,
        }
    });
    let spec = GroupSpec {
        id,
        role,
        parent,
        own_rank: own_rank as u32,
        mrr: None,
        children,
    };
    GroupMaps::open(&sw.pins.layout)
        .unwrap_or_else(|e| panic!("maps of {}: {e}", sw.ip))
        .install(&spec)
        .unwrap_or_else(|e| panic!("install {id:#x} on {}: {e}", sw.ip));
}

pub(super) fn port_names(ns: &NetNs) -> Vec<String> {
    let out = ns.ip(&["-j", "link", "show", "type", "veth"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ip -j");
    v.as_array()
        .expect("array")
        .iter()
        .map(|l| l["ifname"].as_str().expect("name").to_owned())
        .collect()
}
