//! Every atomic, lock and park the scheduler's protocols use, in one place.
//!
//! Under `--cfg loom` these are loom's model-checked versions, so the dependency
//! counters, the sleep/wake hand-off and the completion protocol can be explored
//! exhaustively by the tests in `tests/loom.rs`-style unit modules (see `loom_models`).
//! The crate's protocols take their atomics, locks, parks and thread handles from here, never
//! from `std::sync` or `std::thread` directly. What loom need not model comes from `std`:
//! `Arc` and `OnceLock` (shared immutable data), the graph builder's process-wide id counter
//! (`graph/builder.rs`), and the unit tests that do not run under loom.

#[cfg(not(loom))]
mod imp {
    pub(crate) use std::sync::atomic::{
        fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
    };
    pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};
    pub(crate) use std::thread::{current as current_thread, park, Thread};

    /// Parks the current thread for at most `dur` (loom has no timed park).
    pub(crate) fn park_timeout(dur: std::time::Duration) {
        std::thread::park_timeout(dur)
    }

    /// Gives up the rest of this time slice.
    pub(crate) fn yield_now() {
        std::thread::yield_now()
    }
}

#[cfg(loom)]
mod imp {
    pub(crate) use loom::sync::atomic::{
        fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
    };
    pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};
    pub(crate) use loom::thread::{current as current_thread, park, Thread};

    /// Under loom a timed park is modelled as a yield: the model must not depend on time.
    pub(crate) fn park_timeout(_dur: std::time::Duration) {
        loom::thread::yield_now()
    }

    /// Gives up the rest of this time slice.
    pub(crate) fn yield_now() {
        loom::thread::yield_now()
    }
}

pub(crate) use imp::*;

/// Asks the cache for the line at `p` (for reading): a hint, which never faults, so `p` may
/// point anywhere (compute it with `wrapping_add`). A no-op off x86-64 and under loom.
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(all(target_arch = "x86_64", not(loom)))]
    // SAFETY: `prefetcht0` reads nothing architecturally and never faults, whatever `p` is.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>())
    };
    #[cfg(not(all(target_arch = "x86_64", not(loom))))]
    let _ = p;
}

/// `n` counters at zero. Outside loom they come from zeroed memory: the allocator hands out
/// untouched pages, so counters that a run never touches (nodes with one predecessor) cost
/// nothing to create.
/// `None` when they cannot be allocated (the caller reports it).
#[cfg(not(loom))]
pub(crate) fn zeroed_counters(n: usize) -> Option<Box<[AtomicU32]>> {
    if n == 0 {
        return Some(Box::new([]));
    }
    let layout = std::alloc::Layout::array::<AtomicU32>(n).ok()?;
    // SAFETY: `layout` has a non-zero size (n > 0).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as *mut AtomicU32;
    if ptr.is_null() {
        return None;
    }
    // SAFETY: an `AtomicU32` has the layout of a `u32`, for which all-zero bits are 0; the
    // memory holds `n` of them and was allocated with the layout `Box<[AtomicU32]>` frees with.
    Some(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, n)) })
}

/// `n` counters at zero (loom's atomics must be constructed).
#[cfg(loom)]
pub(crate) fn zeroed_counters(n: usize) -> Option<Box<[AtomicU32]>> {
    Some((0..n).map(|_| AtomicU32::new(0)).collect())
}

/// `n` zeros, from zeroed memory as [`zeroed_counters`] (the allocator hands out untouched
/// pages, which a build writes once instead of twice); `None` when they cannot be allocated.
pub(crate) fn zeroed_u32s(n: usize) -> Option<Vec<u32>> {
    if n == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u32>(n).ok()?;
    // SAFETY: `layout` has a non-zero size (n > 0).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as *mut u32;
    if ptr.is_null() {
        return None;
    }
    // SAFETY: the memory holds `n` initialised `u32`s (all-zero bits are 0) and was allocated by
    // the global allocator with the layout a `Vec<u32>` of capacity `n` frees it with.
    Some(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

/// Locks `m`, ignoring poisoning: the scheduler's own critical sections never panic while
/// holding a lock, and a node's panic is caught before it can reach one.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// A counter written by one thread only and read by any: a plain load and store instead of
/// a locked read-modify-write, so a worker's statistics cost one ordinary add.
#[derive(Debug)]
pub(crate) struct OwnedCounter(AtomicU64);

impl OwnedCounter {
    pub(crate) fn new() -> Self {
        OwnedCounter(AtomicU64::new(0))
    }

    /// Adds `n`. Only the owning worker may call this.
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }

    /// Sets the value. Only the owning worker may call this.
    #[inline]
    pub(crate) fn set(&self, n: u64) {
        self.0.store(n, Ordering::Relaxed);
    }

    /// Reads the current value from any thread.
    #[inline]
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn counters_that_cannot_be_allocated_are_none() {
        assert_eq!(zeroed_counters(3).map(|c| c.len()), Some(3));
        assert!(zeroed_counters(0).is_some_and(|c| c.is_empty()));
        // Too large for a layout, and too large for any address space (which Miri reports as
        // its own resource exhaustion instead of a null).
        assert!(zeroed_counters(usize::MAX / 2).is_none());
        if !cfg!(miri) {
            assert!(zeroed_counters(1 << 60).is_none());
        }
    }
}
