//! NVTX ranges around GPU node bodies (feature `nvtx`), through cudarc's bindings.

use std::sync::OnceLock;

/// Whether libnvToolsExt loads (checked once; without it no range is pushed).
fn present() -> bool {
    static P: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to load the library by name; calls nothing in it.
    *P.get_or_init(|| unsafe { cudarc::nvtx::sys::is_culib_present() })
}

/// A range named `node (graph)` on the calling worker's thread, popped when dropped; `None`
/// where the library is missing.
pub(crate) fn node_range(node: &str, graph: &str) -> Option<cudarc::nvtx::safe::Range> {
    if !present() {
        return None;
    }
    // NVTX takes C strings: a NUL in a name would end it early; it becomes a space.
    let name = format!("{node} ({graph})").replace('\0', " ");
    Some(cudarc::nvtx::safe::scoped_range(name))
}
