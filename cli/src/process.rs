//! This process as Linux's `/proc` shows it: its OS threads (how many, their ids, the calling
//! one's) and its resident memory. `None` (or empty) where `/proc` does not exist.

use std::collections::HashSet;

/// The number of OS threads of this process, counted from `/proc/self/task`.
pub(crate) fn os_threads() -> Option<usize> {
    std::fs::read_dir("/proc/self/task").ok().map(|d| d.count())
}

/// The ids of this process's OS threads (`/proc/self/task`).
pub(crate) fn thread_ids() -> HashSet<u32> {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|t| t.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The calling thread's OS id (`/proc/thread-self` links to `PID/task/TID`).
pub(crate) fn current_tid() -> Option<u32> {
    std::fs::read_link("/proc/thread-self")
        .ok()?
        .file_name()?
        .to_str()?
        .parse()
        .ok()
}

/// Resident memory of this process (`VmRSS` of `/proc/self/status`), in bytes.
pub(crate) fn rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}
