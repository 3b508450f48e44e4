//! A daemon's watch over its ports: keeps the programs told which ports cannot send
//! redirected frames (`port_health::refresh`) and says when that changes, or when frames
//! innet sent out of such a port are lost (their `redirect_errors` from `stats`).

use std::{collections::HashMap, time::Duration};

use tracing::{info, warn};

use crate::{
    pins::PinLayout,
    port_health::{PortHealth, refresh},
};

/// How often a daemon looks at its ports.
pub const WATCH_PERIOD: Duration = Duration::from_secs(2);

/// Watches the ports attached under `pins` for as long as it runs: keeps `TX_BLOCKED`
/// current, and logs when a port starts or stops taking redirected frames and when frames
/// innet sent out of one that cannot are lost (the attach already said how things stood at
/// the start).
pub async fn watch(pins: PinLayout) {
    let mut seen: HashMap<String, (PortHealth, u64)> = HashMap::new();
    let mut tick = tokio::time::interval(WATCH_PERIOD);
    loop {
        tick.tick().await;
        let layout = pins.clone();
        let Ok((now, lost)) = tokio::task::spawn_blocking(move || {
            let lost = crate::stats::read(&layout).unwrap_or_default();
            (refresh(&layout), lost)
        })
        .await
        else {
            continue;
        };
        for (ifname, ifindex, health) in now {
            let lost = lost
                .iter()
                .find(|p| p.ifindex == ifindex)
                .map_or(0, |p| p.total.redirect_errors);
            if let Some((before, lost_before)) = seen.get(&ifname) {
                report_change(&ifname, before, &health);
                if lost > *lost_before
                    && let Some(line) = health.drop_warning(&ifname, lost)
                {
                    warn!(port = ifname, "{line}");
                }
            }
            seen.insert(ifname, (health, lost));
        }
    }
}

fn report_change(ifname: &str, before: &PortHealth, now: &PortHealth) {
    match (&before.redirect_blocked, &now.redirect_blocked) {
        (None, Some(why)) => warn!(port = ifname, "{why}"),
        (Some(_), None) => info!(
            port = ifname,
            "frames innet redirects out of this port can leave it again"
        ),
        _ => {}
    }
}
