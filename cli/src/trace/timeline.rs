//! A Chrome trace read back as a [`Timeline`] and drawn as an SVG picture.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde_json::Value;

/// What a bar of a [`Timeline`] stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BarKind {
    /// A node ran.
    Node,
    /// The worker was parked.
    Park,
    /// An extra span (e.g. GPU time on a stream).
    Span,
}

/// One interval of a [`Timeline`], in microseconds.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Bar {
    /// Row index into [`Timeline::rows`].
    pub(crate) row: usize,
    /// Node (or span) name.
    pub(crate) name: String,
    /// Graph name (`park` / `span` for those).
    pub(crate) graph: String,
    /// Start, µs.
    pub(crate) ts: f64,
    /// Duration, µs.
    pub(crate) dur: f64,
    /// What it is.
    pub(crate) kind: BarKind,
    /// The node was stolen from another worker's deque (`args.stolen`).
    pub(crate) stolen: bool,
    /// The run it belongs to (`args.run`, written by `boundpool run --repeat`).
    pub(crate) run: Option<u64>,
}

/// How [`Timeline::to_svg`] colours node bars.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum ColorBy {
    /// By graph when the trace holds more than one graph, else by run when it holds more than
    /// one run, else by node name.
    #[default]
    Auto,
    /// One colour per graph.
    Graph,
    /// One colour per run (`args.run`).
    Run,
    /// One colour per node name.
    Node,
}

/// A timeline read from a Chrome trace file: rows (tracks) and bars.
#[derive(Clone, Debug, Default)]
pub(crate) struct Timeline {
    /// Row names, in display order.
    pub(crate) rows: Vec<String>,
    /// Every complete event.
    pub(crate) bars: Vec<Bar>,
}

const PALETTE: [&str; 12] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#3b8bc2", "#8cd17d", "#d37295",
];

impl Timeline {
    /// Reads the events of a Chrome trace (as written by [`chrome_trace`](super::chrome_trace), or any file with
    /// `traceEvents` of `M` `thread_name` and `X` complete events; `B`/`E` pairs are not read).
    ///
    /// Errors: no `traceEvents` array, or an `X` event without a numeric `ts`.
    pub(crate) fn from_chrome_trace(v: &Value) -> Result<Timeline, String> {
        let events = v
            .get("traceEvents")
            .and_then(Value::as_array)
            .or_else(|| v.as_array())
            .ok_or("not a Chrome trace: no `traceEvents` array")?;
        let key = |e: &Value| {
            (
                e.get("pid").and_then(Value::as_u64).unwrap_or(0),
                e.get("tid").and_then(Value::as_u64).unwrap_or(0),
            )
        };
        let mut names: HashMap<(u64, u64), String> = HashMap::new();
        let mut sort: HashMap<(u64, u64), i64> = HashMap::new();
        for e in events {
            if e.get("ph").and_then(Value::as_str) != Some("M") {
                continue;
            }
            let args = e.get("args");
            match e.get("name").and_then(Value::as_str) {
                Some("thread_name") => {
                    if let Some(n) = args.and_then(|a| a.get("name")).and_then(Value::as_str) {
                        names.insert(key(e), n.to_string());
                    }
                }
                Some("thread_sort_index") => {
                    if let Some(n) = args
                        .and_then(|a| a.get("sort_index"))
                        .and_then(Value::as_i64)
                    {
                        sort.insert(key(e), n);
                    }
                }
                _ => {}
            }
        }
        let mut keys: Vec<(u64, u64)> = names.keys().copied().collect();
        for e in events {
            if e.get("ph").and_then(Value::as_str) == Some("X")
                && !names.contains_key(&key(e))
                && !keys.contains(&key(e))
            {
                keys.push(key(e));
            }
        }
        keys.sort_by_key(|k| (sort.get(k).copied().unwrap_or(i64::MAX), *k));
        let row_of: HashMap<(u64, u64), usize> =
            keys.iter().enumerate().map(|(i, k)| (*k, i)).collect();
        let rows = keys
            .iter()
            .map(|k| {
                names
                    .get(k)
                    .cloned()
                    .unwrap_or_else(|| format!("thread {}", k.1))
            })
            .collect();
        let mut bars = Vec::new();
        for e in events {
            if e.get("ph").and_then(Value::as_str) != Some("X") {
                continue;
            }
            let ts = e
                .get("ts")
                .and_then(Value::as_f64)
                .ok_or("an X event has no numeric `ts`")?;
            let dur = e.get("dur").and_then(Value::as_f64).unwrap_or(0.0);
            let name = e
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let graph = e
                .get("cat")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let kind = match e
                .get("args")
                .and_then(|a| a.get("kind"))
                .and_then(Value::as_str)
            {
                Some("park") => BarKind::Park,
                Some("span") => BarKind::Span,
                _ => BarKind::Node,
            };
            let stolen = e
                .pointer("/args/stolen")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let run = e.pointer("/args/run").and_then(Value::as_u64);
            bars.push(Bar {
                row: row_of[&key(e)],
                name,
                graph,
                ts,
                dur,
                kind,
                stolen,
                run,
            });
        }
        Ok(Timeline { rows, bars })
    }

    /// Draws the timeline as a standalone SVG picture `width` pixels wide: one row per track
    /// (its name on the left), node bars coloured by graph or node name, parks as a thin grey
    /// line (so a gap with no line is a worker searching for work), extra spans hatched in their
    /// colour, and a time axis with ticks and labels. Bars narrower than a pixel that touch are
    /// drawn as one bar (its tooltip says how many slices), so million-node traces stay small.
    pub(crate) fn to_svg(&self, width: u32, color_by: ColorBy) -> String {
        let width = width.max(400) as f64;
        let (label_w, row_h, top, bottom, right) = (230.0, 26.0, 56.0, 46.0, 20.0);
        let plot_w = width - label_w - right;
        let nodes = || self.bars.iter().filter(|b| b.kind != BarKind::Park);
        let t0 = self.bars.iter().map(|b| b.ts).fold(f64::INFINITY, f64::min);
        let t1 = self
            .bars
            .iter()
            .map(|b| b.ts + b.dur)
            .fold(f64::NEG_INFINITY, f64::max);
        let (t0, t1) = if t0.is_finite() && t1 > t0 {
            (t0, t1)
        } else {
            (0.0, 1.0)
        };
        let span = t1 - t0;
        let x = |t: f64| label_w + (t - t0) / span * plot_w;
        let rows = self.rows.len().max(1);
        let graphs: Vec<&str> = {
            let mut g: Vec<&str> = nodes()
                .filter(|b| b.kind == BarKind::Node)
                .map(|b| b.graph.as_str())
                .collect();
            g.sort_unstable();
            g.dedup();
            g
        };
        // Node names, when few enough to give each its own colour (else colours are hashed).
        let names: Vec<&str> = {
            let mut n: Vec<&str> = self
                .bars
                .iter()
                .filter(|b| b.kind == BarKind::Node)
                .map(|b| b.name.as_str())
                .collect();
            n.sort_unstable();
            n.dedup();
            if n.len() > PALETTE.len() {
                n.clear();
            }
            n
        };
        let runs: Vec<u64> = {
            let mut r: Vec<u64> = self.bars.iter().filter_map(|b| b.run).collect();
            r.sort_unstable();
            r.dedup();
            r
        };
        let by = match color_by {
            ColorBy::Auto if graphs.len() > 1 => ColorBy::Graph,
            ColorBy::Auto if runs.len() > 1 => ColorBy::Run,
            ColorBy::Auto => ColorBy::Node,
            c => c,
        };
        let color = |b: &Bar| -> &'static str {
            let i = match by {
                ColorBy::Graph => graphs
                    .binary_search(&b.graph.as_str())
                    .unwrap_or_else(|_| fnv(&b.graph) as usize),
                ColorBy::Run => b
                    .run
                    .and_then(|r| runs.binary_search(&r).ok())
                    .unwrap_or_else(|| fnv(&b.name) as usize),
                _ => names
                    .binary_search(&b.name.as_str())
                    .unwrap_or_else(|_| fnv(&b.name) as usize),
            };
            PALETTE[i % PALETTE.len()]
        };
        let legend_h = 24.0;
        let height = top + rows as f64 * row_h + bottom + legend_h;
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">"#
        );
        let _ = writeln!(
            s,
            r##"<defs><pattern id="hatch" width="4" height="4" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="2" height="4" fill="#ffffff" opacity="0.55"/></pattern></defs>"##
        );
        let _ = writeln!(s, r##"<rect width="100%" height="100%" fill="#ffffff"/>"##);
        let n_nodes = self.bars.iter().filter(|b| b.kind == BarKind::Node).count();
        let _ = writeln!(
            s,
            r##"<text x="{}" y="22" font-size="15" font-weight="bold" fill="#222">boundpool timeline</text><text x="{}" y="40" fill="#555">{} node slices on {} tracks over {}; colour by {}; dark top edge: stolen; grey line: parked; blank: searching for work</text>"##,
            12,
            12,
            n_nodes,
            self.rows.len(),
            fmt_time(span),
            match by {
                ColorBy::Graph => "graph",
                ColorBy::Run => "run",
                _ => "node name",
            }
        );
        // Rows.
        for (i, name) in self.rows.iter().enumerate() {
            let y = top + i as f64 * row_h;
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
        // Bars, merged per row where they are sub-pixel and touch.
        let mut per_row: Vec<Vec<&Bar>> = vec![Vec::new(); rows];
        for b in &self.bars {
            if b.row < rows {
                per_row[b.row].push(b);
            }
        }
        for (r, bars) in per_row.iter_mut().enumerate() {
            bars.sort_by(|a, b| a.ts.total_cmp(&b.ts));
            let y = top + r as f64 * row_h;
            // Parks: a thin grey line across the row's middle.
            for b in bars.iter().filter(|b| b.kind == BarKind::Park) {
                let (x0, x1) = (x(b.ts), x(b.ts + b.dur));
                let _ = writeln!(
                    s,
                    r##"<rect x="{x0:.2}" y="{:.1}" width="{:.2}" height="2" fill="#9aa0a6"><title>parked {}</title></rect>"##,
                    y + row_h / 2.0 - 1.0,
                    (x1 - x0).max(0.5),
                    fmt_time(b.dur)
                );
            }
            let mut cur: Option<Merged> = None;
            for b in bars.iter().filter(|b| b.kind != BarKind::Park) {
                let (x0, x1) = (x(b.ts), x(b.ts + b.dur));
                let c = color(b);
                if let Some(m) = &mut cur {
                    // Merge only sub-pixel slices: anything wider keeps its own bar, so node
                    // boundaries stay visible.
                    let tiny = (x1 - x0) < 1.0 && ((m.x1 - m.x0) < 1.0 || m.count > 1);
                    if x0 <= m.x1 + 0.5 && tiny {
                        m.x1 = m.x1.max(x1);
                        m.t1 = m.t1.max(b.ts + b.dur - t0);
                        m.count += 1;
                        continue;
                    }
                }
                if let Some(m) = cur.take() {
                    m.write(&mut s, y, row_h);
                }
                cur = Some(Merged {
                    x0,
                    x1,
                    t0: b.ts - t0,
                    t1: b.ts + b.dur - t0,
                    count: 1,
                    stolen: b.stolen,
                    color: c,
                    span: b.kind == BarKind::Span,
                    label: if b.graph.is_empty() || b.kind == BarKind::Span {
                        b.name.clone()
                    } else {
                        format!("{} ({})", b.name, b.graph)
                    },
                });
            }
            if let Some(m) = cur.take() {
                m.write(&mut s, y, row_h);
            }
        }
        // Axis.
        let ay = top + rows as f64 * row_h;
        let _ = writeln!(
            s,
            r##"<line x1="{label_w}" y1="{ay}" x2="{:.1}" y2="{ay}" stroke="#333"/>"##,
            label_w + plot_w
        );
        let step = nice_step(span / 8.0);
        let mut k = 0u64;
        loop {
            let t = k as f64 * step;
            if t > span * 1.0001 {
                break;
            }
            let tx = x(t0 + t);
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
            label_w + plot_w,
            ay + 34.0
        );
        // Legend.
        let ly = ay + bottom + 12.0;
        let mut lx = label_w;
        let entries: Vec<(String, &str)> = match by {
            ColorBy::Graph => graphs
                .iter()
                .enumerate()
                .take(PALETTE.len())
                .map(|(i, g)| (g.to_string(), PALETTE[i]))
                .collect(),
            ColorBy::Run => runs
                .iter()
                .enumerate()
                .take(PALETTE.len())
                .map(|(i, r)| (format!("run {r}"), PALETTE[i]))
                .collect(),
            _ => names
                .iter()
                .enumerate()
                .map(|(i, n)| (n.to_string(), PALETTE[i]))
                .collect(),
        };
        for (name, c) in entries {
            let _ = writeln!(
                s,
                r##"<rect x="{lx:.1}" y="{:.1}" width="12" height="12" fill="{c}"/><text x="{:.1}" y="{:.1}" fill="#333">{}</text>"##,
                ly - 10.0,
                lx + 16.0,
                ly,
                esc(&name)
            );
            lx += 28.0 + 7.0 * name.chars().count() as f64;
        }
        s.push_str("</svg>\n");
        s
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

    use boundpool::observe::chrome_trace;
    use boundpool::{SliceKind, Trace};

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
        assert_eq!(
            t.rows,
            vec!["worker 0 (core 0, host)", "worker 1 (core 1, host)"]
        );
        assert_eq!(t.bars.len(), 3);
        let svg = t.to_svg(800, ColorBy::Auto);
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("worker 1 (core 1, host)"));
        assert!(svg.contains("a (g)") && svg.contains("b (g)"));
        assert!(svg.contains("parked"));
        assert!(svg.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn chrome_trace_names_node_spans_like_nodes() {
        let track = |name: &str, worker| boundpool::TraceTrack {
            name: name.into(),
            worker,
            core: None,
            group: String::new(),
        };
        let slice = |track, name: &str, graph: &str, node, kind| boundpool::TraceSlice {
            track,
            name: name.into(),
            graph: graph.into(),
            node,
            start_ns: 1_000,
            end_ns: 3_000,
            kind,
        };
        let t = Trace {
            epoch: std::time::Instant::now(),
            tracks: vec![
                track("worker 0", Some(0)),
                track("GPU 0 (x) stream 0", None),
            ],
            slices: vec![
                slice(0, "k", "g", Some(4), SliceKind::Node { stolen: false }),
                slice(1, "k", "g", Some(4), SliceKind::Span),
                slice(1, "marker", "", None, SliceKind::Span),
            ],
            dropped: 0,
        };
        let v = chrome_trace(&t, |_, _| {});
        let xs: Vec<&Value> = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .collect();
        assert_eq!(xs.len(), 3);
        let gpu = xs
            .iter()
            .find(|e| e["tid"] == 2 && e["name"] == "k")
            .unwrap();
        assert_eq!(gpu["cat"], "g");
        assert_eq!(gpu["args"]["kind"], "span");
        assert_eq!(gpu["args"]["node"], 4);
        assert_eq!(gpu["args"]["graph"], "g");
        assert_eq!(gpu["dur"], 2.0);
        let plain = xs.iter().find(|e| e["name"] == "marker").unwrap();
        assert_eq!(plain["cat"], "span");
        assert!(plain["args"].get("node").is_none());
        // Read back: the node span is a span bar of graph `g`.
        let tl = Timeline::from_chrome_trace(&v).unwrap();
        let bar = tl
            .bars
            .iter()
            .find(|b| b.row == 1 && b.name == "k")
            .unwrap();
        assert_eq!((bar.kind, bar.graph.as_str()), (BarKind::Span, "g"));
    }
}
