//! The stall injector holds a thread placed on its core off that core for a whole stall: a
//! thread pinned beside it sees a gap between two of its clock reads as long as the stall,
//! where two threads sharing a core under the ordinary scheduler take turns of a few ms.

use std::time::{Duration, Instant};

use boundpool_bench::stalls::{self, Place};
use boundpool_scheduler::pin_current_thread;

/// The stall's length; the ordinary scheduler's turns are far shorter.
const STALL_MS: f64 = 20.0;

#[test]
fn a_stall_holds_the_core_for_its_whole_length() {
    let core = std::thread::available_parallelism().map_or(1, |n| n.get()) - 1;
    let spec = stalls::parse(&format!("high-path:{STALL_MS}:10")).expect("a good spec");
    assert_eq!(spec.place, Place::HighPath);
    // Pinned first: every stall then runs while this thread waits for the same core.
    pin_current_thread(&[core]).expect("pinned where the stall thread goes");
    if let Err(e) = stalls::start(spec, &[core]) {
        assert!(
            e.contains("sched_setscheduler"),
            "only a refused SCHED_FIFO may stop the test: {e}"
        );
        println!("SKIPPED: this machine refuses SCHED_FIFO ({e})");
        return;
    }
    // Read the clock until two stalls have run (10 a second), at most 10 s: the first may have
    // begun before the first read, the second runs wholly inside the reads.
    let (t0, mut last, mut longest) = (Instant::now(), Instant::now(), Duration::ZERO);
    while stalls::injected_ms() < 2.0 * STALL_MS && t0.elapsed() < Duration::from_secs(10) {
        let now = Instant::now();
        longest = longest.max(now - last);
        last = now;
    }
    // The last stall may have ended between the last read and the loop's test.
    longest = longest.max(last.elapsed());
    println!(
        "stalls ran {:.1} ms; the longest gap beside them {longest:?}",
        stalls::injected_ms()
    );
    assert!(
        stalls::injected_ms() >= 2.0 * STALL_MS,
        "two stalls did not run in 10 s ({} ms)",
        stalls::injected_ms()
    );
    assert!(
        longest.as_secs_f64() * 1e3 >= 0.9 * STALL_MS,
        "the longest gap beside the stall thread was {longest:?}, under the {STALL_MS} ms stall"
    );
    assert!(
        stalls::start(spec, &[core]).is_err(),
        "a second start is refused"
    );
}
