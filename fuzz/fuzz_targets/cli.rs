//! The `innet` command line: arbitrary argument vectors (split at NUL bytes) through clap
//! and innet's own value parsers (group ids, MACs, ops, modes …). Parsing must end in a
//! command or an error message, never a panic. Nothing is run.
#![no_main]

// The CLI lives in the `innet` binary crate; this target compiles the same source.
#[allow(dead_code, unused_imports)]
#[path = "../../innet-user/src/cli/mod.rs"]
mod cli;

use clap::Parser as _;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let args = std::iter::once("innet").chain(text.split('\0'));
    if let Err(e) = cli::Cli::try_parse_from(args) {
        // Rendering the message runs the error's own formatting.
        let _ = e.render().to_string();
    }
});
