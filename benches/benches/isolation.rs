//! Isolation bench, host graphs only: does a stalled core of the batch's worker group reach a
//! latency-critical graph that runs on a group of its own? The pool has two groups: `latency`
//! (one worker, on the first core) and `batch` (the other cores but one). The foreground is a
//! chain of `CHAIN` nodes of `FG_WORK` busy time at `Priority::High`, placed on `latency`,
//! submitted every `PERIOD` from a thread pinned to the core left out (on two cores, the latency
//! worker's) and waited for. The background is wide graphs on `batch` kept in flight by one
//! feeder thread per batch core, pinned there. Stalls (`boundpool_bench::stalls`, SCHED_FIFO threads that spin MS ms at random
//! instants) go on every batch core, workers' and feeders' alike, as the hypervisor's steal
//! would.
//!
//! `--latency-workers N` gives the latency group N workers and `--stall-on latency` stalls the
//! first of them instead (the steal of the group's own cores); `--fg device-poll` and
//! `device-completer` make the foreground a request as a GPU node makes it (staging, a
//! deferred completion `DEVICE` after its body, a read), its completion polled by its worker or
//! sent by a thread standing for the device. The foreground's thread and the device thread get
//! cores of their own where the batch keeps one.
//!
//! Four phases, cut into `--slices` and alternated: the foreground alone and loaded, each
//! without and with the stalls. Nothing of the foreground runs on a stalled core, so with no
//! coupling through the pool (a lock a stalled batch thread holds, a wake-up it owes) its tail
//! loaded with stalls is its tail loaded without: the ratio printed last. Without a core for
//! each group, or where SCHED_FIFO is refused, it says so and exits.
//!
//! `cargo bench -p boundpool-bench --bench isolation [-- --seconds S --slices N --stall MS:PER_S
//! --rounds R --latency-workers N --stall-on batch|latency --fg chain|device-poll|device-completer
//! --paced-spin-us U --json]`

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::task::Poll;
use std::thread;
use std::time::{Duration, Instant};

use boundpool_bench::stalls;
use boundpool_scheduler::backend::{Completer, NodeCtxExt};
use boundpool_scheduler::{
    pin_current_thread, Cores, Graph, GraphBuilder, GroupId, GroupSpec, Pool, PoolBuilder, Priority,
};
use boundpool_workloads::{busy_work, Sorted};
use serde_json::json;

/// Nodes of the foreground chain, and each one's busy time.
const CHAIN: usize = 5;
const FG_WORK: Duration = Duration::from_micros(5);
/// Foreground submissions are this far apart.
const PERIOD: Duration = Duration::from_micros(200);
/// Width of a background graph, each node's busy time, and graphs kept in flight per feeder.
const BG_WIDTH: usize = 16;
const BG_WORK: Duration = Duration::from_micros(20);
const BG_IN_FLIGHT: usize = 4;
/// The device's time in the `device-*` foregrounds.
const DEVICE: Duration = Duration::from_micros(60);

/// The foreground's latency (submit to `wait` returned) against stalls on the batch's cores.
#[derive(clap::Parser, Debug)]
struct Args {
    /// Seconds per phase (each cut into `--slices`).
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Slices per phase, alternated with the other phases' so that a drift in the host's speed
    /// falls on all four alike.
    #[arg(long, default_value_t = 5)]
    slices: u32,
    /// The stalls on each batch core: MS:PER_S.
    #[arg(long, default_value = "2:20")]
    stall: String,
    /// Rounds (each the four phases).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Workers of the latency group (its cores: the first ones; the batch group gets the rest,
    /// and none left means no batch and no loaded phases).
    #[arg(long, default_value_t = 1)]
    latency_workers: usize,
    /// Where the stalls go: `batch` (every batch core) or `latency` (the latency group's first
    /// core only: one of its workers held off, as the hypervisor's steal of its own cores would).
    #[arg(long, default_value = "batch", value_parser = ["batch", "latency"])]
    stall_on: String,
    /// The foreground's shape: `chain` (`CHAIN` nodes of `FG_WORK`), or a request's as a GPU
    /// node makes it, a staging node, a node whose completion waits `DEVICE` as a device's
    /// work would, a read node: `device-poll` (the completion polled by the worker that ran
    /// the node, as the GPU backend's is) or `device-completer` (completed by another thread
    /// through a `Completer` at the same instant, and taken by whichever worker of the group
    /// is free).
    #[arg(long, default_value = "chain", value_parser = ["chain", "device-poll", "device-completer"])]
    fg: String,
    /// The pool's paced spin, µs (`PoolBuilder::paced_spin`; default the library's: on where
    /// the pool leaves two cores to its clients).
    #[arg(long)]
    paced_spin_us: Option<u64>,
    /// JSON lines.
    #[arg(long)]
    json: bool,
}

/// One phase's foreground latencies (µs) and the background's nodes per second.
#[derive(Default)]
struct Phase {
    lat: Vec<f64>,
    bg_nodes: u64,
    secs: f64,
    stalls_ms: f64,
}

impl Phase {
    fn pct(&self, p: f64) -> f64 {
        Sorted::new(self.lat.clone()).percentile(p)
    }

    /// Foreground runs slower than half a stall: what a stall that reached the foreground
    /// would leave.
    fn over(&self, us: f64) -> usize {
        self.lat.iter().filter(|&&l| l > us).count()
    }
}

struct Bench {
    pool: Pool,
    fg: Graph,
    /// None without batch cores.
    bg: Option<Graph>,
    latency_cores: Vec<usize>,
    batch_cores: Vec<usize>,
    /// The foreground's thread's core (and the device thread's, `device_core`).
    client_core: usize,
    device_core: usize,
}

impl Bench {
    /// The latency group on the first `latency_workers` of `cores`, the batch group on the rest.
    fn new(
        cores: &[usize],
        latency_workers: usize,
        shape: &str,
        paced_spin: Option<Duration>,
    ) -> Result<Self, String> {
        if latency_workers == 0 || latency_workers > cores.len() {
            return Err(format!(
                "--latency-workers {latency_workers}: give 1 to {} (the cores this process may use)",
                cores.len()
            ));
        }
        let (latency_cores, rest) = cores.split_at(latency_workers);
        let latency_cores = latency_cores.to_vec();
        // A core of its own for the foreground's thread and for the device thread, each where
        // one is left for the batch; the latency group's last core otherwise.
        let mut rest = rest.to_vec();
        let own = |rest: &mut Vec<usize>, fallback: usize| {
            if rest.len() >= 2 {
                rest.remove(0)
            } else {
                fallback
            }
        };
        let last = *latency_cores.last().expect("a latency core");
        let client_core = own(&mut rest, last);
        let device_core = match shape {
            "device-completer" => own(&mut rest, client_core),
            _ => client_core,
        };
        let batch_cores = rest;
        let mut groups =
            vec![GroupSpec::new("latency", latency_workers)
                .cores(Cores::List(latency_cores.clone()))];
        if !batch_cores.is_empty() {
            groups.push(
                GroupSpec::new("batch", batch_cores.len()).cores(Cores::List(batch_cores.clone())),
            );
        }
        let pool = PoolBuilder::new().name("isolation").groups(groups);
        let pool = match paced_spin {
            Some(d) => pool.paced_spin(d),
            None => pool,
        };
        let pool = pool.build().map_err(|e| e.to_string())?;
        let lat = pool.group("latency").ok_or("no latency group")?;
        let fg = match shape {
            "chain" => chain(lat)?,
            _ => request(lat, shape == "device-completer", device_core)?,
        };
        let bg = match pool.group("batch") {
            Some(batch) => Some(background(batch)?),
            None => None,
        };
        Ok(Bench {
            pool,
            fg,
            bg,
            latency_cores,
            batch_cores,
            client_core,
            device_core,
        })
    }

    /// The foreground every `PERIOD` for `secs` (with the background when `loaded`), into `p`.
    fn phase(&self, loaded: bool, secs: f64, p: &mut Phase) {
        let stop = AtomicBool::new(false);
        let nodes = AtomicU64::new(0);
        let stalls0 = stalls::injected_ms();
        let t0 = Instant::now();
        thread::scope(|s| {
            if loaded {
                for &core in &self.batch_cores {
                    let (stop, nodes) = (&stop, &nodes);
                    s.spawn(move || self.feed(core, stop, nodes));
                }
            }
            let fg = s.spawn(|| self.foreground(Duration::from_secs_f64(secs)));
            p.lat.extend(fg.join().expect("foreground"));
            stop.store(true, Ordering::Relaxed);
        });
        p.secs += t0.elapsed().as_secs_f64();
        p.bg_nodes += nodes.load(Ordering::Relaxed);
        p.stalls_ms += stalls::injected_ms() - stalls0;
    }

    fn foreground(&self, dur: Duration) -> Vec<f64> {
        pin_current_thread(&[self.client_core]).expect("foreground placed");
        let mut lat = Vec::new();
        let start = Instant::now();
        let mut next = start;
        while start.elapsed() < dur {
            let now = Instant::now();
            if next > now {
                thread::sleep(next - now);
            }
            next = (next + PERIOD).max(Instant::now());
            let t = Instant::now();
            self.pool
                .submit(&self.fg)
                .and_then(|h| h.wait())
                .expect("foreground run");
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
        lat
    }

    fn feed(&self, core: usize, stop: &AtomicBool, nodes: &AtomicU64) {
        let Some(bg) = &self.bg else { return };
        pin_current_thread(&[core]).expect("feeder placed");
        let mut q = std::collections::VecDeque::new();
        while !stop.load(Ordering::Relaxed) {
            while q.len() < BG_IN_FLIGHT {
                q.push_back(self.pool.submit(bg).expect("background submit"));
            }
            if let Some(h) = q.pop_front() {
                h.wait().expect("background run");
                nodes.fetch_add(BG_WIDTH as u64 + 2, Ordering::Relaxed);
            }
        }
        for h in q {
            h.wait().expect("background run");
        }
    }
}

/// The `chain` foreground on `lat`: `CHAIN` nodes of `FG_WORK` at high priority.
fn chain(lat: GroupId) -> Result<Graph, String> {
    let mut g = GraphBuilder::new("foreground");
    let mut prev = None;
    for i in 0..CHAIN {
        let n = g.node(format!("fg{i}"), |_| {
            busy_work(FG_WORK.as_nanos() as u64);
            Ok(())
        });
        g.place(n, lat);
        if let Some(p) = prev {
            g.edge(p, n);
        }
        prev = Some(n);
    }
    g.priority(Priority::High);
    g.build().map_err(|e| e.to_string())
}

/// The `device-*` foregrounds on `lat`: staging, a node whose completion comes `DEVICE` after
/// its body (polled by its worker, or with `completer` completed by a thread pinned to `core`
/// that stands for the device), reading; at high priority.
fn request(lat: GroupId, completer: bool, core: usize) -> Result<Graph, String> {
    let mut g = GraphBuilder::new("request");
    let stage = g.node("stage", |_| {
        busy_work(FG_WORK.as_nanos() as u64);
        Ok(())
    });
    let device = if completer {
        let tx = device_thread(core);
        g.node("device", move |ctx| {
            let c = ctx.complete_later();
            tx.send((Instant::now() + DEVICE, c))
                .map_err(|_| "the device thread is gone".into())
        })
    } else {
        g.node("device", |ctx| {
            let done = Instant::now() + DEVICE;
            ctx.complete_when(move |_: &()| {
                if Instant::now() >= done {
                    Poll::Ready(Ok(()))
                } else {
                    Poll::Pending
                }
            });
            Ok(())
        })
    };
    let read = g.node("read", |_| {
        busy_work(FG_WORK.as_nanos() as u64);
        Ok(())
    });
    g.edge(stage, device).edge(device, read);
    g.place(stage, lat).place(device, lat).place(read, lat);
    g.priority(Priority::High);
    g.build().map_err(|e| e.to_string())
}

/// A thread on `core` that completes each completer it is sent at its instant, looking at the
/// clock between yields (the stand-in for a device's completion seen by another thread).
fn device_thread(core: usize) -> mpsc::Sender<(Instant, Completer)> {
    let (tx, rx) = mpsc::channel::<(Instant, Completer)>();
    thread::spawn(move || {
        pin_current_thread(&[core]).expect("device thread placed");
        for (done, c) in rx {
            while Instant::now() < done {
                thread::yield_now();
            }
            c.complete(Ok(()));
        }
    });
    tx
}

/// A background graph on `batch`: a source, `BG_WIDTH` nodes of `BG_WORK`, a sink.
fn background(batch: GroupId) -> Result<Graph, String> {
    let mut g = GraphBuilder::new("background");
    let src = g.node("source", |_| Ok(()));
    let sink = g.node("sink", |_| Ok(()));
    g.place(src, batch).place(sink, batch);
    for i in 0..BG_WIDTH {
        let n = g.node(format!("bg{i}"), |_| {
            busy_work(BG_WORK.as_nanos() as u64);
            Ok(())
        });
        g.place(n, batch).edge(src, n).edge(n, sink);
    }
    g.build().map_err(|e| e.to_string())
}

fn main() {
    let a: Args = boundpool_bench::flags::parse();
    let cores = allowed_cores();
    let paced = a.paced_spin_us.map(Duration::from_micros);
    let b = match Bench::new(&cores, a.latency_workers, &a.fg, paced) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("isolation bench: {e}");
            std::process::exit(2);
        }
    };
    let (place, stalled) = match a.stall_on.as_str() {
        "latency" => ("high-path", vec![b.latency_cores[0]]),
        _ => ("batch-workers", b.batch_cores.clone()),
    };
    if stalled.is_empty() {
        println!("SKIPPED isolation bench: no batch cores to stall (this process has {cores:?}; --latency-workers {})", a.latency_workers);
        return;
    }
    let spec = match stalls::parse(&format!("{place}:{}", a.stall)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("isolation bench: --stall: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = stalls::start(spec, &stalled) {
        println!("SKIPPED isolation bench: no stalls: {e}");
        return;
    }
    println!(
        "latency group on {:?}, batch group and its feeders on {:?}, the foreground's thread on {}, the device thread's on {}, stalls on {stalled:?}; foreground `{}` at high priority every {PERIOD:?}",
        b.latency_cores, b.batch_cores, b.client_core, b.device_core, a.fg
    );
    println!("| round | alone p50 / p99 / p99.9 | alone, stalls | loaded | loaded, stalls | p99 loaded / alone | p99 loaded with stalls / without | bg nodes/s with stalls / without | runs over half a stall: alone, with stalls, loaded, with stalls | stalls ms alone / loaded |");
    println!("| ---: | --- | --- | --- | --- | ---: | ---: | ---: | --- | --- |");
    let phases = if b.bg.is_some() { 4 } else { 2 };
    let part = a.seconds / f64::from(a.slices.max(1));
    let half = spec.stall_ms() * 1e3 / 2.0;
    for round in 1..=a.rounds {
        // alone, alone with stalls, loaded, loaded with stalls
        let mut ph: [Phase; 4] = Default::default();
        for slice in 0..a.slices.max(1) {
            let mut order: Vec<usize> = (0..phases).collect();
            order.rotate_left(slice as usize % phases);
            for i in order {
                stalls::set_active(i % 2 == 1);
                b.phase(i >= 2, part, &mut ph[i]);
            }
        }
        stalls::set_active(false);
        report(round, &ph[..phases], half, &a);
    }
}

/// One round's row (and JSON line): the phases run (two without a batch group: alone, alone
/// with stalls).
fn report(round: usize, ph: &[Phase], half: f64, a: &Args) {
    let trio = |p: &Phase| {
        format!(
            "{:.0} / {:.0} / {:.0}",
            p.pct(0.5),
            p.pct(0.99),
            p.pct(0.999)
        )
    };
    let dash = || "-".to_string();
    let bg = |p: &Phase| p.bg_nodes as f64 / p.secs.max(1e-9);
    let loaded = ph.len() == 4;
    let ratio = |x: f64| if loaded { format!("{x:.2}") } else { dash() };
    let (loading, coupling, bg_kept) = if loaded {
        (
            ph[2].pct(0.99) / ph[0].pct(0.99),
            ph[3].pct(0.99) / ph[2].pct(0.99),
            bg(&ph[3]) / bg(&ph[2]),
        )
    } else {
        (f64::NAN, f64::NAN, f64::NAN)
    };
    let over: Vec<String> = ph.iter().map(|p| p.over(half).to_string()).collect();
    let stalls_loaded = ph
        .get(3)
        .map_or_else(dash, |p| format!("{:.0}", p.stalls_ms));
    println!(
        "| {round} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} / {stalls_loaded} |",
        trio(&ph[0]),
        trio(&ph[1]),
        ph.get(2).map_or_else(dash, trio),
        ph.get(3).map_or_else(dash, trio),
        ratio(loading),
        ratio(coupling),
        ratio(bg_kept),
        over.join(", "),
        ph[1].stalls_ms,
    );
    if a.json {
        let p99 = |i: usize| ph.get(i).map(|p| p.pct(0.99));
        let v = json!({"bench": "isolation", "round": round, "stall": a.stall,
            "stall_on": a.stall_on, "latency_workers": a.latency_workers,
            "alone_p99_us": p99(0), "alone_stalls_p99_us": p99(1),
            "loaded_p99_us": p99(2), "loaded_stalls_p99_us": p99(3),
            "p99_loaded_over_alone": loaded.then_some(loading),
            "p99_stalls_over_none_loaded": loaded.then_some(coupling),
            "bg_nodes_per_s": ph.get(2).map(bg), "bg_nodes_per_s_stalls": ph.get(3).map(bg),
            "over_half_a_stall": ph.iter().map(|p| p.over(half)).collect::<Vec<_>>(),
            "stalls_ms_alone": ph[1].stalls_ms, "stalls_ms_loaded": ph.get(3).map(|p| p.stalls_ms)});
        println!("{v}");
    }
}

/// The cores this process may run on (`Cpus_allowed_list` of /proc/self/status; empty where it
/// cannot be read).
fn allowed_cores() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let Some(list) = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
    else {
        return Vec::new();
    };
    list.trim()
        .split(',')
        .filter_map(|r| match r.split_once('-') {
            Some((a, b)) => Some(a.parse().ok()?..=b.parse().ok()?),
            None => r.parse().ok().map(|c| c..=c),
        })
        .flatten()
        .collect()
}
