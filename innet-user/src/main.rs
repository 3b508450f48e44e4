//! `innet`: attach innet's XDP programs to switch ports, inspect them, write example packets.

mod cli;

use anyhow::Result;
use clap::Parser as _;
use tracing_subscriber::EnvFilter;

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    cli::Cli::parse().run()
}
