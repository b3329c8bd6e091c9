//! `boundpool run --gpu [--replay] [--partitions SPEC]` and `boundpool bench --gpu`: exit 2
//! without a GPU; with one (`BOUNDPOOL_REQUIRE_GPU=1` on the GPU machine), every figure is there.

use std::process::{Command, Output};

use boundpool_test_support::GpuTest;

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_boundpool"))
        .args(args)
        .output()
        .expect("boundpool runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn without_a_gpu_run_and_bench_exit_2() {
    if boundpool::gpu::gpu_unavailable_reason().is_none() {
        return;
    }
    for args in [
        &["run", "--gpu", "--shape", "chain", "--size", "10"][..],
        &[
            "run", "--gpu", "--replay", "--shape", "wide", "--size", "10",
        ][..],
        &["bench", "--gpu", "--json"][..],
    ] {
        let o = run(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o.stderr));
        assert!(
            text(&o.stderr).contains("no GPU"),
            "{args:?}: {}",
            text(&o.stderr)
        );
        assert_eq!(text(&o.stdout), "", "{args:?}");
    }
    // --replay needs --gpu, --max-width needs --replay and at least 1.
    let o = run(&["run", "--replay", "--shape", "chain", "--size", "10"]);
    assert_eq!(o.status.code(), Some(2));
    let o = run(&[
        "run",
        "--gpu",
        "--shape",
        "wide",
        "--size",
        "10",
        "--max-width",
        "4",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("--replay"), "{}", text(&o.stderr));
    let o = run(&[
        "run",
        "--gpu",
        "--replay",
        "--shape",
        "wide",
        "--size",
        "10",
        "--max-width",
        "0",
    ]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn run_gpu_shapes_eager_and_replayed() {
    // The command runs in a child process: no context check here.
    let Some(_t) = GpuTest::start_without_context_check("run_gpu_shapes_eager_and_replayed", 600)
    else {
        return;
    };
    for shape in ["chain", "tree", "wide", "wavefront", "random"] {
        for replay in [false, true] {
            let mut args = vec![
                "run", "--gpu", "--shape", shape, "--size", "300", "--repeat", "3", "--json",
            ];
            if replay {
                args.push("--replay");
            }
            let o = run(&args);
            assert!(o.status.success(), "{args:?}: {}", text(&o.stderr));
            let v: serde_json::Value = serde_json::from_slice(&o.stdout)
                .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {}", text(&o.stdout)));
            assert_eq!(v["shape"], shape, "{v}");
            assert_eq!(v["mode"], if replay { "replay" } else { "eager" }, "{v}");
            assert!(v["nodes"].as_u64() > Some(0), "{v}");
            assert!(v["median_run_us"].as_f64() > Some(0.0), "{v}");
            if replay {
                assert!(v["segments"].as_u64() >= Some(1), "{v}");
                assert!(v["capture_us_per_node"].as_f64() > Some(0.0), "{v}");
                // One kernel node per node (plus at most one empty root per segment where the
                // driver refuses an empty dependency set).
                let (c, n, segs) = (
                    v["captured_nodes"].as_u64().unwrap(),
                    v["nodes"].as_u64().unwrap(),
                    v["segments"].as_u64().unwrap(),
                );
                assert!(c >= n && c <= n + segs, "captured nodes: {v}");
                // The DAG's edges, not a serial chain (plus one per root with an empty root).
                let e = v["captured_edges"].as_u64().unwrap();
                let de = v["edges"].as_u64().unwrap();
                assert!(e >= de && e <= de + n, "captured edges: {v}");
            }
        }
    }
}

#[test]
fn bench_gpu_json_has_every_row() {
    let Some(_t) = GpuTest::start_without_context_check("bench_gpu_json_has_every_row", 600) else {
        return;
    };
    let o = run(&["bench", "--gpu", "--runs", "1", "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&o.stdout)));
    let rows = v.as_array().expect("an array of rows");
    for shape in ["independent", "chain", "wavefront", "update"] {
        let r = rows
            .iter()
            .find(|r| r["shape"] == shape)
            .unwrap_or_else(|| panic!("no {shape} row: {v}"));
        if shape == "update" {
            assert!(r["update_vs_fresh"].as_f64() > Some(0.0), "{r}");
        } else {
            for k in [
                "eager_us",
                "replay_us",
                "raw_us",
                "replay_vs_raw",
                "capture_us_per_node",
                "instantiate_us_per_node",
            ] {
                assert!(r[k].as_f64() > Some(0.0), "{shape}: {k}: {r}");
            }
        }
    }
}

/// `run --gpu --partitions`: the pool's split printed before the run (one line per device)
/// and in the JSON; a size the device cannot give exits 2 with the pool's message.
#[test]
fn run_gpu_on_sm_partitions_reports_them() {
    let Some(_t) =
        GpuTest::start_without_context_check("run_gpu_on_sm_partitions_reports_them", 600)
    else {
        return;
    };
    let spec = "latency:8:1,bulk:rest:2";
    for replay in [false, true] {
        let mut args = vec![
            "run",
            "--gpu",
            "--shape",
            "wavefront",
            "--size",
            "300",
            "--repeat",
            "2",
            "--partitions",
            spec,
            "--json",
        ];
        if replay {
            args.push("--replay");
        }
        let o = run(&args);
        assert!(o.status.success(), "{args:?}: {}", text(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {}", text(&o.stdout)));
        assert!(v["median_run_us"].as_f64() > Some(0.0), "{v}");
        let d = &v["partitions"][0];
        assert_eq!(d["device"], 0, "{v}");
        let sms = d["sms"].as_u64().expect("the device's SMs");
        let p = d["partitions"].as_array().expect("the partitions");
        assert_eq!(p.len(), 2, "{v}");
        assert_eq!(
            p[0],
            serde_json::json!({"name": "latency", "sms": 8, "group": "gpu0.latency", "workers": 1}),
            "{v}"
        );
        assert_eq!(p[1]["name"], "bulk", "{v}");
        assert_eq!(p[1]["group"], "gpu0.bulk", "{v}");
        assert_eq!(p[1]["workers"], 2, "{v}");
        assert_eq!(p[1]["sms"].as_u64(), Some(sms - 8), "{v}");
        assert_eq!(d["unused_sms"], 0, "{v}");
    }
    // Text: the line comes first, before the figures.
    let o = run(&[
        "run",
        "--gpu",
        "--shape",
        "chain",
        "--size",
        "50",
        "--partitions",
        "latency:8",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let first = out.lines().next().unwrap_or("");
    assert!(first.starts_with("SM partitions of GPU 0 ("), "{out}");
    assert!(
        first.contains("latency 8 SMs (group gpu0.latency, 1 worker)"),
        "{out}"
    );
    // No rest partition: the other SMs are reported unused.
    assert!(!first.ends_with("unused SMs: 0"), "{out}");
    // More SMs than the device has.
    let o = run(&["run", "--gpu", "--partitions", "huge:100000"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("100000"), "{}", text(&o.stderr));
}
