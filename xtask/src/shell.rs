//! Running commands with their output shown and failures reported with the command line.

use std::process::Command;

use anyhow::{Context as _, Result, bail};

/// Runs `cmd` with inherited stdio; fails unless it exits 0.
pub fn exec(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("spawning {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// Runs `cmd` in place of this process (exec(2)), so that a signal meant for xtask
/// (`timeout`, `systemctl stop`, a CI job's cancel, a closed terminal) reaches the lab tool
/// itself, which tears its fabric down. Returns only if the exec failed.
pub fn exec_in_place(cmd: &mut Command) -> Result<()> {
    use std::os::unix::process::CommandExt as _;
    Err(cmd.exec()).with_context(|| format!("running {cmd:?}"))
}

/// Whether `cmd` runs and exits 0 (output discarded).
pub fn succeeds(cmd: &mut Command) -> bool {
    cmd.output().is_ok_and(|o| o.status.success())
}

/// `cargo` as the one running us.
pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// The workspace root.
pub fn workspace() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace")
        .to_owned()
}
