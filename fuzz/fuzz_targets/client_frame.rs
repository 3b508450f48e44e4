//! What a leader's socket receives (UDP payloads): the client's parser never panics, and
//! what it accepts has exactly the body its header announces (the client slices results
//! and host messages by it).
#![no_main]

use innet_client::frames;
use innet_common::{proto::element_bytes, validate::Verdict, wire::ControlPayload};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|payload: &[u8]| {
    let Some(f) = frames::parse(payload) else {
        return;
    };
    match f.verdict {
        Verdict::Data { op, dtype, count } => {
            assert_eq!(f.body().len(), usize::from(count) * element_bytes(op, dtype));
            assert!(f.control().is_none());
        }
        Verdict::Control(_) => {
            assert_eq!(f.body().len(), size_of::<ControlPayload>());
            assert!(f.control().is_some() && !f.is_result());
        }
    }
});
