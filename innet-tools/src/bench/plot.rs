//! The run's plots, as SVG and PNG: latency vs message size per node count (one line per
//! mode), and the speed-up over `host-rd` vs node count (one line per INC mode and size).

use std::path::Path;

use plotters::{
    coord::Shift,
    prelude::*,
    style::{FontStyle, register_font},
};

use super::{
    LatencyRow,
    speedup::{BASELINE, INC_MODES, distinct, find, speedup},
};

/// The font plotters measures and draws text with (Debian's `fonts-dejavu-core`, which
/// `cargo xtask setup` installs).
const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
const SIZE: (u32, u32) = (900, 560);
const MODES: [&str; 5] = ["host-rd", "host-ring", "inc-node", "inc-socket", "inc-nic"];
/// Sizes whose speed-up the node-count plot follows.
const SPEEDUP_SIZES: [usize; 2] = [4, 256];

/// Line colours: the hosts' baselines grey first, then ten distinct hues (a goodput chart
/// has ten lines; the palette repeats only beyond twelve).
fn color(i: usize) -> RGBColor {
    const PALETTE: [RGBColor; 12] = [
        RGBColor(90, 90, 90),
        RGBColor(160, 160, 160),
        RGBColor(31, 119, 180),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(255, 127, 14),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
        RGBColor(0, 0, 0),
    ];
    PALETTE[i % PALETTE.len()]
}

/// Height of the legend strip under a goodput chart, per row of [`LEGEND_COLUMNS`] entries.
const LEGEND_ROW: u32 = 24;
const LEGEND_COLUMNS: usize = 3;

/// Writes `latency-<n>-nodes.{svg,png}` for each node count, `speedup.{svg,png}` and, with
/// goodput rows, a goodput chart per node count ([`goodput_chart_name`]) into `dir`;
/// returns the files written.
///
/// # Errors
/// The font is missing, or a file cannot be written.
pub fn all(rows: &[LatencyRow], goodput: &[LatencyRow], dir: &Path) -> Result<Vec<String>, String> {
    let font = std::fs::read(FONT)
        .map_err(|e| format!("{FONT}: {e} (install fonts-dejavu-core: cargo xtask setup does)"))?;
    // plotters keeps the font for the process's lifetime.
    register_font(
        "sans-serif",
        FontStyle::Normal,
        Box::leak(font.into_boxed_slice()),
    )
    .map_err(|_| format!("{FONT} is not a usable font"))?;
    let mut written = vec![];
    for nodes in distinct(rows, |r| r.nodes) {
        let name = format!("latency-{nodes}-nodes");
        let (svg, png) = files(dir, &name);
        latency(
            &SVGBackend::new(&svg, SIZE).into_drawing_area(),
            rows,
            nodes,
        )?;
        latency(
            &BitMapBackend::new(&png, SIZE).into_drawing_area(),
            rows,
            nodes,
        )?;
        written.extend([svg, png].map(|p| p.display().to_string()));
    }
    for ppn in common_ppns(rows) {
        let (svg, png) = files(dir, &format!("speedup-{ppn}ppn"));
        speedups(&SVGBackend::new(&svg, SIZE).into_drawing_area(), rows, ppn)?;
        speedups(
            &BitMapBackend::new(&png, SIZE).into_drawing_area(),
            rows,
            ppn,
        )?;
        written.extend([svg, png].map(|p| p.display().to_string()));
    }
    let counts = distinct(goodput, |r| r.nodes);
    for &nodes in &counts {
        let goodput: Vec<LatencyRow> = goodput
            .iter()
            .filter(|r| r.nodes == nodes)
            .cloned()
            .collect();
        let goodput = goodput.as_slice();
        let (svg, png) = files(dir, &goodput_chart_name(&counts, nodes));
        // Its many lines keep their legend in a strip below the chart, off the data.
        let lines = goodput_labels(goodput).len();
        let size = (
            SIZE.0,
            SIZE.1 + LEGEND_ROW * lines.div_ceil(LEGEND_COLUMNS) as u32 + 10,
        );
        goodput_chart(&SVGBackend::new(&svg, size).into_drawing_area(), goodput)?;
        goodput_chart(&BitMapBackend::new(&png, size).into_drawing_area(), goodput)?;
        written.extend([svg, png].map(|p| p.display().to_string()));
    }
    Ok(written)
}

/// The goodput chart of `nodes` nodes among the run's node counts `counts`: `goodput`
/// for the fewest (the name of runs with one node count), `goodput-<n>-nodes` for others.
#[must_use]
pub fn goodput_chart_name(counts: &[usize], nodes: usize) -> String {
    if counts.first() == Some(&nodes) {
        "goodput".into()
    } else {
        format!("goodput-{nodes}-nodes")
    }
}

/// The goodput chart's lines, in the order of the rows: one per mode, MTU, window and
/// element type.
fn goodput_labels(rows: &[LatencyRow]) -> Vec<String> {
    let mut labels: Vec<String> = vec![];
    for r in rows.iter().filter(|r| r.failed.is_none()) {
        if !labels.contains(&r.goodput_label()) {
            labels.push(r.goodput_label());
        }
    }
    labels
}

/// Goodput (MB/s of message) vs size, one line per mode and MTU; failed points left out.
/// The legend is a strip under the chart (`root` is that much taller than [`SIZE`]).
fn goodput_chart<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    rows: &[LatencyRow],
) -> Result<(), String> {
    let ok: Vec<&LatencyRow> = rows.iter().filter(|r| r.failed.is_none()).collect();
    let mbps = |r: &LatencyRow| r.bytes as f64 / r.avg_us;
    let hi = ok.iter().fold(1f64, |hi, r| hi.max(mbps(r)));
    let sizes = distinct(rows, |r| r.bytes);
    let (xmin, xmax) = (
        *sizes.first().unwrap_or(&65_536) as f64,
        *sizes.last().unwrap_or(&(64 << 20)) as f64,
    );
    let (nodes, dtype) = rows
        .first()
        .map_or((0, ""), |r| (r.nodes, r.dtype.as_str()));
    root.fill(&WHITE).map_err(err)?;
    let (plot, strip) = root.split_vertically(SIZE.1);
    // Sizes span three decades, goodputs one: the y axis is linear, from zero.
    let mut chart = ChartBuilder::on(&plot)
        .caption(
            format!("allreduce goodput, {nodes} nodes × 1 rank per node, {dtype} SUM"),
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d((xmin / 1.2..xmax * 1.2).log_scale(), 0.0..hi * 1.1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc("MB/s of message per allreduce")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(err)?;
    let labels = goodput_labels(rows);
    for (i, label) in labels.iter().enumerate() {
        let line: Vec<(f64, f64)> = ok
            .iter()
            .filter(|r| r.goodput_label() == *label)
            .map(|r| (r.bytes as f64, mbps(r)))
            .collect();
        series(&mut chart, line, color(i), 2, label)?;
    }
    let column = SIZE.0 as i32 / LEGEND_COLUMNS as i32;
    for (i, label) in labels.iter().enumerate() {
        let (x, y) = (
            20 + column * (i % LEGEND_COLUMNS) as i32,
            12 + LEGEND_ROW as i32 * (i / LEGEND_COLUMNS) as i32,
        );
        strip
            .draw(&PathElement::new(
                vec![(x, y), (x + 24, y)],
                color(i).stroke_width(3),
            ))
            .map_err(err)?;
        strip
            .draw(&Text::new(
                label.clone(),
                (x + 32, y - 8),
                ("sans-serif", 15),
            ))
            .map_err(err)?;
    }
    root.present().map_err(err)
}

/// The SVG and PNG paths of chart `name`.
fn files(dir: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    (
        dir.join(format!("{name}.svg")),
        dir.join(format!("{name}.png")),
    )
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Latency vs size at `nodes`, at the most ranks per node measured there.
fn latency<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    rows: &[LatencyRow],
    nodes: usize,
) -> Result<(), String> {
    let ppn = rows
        .iter()
        .filter(|r| r.nodes == nodes)
        .map(|r| r.ppn)
        .max()
        .unwrap_or(1);
    let pts: Vec<&LatencyRow> = rows
        .iter()
        .filter(|r| r.nodes == nodes && r.ppn == ppn)
        .collect();
    let (lo, hi) = pts.iter().fold((f64::MAX, 0f64), |(lo, hi), r| {
        (lo.min(r.avg_us), hi.max(r.avg_us))
    });
    let sizes = distinct(rows, |r| r.bytes);
    let (xmin, xmax) = (
        *sizes.first().unwrap_or(&4) as f64,
        *sizes.last().unwrap_or(&256) as f64,
    );
    let mut chart = log_log(
        root,
        format!("allreduce latency, {nodes} nodes × {ppn} ranks per node"),
        (xmin..xmax * 1.2, lo * 0.8..hi * 1.25),
        ("message size (bytes, int32 SUM)", "average latency (µs)"),
    )?;
    for (i, mode) in MODES.iter().enumerate() {
        let line: Vec<(f64, f64)> = sizes
            .iter()
            .filter_map(|&b| find(rows, mode, nodes, ppn, b).map(|r| (b as f64, r.avg_us)))
            .collect();
        if line.is_empty() {
            continue;
        }
        series(&mut chart, line, color(i), 2, mode)?;
    }
    legend_and_present(&mut chart, root)
}

/// A chart whose axes are both logarithmic.
type LogLog<'a, DB> = ChartContext<'a, DB, Cartesian2d<LogCoord<f64>, LogCoord<f64>>>;

/// A white chart with both axes logarithmic over `ranges`, its caption and mesh drawn.
fn log_log<'a, DB: DrawingBackend>(
    root: &'a DrawingArea<DB, Shift>,
    caption: String,
    (x, y): (std::ops::Range<f64>, std::ops::Range<f64>),
    (x_desc, y_desc): (&str, &str),
) -> Result<LogLog<'a, DB>, String> {
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(root)
        .caption(caption, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(x.log_scale(), y.log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(err)?;
    Ok(chart)
}

/// One labelled line with a dot at each point.
fn series<DB: DrawingBackend, X: Ranged<ValueType = f64>, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<X, Y>>,
    line: Vec<(f64, f64)>,
    c: RGBColor,
    width: u32,
    label: &str,
) -> Result<(), String> {
    chart
        .draw_series(LineSeries::new(line.clone(), c.stroke_width(width)))
        .map_err(err)?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(width)));
    chart
        .draw_series(
            line.into_iter()
                .map(|p| Circle::new(p, width + 2, c.filled())),
        )
        .map_err(err)?;
    Ok(())
}

/// Draws the legend in the upper left and writes the file.
fn legend_and_present<'a, DB, X, Y>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    root: &DrawingArea<DB, Shift>,
) -> Result<(), String>
where
    DB: DrawingBackend + 'a,
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

/// The ranks-per-node counts measured at every node count (one speed-up plot each).
#[must_use]
pub fn common_ppns(rows: &[LatencyRow]) -> Vec<usize> {
    let nodes = distinct(rows, |r| r.nodes);
    distinct(rows, |r| r.ppn)
        .into_iter()
        .filter(|&p| {
            nodes
                .iter()
                .all(|&n| rows.iter().any(|r| r.nodes == n && r.ppn == p))
        })
        .collect()
}

/// Speed-up over `host-rd` vs node count at `ppn` ranks per node.
fn speedups<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    rows: &[LatencyRow],
    ppn: usize,
) -> Result<(), String> {
    let nodes = distinct(rows, |r| r.nodes);
    let mut lines = vec![];
    for (m, mode) in INC_MODES.into_iter().enumerate() {
        for bytes in SPEEDUP_SIZES {
            let line: Vec<(f64, f64)> = nodes
                .iter()
                .filter_map(|&n| speedup(rows, mode, n, ppn, bytes).map(|s| (n as f64, s)))
                .collect();
            if !line.is_empty() {
                // Colours as in the latency plots (MODES order); thin 4 B, thick 256 B.
                let width = if bytes == SPEEDUP_SIZES[0] { 1 } else { 3 };
                lines.push((format!("{mode}, {bytes} B"), line, color(m + 2), width));
            }
        }
    }
    let top = lines
        .iter()
        .flat_map(|(_, l, _, _)| l.iter().map(|p| p.1))
        .fold(3.0f64, f64::max);
    let (x0, x1) = (
        *nodes.first().unwrap_or(&1) as f64,
        *nodes.last().unwrap_or(&16) as f64,
    );
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(root)
        .caption(
            format!("speed-up over {BASELINE}, {ppn} ranks per node"),
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(x0 - 1.0..x1 + 1.0, 0f64..top * 1.15)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("nodes")
        .y_desc(format!("{BASELINE} latency / mode latency"))
        .draw()
        .map_err(err)?;
    for (y, label, style) in [
        (1.0, "1× (no gain)", BLACK.stroke_width(1)),
        (2.71, "2.71× (the NIC paper's best)", RED.stroke_width(1)),
    ] {
        chart
            .draw_series(LineSeries::new(vec![(x0 - 1.0, y), (x1 + 1.0, y)], style))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    }
    for (label, line, c, width) in lines {
        series(&mut chart, line, c, width, &label)?;
    }
    legend_and_present(&mut chart, root)
}
