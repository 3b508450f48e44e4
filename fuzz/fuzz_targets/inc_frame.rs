//! Whole frames through the shared INC parser and the classifier model: no panic, and the
//! two agree — a frame that parses (ICRC aside) is exactly what the classifier calls it,
//! and a parse error names the classifier's class.
#![no_main]

use innet_common::{
    codec::{Class, classify, parse, parse_unverified},
    validate::Verdict,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|frame: &[u8]| {
    let class = classify(frame);
    match parse_unverified(frame) {
        Ok(p) => {
            let want = match p.verdict {
                Verdict::Data { .. } => Class::IncData,
                Verdict::Control(_) => Class::IncControl,
            };
            assert_eq!(class, want, "parse and classify disagree");
            let _ = p.control();
        }
        Err(e) => {
            assert_eq!(e.class(), Some(class), "{e}");
        }
    }
    // The ICRC check itself must not panic on any frame.
    let _ = parse(frame);
});
