//! Collecting abandoned groups: a group the control plane installed whose data counter
//! (`rx`) has not moved for the idle timeout is removed, so a job that died without a kill
//! does not hold switch capacity forever. Groups added by hand (no MRR) are left alone.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use tracing::info;

use crate::group_maps::GroupMaps;

#[derive(Default)]
pub struct IdleCollector {
    /// Per group: the last `rx` seen and when it last changed.
    seen: HashMap<u32, (u64, Instant)>,
    /// Groups collected so far.
    pub collected: u64,
}

impl IdleCollector {
    /// Removes the groups idle for longer than `timeout`; returns their ids.
    pub fn sweep(&mut self, groups: &mut GroupMaps, timeout: Duration) -> Vec<u32> {
        let now = Instant::now();
        let Ok(list) = groups.list() else {
            return vec![];
        };
        let mut idle = vec![];
        let mut live = HashMap::new();
        for g in list.iter().filter(|g| g.config.mrr_ip != [0; 4]) {
            let (rx, since) = match self.seen.get(&g.id) {
                Some(&(rx, since)) if rx == g.stats.rx => (rx, since),
                _ => (g.stats.rx, now),
            };
            if now.duration_since(since) >= timeout {
                idle.push(g.id);
            } else {
                live.insert(g.id, (rx, since));
            }
        }
        self.seen = live;
        for &id in &idle {
            if groups.remove(id).is_ok() {
                self.collected += 1;
                info!(
                    group = format_args!("{id:#08x}"),
                    idle_secs = timeout.as_secs(),
                    "collected an idle group"
                );
            }
        }
        idle
    }
}
