//! Shared helpers of the GPU tests.
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

/// Writes `line` to the process's real stderr. The test harness captures what `print!` and
/// `eprint!` write (and shows it only for a failed test), not writes to the stderr handle, so a
/// skip written here shows in a plain `cargo test` run.
pub fn uncaptured_notice(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Whether a GPU is usable. Without one: says so on the real stderr (seen in a plain
/// `cargo test` run) and returns false, or panics when `BOUNDPOOL_REQUIRE_GPU=1`.
pub fn gpu_or_skip(test: &str) -> bool {
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
pub fn watchdog(test: &'static str, secs: u64) -> Watchdog {
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

pub struct Watchdog(Option<std::sync::mpsc::Sender<()>>);
impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// Asserts that no framework driver call so far was made with the wrong or no context.
pub fn assert_no_wrong_context(test: &str) {
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
