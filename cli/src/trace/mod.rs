//! `boundpool trace`: summarise a Chrome trace, or draw it as an SVG timeline
//! (`timeline.rs` reads it, `svg.rs` draws it).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};

use self::timeline::{BarKind, ColorBy, Timeline};

mod svg;
mod timeline;

#[derive(Args, Debug)]
pub(crate) struct TraceArgs {
    /// A Chrome trace file (as written by `boundpool run --trace`).
    file: PathBuf,
    /// Draw the timeline to this SVG file.
    #[arg(long, value_name = "OUT.svg")]
    svg: Option<PathBuf>,
    /// Width of the picture in pixels.
    #[arg(long, default_value_t = 1400)]
    width: u32,
    /// Colour node bars by graph, run or node name (auto: graph if several, else run if several, else node).
    #[arg(long, value_enum, default_value_t = ColorArg::Auto)]
    color: ColorArg,
}

/// How node bars are coloured.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum ColorArg {
    /// By graph when the trace holds several graphs, else by run when it holds several runs,
    /// else by node name.
    Auto,
    /// One colour per graph.
    Graph,
    /// One colour per run (`run --repeat`).
    Run,
    /// One colour per node name.
    Node,
}

pub(crate) fn main(a: TraceArgs) -> ExitCode {
    let fail = |m: String| {
        eprintln!("boundpool trace: {m}");
        ExitCode::from(2)
    };
    let text = match std::fs::read_to_string(&a.file) {
        Ok(t) => t,
        Err(e) => return fail(format!("cannot read {}: {e}", a.file.display())),
    };
    let v: serde_json::Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => return fail(format!("{} is not JSON: {e}", a.file.display())),
    };
    let t = match Timeline::from_chrome_trace(&v) {
        Ok(t) => t,
        Err(e) => return fail(format!("{}: {e}", a.file.display())),
    };
    match &a.svg {
        Some(out) => draw(&a, &t, out),
        None => {
            summarise(&t, &v);
            ExitCode::SUCCESS
        }
    }
}

/// Draws `t` to the SVG file `out`.
fn draw(a: &TraceArgs, t: &Timeline, out: &std::path::Path) -> ExitCode {
    let color = match a.color {
        ColorArg::Auto => ColorBy::Auto,
        ColorArg::Graph => ColorBy::Graph,
        ColorArg::Run => ColorBy::Run,
        ColorArg::Node => ColorBy::Node,
    };
    if let Err(e) = std::fs::write(out, svg::draw(t, a.width, color)) {
        eprintln!("boundpool trace: cannot write {}: {e}", out.display());
        return ExitCode::from(1);
    }
    println!(
        "wrote {} ({} tracks, {} slices)",
        out.display(),
        t.rows.len(),
        t.bars.len()
    );
    ExitCode::SUCCESS
}

/// Prints a summary per track of `t` (read from the trace `v`): nodes, busy time, parked time,
/// over the trace's span, and the nodes stolen.
fn summarise(t: &Timeline, v: &serde_json::Value) {
    let t0 = t.bars.iter().map(|b| b.ts).fold(f64::INFINITY, f64::min);
    let t1 = t
        .bars
        .iter()
        .map(|b| b.ts + b.dur)
        .fold(f64::NEG_INFINITY, f64::max);
    let span = if t1 > t0 { t1 - t0 } else { 0.0 };
    println!(
        "{} tracks, {} slices over {:.1} µs",
        t.rows.len(),
        t.bars.len(),
        span
    );
    println!(
        "{:<36} {:>9} {:>12} {:>7} {:>12} {:>8}",
        "track", "slices", "busy µs", "busy", "parked µs", "stolen"
    );
    for (i, name) in t.rows.iter().enumerate() {
        let bars = t.bars.iter().filter(|b| b.row == i);
        let (mut count, mut busy, mut parked) = (0, 0.0, 0.0);
        for b in bars {
            match b.kind {
                BarKind::Park => parked += b.dur,
                _ => {
                    count += 1;
                    busy += b.dur;
                }
            }
        }
        let stolen = stolen_on(v, i);
        let pct = if span > 0.0 { 100.0 * busy / span } else { 0.0 };
        println!("{name:<36} {count:>9} {busy:>12.1} {pct:>6.1}% {parked:>12.1} {stolen:>8}");
    }
}

/// Node events of row `row` (tid `row + 1`, as `run --trace` writes them) marked stolen.
fn stolen_on(v: &serde_json::Value, row: usize) -> usize {
    v.get("traceEvents")
        .and_then(|e| e.as_array())
        .map(|events| {
            events
                .iter()
                .filter(|e| e.get("ph").and_then(|p| p.as_str()) == Some("X"))
                .filter(|e| e.get("tid").and_then(|t| t.as_u64()) == Some(row as u64 + 1))
                .filter(|e| e.pointer("/args/stolen").and_then(|s| s.as_bool()) == Some(true))
                .count()
        })
        .unwrap_or(0)
}
