//! `innet pcap` output decoded by tshark's InfiniBand dissector: every frame is RoCEv2
//! (BTH + DETH), nothing is flagged malformed, and the ICRC tshark shows is the one we
//! compute.

use std::process::Command;

use innet_common::{codec::parse, wire::ICRC_LEN};
use innet_lab::{innet_bin, run, unique_id};

#[test]
fn tshark_decodes_every_example_as_rocev2_with_valid_icrc() {
    let file = std::env::temp_dir().join(format!("innet-test-{}.pcap", unique_id()));
    run(Command::new(innet_bin()).arg("pcap").arg(&file));
    let out = run(Command::new("tshark").arg("-r").arg(&file).args([
        "-T",
        "fields",
        "-E",
        "separator=,",
        "-e",
        "infiniband.bth.opcode",
        "-e",
        "infiniband.deth.q_key",
        "-e",
        "infiniband.invariant.crc",
        "-e",
        "_ws.malformed",
        "-e",
        "_ws.expert.severity",
    ]));
    let _ = std::fs::remove_file(&file);
    let rows: Vec<String> = String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(str::to_owned)
        .collect();
    let examples = innet::pcap::examples();
    assert_eq!(rows.len(), examples.len(), "{rows:?}");
    for (row, example) in rows.iter().zip(&examples) {
        let cols: Vec<&str> = row.split(',').collect();
        assert_eq!(
            cols[0], "100",
            "UD SEND Only: {row} ({})",
            example.description
        );
        assert_eq!(
            u64::from_str_radix(cols[1].trim_start_matches("0x"), 16).expect("qkey"),
            0x1cc0_ffee,
            "{row}"
        );
        assert_eq!(cols[3], "", "tshark flags no malformed packet: {row}");
        assert_eq!(cols[4], "", "tshark raises no expert warning: {row}");
        // tshark prints the four ICRC bytes as a big-endian number; our parse verified them.
        let f = &example.frame;
        parse(f).unwrap_or_else(|e| panic!("{}: {e}", example.description));
        let tail: [u8; 4] = f[f.len() - ICRC_LEN..].try_into().expect("4 bytes");
        let shown = u32::from_str_radix(cols[2].trim_start_matches("0x"), 16).expect("icrc");
        assert_eq!(
            shown,
            u32::from_be_bytes(tail),
            "{row} ({})",
            example.description
        );
    }
}
