use super::*;

const SAMPLE: &str = include_str!("../../../dist/innet/daemon.sample.toml");

fn file() -> &'static Path {
    Path::new("/etc/innet/tor0.toml")
}

fn parse(text: &str) -> Result<DaemonSettings, ConfigError> {
    DaemonSettings::parse(text, file())
}

/// A kernel with one bridge, `br0`, of ports `swp1` and `swp2`.
fn one_bridge(name: &str) -> Result<Vec<String>, BridgeError> {
    match name {
        "br0" => Ok(vec!["swp1".into(), "swp2".into()]),
        _ => Err(BridgeError::Unknown {
            bridge: name.into(),
        }),
    }
}

fn resolve(flags: DaemonSettings, text: &str) -> Result<DaemonConfig, ConfigError> {
    flags
        .over(parse(text).expect("parses"), Some(file()))
        .resolve(one_bridge)
}

#[test]
fn the_sample_parses_and_resolves() {
    let s = parse(SAMPLE).expect("the sample parses");
    assert_eq!(s.role, Some(DaemonRole::Tor));
    assert_eq!(s.bridge.as_deref(), Some("br0"));
    let c = resolve(DaemonSettings::default(), SAMPLE).expect("resolves");
    assert_eq!(c.ports, ["swp1", "swp2"]);
    assert_eq!(c.sizing, Sizing::default());
    assert_eq!(c.pin_path, Path::new(DEFAULT_ROOT));
}

/// Every commented-out `# key = value` of the sample is a valid key and value, and
/// together they set every key: the sample documents all of them.
#[test]
fn the_samples_commented_keys_are_every_key_and_valid() {
    let uncommented = SAMPLE
        .lines()
        .map(|l| match l.strip_prefix("# ") {
            Some(rest) if rest.split_once(" = ").is_some_and(|(k, _)| is_key(k)) => rest,
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let s = parse(&uncommented).expect("every commented key parses");
    assert!(
        s.role.is_some()
            && s.ip.is_some()
            && !s.iface.is_empty()
            && s.bridge.is_some()
            && !s.uplink.is_empty()
            && s.mode.is_some()
            && s.capacity.is_some()
            && s.window.is_some()
            && s.keep_state.is_some()
            && s.idle_timeout.is_some()
            && s.metrics.is_some()
            && s.ops.len() == Op::ALL.len()
            && s.pin_path.is_some(),
        "the sample shows every key: {s:?}"
    );
    let defaults = resolve(DaemonSettings::default(), SAMPLE).expect("resolves");
    let shown = DaemonSettings {
        iface: vec![],
        uplink: vec![],
        ..s
    }
    .over(DaemonSettings::default(), None)
    .resolve(one_bridge)
    .expect("resolves");
    assert_eq!(
        (
            shown.mode,
            shown.sizing,
            shown.keep_state,
            shown.idle_timeout
        ),
        (
            defaults.mode,
            defaults.sizing,
            defaults.keep_state,
            defaults.idle_timeout
        ),
        "the sample shows the defaults"
    );
    assert_eq!(shown.pin_path, defaults.pin_path);
}

fn is_key(k: &str) -> bool {
    !k.is_empty() && k.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
}

#[test]
fn every_key_parses_to_its_setting() {
    let s = parse(
        r#"
        role = "spine"
        ip = "10.1.2.3"
        iface = ["a", "b"]
        uplink = ["b"]
        mode = "skb"
        capacity = 32
        window = 64
        keep_state = true
        idle_timeout = 0
        metrics = "0.0.0.0:9464"
        ops = ["sum", "max"]
        pin_path = "/sys/fs/bpf/x"
        "#,
    )
    .expect("parses");
    assert_eq!(
        s,
        DaemonSettings {
            role: Some(DaemonRole::Spine),
            ip: Some(Ipv4Addr::new(10, 1, 2, 3)),
            iface: vec!["a".into(), "b".into()],
            bridge: None,
            uplink: vec!["b".into()],
            mode: Some(XdpMode::Skb),
            capacity: Some(32),
            window: Some(64),
            keep_state: Some(true),
            idle_timeout: Some(0),
            metrics: Some("0.0.0.0:9464".parse().expect("addr")),
            ops: vec![Op::Sum, Op::Max],
            pin_path: Some("/sys/fs/bpf/x".into()),
        }
    );
    let c = s
        .over(DaemonSettings::default(), None)
        .resolve(one_bridge)
        .expect("ok");
    assert_eq!(c.idle_timeout, None, "0 never frees");
    assert_eq!(
        c.sizing,
        Sizing {
            capacity: 32,
            window: 64
        }
    );
}

#[test]
fn flags_win_key_by_key() {
    let text = r#"
        role = "tor"
        ip = "10.0.0.1"
        bridge = "br0"
        window = 32
        idle_timeout = 90
        pin_path = "/sys/fs/bpf/file"
    "#;
    let flags = DaemonSettings {
        window: Some(64),
        ip: Some(Ipv4Addr::new(10, 9, 9, 9)),
        ..DaemonSettings::default()
    };
    let c = resolve(flags, text).expect("resolves");
    assert_eq!(c.sizing.window, 64, "the flag wins");
    assert_eq!(c.ip, Some(Ipv4Addr::new(10, 9, 9, 9)), "the flag wins");
    assert_eq!(c.idle_timeout, Some(Duration::from_secs(90)), "the file's");
    assert_eq!(c.pin_path, Path::new("/sys/fs/bpf/file"), "the file's");
    assert_eq!(c.sizing.capacity, DEFAULT_CAPACITY, "the default");
    assert_eq!(c.origins.of("window"), "--window");
    assert_eq!(
        c.origins.of("idle_timeout"),
        "`idle_timeout` in /etc/innet/tor0.toml"
    );
    assert_eq!(
        c.origins.of("keep_state"),
        "--keep-state",
        "unset: the flag"
    );
}

#[test]
fn ports_on_the_command_line_replace_iface_and_bridge_of_the_file() {
    let text = "role = \"tor\"\nip = \"10.0.0.1\"\nbridge = \"br0\"\niface = [\"x9\"]\n";
    let c = resolve(DaemonSettings::default(), text).expect("resolves");
    assert_eq!(
        c.ports,
        ["x9", "swp1", "swp2"],
        "iface, then the bridge's ports"
    );
    let flags = DaemonSettings {
        iface: vec!["eth7".into()],
        ..DaemonSettings::default()
    };
    assert_eq!(resolve(flags, text).expect("resolves").ports, ["eth7"]);
    let flags = DaemonSettings {
        bridge: Some("br0".into()),
        ..DaemonSettings::default()
    };
    let text = "role = \"tor\"\nip = \"10.0.0.1\"\niface = [\"x9\"]\n";
    assert_eq!(resolve(flags, text).expect("ok").ports, ["swp1", "swp2"]);
    let text = "role = \"tor\"\nip = \"10.0.0.1\"\niface = [\"swp2\"]\nbridge = \"br0\"\n";
    let c = resolve(DaemonSettings::default(), text).expect("resolves");
    assert_eq!(c.ports, ["swp2", "swp1"], "a port named twice runs once");
}

#[test]
fn without_a_file_the_flags_alone_decide() {
    let flags = DaemonSettings {
        role: Some(DaemonRole::Nic),
        iface: vec!["eth0".into()],
        ..DaemonSettings::default()
    };
    let c = flags
        .over(DaemonSettings::default(), None)
        .resolve(one_bridge)
        .expect("ok");
    assert_eq!(
        (c.role, c.ip),
        (DaemonRole::Nic, None),
        "a NIC needs no address"
    );
    assert_eq!(
        c.idle_timeout,
        Some(Duration::from_secs(DEFAULT_IDLE_TIMEOUT))
    );
    assert_eq!(
        (c.mode, c.keep_state, c.metrics),
        (XdpMode::Native, false, None)
    );
}

/// The metrics endpoint binds to loopback unless told an address: its labels name
/// every group's wire id (issue 44).
#[test]
fn metrics_default_to_loopback() {
    let local: SocketAddr = "127.0.0.1:9464".parse().expect("addr");
    assert_eq!(parse_metrics("9464"), Ok(local));
    assert_eq!(
        parse_metrics("0.0.0.0:9464"),
        Ok("0.0.0.0:9464".parse().expect("addr"))
    );
    assert!(parse_metrics("0.0.0.0").is_err());
    for text in [
        "metrics = 9464",
        "metrics = \"9464\"",
        "metrics = \"127.0.0.1:9464\"",
    ] {
        assert_eq!(parse(text).expect(text).metrics, Some(local), "{text}");
    }
    assert!(parse("metrics = \"everywhere\"").is_err());
    assert_eq!(parse("").expect("empty").metrics, None);
}

/// An error and its causes, as `anyhow` shows them on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text = format!("{text}: {c}");
        cause = c.source();
    }
    text
}

fn error(flags: DaemonSettings, text: &str) -> String {
    chain(&resolve(flags, text).expect_err("refused"))
}

#[test]
fn errors_name_the_file_the_key_and_the_fix() {
    let e = error(
        DaemonSettings::default(),
        "role = \"tor\"\nip = \"10.0.0.1\"\n",
    );
    assert_eq!(
        e,
        "no ports to run on: give --iface (or --bridge), or `iface`/`bridge` in the config file /etc/innet/tor0.toml"
    );
    let e = error(DaemonSettings::default(), "bridge = \"br0\"\n");
    assert!(
        e.starts_with("no role: give --role, or `role` in the config file"),
        "{e}"
    );
    let e = error(
        DaemonSettings::default(),
        "role = \"spine\"\nbridge = \"br0\"\n",
    );
    assert!(
        e.starts_with("no address for the SPINE: give --ip, or `ip`"),
        "{e}"
    );
    let text = "role = \"tor\"\nip = \"10.0.0.1\"\nbridge = \"br9\"\n";
    let e = error(DaemonSettings::default(), text);
    assert!(
        e.starts_with("`bridge` in /etc/innet/tor0.toml: cannot list the bridge's ports: no interface named `br9`"),
        "{e}"
    );
    let flags = DaemonSettings {
        bridge: Some("br9".into()),
        ..DaemonSettings::default()
    };
    assert!(
        error(flags, text).starts_with("--bridge: cannot list"),
        "flag named"
    );
    let text = "role = \"tor\"\nip = \"10.0.0.1\"\nbridge = \"br0\"\nwindow = 12\n";
    let e = error(DaemonSettings::default(), text);
    assert!(
        e.starts_with("`window` in /etc/innet/tor0.toml: the switch's group maps cannot be sized so: window 12"),
        "{e}"
    );
    let text = "role = \"tor\"\nip = \"10.0.0.1\"\nbridge = \"br0\"\nuplink = [\"up0\"]\n";
    let e = error(DaemonSettings::default(), text);
    assert!(
        e.contains("uplink up0 (`uplink` in /etc/innet/tor0.toml) is not one"),
        "{e}"
    );
    let no_file = DaemonSettings::default().over(DaemonSettings::default(), None);
    let e = no_file
        .resolve(one_bridge)
        .expect_err("no role")
        .to_string();
    assert_eq!(
        e,
        "no role: give --role, or `role` in a config file (--config FILE)"
    );
}

#[test]
fn parse_errors_name_the_file_the_key_and_the_line() {
    for (text, expect) in [
        ("windw = 8\n", "unknown field `windw`, expected one of"),
        (
            "role = \"leaf\"\n",
            "unknown variant `leaf`, expected one of",
        ),
        ("mode = \"hw\"\n", "unknown mode \"hw\": use native or skb"),
        ("ops = [\"avg\"]\n", "unknown op \"avg\": use sum"),
        ("ip = \"10.0.0\"\n", "invalid"),
        ("iface = \"eth0\"\n", "expected a sequence"),
        ("window = -1\n", "window"),
    ] {
        let e = chain(&parse(text).expect_err(text));
        assert!(
            e.starts_with("/etc/innet/tor0.toml is not a valid innet daemon config"),
            "{e}"
        );
        assert!(e.contains(expect), "{text}: {e}");
        assert!(e.contains("line 1"), "{text}: the line: {e}");
    }
    let e = DaemonSettings::from_file(Path::new("/nonexistent/innet.toml")).expect_err("no file");
    assert!(
        e.to_string()
            .starts_with("cannot read the config file /nonexistent/innet.toml")
    );
}
