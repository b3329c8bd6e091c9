//! `boundpool bench --latency`: one JSON object with every figure, the table, and the `--gpu`
//! path's exit status without a GPU. Figures are not judged here (speed is for the bench).

use std::process::{Command, Output};

use boundpool_test_support::GpuTest;
use serde_json::Value;

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_boundpool"))
        .args(args)
        .output()
        .expect("the boundpool binary starts")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

const FIGURES: [&str; 7] = [
    "p50_alone_us",
    "p99_alone_us",
    "p50_loaded_us",
    "p99_loaded_us",
    "max_loaded_us",
    "background_alone_nodes_per_s",
    "background_loaded_nodes_per_s",
];

/// Runs `bench --latency --json` with `extra` and checks every figure, at high priority (top
/// level) and at normal priority (`normal`).
fn json_figures(extra: &[&str], pool: &str) -> Value {
    let mut args = vec!["bench", "--latency", "--json", "--seconds", "0.2"];
    args.extend_from_slice(extra);
    let o = run(&args);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert_eq!(out.trim().lines().count(), 1, "one JSON object: {out}");
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    for key in FIGURES {
        let x = v[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} missing: {v}"));
        assert!(x > 0.0, "{key} = {x}");
        let x = v["normal"][key]
            .as_f64()
            .unwrap_or_else(|| panic!("normal.{key} missing: {v}"));
        assert!(x > 0.0, "normal.{key} = {x}");
    }
    assert!(v["p50_loaded_us"].as_f64() <= v["max_loaded_us"].as_f64());
    assert!(v["targets"]["p99_met"].is_boolean());
    assert!(v["targets"]["background_met"].is_boolean());
    assert_eq!(v["pool"], pool);
    v
}

#[test]
fn json_has_every_figure() {
    json_figures(&[], "host");
}

/// The same on a GPU pool (skipped without a GPU, unless `BOUNDPOOL_REQUIRE_GPU=1`).
#[test]
fn gpu_json_has_every_figure() {
    // The command runs in a child process: no context check here.
    let Some(_t) = GpuTest::start_without_context_check("gpu_json_has_every_figure", 600) else {
        return;
    };
    let v = json_figures(&["--gpu"], "gpu");
    assert!(v["gpu_background_kernel"]["grid"].as_u64() > Some(1), "{v}");
    assert!(
        v["gpu_background_kernel"]["waves"].as_u64() > Some(1),
        "{v}"
    );
    assert_eq!(v["cuda_device_max_connections"], "32", "{v}");
    let w = &v["one_wave_background"];
    for key in [
        "p99_loaded_us",
        "background_alone_nodes_per_s",
        "background_loaded_nodes_per_s",
    ] {
        assert!(
            w[key].as_f64() > Some(0.0),
            "one_wave_background.{key}: {v}"
        );
    }
    assert!(w["p99_met"].is_boolean(), "{v}");
}

#[test]
fn table_names_the_phases() {
    let o = run(&["bench", "--latency", "--seconds", "0.1", "--threads", "1"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    for phase in [
        "alone (high)",
        "alone (normal)",
        "background alone",
        "loaded, high priority",
        "loaded, normal priority",
    ] {
        assert!(out.contains(phase), "{phase}: {out}");
    }
}

#[test]
fn bad_settings_and_no_gpu_exit_2() {
    let o = run(&["bench", "--latency", "--seconds", "0"]);
    assert_eq!(o.status.code(), Some(2));
    if boundpool::gpu::gpu_unavailable_reason().is_none() {
        return; // a GPU is here: `--latency --gpu` (and `--gpu`, the replay bench) would run
    }
    // Alone, --gpu is the replay bench (tests/cli_replay.rs): without a GPU, exit 2 too.
    let o = run(&["bench", "--gpu"]);
    assert_eq!(o.status.code(), Some(2), "--gpu without a GPU");
    let o = run(&["bench", "--latency", "--gpu", "--seconds", "0.1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("no GPU"), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "");
}
