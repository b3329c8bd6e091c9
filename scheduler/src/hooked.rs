//! Which pool's spin hook this thread is running, if any (a leaf): a `Completer` called there
//! queues its completion for this very worker, which looks at the queues as soon as the hook
//! returns, so no peer is woken for it (`Registry::push_external`).

use std::cell::Cell;

thread_local! {
    /// The registry's address and the worker's group, while the worker runs its spin hook.
    static IN_SPIN_HOOK: Cell<Option<(usize, usize)>> = const { Cell::new(None) };
}

/// Marks this thread as a worker of `registry` (by address), group `group`, running its spin
/// hook, until dropped (also when the hook unwinds).
pub(crate) struct SpinHookGuard(());

impl SpinHookGuard {
    pub(crate) fn enter(registry: usize, group: usize) -> Self {
        IN_SPIN_HOOK.with(|c| c.set(Some((registry, group))));
        SpinHookGuard(())
    }
}

impl Drop for SpinHookGuard {
    fn drop(&mut self) {
        IN_SPIN_HOOK.with(|c| c.set(None));
    }
}

/// The group of this thread's worker if it runs the spin hook of the pool whose registry is
/// at `registry`.
pub(crate) fn spin_hook_group(registry: usize) -> Option<usize> {
    IN_SPIN_HOOK
        .with(Cell::get)
        .and_then(|(r, g)| (r == registry).then_some(g))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_names_one_pool_and_ends_with_its_guard() {
        assert_eq!(spin_hook_group(8), None);
        {
            let _g = SpinHookGuard::enter(8, 3);
            assert_eq!(spin_hook_group(8), Some(3));
            assert_eq!(
                spin_hook_group(16),
                None,
                "another pool's push wakes as before"
            );
        }
        assert_eq!(spin_hook_group(8), None);
    }
}
