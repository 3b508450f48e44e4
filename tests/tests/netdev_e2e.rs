//! What `innet_net::netdev` reads through netlink, against what `ip` and `bridge` report of
//! the same namespaces: two hosts on a bridge in a switch namespace, no static neighbours.
//! A host resolves the other's MAC through netlink alone (nothing else sends a frame), the
//! bridge learns both and its forwarding table reads back; links, masters, veth peers, MTU,
//! addresses and TX drop counters match.

use std::{net::Ipv4Addr, time::Duration};

use innet_lab::{NetNs, unique_id};
use innet_net::netdev;

fn json(ns: &NetNs, args: &[&str]) -> serde_json::Value {
    let out = ns.ip(args);
    serde_json::from_slice(&out.stdout).expect("ip -j output")
}

fn mac_of(text: &str) -> [u8; 6] {
    let mut mac = [0u8; 6];
    for (m, part) in mac.iter_mut().zip(text.split(':')) {
        *m = u8::from_str_radix(part, 16).expect("hex");
    }
    mac
}

struct Lan {
    hosts: [NetNs; 2],
    switch: NetNs,
    ports: [String; 2],
    bridge: String,
}

const IPS: [Ipv4Addr; 2] = [Ipv4Addr::new(10, 203, 0, 1), Ipv4Addr::new(10, 203, 0, 2)];

fn lan() -> Lan {
    let hosts = [NetNs::new("nd-h1"), NetNs::new("nd-h2")];
    let switch = NetNs::new("nd-s");
    let id = unique_id();
    let bridge = format!("br{id}");
    switch.ip(&["link", "add", &bridge, "type", "bridge"]);
    switch.ip(&["link", "set", &bridge, "up"]);
    let ports = [format!("p1{id}"), format!("p2{id}")];
    for ((h, port), ip) in hosts.iter().zip(&ports).zip(IPS) {
        innet_lab::ip(&[
            "link",
            "add",
            "eth0",
            "netns",
            &h.name,
            "type",
            "veth",
            "peer",
            "name",
            port,
            "netns",
            &switch.name,
        ]);
        h.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
        h.ip(&["link", "set", "eth0", "up"]);
        switch.ip(&["link", "set", port, "master", &bridge]);
        switch.ip(&["link", "set", port, "up"]);
    }
    Lan {
        hosts,
        switch,
        ports,
        bridge,
    }
}

#[test]
fn a_neighbour_is_resolved_and_the_bridge_learns_it_through_netlink() {
    let lan = lan();
    let [h1, h2] = &lan.hosts;
    let mac2 = mac_of(
        json(h2, &["-j", "link", "show", "eth0"])[0]["address"]
            .as_str()
            .unwrap(),
    );
    let mac1 = mac_of(
        json(h1, &["-j", "link", "show", "eth0"])[0]["address"]
            .as_str()
            .unwrap(),
    );
    assert_eq!(h1.run(|| netdev::mac("eth0").unwrap()), mac1);
    assert_eq!(
        json(h1, &["-j", "neigh", "show", "dev", "eth0"]),
        serde_json::json!([]),
        "no neighbour known before the question"
    );
    // Within the bridge's forwarding delay a port may still be learning: ask for long enough.
    let got = h1.run(|| netdev::neighbour_mac(IPS[1], "eth0", Duration::from_secs(5)));
    assert_eq!(got, Some(mac2), "ARP resolved through netlink (NTF_USE)");
    let seen = json(h1, &["-j", "neigh", "show", "dev", "eth0"]);
    assert_eq!(seen[0]["lladdr"].as_str().map(mac_of), Some(mac2), "{seen}");
    assert_eq!(
        h1.run(|| netdev::neighbour_mac(
            Ipv4Addr::new(10, 203, 0, 9),
            "eth0",
            Duration::from_millis(300)
        )),
        None,
        "nobody holds .9"
    );

    let br = lan.switch.run(|| netdev::ifindex(&lan.bridge).unwrap());
    let index = |p: &str| lan.switch.run(|| netdev::ifindex(p).unwrap());
    let fdb = lan.switch.run(|| netdev::bridge_fdb(br).unwrap());
    assert_eq!(fdb.get(&mac1), Some(&index(&lan.ports[0])), "{fdb:?}");
    assert_eq!(fdb.get(&mac2), Some(&index(&lan.ports[1])), "{fdb:?}");
    // The same learned entries `bridge fdb` shows (its own and permanent ones left out).
    let shown = lan
        .switch
        .command("bridge")
        .args(["-j", "fdb", "show", "br", &lan.bridge])
        .output()
        .unwrap();
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    let learned = shown
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["state"] != "permanent"
                && !e["flags"]
                    .as_array()
                    .is_some_and(|f| f.iter().any(|x| x == "self"))
        })
        .count();
    assert_eq!(fdb.len(), learned, "{shown}");
}

#[test]
fn links_addresses_and_counters_match_what_ip_reports() {
    let lan = lan();
    let links = lan.switch.run(|| netdev::links().unwrap());
    let br = links
        .iter()
        .find(|l| l.name == lan.bridge)
        .expect("the bridge");
    assert_eq!(br.kind.as_deref(), Some("bridge"));
    for port in &lan.ports {
        let l = links.iter().find(|l| &l.name == port).expect("the port");
        let shown = &json(&lan.switch, &["-j", "-s", "link", "show", port])[0];
        assert_eq!(l.master, Some(br.index), "{port} is the bridge's");
        assert_eq!(l.kind.as_deref(), Some("veth"));
        assert_eq!(l.mtu, shown["mtu"].as_u64().map(|m| m as u32));
        let details = &json(&lan.switch, &["-j", "-d", "link", "show", port])[0];
        assert_eq!(l.max_mtu, details["max_mtu"].as_u64().map(|m| m as u32));
        assert_eq!(l.mac, shown["address"].as_str().map(mac_of));
        assert_eq!(l.tx_dropped, shown["stats64"]["tx"]["dropped"].as_u64());
        let (peer, netns) = l.peer.expect("a veth has a peer");
        assert_eq!(
            Some(u64::from(peer)),
            shown["link_index"].as_u64(),
            "{shown}"
        );
        assert!(netns.is_some(), "the peer lives in a host's namespace");
        assert_eq!(l.xdp, None, "no program attached");
    }
    let [h1, _] = &lan.hosts;
    assert_eq!(h1.run(|| netdev::ipv4_addresses("eth0")), vec![IPS[0]]);
    assert_eq!(
        h1.run(|| netdev::ifname_of(IPS[0])).as_deref(),
        Some("eth0")
    );
    assert_eq!(h1.run(|| netdev::ifname_of(IPS[1])), None);
}
