//! The application runs' section of the report.

use std::fmt::Write as _;

use super::{AppRow, speeds};

/// The section: per application and shape, plain MPI against MPI + innet per iteration and
/// start to finish, whether the output matched; then every run.
#[must_use]
pub fn markdown(rows: &[AppRow]) -> String {
    let mut s = String::from("## Applications under mpirun (multi-node launch)\n\n");
    s += "Whole applications, OpenMPI's multi-node launch (a daemon per node, shared memory \
          within a node, TCP through the fabric between nodes, yield when idle, no binding, \
          the scheduler's autogroups off), plain and with innet's interposer preloaded with \
          nothing set (placement found, learned cutover). Per application and shape: a \
          plain run first, discarded (warm-up), then plain, + innet, plain again; *speed* is \
          the mean of the two plain runs over + innet's. *Per iteration*: the application's \
          own loop time (LAMMPS's `Loop time` per step; the solver's timed solve per CG \
          iteration); *start to finish*: mpirun's wall time, start-up included. *Output*: \
          LAMMPS's thermo table, the solver's final residual norm, against both plain \
          runs' (a difference is the residuals' difference over the right-hand side's \
          norm: innet's sums run in another order than MPI's).\n\n";
    s += "| application | problem | shape | per iteration, MPI / + innet | speed | start to finish, MPI / + innet | speed | output | served by innet | fell back |\n\
          |---|---|---|---:|---:|---:|---:|---|---:|---:|\n";
    for sp in speeds(rows) {
        let of = |innet: bool| {
            let mine: Vec<&AppRow> = rows
                .iter()
                .filter(|r| {
                    r.innet == innet
                        && r.counts()
                        && (r.app.as_str(), r.nodes, r.ppn) == (sp.app.as_str(), sp.nodes, sp.ppn)
                })
                .collect();
            let n = mine.len().max(1) as f64;
            (
                mine.iter().map(|r| r.per_iteration_us).sum::<f64>() / n,
                mine.iter().map(|r| r.wall_s).sum::<f64>() / n,
                mine.iter().map(|r| r.served).sum::<u64>(),
                mine.iter().map(|r| r.fallbacks).sum::<u64>(),
            )
        };
        let (plain_it, plain_wall, ..) = of(false);
        let (innet_it, innet_wall, served, fell_back) = of(true);
        let output = if sp.identical {
            "identical".to_string()
        } else if sp.difference < 1.0 {
            format!("differs by {:.1e} of ‖b‖", sp.difference)
        } else {
            "differs".to_string()
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} × {} | {plain_it:.1} / {innet_it:.1} µs | {:.2}× | {plain_wall:.2} / {innet_wall:.2} s | {:.2}× | {output} | {served} | {fell_back} |",
            sp.app, sp.problem, sp.nodes, sp.ppn, sp.per_iteration, sp.wall
        );
    }
    s += "\nEvery run:\n\n| application | shape | run | per iteration | iterations | start to finish | output | failed |\n\
          |---|---|---|---:|---:|---:|---|---|\n";
    for r in rows {
        let output = r.output.lines().last().unwrap_or("");
        let _ = writeln!(
            s,
            "| {} | {} × {} | {} | {:.1} µs | {} | {:.2} s | `{output}` | {} |",
            r.app,
            r.nodes,
            r.ppn,
            r.run,
            r.per_iteration_us,
            r.iterations,
            r.wall_s,
            r.failed.as_deref().unwrap_or("")
        );
    }
    s += "\n";
    s
}
