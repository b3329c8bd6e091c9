//! The latency-critical client's tail: the priority scenario repeated (`--priority-only`, with
//! `--batch-clients 8,16,32` and `--rounds 5`), each round's p99 loaded over alone printed, and a
//! probe (`--tail-probe`) that says where the slowest 1% of the client's requests lost their
//! time on the host: the client thread's and the pool threads' time runnable but waiting for a
//! core (`/proc/<tid>/schedstat`'s run delay), the client's involuntary switches and the
//! hypervisor's steal on the high path's cores and on the others (`/proc/stat`), the host's
//! TLB shootdowns and function-call IPIs (`/proc/interrupts`) and the stalls injected
//! (`--inject-stalls`), read around
//! each request (outside its timed window); and where each request's time went around
//! its GPU segment (`Replayable::probe_launches`): before the launch, inside the driver's
//! launch call, on the device, and from the device's end to its worker seeing it done.

use std::fs;
use std::sync::Mutex;

use boundpool::gpu::LaunchRecord;

use super::*;

/// A thread's scheduler counters: ns on a core, ns runnable but waiting for one.
#[derive(Clone, Copy, Default)]
struct SchedStat {
    run_ns: u64,
    wait_ns: u64,
}

fn schedstat(path: &str) -> SchedStat {
    let s = fs::read_to_string(path).unwrap_or_default();
    let mut it = s.split_whitespace().map(|x| x.parse::<u64>().unwrap_or(0));
    SchedStat {
        run_ns: it.next().unwrap_or(0),
        wait_ns: it.next().unwrap_or(0),
    }
}

/// The calling thread's involuntary context switches so far.
fn involuntary_switches() -> u64 {
    fs::read_to_string("/proc/thread-self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The schedstat files of this process's threads now (called after the pool is built and
/// before any client starts: the pool's workers and the driver's threads; not the stall
/// threads of `--inject-stalls`).
fn pool_threads() -> Vec<String> {
    let me = fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|t| Some(t) != me.as_ref())
                .filter(|t| {
                    let comm = fs::read_to_string(format!("/proc/self/task/{t}/comm"));
                    !comm.is_ok_and(|c| c.starts_with("stall-"))
                })
                .map(|t| format!("/proc/self/task/{t}/schedstat"))
                .collect()
        })
        .unwrap_or_default()
}

/// What one probed request cost, in µs (switches counted).
#[derive(Clone, Copy)]
struct Sample {
    start: Instant,
    latency: f64,
    client_wait: f64,
    client_involuntary: f64,
    pool_wait: f64,
    pool_wait_max: f64,
    pool_run: f64,
    /// The hypervisor's steal meanwhile (ms ticks × 10, so an estimate whose mean over many
    /// requests holds): on the high path's cores, on the others.
    high_steal: f64,
    other_steal: f64,
    /// The host's TLB shootdowns and function-call IPIs meanwhile.
    tlb_shootdowns: f64,
    function_calls: f64,
    /// Stalls injected meanwhile (`--inject-stalls`; µs over their cores).
    stalls: f64,
}

/// Reads the counters around each of the high client's requests.
pub(super) struct TailProbe {
    threads: Vec<String>,
    samples: Mutex<Vec<Sample>>,
    /// Instead of the counters, each request's window (ns since this instant).
    epoch: Option<Instant>,
    windows: Mutex<Vec<(u64, u64)>>,
    /// The high graph's probed launches over the run, oldest first.
    launches: Mutex<Vec<LaunchRecord>>,
    /// When the high graph's read-out node ran (`ServedModel::reads`), per run.
    reads: Mutex<Vec<(Instant, Instant)>>,
}

/// The counters before a request.
pub(super) struct Before {
    client: SchedStat,
    involuntary: u64,
    pool: Vec<SchedStat>,
    cpu: CpuTime,
}

impl TailProbe {
    fn new() -> Self {
        Self {
            threads: pool_threads(),
            samples: Mutex::new(Vec::new()),
            epoch: None,
            windows: Mutex::new(Vec::new()),
            launches: Mutex::new(Vec::new()),
            reads: Mutex::new(Vec::new()),
        }
    }

    /// A probe that records each request's window only (for the traced breakdown).
    fn windows(epoch: Instant) -> Self {
        Self {
            threads: Vec::new(),
            samples: Mutex::new(Vec::new()),
            epoch: Some(epoch),
            windows: Mutex::new(Vec::new()),
            launches: Mutex::new(Vec::new()),
            reads: Mutex::new(Vec::new()),
        }
    }

    pub(super) fn before(&self) -> Option<Before> {
        if self.epoch.is_some() {
            return None;
        }
        Some(Before {
            client: schedstat("/proc/thread-self/schedstat"),
            involuntary: involuntary_switches(),
            pool: self.threads.iter().map(|p| schedstat(p)).collect(),
            cpu: CpuTime::now(),
        })
    }

    pub(super) fn after(&self, b: Option<Before>, start: Instant, latency: Duration) {
        let Some(b) = b else {
            if let Some(e) = self.epoch {
                let t0 = start.saturating_duration_since(e).as_nanos() as u64;
                let t1 = t0 + latency.as_nanos() as u64;
                self.windows.lock().unwrap().push((t0, t1));
            }
            return;
        };
        let cpu = CpuTime::now();
        let client = schedstat("/proc/thread-self/schedstat");
        let involuntary = involuntary_switches();
        let ipis = cpu.ipis.since(b.cpu.ipis);
        let us = |ns: u64| ns as f64 / 1e3;
        let (mut wait, mut max, mut run) = (0u64, 0u64, 0u64);
        for (p, old) in self.threads.iter().zip(&b.pool) {
            let now = schedstat(p);
            let w = now.wait_ns.saturating_sub(old.wait_ns);
            wait += w;
            max = max.max(w);
            run += now.run_ns.saturating_sub(old.run_ns);
        }
        let s = Sample {
            start,
            latency: latency.as_secs_f64() * 1e6,
            client_wait: us(client.wait_ns.saturating_sub(b.client.wait_ns)),
            client_involuntary: involuntary.saturating_sub(b.involuntary) as f64,
            pool_wait: us(wait),
            pool_wait_max: us(max),
            pool_run: us(run),
            high_steal: cpu.high_steal_ms.saturating_sub(b.cpu.high_steal_ms) as f64 * 1000.0,
            other_steal: (cpu.steal_ms.saturating_sub(cpu.high_steal_ms))
                .saturating_sub(b.cpu.steal_ms.saturating_sub(b.cpu.high_steal_ms))
                as f64
                * 1000.0,
            tlb_shootdowns: ipis.tlb_shootdowns as f64,
            function_calls: ipis.function_calls as f64,
            stalls: (cpu.stalls_ms - b.cpu.stalls_ms) * 1e3,
        };
        self.samples.lock().unwrap().push(s);
    }

    /// The median request against the slowest 1%: each column's mean over the group.
    fn report(&self, label: &str) {
        let mut s = self.samples.lock().unwrap().clone();
        s.sort_by(|a, b| a.latency.total_cmp(&b.latency));
        if s.len() < 100 {
            println!("{label}: {} probed requests, too few", s.len());
            return;
        }
        let mean =
            |g: &[Sample], f: fn(&Sample) -> f64| g.iter().map(f).sum::<f64>() / g.len() as f64;
        let n = s.len();
        let mid = &s[n * 45 / 100..n * 55 / 100];
        let slow = &s[n * 99 / 100..];
        println!("{label}: {n} probed requests (means over each group; µs, switches counted)");
        println!("| group | latency | client waiting for a core | client involuntary switches | pool threads waiting (sum) | (max one thread) | pool threads on a core | steal on the high path's cores | steal on the others | TLB shootdowns | function-call IPIs | stalls injected |");
        println!(
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        );
        for (name, g) in [("p45-p55", mid), ("slowest 1%", slow)] {
            println!(
                "| {name} | {:.1} | {:.1} | {:.2} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
                mean(g, |x| x.latency),
                mean(g, |x| x.client_wait),
                mean(g, |x| x.client_involuntary),
                mean(g, |x| x.pool_wait),
                mean(g, |x| x.pool_wait_max),
                mean(g, |x| x.pool_run),
                mean(g, |x| x.high_steal),
                mean(g, |x| x.other_steal),
                mean(g, |x| x.tlb_shootdowns),
                mean(g, |x| x.function_calls),
                mean(g, |x| x.stalls),
            );
        }
        self.report_launches(mid, slow);
    }

    /// The run's probed launches of the high graph (`Replayable::take_launch_records`).
    fn attribute(&self, launches: Vec<LaunchRecord>, mut reads: Vec<(Instant, Instant)>) {
        *self.launches.lock().unwrap() = launches;
        reads.sort_by_key(|r| r.0);
        *self.reads.lock().unwrap() = reads;
    }

    /// Each group's requests cut at their GPU segment's launch: each column's mean over the
    /// requests whose launch was read (the run's last one is not).
    fn report_launches(&self, mid: &[Sample], slow: &[Sample]) {
        let mut launches = self.launches.lock().unwrap().clone();
        if launches.is_empty() {
            return;
        }
        launches.sort_by_key(|l| l.begin);
        let reads = self.reads.lock().unwrap().clone();
        let cut = |g: &[Sample]| -> Vec<[f64; LAUNCH_COLUMNS.len()]> {
            g.iter()
                .filter_map(|x| {
                    let end = x.start + Duration::from_secs_f64(x.latency / 1e6);
                    let i = launches.partition_point(|l| l.begin < x.start);
                    let l = launches.get(i).filter(|l| l.begin <= end)?;
                    let j = reads.partition_point(|r| r.0 < x.start);
                    let read = reads.get(j).filter(|r| r.1 <= end)?;
                    launch_columns(x.start, end, l, *read)
                })
                .collect()
        };
        println!(
            "| group | requests with their launch read | {} |",
            LAUNCH_COLUMNS.join(" | ")
        );
        println!("| --- | ---: |{}", " ---: |".repeat(LAUNCH_COLUMNS.len()));
        for (name, g) in [("p45-p55", mid), ("slowest 1%", slow)] {
            let rows = cut(g);
            let cols: Vec<String> = (0..LAUNCH_COLUMNS.len())
                .map(|c| {
                    let m = rows.iter().map(|r| r[c]).sum::<f64>() / rows.len().max(1) as f64;
                    format!("{m:.1}")
                })
                .collect();
            println!(
                "| {name} | {} of {} | {} |",
                rows.len(),
                g.len(),
                cols.join(" | ")
            );
        }
    }
}

/// The columns of a request cut at its GPU segment's launch (µs, polls counted). Those not in
/// parentheses nor about the polls add up to the latency.
const LAUNCH_COLUMNS: [&str; 14] = [
    "submit -> launch begins",
    "(of which the probe reading the previous launch)",
    "launch call (cuGraphLaunch)",
    "probe's 2 event records",
    "launch returns -> device reaches the start event",
    "device: start -> end event",
    "device end -> worker sees it done",
    "(that worker's gap between polls before it saw)",
    "launch returns -> first completion poll",
    "completion polls (count)",
    "(host time inside them)",
    "seen -> read node starts",
    "read output node",
    "read end -> client returns",
];

/// `b - a` in µs, negative when `b` is earlier.
fn us_from(a: Instant, b: Instant) -> f64 {
    match b.checked_duration_since(a) {
        Some(d) => d.as_secs_f64() * 1e6,
        None => -(a - b).as_secs_f64() * 1e6,
    }
}

/// One request (`start` to `end`, the client's clock) cut at its launch `l`.
fn launch_columns(
    start: Instant,
    end: Instant,
    l: &LaunchRecord,
    (read_start, read_end): (Instant, Instant),
) -> Option<[f64; LAUNCH_COLUMNS.len()]> {
    let (seen, first_poll) = (l.seen?, l.first_poll?);
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    Some([
        us_from(start, l.begin),
        us(l.read_before),
        us(l.launch_call),
        us(l.record_calls),
        us_from(l.launched, l.device_start),
        us_from(l.device_start, l.device_end),
        us_from(l.device_end, seen),
        us(l.gap_before_seen),
        us_from(l.launched, first_poll),
        f64::from(l.polls),
        us(l.poll_time),
        us_from(seen, read_start),
        us_from(read_start, read_end),
        us_from(read_end, end),
    ])
}

/// The host's CPU time so far, from /proc/stat (ms summed over its cores; zero where it cannot
/// be read): `busy` on the process's and others' threads (user, nice, system, irq, softirq),
/// `steal` runnable while the hypervisor ran something else, and of that `high_steal` on the
/// cores the latency-critical client's requests run on (`placement::high_path_cores`).
#[derive(Clone, Copy)]
struct CpuTime {
    busy_ms: u64,
    steal_ms: u64,
    high_steal_ms: u64,
    ipis: Ipis,
    /// Stalls injected so far (`--inject-stalls`), ms over their cores.
    stalls_ms: f64,
}

/// Inter-processor interrupts the host's cores took so far (`/proc/interrupts`, x86's rows;
/// zero elsewhere). A TLB shootdown's sender waits until every core it targets answers, so one
/// on a core the hypervisor has stopped stalls the sender until that core runs again.
#[derive(Clone, Copy, Default)]
struct Ipis {
    tlb_shootdowns: u64,
    function_calls: u64,
}

impl Ipis {
    fn now() -> Self {
        let text = std::fs::read_to_string("/proc/interrupts").unwrap_or_default();
        let row = |name: &str| -> u64 {
            text.lines()
                .find_map(|l| l.trim_start().strip_prefix(name))
                .map(|rest| {
                    rest.split_whitespace()
                        .map_while(|t| t.parse::<u64>().ok())
                        .sum()
                })
                .unwrap_or(0)
        };
        Ipis {
            tlb_shootdowns: row("TLB:"),
            function_calls: row("CAL:"),
        }
    }

    fn since(self, earlier: Ipis) -> Ipis {
        Ipis {
            tlb_shootdowns: self.tlb_shootdowns.saturating_sub(earlier.tlb_shootdowns),
            function_calls: self.function_calls.saturating_sub(earlier.function_calls),
        }
    }

    fn add(&mut self, more: Ipis) {
        self.tlb_shootdowns += more.tlb_shootdowns;
        self.function_calls += more.function_calls;
    }
}

impl CpuTime {
    fn now() -> Self {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let ticks = |line: &str| -> Vec<u64> {
            line.split_whitespace()
                .skip(1)
                .map(|t| t.parse().unwrap_or(0))
                .collect()
        };
        let at = |t: &[u64], i: usize| t.get(i).copied().unwrap_or(0);
        let all = ticks(stat.lines().next().unwrap_or_default());
        let high = placement::high_path_cores();
        let high_steal: u64 = stat
            .lines()
            .filter_map(|l| {
                let (name, _) = l.split_once(' ')?;
                let core: usize = name.strip_prefix("cpu")?.parse().ok()?;
                high.contains(&core).then(|| at(&ticks(l), 7))
            })
            .sum();
        // USER_HZ is 100 on Linux: a tick is 10 ms.
        CpuTime {
            busy_ms: (at(&all, 0) + at(&all, 1) + at(&all, 2) + at(&all, 5) + at(&all, 6)) * 10,
            steal_ms: at(&all, 7) * 10,
            high_steal_ms: high_steal * 10,
            ipis: Ipis::now(),
            stalls_ms: stalls::injected_ms(),
        }
    }
}

/// A phase's CPU time, summed over its slices: wall ms, the host's busy and stolen ms.
#[derive(Clone, Copy, Default)]
struct PhaseCpu {
    wall_ms: f64,
    busy_ms: u64,
    steal_ms: u64,
    high_steal_ms: u64,
    ipis: Ipis,
    stalls_ms: f64,
}

impl PhaseCpu {
    /// Runs `f`, adding its wall time and the host's CPU time meanwhile.
    fn time<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let (c0, t0) = (CpuTime::now(), Instant::now());
        let r = f();
        let c1 = CpuTime::now();
        self.wall_ms += t0.elapsed().as_secs_f64() * 1e3;
        self.busy_ms += c1.busy_ms.saturating_sub(c0.busy_ms);
        self.steal_ms += c1.steal_ms.saturating_sub(c0.steal_ms);
        self.high_steal_ms += c1.high_steal_ms.saturating_sub(c0.high_steal_ms);
        self.ipis.add(c1.ipis.since(c0.ipis));
        self.stalls_ms += c1.stalls_ms - c0.stalls_ms;
        r
    }

    /// TLB shootdowns and function-call IPIs per second of the phase, as "tlb, calls" in k/s.
    fn ipi_rates(&self) -> String {
        let per_s = |n: u64| n as f64 / self.wall_ms.max(1.0);
        format!(
            "{:.1}, {:.1}",
            per_s(self.ipis.tlb_shootdowns),
            per_s(self.ipis.function_calls)
        )
    }

    /// Cores busy on average over the phase.
    fn cores_busy(&self) -> f64 {
        self.busy_ms as f64 / self.wall_ms.max(1.0)
    }
}

/// A run's requests slower than 500 µs: how many, in how many distinct 10 ms windows of their
/// starts (few windows for many requests: stalls that hit whatever was in flight), the slowest.
struct SlowRequests {
    count: usize,
    windows: usize,
    max_us: f64,
}

impl SlowRequests {
    fn of(run: &Run) -> Self {
        let first = run.starts.first().copied();
        let mut windows: Vec<u128> = (run.lat.iter().zip(&run.starts))
            .filter(|(l, _)| l.as_micros() > 500)
            .map(|(_, &t)| first.map_or(0, |f| t.duration_since(f).as_millis() / 10))
            .collect();
        let count = windows.len();
        windows.dedup();
        let max_us = run.lat.iter().max().map_or(0.0, |d| d.as_secs_f64() * 1e6);
        SlowRequests {
            count,
            windows: windows.len(),
            max_us,
        }
    }
}

impl std::fmt::Display for SlowRequests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}, {:.0})", self.count, self.windows, self.max_us)
    }
}

/// The priority scenario `a.rounds` times for each batch size: the high client's p50, p99 and
/// p99.9 alone and loaded, the ratio, and the batch's requests/s loaded over alone.
pub(super) fn priority_rounds<T: Elem>(
    pool: &GpuPool,
    devices: (&GpuDevice, &GpuDevice),
    a: &Args,
    out: &mut Vec<Value>,
) where
    CudaBlas: Gemm<T>,
{
    let most = a.batch_clients.iter().copied().max().unwrap_or(8);
    let b = Bench::<T>::new(pool, devices, most, a);
    if a.slices > 1 {
        println!(
            "each phase in {} slices of {:.3} s, alternated",
            a.slices,
            a.seconds / f64::from(a.slices)
        );
    }
    println!("| dtype | batch clients | round | alone p50 | alone p99 | alone p99.9 | loaded p50 | loaded p99 | loaded p99.9 | p99 loaded/alone | batch req/s loaded/alone | alone > 500 µs (10 ms windows, max µs) | loaded > 500 µs (windows, max) | steal ms alone / loaded (of which on the high path's cores) | batch kept, slices' range | cores busy alone / loaded | TLB shootdowns, function-call IPIs k/s alone / loaded | stalls injected ms alone / loaded |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- | --- | --- | --- | --- |");
    for &batch in &a.batch_clients {
        for round in 1..=a.rounds {
            let r = sliced_round(&b, pool, batch, a);
            let ratio = r.loaded.pct(0.99) / r.alone.pct(0.99);
            let kept = r.loaded_batch.rps() / r.batch_alone.rps();
            let (kept_lo, kept_hi) = r.kept_range();
            println!(
                "| {} | {batch} | {round} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {ratio:.3} | {kept:.3} | {} | {} | {} / {} ({} / {}) | {kept_lo:.2}-{kept_hi:.2} | {:.1} / {:.1} | {} / {} | {:.0} / {:.0} |",
                T::NAME,
                r.alone.pct(0.5),
                r.alone.pct(0.99),
                r.alone.pct(0.999),
                r.loaded.pct(0.5),
                r.loaded.pct(0.99),
                r.loaded.pct(0.999),
                SlowRequests::of(&r.alone),
                SlowRequests::of(&r.loaded),
                r.cpu_alone.steal_ms,
                r.cpu_loaded.steal_ms,
                r.cpu_alone.high_steal_ms,
                r.cpu_loaded.high_steal_ms,
                r.cpu_alone.cores_busy(),
                r.cpu_loaded.cores_busy(),
                r.cpu_alone.ipi_rates(),
                r.cpu_loaded.ipi_rates(),
                r.cpu_alone.stalls_ms,
                r.cpu_loaded.stalls_ms,
            );
            let v = json!({"impl": "boundpool", "scenario": "priority_round", "dtype": T::NAME,
                "batch_clients": batch, "round": round, "slices": a.slices,
                "high_alone_p50_us": r.alone.pct(0.5), "high_alone_p99_us": r.alone.pct(0.99),
                "high_loaded_p50_us": r.loaded.pct(0.5), "high_loaded_p99_us": r.loaded.pct(0.99),
                "batch_rps": r.loaded_batch.rps(), "batch_alone_rps": r.batch_alone.rps(),
                "batch_kept_by_slice": r.kept_by_slice,
                "steal_ms_alone": r.cpu_alone.steal_ms, "steal_ms_loaded": r.cpu_loaded.steal_ms,
                "high_path_steal_ms_alone": r.cpu_alone.high_steal_ms, "high_path_steal_ms_loaded": r.cpu_loaded.high_steal_ms,
                "cores_busy_alone": r.cpu_alone.cores_busy(), "cores_busy_loaded": r.cpu_loaded.cores_busy(),
                "tlb_shootdowns_alone": r.cpu_alone.ipis.tlb_shootdowns, "tlb_shootdowns_loaded": r.cpu_loaded.ipis.tlb_shootdowns,
                "function_call_ipis_alone": r.cpu_alone.ipis.function_calls, "function_call_ipis_loaded": r.cpu_loaded.ipis.function_calls,
                "stalls_ms_alone": r.cpu_alone.stalls_ms, "stalls_ms_loaded": r.cpu_loaded.stalls_ms});
            line(&v, a.json);
            out.push(v);
        }
    }
}

/// One round of the priority scenario: the high client alone and loaded, the batch alone and
/// loaded, the host's CPU time over the high client's alone and the loaded phases, and the
/// batch's requests/s loaded over alone in each slice.
struct Round {
    alone: Run,
    batch_alone: Run,
    loaded_batch: Run,
    loaded: Run,
    cpu_alone: PhaseCpu,
    cpu_loaded: PhaseCpu,
    kept_by_slice: Vec<f64>,
}

impl Round {
    /// The lowest and the highest slice's batch requests/s loaded over alone.
    fn kept_range(&self) -> (f64, f64) {
        let lo = self
            .kept_by_slice
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min);
        let hi = self.kept_by_slice.iter().copied().fold(0.0, f64::max);
        (lo, hi)
    }
}

/// One round beside `batch` clients, its three phases cut into `a.slices` and alternated. The
/// batch-alone and the loaded phases swap places every other slice, so that whatever warms up
/// behind the phase before (the GPU's clocks, the workers' spin) favours neither.
fn sliced_round<T: Elem>(b: &Bench<T>, pool: &GpuPool, batch: usize, a: &Args) -> Round
where
    CudaBlas: Gemm<T>,
{
    let part = a.seconds / f64::from(a.slices);
    let mut r = Round {
        alone: Run::empty(),
        batch_alone: Run::empty(),
        loaded_batch: Run::empty(),
        loaded: Run::empty(),
        cpu_alone: PhaseCpu::default(),
        cpu_loaded: PhaseCpu::default(),
        kept_by_slice: Vec::new(),
    };
    for slice in 0..a.slices {
        let alone = r
            .cpu_alone
            .time(|| b.serve(pool, 0, false, true, part, None).1);
        r.alone.extend(alone.expect("high"));
        let batch_alone = |r: &mut Round| {
            let run = b.serve(pool, batch, false, false, part, None).0;
            let rps = run.rps();
            r.batch_alone.extend(run);
            rps
        };
        let loaded = |r: &mut Round| {
            let (lb, l) = r
                .cpu_loaded
                .time(|| b.serve(pool, batch, false, true, part, None));
            let rps = lb.rps();
            r.loaded_batch.extend(lb);
            r.loaded.extend(l.expect("high"));
            rps
        };
        let (alone_rps, loaded_rps) = if slice % 2 == 0 {
            let first = batch_alone(&mut r);
            (first, loaded(&mut r))
        } else {
            let first = loaded(&mut r);
            (batch_alone(&mut r), first)
        };
        r.kept_by_slice.push(loaded_rps / alone_rps);
    }
    r
}

/// The probe: the high client alone, then beside each batch size, its requests' host
/// counters read around each.
pub(super) fn probe<T: Elem>(pool: &GpuPool, devices: (&GpuDevice, &GpuDevice), a: &Args)
where
    CudaBlas: Gemm<T>,
{
    let most = a.batch_clients.iter().copied().max().unwrap_or(8);
    let b = Bench::<T>::new(pool, devices, most, a);
    let launches = &b.high.replay;
    for batch in std::iter::once(0).chain(a.batch_clients.iter().copied()) {
        let p = TailProbe::new();
        // On afresh for each run: a new clock reference, at the warm-up's first launch.
        launches.probe_launches(true);
        b.high.reads.record(true);
        let _ = b.serve(pool, batch, false, true, a.seconds, Some(&p));
        launches.probe_launches(false);
        b.high.reads.record(false);
        p.attribute(launches.take_launch_records(), b.high.reads.take());
        match batch {
            0 => p.report(&format!("{} alone", T::NAME)),
            _ => p.report(&format!("{} beside {batch} batch clients", T::NAME)),
        }
    }
}

/// The phases a served request is cut into from the timeline.
pub(super) const PHASES: [&str; 10] = [
    "submit -> first node",
    "stage input node",
    "stage end -> segment node start",
    "segment node (launch)",
    "launch end -> device start",
    "segment on the device",
    "device end -> read node start",
    "read output node",
    "read end -> client returns",
    "total (client)",
];

/// Each window's (a request's submit to its return, ns since the trace's epoch) phases, µs,
/// from the slices of graph `graph` (its nodes, its segment's node and GPU span); windows
/// whose slices are not all found are left out.
pub(super) fn cut_phases(
    tr: &boundpool::Trace,
    windows: &[(u64, u64)],
    graph: &str,
) -> Vec<[f64; PHASES.len()]> {
    let segment = format!("{graph} segment 1");
    let mut slices: Vec<&boundpool::TraceSlice> = tr.slices.iter().collect();
    slices.sort_by_key(|s| s.start_ns);
    let mut rows = Vec::new();
    for &w in windows {
        let from = slices.partition_point(|s| s.start_ns < w.0);
        let to = slices.partition_point(|s| s.start_ns <= w.1);
        let inside = &slices[from..to];
        let gpu = |s: &boundpool::TraceSlice| tr.tracks[s.track].name.starts_with("GPU");
        let node = |n: &str| {
            inside
                .iter()
                .find(|s| s.name == n && s.graph == graph && !gpu(s))
                .map(|s| (s.start_ns, s.end_ns))
        };
        let seg = inside
            .iter()
            .find(|s| s.name == segment && !gpu(s))
            .map(|s| (s.start_ns, s.end_ns));
        let dev = inside
            .iter()
            .find(|s| s.name == segment && gpu(s))
            .map(|s| (s.start_ns, s.end_ns));
        let first = inside
            .iter()
            .filter(|s| s.graph == graph && matches!(s.kind, boundpool::SliceKind::Node { .. }))
            .map(|s| s.start_ns)
            .min();
        let (Some(st), Some(sg), Some(dv), Some(rd), Some(f)) =
            (node("stage input"), seg, dev, node("read output"), first)
        else {
            continue;
        };
        let us = |a: u64, b: u64| b.saturating_sub(a) as f64 / 1e3;
        rows.push([
            us(w.0, f),
            us(st.0, st.1),
            us(st.1, sg.0),
            us(sg.0, sg.1),
            us(sg.1, dv.0),
            us(dv.0, dv.1),
            us(dv.1, rd.0),
            us(rd.0, rd.1),
            us(rd.1, w.1),
            us(w.0, w.1),
        ]);
    }
    rows
}

/// The high client alone and beside each batch size on a traced pool (short runs: the trace
/// holds every node), its requests cut into phases: the median request against the slowest 1%.
pub(super) fn traced<T: Elem>(pool: &GpuPool, devices: (&GpuDevice, &GpuDevice), a: &Args)
where
    CudaBlas: Gemm<T>,
{
    let most = a.batch_clients.iter().copied().max().unwrap_or(8);
    let b = Bench::<T>::new(pool, devices, most, a);
    let graph = format!("serve {} high", T::NAME);
    for batch in std::iter::once(0).chain(a.batch_clients.iter().copied()) {
        let _ = b.serve(pool, batch, false, true, 0.2, None);
        let epoch = pool.take_trace().epoch;
        let probe = TailProbe::windows(epoch);
        let _ = b.serve(pool, batch, false, true, a.seconds.min(1.0), Some(&probe));
        let tr = pool.take_trace();
        let windows = probe.windows.into_inner().unwrap();
        let mut rows = cut_phases(&tr, &windows, &graph);
        rows.sort_by(|x, y| x[9].total_cmp(&y[9]));
        let n = rows.len();
        println!(
            "{} high client beside {batch} batch clients, traced: {n} of {} requests cut ({} slices dropped by the window)",
            T::NAME,
            windows.len(),
            tr.dropped
        );
        if n < 100 {
            continue;
        }
        let mean = |g: &[[f64; PHASES.len()]], i: usize| {
            g.iter().map(|r| r[i]).sum::<f64>() / g.len() as f64
        };
        let (mid, slow) = (&rows[n * 45 / 100..n * 55 / 100], &rows[n * 99 / 100..]);
        println!("| phase | p45-p55 mean µs | slowest 1% mean µs |");
        println!("| --- | ---: | ---: |");
        for (i, p) in PHASES.iter().enumerate() {
            println!("| {p} | {:.1} | {:.1} |", mean(mid, i), mean(slow, i));
        }
    }
}
