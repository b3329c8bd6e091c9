//! A recorded [`Trace`] as Chrome trace JSON.

use serde_json::{json, Value};

use crate::{SliceKind, Trace};

/// Converts a recorded [`Trace`] to the Chrome trace format (a JSON object with `traceEvents`),
/// which Perfetto's UI (<https://ui.perfetto.dev>) and `chrome://tracing` open.
///
/// * One process (`pid` 1) named `boundpool`; one thread per track (`tid` = track index + 1),
///   named as the track (`worker N (core C, GROUP)`, or an extra track's name) and sorted in
///   track order (`M` metadata events).
/// * A complete event (`ph: "X"`) per node: `name` the node's name, `cat` its graph's name,
///   `args` `{graph, stolen, node}` (`node`: its index in the graph).
/// * A complete event per park (`name` and `cat` `"park"`, `args.kind` `"park"`) and per extra
///   span (`args.kind` `"span"`; `cat` `"span"`, or for a span standing for a node, such as a
///   GPU node's device time on its stream's track, its graph's name, with `args` `graph` and
///   `node` as for a node slice).
/// * `ts` and `dur` in microseconds (fractional: nanosecond resolution) since the pool's build.
///
/// `annotate` may add entries to a node event's `args` (the command line adds the run number).
pub fn chrome_trace(
    trace: &Trace,
    mut annotate: impl FnMut(&crate::TraceSlice, &mut serde_json::Map<String, Value>),
) -> Value {
    let mut events = Vec::with_capacity(trace.slices.len() + 2 * trace.tracks.len() + 1);
    events.push(json!({"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "boundpool"}}));
    for (i, t) in trace.tracks.iter().enumerate() {
        events.push(json!({"ph": "M", "name": "thread_name", "pid": 1, "tid": i + 1, "args": {"name": t.name}}));
        events.push(json!({"ph": "M", "name": "thread_sort_index", "pid": 1, "tid": i + 1, "args": {"sort_index": i}}));
    }
    let mut order: Vec<usize> = (0..trace.slices.len()).collect();
    order.sort_by_key(|&i| (trace.slices[i].track, trace.slices[i].start_ns));
    let us = |ns: u64| ns as f64 / 1000.0;
    for i in order {
        let s = &trace.slices[i];
        let mut args = serde_json::Map::new();
        let cat = match s.kind {
            SliceKind::Node { stolen } => {
                args.insert("graph".into(), json!(s.graph));
                args.insert("stolen".into(), json!(stolen));
                args.insert("node".into(), json!(s.node));
                annotate(s, &mut args);
                s.graph.as_str()
            }
            SliceKind::Park => {
                args.insert("kind".into(), json!("park"));
                "park"
            }
            SliceKind::Span => {
                args.insert("kind".into(), json!("span"));
                // A span standing for a node (a GPU node's device time on its stream's track)
                // names it like a node slice does.
                if let Some(node) = s.node {
                    args.insert("graph".into(), json!(s.graph));
                    args.insert("node".into(), json!(node));
                    s.graph.as_str()
                } else {
                    "span"
                }
            }
        };
        events.push(json!({
            "ph": "X",
            "name": s.name,
            "cat": cat,
            "pid": 1,
            "tid": s.track + 1,
            "ts": us(s.start_ns),
            "dur": us(s.end_ns.saturating_sub(s.start_ns)),
            "args": Value::Object(args),
        }));
    }
    json!({"traceEvents": events, "displayTimeUnit": "ns"})
}
