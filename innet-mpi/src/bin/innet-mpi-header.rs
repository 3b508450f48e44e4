//! Writes the shim's C header (`innet_mpi::header`) to the path given, or to stdout.

fn main() -> std::io::Result<()> {
    let header = innet_mpi::header::c_header();
    if let Some(path) = std::env::args_os().nth(1) {
        return std::fs::write(path, header);
    }
    print!("{header}");
    Ok(())
}
