//! A [`Timeline`] drawn as a standalone SVG picture: one row per track (its name on the left),
//! node bars coloured by graph, run or node name, parks as a thin grey line (so a gap with no
//! line is a worker searching for work), extra spans hatched in their colour, a time axis with
//! ticks and labels, and a legend. Bars narrower than a pixel that touch are drawn as one bar
//! (its tooltip says how many slices), so million-node traces stay small.

use std::fmt::Write as _;

use super::timeline::{Bar, BarKind, ColorBy, Timeline};

const PALETTE: [&str; 12] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#3b8bc2", "#8cd17d", "#d37295",
];

/// Draws `tl` `width` pixels wide (at least 400), its node bars coloured as `color_by` says.
pub(super) fn draw(tl: &Timeline, width: u32, color_by: ColorBy) -> String {
    let l = Layout::new(tl, width);
    let c = Colours::new(tl, color_by);
    let mut s = String::new();
    header(&mut s, tl, &l, &c);
    for (i, name) in tl.rows.iter().enumerate() {
        row(&mut s, &l, i, name);
    }
    // Bars, merged per row where they are sub-pixel and touch.
    let mut per_row: Vec<Vec<&Bar>> = vec![Vec::new(); l.rows];
    for b in &tl.bars {
        if b.row < l.rows {
            per_row[b.row].push(b);
        }
    }
    for (r, bars) in per_row.iter_mut().enumerate() {
        bars.sort_by(|a, b| a.ts.total_cmp(&b.ts));
        row_bars(&mut s, &l, &c, l.top + r as f64 * l.row_h, bars);
    }
    axis(&mut s, &l);
    legend(&mut s, &l, &c);
    s.push_str("</svg>\n");
    s
}

/// Where things go: the picture's margins, its plot's width, and the time it spans.
struct Layout {
    width: f64,
    label_w: f64,
    row_h: f64,
    top: f64,
    bottom: f64,
    plot_w: f64,
    /// The first event's time, µs.
    t0: f64,
    /// From the first event's start to the last one's end, µs (1 for an empty timeline).
    span: f64,
    /// Rows drawn (at least one).
    rows: usize,
}

impl Layout {
    fn new(tl: &Timeline, width: u32) -> Self {
        let width = width.max(400) as f64;
        let (label_w, row_h, top, bottom, right) = (230.0, 26.0, 56.0, 46.0, 20.0);
        let t0 = tl.bars.iter().map(|b| b.ts).fold(f64::INFINITY, f64::min);
        let t1 = tl
            .bars
            .iter()
            .map(|b| b.ts + b.dur)
            .fold(f64::NEG_INFINITY, f64::max);
        let (t0, t1) = if t0.is_finite() && t1 > t0 {
            (t0, t1)
        } else {
            (0.0, 1.0)
        };
        Layout {
            width,
            label_w,
            row_h,
            top,
            bottom,
            plot_w: width - label_w - right,
            t0,
            span: t1 - t0,
            rows: tl.rows.len().max(1),
        }
    }

    /// The x coordinate of time `t` (µs).
    fn x(&self, t: f64) -> f64 {
        self.label_w + (t - self.t0) / self.span * self.plot_w
    }

    /// The axis' y coordinate, under the last row.
    fn axis_y(&self) -> f64 {
        self.top + self.rows as f64 * self.row_h
    }
}

/// How node bars are coloured: by graph, run or node name, each in the order sorted.
struct Colours<'a> {
    by: ColorBy,
    graphs: Vec<&'a str>,
    /// Node names, when few enough to give each its own colour (else colours are hashed).
    names: Vec<&'a str>,
    runs: Vec<u64>,
}

impl<'a> Colours<'a> {
    fn new(tl: &'a Timeline, color_by: ColorBy) -> Self {
        let mut graphs: Vec<&str> = tl
            .bars
            .iter()
            .filter(|b| b.kind == BarKind::Node)
            .map(|b| b.graph.as_str())
            .collect();
        graphs.sort_unstable();
        graphs.dedup();
        let mut names: Vec<&str> = tl
            .bars
            .iter()
            .filter(|b| b.kind == BarKind::Node)
            .map(|b| b.name.as_str())
            .collect();
        names.sort_unstable();
        names.dedup();
        if names.len() > PALETTE.len() {
            names.clear();
        }
        let mut runs: Vec<u64> = tl.bars.iter().filter_map(|b| b.run).collect();
        runs.sort_unstable();
        runs.dedup();
        let by = match color_by {
            ColorBy::Auto if graphs.len() > 1 => ColorBy::Graph,
            ColorBy::Auto if runs.len() > 1 => ColorBy::Run,
            ColorBy::Auto => ColorBy::Node,
            c => c,
        };
        Colours {
            by,
            graphs,
            names,
            runs,
        }
    }

    fn of(&self, b: &Bar) -> &'static str {
        let i = match self.by {
            ColorBy::Graph => self
                .graphs
                .binary_search(&b.graph.as_str())
                .unwrap_or_else(|_| fnv(&b.graph) as usize),
            ColorBy::Run => b
                .run
                .and_then(|r| self.runs.binary_search(&r).ok())
                .unwrap_or_else(|| fnv(&b.name) as usize),
            _ => self
                .names
                .binary_search(&b.name.as_str())
                .unwrap_or_else(|_| fnv(&b.name) as usize),
        };
        PALETTE[i % PALETTE.len()]
    }

    /// What the colours stand for, as the picture's subtitle says it.
    fn what(&self) -> &'static str {
        match self.by {
            ColorBy::Graph => "graph",
            ColorBy::Run => "run",
            _ => "node name",
        }
    }

    /// The legend's entries: each graph, run or node name with its colour.
    fn legend(&self) -> Vec<(String, &'static str)> {
        match self.by {
            ColorBy::Graph => self
                .graphs
                .iter()
                .enumerate()
                .take(PALETTE.len())
                .map(|(i, g)| (g.to_string(), PALETTE[i]))
                .collect(),
            ColorBy::Run => self
                .runs
                .iter()
                .enumerate()
                .take(PALETTE.len())
                .map(|(i, r)| (format!("run {r}"), PALETTE[i]))
                .collect(),
            _ => self
                .names
                .iter()
                .enumerate()
                .map(|(i, n)| (n.to_string(), PALETTE[i]))
                .collect(),
        }
    }
}

/// The `<svg>` element, the hatch pattern, the background, the title and the subtitle.
fn header(s: &mut String, tl: &Timeline, l: &Layout, c: &Colours<'_>) {
    let legend_h = 24.0;
    let width = l.width;
    let height = l.top + l.rows as f64 * l.row_h + l.bottom + legend_h;
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r##"<defs><pattern id="hatch" width="4" height="4" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="2" height="4" fill="#ffffff" opacity="0.55"/></pattern></defs>"##
    );
    let _ = writeln!(s, r##"<rect width="100%" height="100%" fill="#ffffff"/>"##);
    let n_nodes = tl.bars.iter().filter(|b| b.kind == BarKind::Node).count();
    let _ = writeln!(
        s,
        r##"<text x="{}" y="22" font-size="15" font-weight="bold" fill="#222">boundpool timeline</text><text x="{}" y="40" fill="#555">{} node slices on {} tracks over {}; colour by {}; dark top edge: stolen; grey line: parked; blank: searching for work</text>"##,
        12,
        12,
        n_nodes,
        tl.rows.len(),
        fmt_time(l.span),
        c.what()
    );
}

/// Row `i`'s background band and its track's name.
fn row(s: &mut String, l: &Layout, i: usize, name: &str) {
    let (label_w, plot_w, row_h) = (l.label_w, l.plot_w, l.row_h);
    let y = l.top + i as f64 * row_h;
    let fill = if i % 2 == 0 { "#f4f5f7" } else { "#eceef1" };
    let _ = writeln!(
        s,
        r#"<rect x="{label_w}" y="{y}" width="{plot_w:.1}" height="{row_h}" fill="{fill}"/>"#
    );
    let _ = writeln!(
        s,
        r##"<text x="{}" y="{:.1}" fill="#222">{}</text>"##,
        10,
        y + row_h / 2.0 + 4.0,
        esc(name)
    );
}

/// One row's bars (sorted by start) at height `y`: its parks, then its node and span bars,
/// sub-pixel ones that touch merged into one.
fn row_bars(s: &mut String, l: &Layout, c: &Colours<'_>, y: f64, bars: &[&Bar]) {
    // Parks: a thin grey line across the row's middle.
    for b in bars.iter().filter(|b| b.kind == BarKind::Park) {
        let (x0, x1) = (l.x(b.ts), l.x(b.ts + b.dur));
        let _ = writeln!(
            s,
            r##"<rect x="{x0:.2}" y="{:.1}" width="{:.2}" height="2" fill="#9aa0a6"><title>parked {}</title></rect>"##,
            y + l.row_h / 2.0 - 1.0,
            (x1 - x0).max(0.5),
            fmt_time(b.dur)
        );
    }
    let mut cur: Option<Merged> = None;
    for b in bars.iter().filter(|b| b.kind != BarKind::Park) {
        let (x0, x1) = (l.x(b.ts), l.x(b.ts + b.dur));
        if let Some(m) = &mut cur {
            // Merge only sub-pixel slices: anything wider keeps its own bar, so node
            // boundaries stay visible.
            let tiny = (x1 - x0) < 1.0 && ((m.x1 - m.x0) < 1.0 || m.count > 1);
            if x0 <= m.x1 + 0.5 && tiny {
                m.x1 = m.x1.max(x1);
                m.t1 = m.t1.max(b.ts + b.dur - l.t0);
                m.count += 1;
                continue;
            }
        }
        if let Some(m) = cur.take() {
            m.write(s, y, l.row_h);
        }
        cur = Some(Merged {
            x0,
            x1,
            t0: b.ts - l.t0,
            t1: b.ts + b.dur - l.t0,
            count: 1,
            stolen: b.stolen,
            color: c.of(b),
            span: b.kind == BarKind::Span,
            label: if b.graph.is_empty() || b.kind == BarKind::Span {
                b.name.clone()
            } else {
                format!("{} ({})", b.name, b.graph)
            },
        });
    }
    if let Some(m) = cur.take() {
        m.write(s, y, l.row_h);
    }
}

/// The time axis under the rows: ticks at a 1-2-5 step with labels and faint grid lines.
fn axis(s: &mut String, l: &Layout) {
    let (label_w, top) = (l.label_w, l.top);
    let ay = l.axis_y();
    let _ = writeln!(
        s,
        r##"<line x1="{label_w}" y1="{ay}" x2="{:.1}" y2="{ay}" stroke="#333"/>"##,
        label_w + l.plot_w
    );
    let step = nice_step(l.span / 8.0);
    let mut k = 0u64;
    loop {
        let t = k as f64 * step;
        if t > l.span * 1.0001 {
            break;
        }
        let tx = l.x(l.t0 + t);
        let _ = writeln!(
            s,
            r##"<line x1="{tx:.1}" y1="{ay}" x2="{tx:.1}" y2="{:.1}" stroke="#333"/>"##,
            ay + 5.0
        );
        let _ = writeln!(
            s,
            r##"<line x1="{tx:.1}" y1="{top}" x2="{tx:.1}" y2="{ay}" stroke="#000" stroke-opacity="0.07"/>"##
        );
        let _ = writeln!(
            s,
            r##"<text x="{tx:.1}" y="{:.1}" text-anchor="middle" fill="#333">{}</text>"##,
            ay + 18.0,
            fmt_time(t)
        );
        k += 1;
    }
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#555">time since the first event</text>"##,
        label_w + l.plot_w,
        ay + 34.0
    );
}

/// The legend under the axis: a swatch and a name per colour.
fn legend(s: &mut String, l: &Layout, c: &Colours<'_>) {
    let ly = l.axis_y() + l.bottom + 12.0;
    let mut lx = l.label_w;
    for (name, colour) in c.legend() {
        let _ = writeln!(
            s,
            r##"<rect x="{lx:.1}" y="{:.1}" width="12" height="12" fill="{colour}"/><text x="{:.1}" y="{:.1}" fill="#333">{}</text>"##,
            ly - 10.0,
            lx + 16.0,
            ly,
            esc(&name)
        );
        lx += 28.0 + 7.0 * name.chars().count() as f64;
    }
}

struct Merged {
    x0: f64,
    x1: f64,
    t0: f64,
    t1: f64,
    count: usize,
    stolen: bool,
    color: &'static str,
    span: bool,
    label: String,
}

impl Merged {
    fn write(&self, s: &mut String, y: f64, row_h: f64) {
        // Bars wider than 2 px leave a half-pixel gap at their end, so neighbours stay apart.
        let w = self.x1 - self.x0;
        let w = if w > 2.0 { w - 0.5 } else { w.max(0.6) };
        let title = if self.count == 1 {
            let stolen = if self.stolen { ", stolen" } else { "" };
            format!(
                "{}: {} at {}{stolen}",
                self.label,
                fmt_time(self.t1 - self.t0),
                fmt_time(self.t0)
            )
        } else {
            format!(
                "{} slices from {} to {} (first: {})",
                self.count,
                fmt_time(self.t0),
                fmt_time(self.t1),
                self.label
            )
        };
        let _ = write!(
            s,
            r#"<rect x="{:.2}" y="{:.1}" width="{w:.2}" height="{:.1}" fill="{}"><title>{}</title></rect>"#,
            self.x0,
            y + 4.0,
            row_h - 8.0,
            self.color,
            esc(&title)
        );
        if self.span {
            let _ = write!(
                s,
                r#"<rect x="{:.2}" y="{:.1}" width="{w:.2}" height="{:.1}" fill="url(#hatch)"/>"#,
                self.x0,
                y + 4.0,
                row_h - 8.0
            );
        }
        if self.stolen && self.count == 1 {
            let _ = write!(
                s,
                r##"<rect x="{:.2}" y="{:.1}" width="{w:.2}" height="3" fill="#222"/>"##,
                self.x0,
                y + 4.0
            );
        }
        s.push('\n');
    }
}

/// A tick step of 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw.is_nan() || raw <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(raw.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * p >= raw {
            return m * p;
        }
    }
    10.0 * p
}

/// Formats microseconds with a fitting unit.
fn fmt_time(us: f64) -> String {
    let trim = |v: f64| {
        let s = format!("{v:.3}");
        let s = s.trim_end_matches('0').trim_end_matches('.').to_string();
        if s.is_empty() || s == "-0" {
            "0".to_string()
        } else {
            s
        }
    };
    if us.abs() >= 1_000_000.0 {
        format!("{} s", trim(us / 1_000_000.0))
    } else if us.abs() >= 1000.0 {
        format!("{} ms", trim(us / 1000.0))
    } else if us.abs() >= 1.0 || us == 0.0 {
        format!("{} µs", trim(us))
    } else {
        format!("{} ns", trim(us * 1000.0))
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x1000_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nice_steps_are_1_2_5() {
        assert_eq!(nice_step(0.7), 1.0);
        assert_eq!(nice_step(1.5), 2.0);
        assert_eq!(nice_step(3.0), 5.0);
        assert_eq!(nice_step(7.0), 10.0);
        assert_eq!(nice_step(120.0), 200.0);
    }

    #[test]
    fn times_get_units() {
        assert_eq!(fmt_time(0.0), "0 µs");
        assert_eq!(fmt_time(0.25), "250 ns");
        assert_eq!(fmt_time(1500.0), "1.5 ms");
        assert_eq!(fmt_time(2_000_000.0), "2 s");
    }

    #[test]
    fn svg_of_a_small_timeline() {
        let v = json!({"traceEvents": [
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "worker 0 (core 0, host)"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "worker 1 (core 1, host)"}},
            {"ph": "X", "name": "a", "cat": "g", "pid": 1, "tid": 1, "ts": 0.0, "dur": 10.0, "args": {}},
            {"ph": "X", "name": "park", "cat": "park", "pid": 1, "tid": 2, "ts": 0.0, "dur": 9.0, "args": {"kind": "park"}},
            {"ph": "X", "name": "b", "cat": "g", "pid": 1, "tid": 2, "ts": 11.0, "dur": 10.0, "args": {}},
        ]});
        let t = Timeline::from_chrome_trace(&v).unwrap();
        let svg = draw(&t, 800, ColorBy::Auto);
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("worker 1 (core 1, host)"));
        assert!(svg.contains("a (g)") && svg.contains("b (g)"));
        assert!(svg.contains("parked"));
        assert!(svg.trim_end().ends_with("</svg>"));
    }
}
