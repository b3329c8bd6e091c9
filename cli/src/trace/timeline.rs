//! A Chrome trace read back as a [`Timeline`]: its tracks as rows and its complete events as
//! bars (drawn by `svg.rs`).

use std::collections::HashMap;

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

/// How the SVG picture (`svg::draw`) colours node bars.
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

/// A track's key in a Chrome trace: its `pid` and `tid`.
type TrackKey = (u64, u64);

fn track_of(e: &Value) -> TrackKey {
    (
        e.get("pid").and_then(Value::as_u64).unwrap_or(0),
        e.get("tid").and_then(Value::as_u64).unwrap_or(0),
    )
}

fn is_complete(e: &Value) -> bool {
    e.get("ph").and_then(Value::as_str) == Some("X")
}

impl Timeline {
    /// Reads the events of a Chrome trace (as written by [`chrome_trace`](boundpool::observe::chrome_trace), or any file with
    /// `traceEvents` of `M` `thread_name` and `X` complete events; `B`/`E` pairs are not read).
    ///
    /// Errors: no `traceEvents` array, or an `X` event without a numeric `ts`.
    pub(crate) fn from_chrome_trace(v: &Value) -> Result<Timeline, String> {
        let events = v
            .get("traceEvents")
            .and_then(Value::as_array)
            .or_else(|| v.as_array())
            .ok_or("not a Chrome trace: no `traceEvents` array")?;
        let (keys, rows) = tracks(events);
        let row_of: HashMap<TrackKey, usize> =
            keys.iter().enumerate().map(|(i, k)| (*k, i)).collect();
        let bars = events
            .iter()
            .filter(|e| is_complete(e))
            .map(|e| bar(e, row_of[&track_of(e)]))
            .collect::<Result<_, _>>()?;
        Ok(Timeline { rows, bars })
    }
}

/// The trace's tracks, in display order (by `thread_sort_index`, then key), with their names
/// (`thread_name`, else `thread TID`): every named track and every track with a complete event.
fn tracks(events: &[Value]) -> (Vec<TrackKey>, Vec<String>) {
    let mut names: HashMap<TrackKey, String> = HashMap::new();
    let mut sort: HashMap<TrackKey, i64> = HashMap::new();
    for e in events {
        if e.get("ph").and_then(Value::as_str) != Some("M") {
            continue;
        }
        let args = e.get("args");
        match e.get("name").and_then(Value::as_str) {
            Some("thread_name") => {
                if let Some(n) = args.and_then(|a| a.get("name")).and_then(Value::as_str) {
                    names.insert(track_of(e), n.to_string());
                }
            }
            Some("thread_sort_index") => {
                if let Some(n) = args
                    .and_then(|a| a.get("sort_index"))
                    .and_then(Value::as_i64)
                {
                    sort.insert(track_of(e), n);
                }
            }
            _ => {}
        }
    }
    let mut keys: Vec<TrackKey> = names.keys().copied().collect();
    for e in events {
        if is_complete(e) && !names.contains_key(&track_of(e)) && !keys.contains(&track_of(e)) {
            keys.push(track_of(e));
        }
    }
    keys.sort_by_key(|k| (sort.get(k).copied().unwrap_or(i64::MAX), *k));
    let rows = keys
        .iter()
        .map(|k| {
            names
                .get(k)
                .cloned()
                .unwrap_or_else(|| format!("thread {}", k.1))
        })
        .collect();
    (keys, rows)
}

/// The bar of the complete event `e`, on row `row`.
fn bar(e: &Value, row: usize) -> Result<Bar, String> {
    let ts = e
        .get("ts")
        .and_then(Value::as_f64)
        .ok_or("an X event has no numeric `ts`")?;
    let text = |key: &str| e.get(key).and_then(Value::as_str).unwrap_or("").to_string();
    let kind = match e
        .get("args")
        .and_then(|a| a.get("kind"))
        .and_then(Value::as_str)
    {
        Some("park") => BarKind::Park,
        Some("span") => BarKind::Span,
        _ => BarKind::Node,
    };
    Ok(Bar {
        row,
        name: text("name"),
        graph: text("cat"),
        ts,
        dur: e.get("dur").and_then(Value::as_f64).unwrap_or(0.0),
        kind,
        stolen: e
            .pointer("/args/stolen")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        run: e.pointer("/args/run").and_then(Value::as_u64),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use boundpool::observe::chrome_trace;
    use boundpool::{SliceKind, Trace};

    #[test]
    fn rows_and_bars_of_a_small_timeline() {
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
