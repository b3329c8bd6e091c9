//! The latency bench's figures: one JSON object, or a table with the targets.

use super::{Results, BG_BLOCK, BG_ONE_WAVE, BG_SHORT_BLOCKS, BG_WAVE, CHAIN};

/// The foreground p99 bound under load: 1.5 × alone + 50 µs on the host, 2 × on the GPU.
fn p99_limit(r: &Results, gpu: bool) -> f64 {
    (if gpu { 2.0 } else { 1.5 }) * r.alone.p99 + 50.0
}

pub(super) fn json(r: &Results, gpu: bool, workers: usize) -> serde_json::Value {
    let limit = p99_limit(r, gpu);
    let mut v = serde_json::json!({
        "pool": if gpu { "gpu" } else { "host" },
        "workers": workers,
        "samples_per_phase": r.samples,
        "p50_alone_us": r.alone.p50,
        "p99_alone_us": r.alone.p99,
        "p50_loaded_us": r.loaded.p50,
        "p99_loaded_us": r.loaded.p99,
        "max_loaded_us": r.loaded.max,
        "background_alone_nodes_per_s": r.bg_alone,
        "background_loaded_nodes_per_s": r.bg_loaded,
        "normal": {
            "p50_alone_us": r.normal_alone.p50,
            "p99_alone_us": r.normal_alone.p99,
            "p50_loaded_us": r.normal_loaded.p50,
            "p99_loaded_us": r.normal_loaded.p99,
            "max_loaded_us": r.normal_loaded.max,
            "background_alone_nodes_per_s": r.bg_alone,
            "background_loaded_nodes_per_s": r.bg_loaded_normal,
        },
        "targets": {
            "p99_loaded_limit_us": limit,
            "p99_met": r.loaded.p99 <= limit,
            "background_ratio": r.bg_loaded / r.bg_alone.max(f64::MIN_POSITIVE),
            "background_met": r.bg_loaded >= 0.8 * r.bg_alone,
        },
    });
    if gpu {
        v["gpu_background_kernel"] = serde_json::json!({
            "grid": BG_WAVE * BG_SHORT_BLOCKS.0,
            "block": BG_BLOCK,
            "waves": BG_SHORT_BLOCKS.0,
            "cycles_per_block": BG_SHORT_BLOCKS.1,
        });
        v["cuda_device_max_connections"] = std::env::var("CUDA_DEVICE_MAX_CONNECTIONS")
            .unwrap_or_default()
            .into();
    }
    if let Some(w) = &r.one_wave {
        v["one_wave_background"] = serde_json::json!({
            "grid": BG_WAVE * BG_ONE_WAVE.0,
            "block": BG_BLOCK,
            "cycles_per_block": BG_ONE_WAVE.1,
            "p50_loaded_us": w.loaded.p50,
            "p99_loaded_us": w.loaded.p99,
            "max_loaded_us": w.loaded.max,
            "background_alone_nodes_per_s": w.bg_alone,
            "background_loaded_nodes_per_s": w.bg_loaded,
            "p99_met": w.loaded.p99 <= limit,
        });
    }
    v
}

pub(super) fn table(r: &Results, gpu: bool, workers: usize) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} pool, {workers} workers; foreground: a {CHAIN}-node chain every ms; background: low-priority wide graphs of 20 µs nodes{}",
        if gpu { "GPU" } else { "host" },
        if gpu {
            format!(
                " (kernels of {} waves of {BG_WAVE} blocks × {BG_BLOCK} threads, filling the device)",
                BG_SHORT_BLOCKS.0
            )
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        s,
        "{:<26} {:>9} {:>9} {:>9} {:>14}",
        "foreground", "p50 µs", "p99 µs", "max µs", "bg nodes/s"
    );
    let _ = writeln!(
        s,
        "{:<26} {:>9.1} {:>9.1} {:>9.1} {:>14}",
        "alone (high)", r.alone.p50, r.alone.p99, r.alone.max, "-"
    );
    let _ = writeln!(
        s,
        "{:<26} {:>9.1} {:>9.1} {:>9.1} {:>14}",
        "alone (normal)", r.normal_alone.p50, r.normal_alone.p99, r.normal_alone.max, "-"
    );
    let _ = writeln!(
        s,
        "{:<26} {:>9} {:>9} {:>9} {:>14.0}",
        "background alone", "-", "-", "-", r.bg_alone
    );
    let _ = writeln!(
        s,
        "{:<26} {:>9.1} {:>9.1} {:>9.1} {:>14.0}",
        "loaded, high priority", r.loaded.p50, r.loaded.p99, r.loaded.max, r.bg_loaded
    );
    let _ = writeln!(
        s,
        "{:<26} {:>9.1} {:>9.1} {:>9.1} {:>14.0}",
        "loaded, normal priority",
        r.normal_loaded.p50,
        r.normal_loaded.p99,
        r.normal_loaded.max,
        r.bg_loaded_normal
    );
    let _ = writeln!(
        s,
        "target p99 under load ≤ {:.1} µs: {}; background ≥ 80% of alone: {:.0}%",
        p99_limit(r, gpu),
        if r.loaded.p99 <= p99_limit(r, gpu) {
            "met"
        } else {
            "MISSED"
        },
        100.0 * r.bg_loaded / r.bg_alone.max(f64::MIN_POSITIVE)
    );
    if let Some(w) = &r.one_wave {
        let _ = writeln!(
            s,
            "worst case, one wave of ~20 µs blocks: loaded high p99 {:.1} µs ({}), max {:.1}; background {:.0}% of its alone {:.0}/s",
            w.loaded.p99,
            if w.loaded.p99 <= p99_limit(r, gpu) { "met" } else { "missed" },
            w.loaded.max,
            100.0 * w.bg_loaded / w.bg_alone.max(f64::MIN_POSITIVE),
            w.bg_alone
        );
    }
    s
}
