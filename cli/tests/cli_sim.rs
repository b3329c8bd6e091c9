//! `boundpool sim`, run as a user runs it: a Cholesky on GPUs with its JSON report and a trace
//! that `boundpool trace` reads, a graph file on ranks, a cost model from a trace, a preset
//! machine edited and given back, bad arguments, and the device check run on recordings made
//! by the simulator itself (so its parsing and its arithmetic are checked without a GPU: a
//! simulation compared with recordings of the same simulation must come out at 1.00).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use boundpool_sim::SmShare;
use serde_json::Value;

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_boundpool"))
        .args(args)
        .output()
        .expect("the boundpool binary starts")
}

fn ok(args: &[&str]) -> String {
    let o = run(args);
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(name: &str) -> Scratch {
    let d = std::env::temp_dir().join(format!("boundpool-cli-sim-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Scratch(d)
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn a_cholesky_on_gpus_reports_and_traces() {
    let d = scratch("chol");
    let trace = d.0.join("t.json");
    let out = ok(&[
        "sim",
        "cholesky",
        "--n",
        "8192",
        "--tile",
        "1024",
        "--gpus",
        "4",
        "--json",
        "--quiet",
        "--trace",
        p(&trace),
    ]);
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["ranks"], 4);
    assert_eq!(v["nodes"], 120);
    assert!(v["makespan_s"].as_f64().unwrap() > 0.0);
    assert!(v["transfers"].as_u64().unwrap() > 0);
    assert!(v["tflops"].as_f64().unwrap() > 1.0);
    // The trace opens as a real one does.
    let summary = ok(&["trace", p(&trace)]);
    assert!(summary.contains("rank 3 worker"), "{summary}");
    assert!(summary.contains("GPU"), "{summary}");
    // A tile without measured rates needs a cost model.
    let o = run(&["sim", "cholesky", "--tile", "1000", "--quiet"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("give --costs"));
}

#[test]
fn a_graph_file_on_two_ranks_and_its_costs() {
    let d = scratch("graph");
    let file = d.0.join("g.json");
    std::fs::write(
        &file,
        r#"{"nodes": [{"name": "a", "work_ns": 100000, "rank": 0},
                     {"name": "b", "work_ns": 200000, "rank": 1},
                     {"name": "c", "work_ns": 100000, "rank": 0}],
            "edges": [["a", "b"], ["b", "c"]]}"#,
    )
    .unwrap();
    let trace = d.0.join("t.json");
    let out = ok(&[
        "sim",
        "graph",
        p(&file),
        "--ranks",
        "2",
        "--json",
        "--quiet",
        "--trace",
        p(&trace),
    ]);
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["transfers"], 2);
    // 400 us of work in a chain, plus two crossings.
    let ms = v["makespan_s"].as_f64().unwrap();
    assert!(ms > 400e-6 && ms < 2e-3, "{ms}");
    // A cost model from that trace has the three kinds at their work.
    let costs = d.0.join("c.json");
    ok(&["sim", "costs", p(&trace), "--out", p(&costs)]);
    let c: Value = serde_json::from_str(&std::fs::read_to_string(&costs).unwrap()).unwrap();
    let b = c["kinds"]["b"]["host"]["quantiles_s"][0].as_f64().unwrap();
    // (On 2 cores shared by 4 workers and 2 communication threads, the others' short spins
    // may slow it by a little.)
    assert!((b - 200e-6).abs() < 4e-6, "{b}");
    // A rank the file names but the run lacks is refused, naming the node.
    let o = run(&["sim", "graph", p(&file), "--ranks", "1", "--quiet"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("'b'"));
}

#[test]
fn a_preset_machine_edited_and_given_back() {
    let d = scratch("machine");
    let mut m: Value =
        serde_json::from_str(&ok(&["sim", "machine", "h100", "--gpus", "16"])).unwrap();
    assert_eq!(m["hosts"], 2);
    m["links"]["network"]["bandwidth_gb_s"] = Value::from(1.0);
    let file = d.0.join("m.json");
    std::fs::write(&file, m.to_string()).unwrap();
    let slow = ok(&[
        "sim",
        "cholesky",
        "--n",
        "16384",
        "--machine",
        p(&file),
        "--json",
        "--quiet",
    ]);
    let fast = ok(&[
        "sim", "cholesky", "--n", "16384", "--gpus", "16", "--json", "--quiet",
    ]);
    let t = |s: &str| {
        serde_json::from_str::<Value>(s.trim()).unwrap()["makespan_s"]
            .as_f64()
            .unwrap()
    };
    assert!(t(&slow) > 2.0 * t(&fast), "{} vs {}", t(&slow), t(&fast));
    m["cores_per_host"] = Value::from(0);
    std::fs::write(&file, m.to_string()).unwrap();
    let o = run(&["sim", "cholesky", "--machine", p(&file), "--quiet"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("must be positive"));
}

/// Writes what `sim_record cholesky` would: a one-worker trace, an 8-worker timing and trace,
/// here made by the simulator.
fn fake_recording(dir: &Path, n: usize, tile: usize) {
    let mut one: Value =
        serde_json::from_str(&ok(&["sim", "machine", "h100", "--gpus", "1"])).unwrap();
    one["groups"] = serde_json::json!([{"name": "one", "workers": 1, "gpu": true}]);
    let mf = dir.join("one.json");
    std::fs::write(&mf, one.to_string()).unwrap();
    let (n_s, t_s) = (n.to_string(), tile.to_string());
    let t1 = dir.join(format!("chol_{n}_1w.json"));
    ok(&[
        "sim",
        "cholesky",
        "--n",
        &n_s,
        "--tile",
        &t_s,
        "--machine",
        p(&mf),
        "--no-critical",
        "--quiet",
        "--trace",
        p(&t1),
    ]);
    let t8 = dir.join(format!("chol_{n}_8w.json"));
    let r: Value = serde_json::from_str(
        ok(&[
            "sim",
            "cholesky",
            "--n",
            &n_s,
            "--tile",
            &t_s,
            "--gpus",
            "1",
            "--json",
            "--quiet",
            "--trace",
            p(&t8),
        ])
        .trim(),
    )
    .unwrap();
    let ms = r["makespan_s"].as_f64().unwrap() * 1e3;
    std::fs::write(
        dir.join(format!("chol_{n}.json")),
        serde_json::json!({"n": n, "tile": tile, "workers": 8, "ms": [ms, ms * 1.01, ms * 0.99], "card": "simulated"})
            .to_string(),
    )
    .unwrap();
}

#[test]
fn the_cholesky_check_reads_recordings() {
    let d = scratch("check");
    fake_recording(&d.0, 8192, 2048);
    fake_recording(&d.0, 4096, 1024);
    let out = ok(&["sim", "check-cholesky", p(&d.0)]);
    // The recordings were simulated with the H100 preset's held share: calibrating on the
    // smallest N finds it again.
    let held: f64 = out
        .strip_prefix("held share ")
        .and_then(|r| r.split(',').next())
        .unwrap_or_else(|| panic!("{out}"))
        .parse()
        .unwrap();
    assert!((held - SmShare::H100_HELD).abs() <= 0.05, "{out}");
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("| 4096") || l.starts_with("| 8192"))
        .collect();
    assert_eq!(rows.len(), 2, "{out}");
    for row in &rows {
        // The recordings are this simulation's own: predicted / measured is 1.
        let ratio: f64 = row.split('|').nth(6).unwrap().trim().parse().unwrap();
        assert!((ratio - 1.0).abs() < 0.02, "{row}");
        assert!(row.contains("| yes |"), "{row}");
    }
    assert!(rows[0].contains("| calibration |"), "{out}");
    assert!(rows[1].contains("| prediction |"), "{out}");
    assert!(
        out.contains(
            "occupancy (device time beside others / alone, measured and simulated), fastest 54.5 TFLOP/s: potrf"
        ),
        "{out}"
    );
    // A given held share calibrates nothing.
    let given = ok(&["sim", "check-cholesky", p(&d.0), "--held", "0.54"]);
    assert!(given.starts_with("held share 0.54, given"), "{given}");
    assert!(!given.contains("| calibration |"), "{given}");
    let o = run(&["sim", "check-cholesky", p(&d.0), "--held", "2"]);
    assert_eq!(o.status.code(), Some(2));
    let o = run(&["sim", "check-cholesky", p(&d.0.join("none"))]);
    assert_eq!(o.status.code(), Some(2));
}
