//! Stalls injected on chosen cores (`bench_serve --inject-stalls WHERE:MS:PER_S`,
//! `bench_isolation --stall MS:PER_S`): on each chosen core a thread at `SCHED_FIFO` priority
//! spins for MS ms at random instants (exponential gaps), PER_S times a second on average, for
//! the whole run ([`set_active`] turns the stalls off and on). The threads placed on those
//! cores are held off them meanwhile, as the hypervisor's steal holds off a vCPU, but at a rate
//! and on cores the bench chooses.
//!
//! What it tells apart: a thread held off while it holds a user-space lock (the driver's, the
//! allocator's, one of the pool's) holds up that lock's other takers here as under steal; but
//! unlike a stopped vCPU, a core running the stall still answers interrupts (a TLB shootdown
//! aimed at it returns at once) and the kernel never holds a thread off inside one of its own
//! spinlocks. So a tail that grows with stalls on the batch's cores in the loaded phases only
//! comes from something the high client shares with the batch in user space; one that does
//! not, while steal on the same cores does, from the hypervisor or the kernel.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use boundpool_scheduler::pin_current_thread;

/// Where stalls go: the cores of the batch's workers, of the batch clients, or of the
/// latency-critical client's path (its own and its partition's workers').
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// `batch-workers`: the cores of the workers outside the latency partition.
    BatchWorkers,
    /// `batch-clients`: the batch clients' cores.
    BatchClients,
    /// `high-path`: the latency-critical client's core and its partition's workers'.
    HighPath,
    /// `latency-workers`: the latency partition's workers' cores only.
    LatencyWorkers,
    /// `high-client`: the latency-critical client's core only.
    HighClient,
}

/// A parsed `--inject-stalls WHERE:MS:PER_S`.
#[derive(Clone, Copy, Debug)]
pub struct StallSpec {
    /// Where the stalls go.
    pub place: Place,
    stall: Duration,
    per_s: f64,
}

/// `WHERE:MS:PER_S`, WHERE one of `batch-workers`, `batch-clients`, `high-path`,
/// `latency-workers`, `high-client`.
pub fn parse(s: &str) -> Result<StallSpec, String> {
    let parts: Vec<&str> = s.split(':').collect();
    let [place, ms, per_s] = parts[..] else {
        return Err(format!("`{s}` is not WHERE:MS:PER_S"));
    };
    let place = match place {
        "batch-workers" => Place::BatchWorkers,
        "batch-clients" => Place::BatchClients,
        "high-path" => Place::HighPath,
        "latency-workers" => Place::LatencyWorkers,
        "high-client" => Place::HighClient,
        _ => {
            return Err(format!(
                "`{place}` is none of batch-workers, batch-clients, high-path, latency-workers, high-client"
            ))
        }
    };
    let ms: f64 = ms
        .parse()
        .map_err(|_| format!("`{ms}` is not a number of ms"))?;
    let per_s: f64 = per_s
        .parse()
        .map_err(|_| format!("`{per_s}` is not a number of stalls a second"))?;
    if !(ms > 0.0 && ms <= 100.0) {
        return Err(format!("a stall of {ms} ms: give one of (0, 100] ms"));
    }
    if !(per_s > 0.0 && ms * per_s <= 200.0) {
        return Err(format!(
            "{per_s} stalls of {ms} ms a second: give a positive rate that holds a core at most 20% of the time"
        ));
    }
    Ok(StallSpec {
        place,
        stall: Duration::from_secs_f64(ms / 1e3),
        per_s,
    })
}

impl StallSpec {
    /// One stall's length, ms.
    pub fn stall_ms(&self) -> f64 {
        self.stall.as_secs_f64() * 1e3
    }
}

/// Nanoseconds of stalls run so far, over every core.
static INJECTED_NS: AtomicU64 = AtomicU64::new(0);
static STARTED: OnceLock<()> = OnceLock::new();
/// Off: the stall threads skip their stalls (they still wake at the same instants).
static ACTIVE: AtomicBool = AtomicBool::new(true);

/// Turns the stalls on or off (on from [`start`]); a stall under way runs to its end.
pub fn set_active(on: bool) {
    ACTIVE.store(on, Ordering::Relaxed);
}

/// Milliseconds of stalls run so far, over every core (0 where none are injected).
pub fn injected_ms() -> f64 {
    INJECTED_NS.load(Ordering::Relaxed) as f64 / 1e6
}

/// Starts one stall thread on each of `cores` (for the life of the process) and returns once
/// each runs at `SCHED_FIFO`; the error says which core could not have one.
pub fn start(spec: StallSpec, cores: &[usize]) -> Result<(), String> {
    if cores.is_empty() {
        return Err(format!("no cores to stall for {:?}", spec.place));
    }
    if STARTED.set(()).is_err() {
        return Err("stalls are already injected".into());
    }
    let (tx, rx) = mpsc::channel();
    for &core in cores {
        let tx = tx.clone();
        std::thread::Builder::new()
            .name(format!("stall-{core}"))
            .spawn(move || {
                let ready = pin_current_thread(&[core])
                    .map_err(|e| format!("core {core}: {e}"))
                    .and_then(|()| fifo().map_err(|e| format!("core {core}: {e}")));
                let ok = ready.is_ok();
                let _ = tx.send(ready);
                if ok {
                    stall_loop(spec, core);
                }
            })
            .map_err(|e| format!("core {core}: a stall thread: {e}"))?;
    }
    drop(tx);
    for r in rx.iter().take(cores.len()) {
        r?;
    }
    println!(
        "stalls injected on {:?} {cores:?}: {:.2} ms at random, {} a second on each (SCHED_FIFO 50)",
        spec.place,
        spec.stall.as_secs_f64() * 1e3,
        spec.per_s
    );
    Ok(())
}

/// Puts the calling thread at `SCHED_FIFO` priority 50, above every thread of the pool and the
/// clients (`SCHED_OTHER`).
fn fifo() -> Result<(), String> {
    let param = libc::sched_param { sched_priority: 50 };
    // SAFETY: `param` is a valid `sched_param` that outlives the call; pid 0 is this thread.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!(
            "sched_setscheduler(SCHED_FIFO): {}",
            std::io::Error::last_os_error()
        ))
    }
}

/// Sleeps an exponential gap of mean `1 / per_s`, spins `stall`, and again, forever.
fn stall_loop(spec: StallSpec, core: usize) {
    let mut rng = XorShift::seeded(core);
    loop {
        let gap = -rng.unit().ln() / spec.per_s;
        std::thread::sleep(Duration::from_secs_f64(gap));
        if !ACTIVE.load(Ordering::Relaxed) {
            continue;
        }
        let t0 = Instant::now();
        while t0.elapsed() < spec.stall {
            std::hint::spin_loop();
        }
        INJECTED_NS.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
}

/// xorshift64*: enough randomness for the stalls' instants, without a dependency.
struct XorShift(u64);

impl XorShift {
    fn seeded(core: usize) -> Self {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        XorShift((t ^ (core as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1)
    }

    /// A uniform draw in (0, 1].
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((x >> 11) + 1) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_are_refused() {
        let s = parse("batch-workers:2:10").expect("a good spec");
        assert_eq!(s.place, Place::BatchWorkers);
        assert_eq!(s.stall, Duration::from_millis(2));
        assert_eq!(
            parse("high-path:0.5:40").expect("good").place,
            Place::HighPath
        );
        assert_eq!(
            parse("latency-workers:2:20").expect("good").place,
            Place::LatencyWorkers
        );
        assert_eq!(
            parse("high-client:2:20").expect("good").place,
            Place::HighClient
        );
        for bad in [
            "batch:2:10",
            "batch-workers:2",
            "batch-workers:x:1",
            "high-path:0:1",
            "high-path:50:10",
        ] {
            assert!(parse(bad).is_err(), "{bad} refused");
        }
    }

    #[test]
    fn unit_draws_stay_in_range() {
        let mut r = XorShift::seeded(3);
        let draws: Vec<f64> = (0..10_000).map(|_| r.unit()).collect();
        assert!(draws.iter().all(|&u| u > 0.0 && u <= 1.0));
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
    }
}
