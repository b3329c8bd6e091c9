//! What the submitters count and the checks that find violations: every output against the
//! host's sum, every injected fault's error against its kind and node.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use boundpool::{bounded, ErrorKind, GraphOutput};

use super::graphs::Shape;

/// Figures every submitter adds to.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) graphs: AtomicU64,
    pub(super) nodes: AtomicU64,
    pub(super) ok: AtomicU64,
    pub(super) errors: AtomicU64,
    pub(super) panics: AtomicU64,
    pub(super) cancels: AtomicU64,
    pub(super) cancelled: AtomicU64,
    pub(super) nested: AtomicU64,
    pub(super) dropped: AtomicU64,
    pub(super) gpu_graphs: AtomicU64,
    pub(super) foreign_buffer_drops: AtomicU64,
    /// GPU nodes run through cudarc's types (`spin_set_add_cudarc`).
    pub(super) cudarc_nodes: AtomicU64,
    pub(super) violations: AtomicU64,
    pub(super) messages: Mutex<Vec<String>>,
}

impl Tally {
    pub(super) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
    pub(super) fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
    pub(super) fn violation(&self, m: String) {
        self.violations.fetch_add(1, Ordering::Relaxed);
        let mut ms = self.messages.lock().unwrap_or_else(|p| p.into_inner());
        if ms.len() < bounded::LIST_ITEMS {
            ms.push(bounded::clip_message(m));
        }
    }
}

/// Checks outputs against the host's sums; `wrong` makes the checker expect a wrong value
/// (the hidden `--inject-wrong-value` flag, to show that a violation is caught).
pub(super) fn check_values(
    tally: &Tally,
    what: &str,
    shape: &Shape,
    got: impl Fn(usize) -> Option<u64>,
    wrong: bool,
) {
    let mut want = shape.expected();
    if wrong {
        want[0] = want[0].wrapping_add(1);
    }
    for (i, w) in want.iter().enumerate() {
        match got(i) {
            Some(v) if v == *w => {}
            Some(v) => {
                return tally.violation(format!("{what}: node n{i} gave {v}, expected {w}"));
            }
            None => return tally.violation(format!("{what}: node n{i} has no output")),
        }
    }
}

/// Checks that a graph made to fail at `n{at}` failed with `kind`, naming that node.
pub(super) fn check_failure(
    tally: &Tally,
    what: &str,
    res: Result<GraphOutput, boundpool::Error>,
    kind: ErrorKind,
    names: &[String],
) {
    match res {
        Ok(_) => tally.violation(format!("{what}: succeeded, but a node was made to fail")),
        Err(e) if e.kind() != kind => tally.violation(format!(
            "{what}: failed as {:?}, expected {kind:?}: {e}",
            e.kind()
        )),
        Err(e) => {
            let text = e.to_string();
            for n in names {
                if !text.contains(&format!("node '{n}'")) {
                    tally.violation(format!(
                        "{what}: the error does not name node '{n}': {text}"
                    ));
                }
            }
        }
    }
}
