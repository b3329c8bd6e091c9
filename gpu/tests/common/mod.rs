//! Shared helpers of the GPU tests.
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use boundpool_gpu::{
    builtin, BoxError, DeviceBuffer, Devices, GpuCtx, GpuPool, GpuPoolBuilder, Kernel,
    LaunchConfig, Module,
};

/// One GPU test's checks, its name given once. [`GpuTest::start`] at the top of a test:
///
/// * without a GPU the test is skipped, visibly (a `SKIPPED` line on the real stderr), or fails
///   when `BOUNDPOOL_REQUIRE_GPU=1`;
/// * a watchdog aborts the process if the test runs past its limit (a hang is a failure);
/// * when the guard is dropped at the test's end (after the test's own locals, its pool
///   included), it asserts that no framework driver call was made with the wrong or no context
///   (not while the test is already panicking).
#[must_use = "bind it (`let Some(_t) = ... else { return }`): its drop ends the test's checks"]
pub struct GpuTest {
    name: &'static str,
    check_context: bool,
    _watchdog: Watchdog,
}

impl GpuTest {
    /// Starts test `name` with a watchdog of `secs` seconds; `None` without a GPU (the test
    /// returns: skipped).
    pub fn start(name: &'static str, secs: u64) -> Option<GpuTest> {
        Self::begin(name, secs, true)
    }

    /// As [`start`](Self::start), without the context check at the end: for the tests that
    /// check no driver calls (a pool whose start fails, a state made and dropped on workers).
    pub fn start_without_context_check(name: &'static str, secs: u64) -> Option<GpuTest> {
        Self::begin(name, secs, false)
    }

    fn begin(name: &'static str, secs: u64, check_context: bool) -> Option<GpuTest> {
        if !gpu_or_skip(name) {
            return None;
        }
        Some(GpuTest {
            name,
            check_context,
            _watchdog: watchdog(name, secs),
        })
    }
}

impl Drop for GpuTest {
    fn drop(&mut self) {
        if self.check_context && !std::thread::panicking() {
            assert_no_wrong_context(self.name);
        }
    }
}

/// Writes `line` to the process's real stderr. The test harness captures what `print!` and
/// `eprint!` write (and shows it only for a failed test), not writes to the stderr handle, so a
/// skip written here shows in a plain `cargo test` run.
pub fn uncaptured_notice(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Whether a GPU is usable. Without one: says so on the real stderr (seen in a plain
/// `cargo test` run) and returns false, or panics when `BOUNDPOOL_REQUIRE_GPU=1`.
fn gpu_or_skip(test: &str) -> bool {
    match boundpool_gpu::gpu_unavailable_reason() {
        None => {
            boundpool_gpu::context_check::set_enabled(true);
            true
        }
        Some(why) => {
            if std::env::var("BOUNDPOOL_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                panic!("{test}: BOUNDPOOL_REQUIRE_GPU=1 but no GPU: {why}");
            }
            uncaptured_notice(&format!("SKIPPED {test}: no GPU: {why}"));
            false
        }
    }
}

/// Aborts the process if the returned guard is not dropped within `secs` (a hang is a failure).
///
/// `BOUNDPOOL_WATCHDOG_SCALE` (a whole number, default 1) multiplies the limit: under
/// compute-sanitizer every kernel and driver call is many times slower.
fn watchdog(test: &'static str, secs: u64) -> Watchdog {
    let scale = std::env::var("BOUNDPOOL_WATCHDOG_SCALE")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(1)
        .max(1);
    let secs = secs.saturating_mul(scale);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
            rx.recv_timeout(Duration::from_secs(secs))
        {
            // The harness's capture is lost when the process aborts.
            uncaptured_notice(&format!("{test}: HUNG for {secs} s, aborting"));
            std::process::abort();
        }
    });
    Watchdog(Some(tx))
}

struct Watchdog(Option<std::sync::mpsc::Sender<()>>);
impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// Asserts that no framework driver call so far was made with the wrong or no context.
fn assert_no_wrong_context(test: &str) {
    let wrong = boundpool_gpu::context_check::wrong_context_calls();
    let checked = boundpool_gpu::context_check::checked_calls();
    eprintln!("{test}: context check: {checked} driver calls checked, {wrong} wrong");
    assert!(checked > 0, "{test}: context checking did not run");
    assert_eq!(
        wrong,
        0,
        "{test}: driver calls with the wrong context: {:?}",
        boundpool_gpu::context_check::wrong_context_samples()
    );
}

/// Full error chain as one string.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(" <- ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// OS threads of this process.
pub fn os_threads() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("Threads:")
                    .map(|v| v.trim().parse().unwrap_or(0))
            })
        })
        .unwrap_or(0)
}

/// The built-in kernels `bp_set_i64`, `bp_add_i64` and `bp_spin`.
pub fn set_add_spin() -> (Kernel, Kernel, Kernel) {
    let m = Module::builtin();
    (
        m.kernel(builtin::SET_I64).unwrap(),
        m.kernel(builtin::ADD_I64).unwrap(),
        m.kernel(builtin::SPIN).unwrap(),
    )
}

/// A node body's GPU work: spin `cycles`, then a new one-element buffer set to `value` plus each
/// input's value. `inputs` is read lazily, one input before its add (after the spin and the set
/// are enqueued), as a body reading `ctx.input` in the loop would.
pub fn spin_set_add<'n, E>(
    ctx: &GpuCtx<'_, 'n>,
    (set, add, spin): (&Kernel, &Kernel, &Kernel),
    cycles: i64,
    value: i64,
    inputs: impl IntoIterator<Item = Result<&'n DeviceBuffer<i64>, E>>,
) -> Result<DeviceBuffer<i64>, BoxError>
where
    BoxError: From<E>,
{
    let mut out = ctx.alloc::<i64>(1)?;
    // SAFETY: kernels get the argument types they declare; buffers are node outputs, which
    // outlive the graph's GPU work.
    unsafe {
        ctx.launch(spin, LaunchConfig::single())
            .arg(cycles)
            .launch()?;
        ctx.launch(set, LaunchConfig::single())
            .arg(&mut out)
            .arg(value)
            .launch()?;
        for src in inputs {
            let src = src?;
            ctx.launch(add, LaunchConfig::single())
                .arg(&mut out)
                .arg(src)
                .launch()?;
        }
    }
    Ok(out)
}

/// The replay tests' pool: `workers` workers on device 0 and one host worker.
pub fn replay_pool(workers: usize) -> GpuPool {
    GpuPoolBuilder::new()
        .name("replay")
        .devices(Devices::List(vec![0]))
        .workers_per_device(workers)
        .host_workers(1, boundpool_scheduler::Cores::Unpinned)
        .build()
        .expect("GPU pool")
}
