//! What the soak prints: its figures and violations, as one JSON object or as lines.

use std::time::Duration;

use serde_json::json;

use super::levels::{DeviceLevel, Levels};
use super::tally::Tally;
use super::watch::ThreadWatch;
use super::SoakArgs;
use crate::gpu_pool::{self, DeviceSplit};

/// The figures besides the tally's.
pub(super) struct Figures<'a> {
    pub(super) elapsed: Duration,
    pub(super) workers: usize,
    /// Main + workers (+ the driver's threads with a GPU), before any submitter.
    pub(super) base_threads: usize,
    pub(super) end_threads: usize,
    pub(super) threads: ThreadWatch,
    /// At the start, after the warm-up, at the end.
    pub(super) levels: [Levels; 3],
    pub(super) splits: &'a [DeviceSplit],
}

/// Prints the figures and the violations as `a` asks; returns the number of violations.
pub(super) fn print(a: &SoakArgs, t: &Tally, f: &Figures<'_>) -> u64 {
    let violations = Tally::get(&t.violations);
    let messages = t.messages.lock().unwrap_or_else(|p| p.into_inner()).clone();
    if a.json {
        println!("{}", json_of(a, t, f, violations, &messages));
    } else {
        print_lines(a, t, f);
        println!("violations       {violations}");
        for m in &messages {
            println!("  {m}");
        }
        if violations as usize > messages.len() {
            println!("  … ({} more)", violations as usize - messages.len());
        }
    }
    violations
}

fn mib(x: Option<u64>) -> Option<f64> {
    x.map(|b| b as f64 / (1 << 20) as f64)
}

/// The device's levels of `f`, when it has a device.
fn device_levels(f: &Figures<'_>) -> Option<[DeviceLevel; 3]> {
    let [s, w, e] = &f.levels;
    Some([s.device?, w.device?, e.device?])
}

fn json_of(
    a: &SoakArgs,
    t: &Tally,
    f: &Figures<'_>,
    violations: u64,
    messages: &[String],
) -> serde_json::Value {
    let g = Tally::get;
    let w = &f.threads;
    let [start, warm, end] = &f.levels;
    let mut v = json!({
        "seconds": f.elapsed.as_secs_f64(),
        "gpu": a.gpu,
        "submitters": a.submitters,
        "workers": f.workers,
        "seed": a.seed,
        "graphs": g(&t.graphs),
        "nodes": g(&t.nodes),
        "graphs_ok": g(&t.ok),
        "faults": {
            "errors": g(&t.errors),
            "panics": g(&t.panics),
            "cancels": g(&t.cancels),
            "cancelled": g(&t.cancelled),
            "nested": g(&t.nested),
            "dropped_handles": g(&t.dropped),
            "foreign_buffer_drops": g(&t.foreign_buffer_drops),
            "cudarc_nodes": g(&t.cudarc_nodes),
        },
        "gpu_graphs": g(&t.gpu_graphs),
        "os_threads": {
            "expected": f.base_threads + a.submitters,
            "min": (w.samples > 0).then_some(w.min),
            "max": (w.samples > 0).then_some(w.max),
            "samples": w.samples,
            "max_starting": w.max_starting,
            "max_short_lived_pool_threads": w.max_short_lived,
            "end": f.end_threads,
        },
        "rss_mib": {"start": mib(start.rss), "warm": mib(warm.rss), "end": mib(end.rss)},
        "violations": violations,
        "violation_messages": messages,
    });
    if !f.splits.is_empty() {
        v["partitions"] = gpu_pool::json_of(f.splits);
    }
    if let Some([s, w, e]) = device_levels(f) {
        let free = |d: &DeviceLevel| mib(d.free.map(|x| x as u64));
        v["device"] = json!({
            "free_mib": {"start": free(&s), "warm": free(&w), "end": free(&e)},
            "live_allocations": {"start": s.live, "end": e.live},
            "events_created": {"start": s.events, "warm": w.events, "end": e.events},
        });
    }
    v
}

/// The figures as lines (the violations follow).
fn print_lines(a: &SoakArgs, t: &Tally, f: &Figures<'_>) {
    let g = Tally::get;
    let w = &f.threads;
    let workers = f.workers;
    let show = |x: Option<f64>| x.map_or("?".into(), |m| format!("{m:.1}"));
    println!(
        "soak             {:.1} s, {} submitters, {workers} workers{}, seed {}",
        f.elapsed.as_secs_f64(),
        a.submitters,
        if a.gpu { " (GPU)" } else { "" },
        a.seed
    );
    println!(
        "graphs           {} ({} nodes; {} succeeded and checked{})",
        g(&t.graphs),
        g(&t.nodes),
        g(&t.ok),
        if a.gpu {
            format!(", {} on the GPU", g(&t.gpu_graphs))
        } else {
            String::new()
        }
    );
    println!(
        "faults           {} errors, {} panics, {} cancels ({} cancelled), {} nested, {} dropped handles{}",
        g(&t.errors),
        g(&t.panics),
        g(&t.cancels),
        g(&t.cancelled),
        g(&t.nested),
        g(&t.dropped),
        if a.gpu {
            format!(
                ", {} buffers dropped off the workers, {} GPU nodes through cudarc",
                g(&t.foreign_buffer_drops),
                g(&t.cudarc_nodes)
            )
        } else {
            String::new()
        }
    );
    println!(
        "OS threads       {} to {} during (expected {}: main + {workers} workers + {} submitters{}), {} at the end",
        if w.samples > 0 { w.min } else { 0 },
        w.max,
        f.base_threads + a.submitters,
        a.submitters,
        if f.base_threads > 1 + workers {
            format!(" + {} of the driver", f.base_threads - 1 - workers)
        } else {
            String::new()
        },
        f.end_threads
    );
    println!(
        "                 {} samples; short-lived pools: at most {} threads at once ({} of them starting)",
        w.samples, w.max_short_lived, w.max_starting
    );
    let [start, warm, end] = &f.levels;
    println!(
        "resident memory  {} MiB at the start, {} after the warm-up, {} at the end",
        show(mib(start.rss)),
        show(mib(warm.rss)),
        show(mib(end.rss))
    );
    if let Some([s, w, e]) = device_levels(f) {
        let m = |x: Option<usize>| show(mib(x.map(|x| x as u64)));
        println!(
            "device memory    {} MiB free at the start, {} after the warm-up, {} at the end",
            m(s.free),
            m(w.free),
            m(e.free)
        );
        println!(
            "live allocations {} at the start, {} at the end",
            s.live, e.live
        );
        println!(
            "events created   {} at the start, {} after the warm-up, {} at the end",
            s.events, w.events, e.events
        );
    }
}
