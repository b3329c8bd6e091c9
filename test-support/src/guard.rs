//! The GPU test guard: skip or fail without a GPU, a watchdog, the context check at the end.

use std::sync::mpsc;
use std::time::Duration;

/// One GPU test's checks, its name given once. [`GpuTest::start`] at the top of a test:
///
/// * without a GPU the test is skipped, visibly (a `SKIPPED` line on the real stderr), or fails
///   when `BOUNDPOOL_REQUIRE_GPU=1`;
/// * a watchdog aborts the process if the test runs past its limit (a hang is a failure);
/// * when the guard is dropped at the test's end (after the test's own locals, its pool
///   included), it asserts that no framework driver call was made with the wrong or no context
///   (not while the test is already panicking).
#[must_use = "bind it (`let Some(_t) = ... else { return }`): its drop ends the test's checks"]
#[derive(Debug)]
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
    /// make no framework driver call in this process (a pool whose start fails, a state made
    /// and dropped on workers, a command line run as a child process).
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
    let (tx, rx) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(Duration::from_secs(secs)) {
            // The harness's capture is lost when the process aborts.
            uncaptured_notice(&format!("{test}: HUNG for {secs} s, aborting"));
            std::process::abort();
        }
    });
    Watchdog(Some(tx))
}

#[derive(Debug)]
struct Watchdog(Option<mpsc::Sender<()>>);

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
