//! The `boundpool` binary, run as a user runs it: every shape, the JSON summary, graph files good
//! and bad, the bench, the trace and its picture, the DOT graph, the metric table and the
//! exposition text. Sizes are small: CI has 2 cores.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_boundpool"))
}

fn run(args: &[&str]) -> Output {
    bin()
        .args(args)
        .output()
        .expect("the boundpool binary starts")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A fresh scratch directory for one test, removed when the test is done with it (passed or
/// not), so that test runs leave nothing in the temporary directory.
fn scratch(name: &str) -> Scratch {
    let d = std::env::temp_dir().join(format!("boundpool-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Scratch(d)
}

struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn json_summary(args: &[&str]) -> Value {
    let o = run(args);
    assert!(o.status.success(), "{args:?} failed: {}", stderr(&o));
    let text = stdout(&o);
    assert_eq!(
        text.trim().lines().count(),
        1,
        "--json prints one line: {text}"
    );
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[test]
fn every_shape_runs_verified_with_a_fixed_thread_count() {
    // (shape, --size, nodes after rounding)
    let cases = [
        ("chain", 300, 300),
        ("tree", 300, 255),
        ("wide", 300, 300),
        ("wavefront", 300, 289),
        ("random", 300, 300),
    ];
    for (shape, size, nodes) in cases {
        let v = json_summary(&[
            "run",
            "--shape",
            shape,
            "--size",
            &size.to_string(),
            "--threads",
            "2",
            "--repeat",
            "3",
            "--json",
        ]);
        assert_eq!(v["nodes"], nodes, "{shape}: {v}");
        assert_eq!(v["verified"], true, "{shape}: {v}");
        assert_eq!(
            v["nodes_run"],
            3 * nodes,
            "{shape}: every node of the 3 runs ran: {v}"
        );
        assert!(v["ns_per_node"].as_f64().unwrap() > 0.0, "{shape}: {v}");
        assert_eq!(
            v["runs_ns_per_node"].as_array().unwrap().len(),
            3,
            "{shape}: {v}"
        );
        // The runs after the first, cold one, and the check timed apart from every run; the
        // figure given is the warm one, the cold one beside it.
        assert!(
            v["warm_ns_per_node"].as_f64().unwrap() > 0.0,
            "{shape}: {v}"
        );
        assert_eq!(v["ns_per_node"], v["warm_ns_per_node"], "{shape}: {v}");
        assert_eq!(
            v["cold_ns_per_node"], v["runs_ns_per_node"][0],
            "{shape}: {v}"
        );
        assert!(
            v["verify_ns_per_node"].as_f64().unwrap() > 0.0,
            "{shape}: {v}"
        );
        assert!(v["steals"].is_u64(), "{shape}: {v}");
        if cfg!(target_os = "linux") {
            // main thread + 2 workers, and nothing else, whatever the shape.
            assert_eq!(v["peak_os_threads"], 3, "{shape}: {v}");
        }
    }
}

#[test]
fn human_summary_names_every_figure_and_prints_nothing_else() {
    let o = run(&["run", "--shape", "chain", "--size", "100", "--threads", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for key in [
        "graph            chain",
        "nodes            100",
        "ns per node",
        // By default a warm figure (runs after the first), the cold one beside it.
        " warm (median of runs 2-5); cold ",
        "runs             ",
        "peak OS threads",
        "steals",
        "verified         yes",
    ] {
        assert!(out.contains(key), "missing {key:?} in:\n{out}");
    }
    // Not a terminal: no progress bar, no notes.
    assert_eq!(stderr(&o), "", "stderr should be empty when not a terminal");
}

#[test]
fn one_run_gives_the_cold_figure_and_says_so() {
    let args = ["run", "--shape", "chain", "--size", "100", "--threads", "2"];
    let o = run(&[&args[..], &["--repeat", "1"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let line = out.lines().find(|l| l.starts_with("ns per node")).unwrap();
    assert!(
        line.contains(" cold (1 run") && !line.contains("warm ("),
        "{line}"
    );
    let v = json_summary(&[&args[..], &["--repeat", "1", "--json"]].concat());
    assert!(v["warm_ns_per_node"].is_null(), "{v}");
    assert_eq!(v["ns_per_node"], v["cold_ns_per_node"], "{v}");
    assert_eq!(v["nodes_run"], 100, "{v}");
    // The default is five runs: one cold, four warm.
    let v = json_summary(&[&args[..], &["--json"]].concat());
    assert_eq!(v["runs_ns_per_node"].as_array().unwrap().len(), 5, "{v}");
    assert_eq!(v["nodes_run"], 500, "{v}");
}

/// Runs the binary with stdin, stdout and stderr on a pseudo-terminal (through util-linux
/// `script`); returns what the terminal showed, or `None` (after saying why) without `script`.
fn run_on_a_terminal(args: &[&str]) -> Option<String> {
    let mut cmd = format!("'{}'", env!("CARGO_BIN_EXE_boundpool"));
    for a in args {
        assert!(!a.contains('\''), "{a}");
        cmd.push_str(&format!(" '{a}'"));
    }
    let o = match Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .stdin(std::process::Stdio::null())
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            println!("skipped: no `script` to give the binary a terminal ({e})");
            return None;
        }
    };
    assert!(o.status.success(), "{args:?} on a terminal: {}", stderr(&o));
    Some(stdout(&o))
}

#[test]
fn progress_bar_only_on_a_terminal_and_not_with_quiet() {
    // 0.8 s of work: the bar shows once a run has taken half a second. (Not a terminal: see
    // `human_summary_names_every_figure_and_prints_nothing_else`.)
    let args = [
        "run",
        "--shape",
        "chain",
        "--size",
        "32",
        "--work-ns",
        "25000000",
        "--threads",
        "2",
        "--repeat",
        "1",
    ];
    let bar = "chain: 32 nodes x 1 [";
    let Some(tty) = run_on_a_terminal(&args) else {
        return;
    };
    assert!(tty.contains(bar), "a bar on a terminal:\n{tty}");
    assert!(tty.contains("verified         yes"), "{tty}");
    let mut quiet = args.to_vec();
    quiet.push("--quiet");
    let tty = run_on_a_terminal(&quiet).unwrap();
    assert!(
        !tty.contains(bar) && !tty.contains('%'),
        "no bar with --quiet:\n{tty}"
    );
    assert!(tty.contains("verified         yes"), "{tty}");
}

#[test]
fn a_good_graph_file_runs_and_verifies() {
    let d = scratch("good");
    let f = d.join("pipeline.json");
    std::fs::write(
        &f,
        r#"{"nodes": [{"name": "load", "work_ns": 2000}, {"name": "left"}, {"name": "right", "work_ns": 1000}, {"name": "join"}],
            "edges": [["load", "left"], ["load", "right"], ["left", "join"], ["right", "join"]]}"#,
    )
    .unwrap();
    let v = json_summary(&[
        "run",
        "--graph",
        f.to_str().unwrap(),
        "--threads",
        "2",
        "--repeat",
        "2",
        "--json",
    ]);
    assert_eq!(v["nodes"], 4);
    assert_eq!(v["edges"], 4);
    assert_eq!(v["graph"], "pipeline");
    assert_eq!(v["verified"], true);
    assert_eq!(v["nodes_run"], 8);
}

/// Runs a bad file and returns stderr; checks the exit status and that nothing ran (no summary,
/// and the trace and DOT files a run would write were never created).
fn bad_file(name: &str, text: &str) -> String {
    let d = scratch(name);
    let f = d.join(format!("{name}.json"));
    std::fs::write(&f, text).unwrap();
    let (trace, dot) = (d.join("trace.json"), d.join("graph.dot"));
    let o = run(&[
        "run",
        "--graph",
        f.to_str().unwrap(),
        "--threads",
        "2",
        "--trace",
        trace.to_str().unwrap(),
        "--dot",
        dot.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{name}: {}", stderr(&o));
    assert_eq!(stdout(&o), "", "{name}: no summary");
    assert!(
        !trace.exists() && !dot.exists(),
        "{name}: nothing ran, nothing written"
    );
    let e = stderr(&o);
    assert!(
        e.contains(&format!("{name}.json")),
        "{name}: the message names the file: {e}"
    );
    e
}

#[test]
fn a_cycle_is_rejected_naming_its_nodes() {
    let e = bad_file(
        "cycle",
        r#"{"nodes": [{"name": "src"}, {"name": "a"}, {"name": "b"}, {"name": "c"}], "edges": [["src", "a"], ["a", "b"], ["b", "c"], ["c", "a"]]}"#,
    );
    assert!(e.contains("cycle"), "{e}");
    for n in ["'a'", "'b'", "'c'"] {
        assert!(e.contains(n), "the cycle's node {n} is named: {e}");
    }
    assert!(!e.contains("'src'"), "src is not on the cycle: {e}");
}

#[test]
fn a_self_edge_is_a_cycle() {
    let e = bad_file(
        "selfedge",
        r#"{"nodes": [{"name": "a"}, {"name": "me"}], "edges": [["a", "me"], ["me", "me"]]}"#,
    );
    assert!(e.contains("cycle") && e.contains("'me'"), "{e}");
}

#[test]
fn an_edge_to_an_unknown_node_is_rejected_naming_it() {
    let e = bad_file(
        "unknown",
        r#"{"nodes": [{"name": "a"}, {"name": "b"}], "edges": [["a", "b"], ["b", "ghost"]]}"#,
    );
    assert!(e.contains("unknown node \"ghost\""), "{e}");
}

#[test]
fn a_duplicate_name_is_rejected_naming_it() {
    let e = bad_file(
        "duplicate",
        r#"{"nodes": [{"name": "a"}, {"name": "twice"}, {"name": "twice"}], "edges": []}"#,
    );
    assert!(e.contains("duplicate node name \"twice\""), "{e}");
}

#[test]
fn malformed_json_is_rejected() {
    let e = bad_file("malformed", r#"{"nodes": [{"name": "a"}, "#);
    assert!(e.contains("malformed JSON") && e.contains("line"), "{e}");
}

#[test]
fn unknown_fields_are_rejected() {
    let e = bad_file("typo", r#"{"nodes": [{"name": "a", "work_nsec": 5}]}"#);
    assert!(e.contains("unknown field `work_nsec`"), "{e}");
}

#[test]
fn bench_json_has_every_shape_and_implementation() {
    let o = run(&[
        "bench",
        "--json",
        "--scale",
        "0.01",
        "--runs",
        "1",
        "--threads",
        "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<Value> = serde_json::from_str(&stdout(&o)).expect("a JSON array");
    let mut seen: HashMap<(String, String), f64> = HashMap::new();
    for r in &rows {
        let ns = r["ns_per_node"].as_f64().expect("ns_per_node is a number");
        assert!(ns > 0.0, "{r}");
        seen.insert(
            (
                r["shape"].as_str().unwrap().into(),
                r["impl"].as_str().unwrap().into(),
            ),
            ns,
        );
    }
    for shape in ["chain", "tree", "wide", "wavefront"] {
        for imp in ["boundpool", "rayon-spawn", "rayon-inline"] {
            assert!(
                seen.contains_key(&(shape.into(), imp.into())),
                "missing {shape}/{imp} in {rows:?}"
            );
        }
    }
    assert!(
        seen.contains_key(&("wide".into(), "thread-per-node".into())),
        "{rows:?}"
    );
}

#[test]
fn bench_scaling_json_has_every_shape_at_each_worker_count() {
    let o = run(&[
        "bench",
        "--scaling",
        "--json",
        "--scale",
        "0.005",
        "--runs",
        "1",
        "--threads",
        "3",
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<Value> = serde_json::from_str(&stdout(&o)).expect("a JSON array");
    // 1, 2, then 3 itself (not a power of two).
    for shape in ["chain", "tree", "wide", "wavefront"] {
        for imp in ["boundpool", "rayon-spawn", "rayon-inline"] {
            let mut ws: Vec<u64> = rows
                .iter()
                .filter(|r| r["shape"] == shape && r["impl"] == imp)
                .map(|r| r["workers"].as_u64().unwrap())
                .collect();
            ws.sort_unstable();
            assert_eq!(ws, [1, 2, 3], "{shape}/{imp}: {rows:?}");
        }
    }
    for r in &rows {
        assert!(r["ns_per_node"].as_f64().unwrap() > 0.0, "{r}");
        let sp = r["speedup"].as_f64().expect("speedup is a number");
        if r["workers"] == 1 {
            assert_eq!(sp, 1.0, "{r}");
        } else {
            assert!(sp > 0.0, "{r}");
        }
        assert_eq!(
            r["impl"] == "boundpool",
            r["vs_best_rayon"].is_number(),
            "{r}"
        );
    }
    let o = run(&[
        "bench",
        "--scaling",
        "--scale",
        "0.005",
        "--runs",
        "1",
        "--threads",
        "2",
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("speedup") && out.contains("vs rayon"), "{out}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("tree")).count(),
        2,
        "one tree line per worker count:\n{out}"
    );
}

#[test]
fn bench_table_has_ratios() {
    let o = run(&[
        "bench",
        "--scale",
        "0.005",
        "--runs",
        "1",
        "--threads",
        "2",
        "--thread-per-node",
        "0",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("vs best rayon"), "{out}");
    // Each shape's better rayon variant has ratio 1.00.
    for shape in ["chain", "tree", "wide", "wavefront"] {
        let ones = out
            .lines()
            .filter(|l| {
                l.starts_with(shape) && l.contains("rayon") && l.trim_end().ends_with("1.00")
            })
            .count();
        assert!(ones >= 1, "{shape} has no rayon row at 1.00:\n{out}");
    }
}

/// `n{i} -> n{j};` lines of a DOT file, as index pairs.
fn dot_edges(dot: &str) -> Vec<(u64, u64)> {
    dot.lines()
        .filter_map(|l| {
            let (a, b) = l.trim().trim_end_matches(';').split_once(" -> ")?;
            Some((
                a.strip_prefix('n')?.parse().ok()?,
                b.strip_prefix('n')?.parse().ok()?,
            ))
        })
        .collect()
}

#[test]
fn trace_has_every_node_once_per_run_no_overlaps_and_respects_edges() {
    let d = scratch("trace");
    let (trace, dot, svg) = (
        d.join("trace.json"),
        d.join("graph.dot"),
        d.join("timeline.svg"),
    );
    let o = run(&[
        "run",
        "--shape",
        "wavefront",
        "--size",
        "144",
        "--threads",
        "2",
        "--work-ns",
        "2000",
        "--repeat",
        "2",
        "--quiet",
        "--trace",
        trace.to_str().unwrap(),
        "--dot",
        dot.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let dot = std::fs::read_to_string(&dot).unwrap();
    assert!(dot.starts_with("digraph \"wavefront\""), "{dot}");
    assert_eq!(dot.matches("[label=").count(), 144, "a line per node");
    let edges = dot_edges(&dot);
    assert_eq!(edges.len(), 2 * 12 * 11, "a 12x12 grid has 264 edges");

    let v: Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let events = v["traceEvents"].as_array().expect("traceEvents");
    // One named track per worker.
    let mut tracks: HashMap<u64, String> = HashMap::new();
    for e in events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
    {
        tracks.insert(
            e["tid"].as_u64().unwrap(),
            e["args"]["name"].as_str().unwrap().to_string(),
        );
    }
    assert_eq!(tracks.len(), 2, "{tracks:?}");
    for (i, name) in [(1, "worker 0 ("), (2, "worker 1 (")] {
        assert!(
            tracks[&i].starts_with(name) && tracks[&i].ends_with(", host)"),
            "{tracks:?}"
        );
    }
    let xs: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    // Slices on one track never overlap (nodes and parks alike).
    let mut by_track: HashMap<u64, Vec<(f64, f64)>> = HashMap::new();
    for e in &xs {
        let ts = e["ts"].as_f64().unwrap();
        by_track
            .entry(e["tid"].as_u64().unwrap())
            .or_default()
            .push((ts, ts + e["dur"].as_f64().unwrap()));
    }
    for (tid, mut spans) in by_track {
        assert!(
            tracks.contains_key(&tid),
            "a slice on an unnamed track {tid}"
        );
        spans.sort_by(|a, b| a.0.total_cmp(&b.0));
        for w in spans.windows(2) {
            assert!(
                w[0].1 <= w[1].0 + 1e-6,
                "overlap on track {tid}: {:?} and {:?}",
                w[0],
                w[1]
            );
        }
    }
    // Every node exactly once per run, each after its predecessors ended.
    for run in [1, 2] {
        let mut at: HashMap<u64, (f64, f64)> = HashMap::new();
        for e in xs
            .iter()
            .filter(|e| e["cat"] == "wavefront" && e["args"]["run"] == run)
        {
            assert_eq!(e["args"]["graph"], "wavefront");
            assert!(e["args"]["stolen"].is_boolean());
            let node = e["args"]["node"].as_u64().unwrap();
            assert_eq!(e["name"], format!("n{node}"));
            let ts = e["ts"].as_f64().unwrap();
            assert!(
                at.insert(node, (ts, ts + e["dur"].as_f64().unwrap()))
                    .is_none(),
                "run {run}: node {node} appears twice"
            );
        }
        assert_eq!(at.len(), 144, "run {run}: every node appears");
        for &(p, s) in &edges {
            assert!(
                at[&p].1 <= at[&s].0 + 1e-6,
                "run {run}: n{s} started at {} before n{p} ended at {}",
                at[&s].0,
                at[&p].1
            );
        }
    }

    // The picture and the summary.
    let o = run(&[
        "trace",
        trace.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
        "--width",
        "900",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
    assert!(
        s.contains(&tracks[&1]) && s.contains(&tracks[&2]),
        "rows are labelled"
    );
    assert!(
        s.contains("run 1") && s.contains("run 2"),
        "coloured by run, with a legend"
    );
    assert!(
        s.contains(" µs</text>") || s.contains(" ms</text>"),
        "the axis has labelled ticks"
    );
    let o = run(&["trace", trace.to_str().unwrap()]);
    assert!(o.status.success());
    assert!(stdout(&o).contains("worker 0 ("), "{}", stdout(&o));
}

#[test]
fn metrics_table_lists_every_metric_and_the_docs_copy_is_current() {
    let o = run(&["metrics"]);
    assert!(o.status.success());
    let table = stdout(&o);
    for &(name, kind, unit, ..) in boundpool::METRICS.iter().chain(boundpool::gpu::GPU_METRICS) {
        let line = table
            .lines()
            .find(|l| l.starts_with(&format!("| `{name}` |")))
            .unwrap_or_else(|| panic!("{name} missing"));
        assert!(line.contains(&format!("| {kind} | {unit} |")), "{line}");
    }
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md"))
            .unwrap();
    assert!(
        docs.contains(&table),
        "docs/metrics.md's metric table differs from `boundpool metrics`; paste its output"
    );
}

#[test]
fn metrics_out_writes_the_exposition_text() {
    let d = scratch("metrics-out");
    let f = d.join("metrics.prom");
    let o = run(&[
        "run",
        "--shape",
        "wide",
        "--size",
        "500",
        "--threads",
        "2",
        "--repeat",
        "2",
        "--quiet",
        "--metrics-out",
        f.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&f).unwrap();
    for t in [
        "# TYPE boundpool_nodes_run_total counter",
        "# TYPE boundpool_workers gauge",
        "# TYPE boundpool_graph_latency_seconds histogram",
    ] {
        assert!(text.contains(t), "missing {t:?} in:\n{text}");
    }
    let nodes_run: f64 = text
        .lines()
        .filter(|l| l.starts_with("boundpool_nodes_run_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert_eq!(nodes_run, 1000.0, "2 runs of 500 nodes:\n{text}");
    assert!(
        text.contains("boundpool_graphs_submitted_total{pool=\"boundpool\"} 2"),
        "{text}"
    );
}

#[test]
fn bad_arguments_fail_cleanly() {
    let o = run(&["run", "--shape", "pentagon"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("pentagon"));
    let o = run(&["run", "--shape", "chain", "--size", "10", "--threads", "0"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("0 workers"), "{}", stderr(&o));
}

#[test]
fn empty_graphs_run_report_zero_nodes_and_succeed() {
    for shape in ["chain", "tree", "wide", "wavefront", "random"] {
        let v = json_summary(&[
            "run",
            "--shape",
            shape,
            "--size",
            "0",
            "--threads",
            "2",
            "--json",
        ]);
        assert_eq!(v["nodes"], 0, "{shape}: {v}");
        assert_eq!(v["edges"], 0, "{shape}: {v}");
        assert_eq!(v["verified"], true, "{shape}: {v}");
        assert!(
            v["ns_per_node"].is_null(),
            "{shape}: no per-node figure: {v}"
        );
        let o = run(&["run", "--shape", shape, "--size", "0", "--threads", "2"]);
        assert!(o.status.success(), "{shape}: {}", stderr(&o));
        let text = stdout(&o);
        assert!(
            text.contains("nodes            0 (0 edges)"),
            "{shape}: {text}"
        );
        assert!(text.contains("verified         yes"), "{shape}: {text}");
        assert!(
            !text.contains("NaN") && !text.contains("inf"),
            "{shape}: {text}"
        );
    }
    let d = scratch("empty");
    for (file, text) in [
        ("bare.json", r#"{"nodes": []}"#),
        (
            "named.json",
            r#"{"name": "nothing", "nodes": [], "edges": []}"#,
        ),
    ] {
        let f = d.join(file);
        std::fs::write(&f, text).unwrap();
        let f = f.to_str().unwrap();
        let v = json_summary(&[
            "run",
            "--graph",
            f,
            "--threads",
            "2",
            "--json",
            "--repeat",
            "2",
        ]);
        assert_eq!(v["nodes"], 0, "{file}: {v}");
        assert_eq!(v["verified"], true, "{file}: {v}");
        let o = run(&["run", "--graph", f, "--threads", "2"]);
        assert!(o.status.success(), "{file}: {}", stderr(&o));
        assert!(
            stdout(&o).contains("nodes            0 (0 edges)"),
            "{file}: {}",
            stdout(&o)
        );
    }
}

#[test]
fn a_thousand_workers_make_one_short_threads_line() {
    let o = run(&[
        "run",
        "--shape",
        "chain",
        "--size",
        "20",
        "--threads",
        "1000",
        "--repeat",
        "30",
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let threads = text
        .lines()
        .find(|l| l.starts_with("threads"))
        .unwrap_or_else(|| panic!("no threads line: {text}"));
    assert!(threads.contains("1000 workers"), "{threads}");
    assert!(threads.contains("… (990 more)"), "{threads}");
    assert!(threads.len() < 120, "{} bytes: {threads}", threads.len());
    let runs = text.lines().find(|l| l.starts_with("runs ")).unwrap();
    assert!(runs.contains("… (20 more)") && runs.len() < 200, "{runs}");
    for line in text.lines() {
        assert!(line.len() < 200, "a long summary line: {line}");
    }
}

/// A typo in `--size` is refused at once, naming the estimate and the limit, before anything is
/// allocated: the binary runs under an address-space limit of 8 GiB, so that were it to build
/// the graph (it used to grow by 9 GB in 12 s), it would fail for want of memory instead of
/// exiting 2 with the message.
#[cfg(target_os = "linux")]
#[test]
fn a_size_too_large_for_the_machine_is_refused_before_anything_is_allocated() {
    for (shape, what) in [("wavefront", "a wavefront of"), ("chain", "a chain of")] {
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ulimit -v 8388608 && exec '{}' run --shape {shape} --size 99999999999999 --threads 2",
                env!("CARGO_BIN_EXE_boundpool")
            ))
            .output()
            .expect("sh runs");
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{shape}: {err}");
        assert_eq!(stdout(&o), "", "{shape}: nothing ran");
        assert!(
            err.contains(&format!("--size 99999999999999: {what} ")),
            "{err}"
        );
        assert!(
            err.contains(" needs about ") && err.contains("(estimated)"),
            "{err}"
        );
        // The limit: here the address space left under the ulimit (at most 8 GiB).
        assert!(
            err.contains("GiB this process can have (the address-space limit"),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

#[test]
fn a_long_cycle_and_huge_names_give_short_messages() {
    // A 20,000-node cycle: the message names some of it and stays short.
    let n = 20_000;
    let nodes: Vec<String> = (0..n).map(|i| format!(r#"{{"name": "n{i}"}}"#)).collect();
    let edges: Vec<String> = (0..n)
        .map(|i| format!(r#"["n{i}", "n{}"]"#, (i + 1) % n))
        .collect();
    let e = bad_file(
        "longcycle",
        &format!(
            r#"{{"nodes": [{}], "edges": [{}]}}"#,
            nodes.join(","),
            edges.join(",")
        ),
    );
    assert!(e.contains("cycle"), "{e}");
    assert!(e.len() < 1500, "{} bytes of message", e.len());
    let long = "x".repeat(200_000);
    for (name, text) in [
        (
            "hugedup",
            format!(r#"{{"nodes": [{{"name": "{long}"}}, {{"name": "{long}"}}]}}"#),
        ),
        (
            "hugeunknown",
            format!(r#"{{"nodes": [{{"name": "a"}}], "edges": [["{long}", "a"]]}}"#),
        ),
        (
            "hugefield",
            format!(r#"{{"nodes": [{{"name": "a", "{long}": 1}}]}}"#),
        ),
        ("hugetype", format!(r#"{{"nodes": "{long}"}}"#)),
    ] {
        let e = bad_file(name, &text);
        assert!(e.len() < 1500, "{name}: {} bytes of message", e.len());
        assert!(
            e.contains("more chars") || e.contains("left out"),
            "{name}: {e}"
        );
    }
}

#[test]
fn a_short_soak_checks_every_outcome_and_finds_no_violation() {
    let v = json_summary(&[
        "soak",
        "--seconds",
        "2",
        "--submitters",
        "8",
        "--threads",
        "2",
        "--json",
    ]);
    assert_eq!(v["violations"], 0, "{v}");
    assert_eq!(v["workers"], 2, "{v}");
    for k in ["graphs", "nodes", "graphs_ok"] {
        assert!(v[k].as_u64().unwrap() > 0, "{k}: {v}");
    }
    for k in ["errors", "panics", "cancels", "nested", "dropped_handles"] {
        assert!(v["faults"][k].as_u64().unwrap() > 0, "no {k} injected: {v}");
    }
    // main + 2 workers + 8 submitters, and back to main + workers at the end.
    assert_eq!(v["os_threads"]["expected"], 11, "{v}");
    assert_eq!(v["os_threads"]["min"], 11, "{v}");
    assert_eq!(v["os_threads"]["end"], 3, "{v}");
}

#[test]
fn a_soak_reports_a_wrong_value_and_exits_1() {
    let o = run(&[
        "soak",
        "--seconds",
        "1",
        "--submitters",
        "2",
        "--threads",
        "2",
        "--inject-wrong-value",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("violations       1"), "{text}");
    assert!(
        text.contains("node n0 gave") && text.contains("expected"),
        "{text}"
    );
}

#[test]
fn soak_without_a_gpu_says_so_with_exit_2() {
    if boundpool::gpu::gpu_unavailable_reason().is_none() {
        return; // a GPU is here: `soak --gpu` would run
    }
    let o = run(&["soak", "--gpu", "--seconds", "1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no GPU"), "{}", stderr(&o));
    assert_eq!(stdout(&o), "");
    let o = run(&["soak", "--seconds", "0"]);
    assert_eq!(o.status.code(), Some(2));
    let o = run(&["soak", "--seconds", "1", "--submitters", "0"]);
    assert_eq!(o.status.code(), Some(2));
}

/// `--partitions` is parsed with the arguments, before any GPU is looked for: a malformed spec
/// exits 2 naming what is wrong and the expected form, GPU or not, and runs nothing.
#[test]
fn a_malformed_partition_spec_exits_2_saying_what_is_wrong() {
    let commands: [&[&str]; 6] = [
        &["run", "--gpu"],
        &["run", "--gpu", "--replay", "--json"],
        &["bench", "--gpu"],
        &["bench", "--gpu", "--json"],
        &["bench", "--latency", "--gpu"],
        &["soak", "--gpu"],
    ];
    for cmd in commands {
        let mut args = cmd.to_vec();
        args.extend(["--partitions", "latency:x:1,bulk:rest:3"]);
        let o = run(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(
            e.contains("partition 1 (`latency:x:1`): the SMs `x` are neither a number nor `rest`"),
            "{args:?}: {e}"
        );
        assert!(e.contains("NAME:SMS[:WORKERS]"), "{args:?}: {e}");
        assert_eq!(stdout(&o), "", "{args:?}");
    }
    for (spec, msg) in [
        (":8", "the name is empty"),
        ("a:rest,b:rest:2", "`rest` given twice"),
        ("a:8:0", "0 workers"),
        ("a:8,", "partition 2 is empty"),
    ] {
        let o = run(&["run", "--gpu", "--partitions", spec]);
        assert_eq!(o.status.code(), Some(2), "{spec}: {}", stderr(&o));
        assert!(stderr(&o).contains(msg), "{spec}: {}", stderr(&o));
    }
    // Only with --gpu, and not with --threads (the workers are the partitions').
    let o = run(&[
        "run",
        "--shape",
        "chain",
        "--size",
        "10",
        "--partitions",
        "a:8",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--gpu"), "{}", stderr(&o));
    let o = run(&["run", "--gpu", "--threads", "2", "--partitions", "a:8"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot be used with"), "{}", stderr(&o));
    // A good spec without a GPU: the GPU check answers, exit 2.
    if boundpool::gpu::gpu_unavailable_reason().is_some() {
        let o = run(&["run", "--gpu", "--partitions", "latency:8:1,bulk:rest:3"]);
        assert_eq!(o.status.code(), Some(2));
        assert!(stderr(&o).contains("no GPU"), "{}", stderr(&o));
    }
}
