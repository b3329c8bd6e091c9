//! Progress bars for long `run` and `bench` invocations.
//!
//! A bar appears only on a terminal (stderr), only without `--quiet`, and only once the work has
//! taken more than half a second, so short runs print nothing extra. It is redrawn by the caller's
//! own thread (no steady-tick thread: `run` counts the process's OS threads).

use std::future::Future;
use std::io::IsTerminal;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Shows after this long.
const DELAY: Duration = Duration::from_millis(500);

/// A progress bar that may never show.
pub(crate) struct Progress {
    bar: Option<ProgressBar>,
    shown: bool,
    since: Instant,
}

impl Progress {
    /// A bar of `len` steps labelled `what`; disabled when `quiet` or stderr is not a terminal.
    pub(crate) fn new(len: u64, what: &str, quiet: bool) -> Self {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let style = ProgressStyle::with_template(
                "{msg} [{bar:40.cyan/blue}] {percent:>3}% {elapsed_precise} eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::hidden())
                .with_style(style)
                .with_message(what.to_string())
        });
        Progress {
            bar,
            shown: false,
            since: Instant::now(),
        }
    }

    /// Whether a bar may be drawn at all.
    pub(crate) fn enabled(&self) -> bool {
        self.bar.is_some()
    }

    /// Moves the bar to `pos`.
    pub(crate) fn set(&mut self, pos: u64) {
        if let Some(b) = &self.bar {
            if !self.shown && self.since.elapsed() >= DELAY {
                b.set_draw_target(ProgressDrawTarget::stderr());
                self.shown = true;
            }
            b.set_position(pos);
        }
    }

    /// Removes the bar.
    pub(crate) fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Drives `fut` to completion on this thread, calling `tick` about every 100 ms while it is
/// pending. Completion wakes the thread at once, so timing is not blurred by the polling.
pub(crate) fn block_on_with<F: Future>(fut: F, mut tick: impl FnMut()) -> F::Output {
    let mut fut = pin!(fut);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        tick();
        std::thread::park_timeout(Duration::from_millis(100));
    }
}
