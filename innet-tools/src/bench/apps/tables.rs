//! The application runs' section of the report.

use super::{AppRow, speeds};
use crate::markdown::{
    Align::{Left, Right},
    Table,
};

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
    s += &speeds_table(rows);
    s += "\nEvery run:\n\n";
    s += &runs_table(rows);
    s += "\n";
    s
}

/// Per application and shape: plain MPI against MPI + innet, and whether the output matched.
fn speeds_table(rows: &[AppRow]) -> String {
    let mut t = Table::aligned([
        ("application", Left),
        ("problem", Left),
        ("shape", Left),
        ("per iteration, MPI / + innet", Right),
        ("speed", Right),
        ("start to finish, MPI / + innet", Right),
        ("speed", Right),
        ("output", Left),
        ("served by innet", Right),
        ("fell back", Right),
    ]);
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
        t.row([
            sp.app.clone(),
            sp.problem.clone(),
            format!("{} × {}", sp.nodes, sp.ppn),
            format!("{plain_it:.1} / {innet_it:.1} µs"),
            format!("{:.2}×", sp.per_iteration),
            format!("{plain_wall:.2} / {innet_wall:.2} s"),
            format!("{:.2}×", sp.wall),
            output,
            served.to_string(),
            fell_back.to_string(),
        ]);
    }
    t.to_string()
}

/// Every run, the warm-ups and failures included.
fn runs_table(rows: &[AppRow]) -> String {
    let mut t = Table::aligned([
        ("application", Left),
        ("shape", Left),
        ("run", Left),
        ("per iteration", Right),
        ("iterations", Right),
        ("start to finish", Right),
        ("output", Left),
        ("failed", Left),
    ]);
    for r in rows {
        let output = r.output.lines().last().unwrap_or("");
        t.row([
            r.app.clone(),
            format!("{} × {}", r.nodes, r.ppn),
            r.run.clone(),
            format!("{:.1} µs", r.per_iteration_us),
            r.iterations.to_string(),
            format!("{:.2} s", r.wall_s),
            format!("`{output}`"),
            r.failed.clone().unwrap_or_default(),
        ]);
    }
    t.to_string()
}
