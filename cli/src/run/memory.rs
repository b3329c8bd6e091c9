//! A graph that cannot fit is refused before anything is allocated: its estimated memory (the
//! library's records, [`estimate_graph_bytes`], and what `run` itself holds per node and edge)
//! against what the machine has for this process (`MemAvailable`, or less where a cgroup or the
//! address-space limit says so). `--size 99999999999999`, a typo, would otherwise grow until
//! the machine runs out.

use std::fmt;
use std::path::{Path, PathBuf};

use boundpool::estimate_graph_bytes;
use boundpool_workloads::Shape;

/// What `run` holds per node besides the library's records: the DAG's name (a `String` and its
/// bytes, up to 16) and busy work, and the check's run count and start and finish numbers.
const RUN_NODE_BYTES: usize = 24 + 16 + 8 + 4 + 8 + 8;
/// Per edge: the DAG's `(from, to)` pair.
const RUN_EDGE_BYTES: usize = 8;

/// The nodes and edges `Dag::shape(shape, size)` makes, counted without making it (a random
/// shape: the most it may have, 4 edges a node).
pub(super) fn shape_counts(shape: Shape, size: usize) -> (usize, usize) {
    match shape {
        Shape::Chain => (size, size.saturating_sub(1)),
        Shape::Tree => {
            // A full binary tree of 2^depth - 1 nodes, depth = floor(log2(size + 1)).
            let depth = usize::BITS - size.saturating_add(1).leading_zeros() - 1;
            let nodes = (1usize << depth) - 1;
            (nodes, nodes.saturating_sub(1))
        }
        Shape::Wide if size < 2 => (size, 0),
        Shape::Wide if size == 2 => (2, 1),
        Shape::Wide => (size, 2 * (size - 2)),
        Shape::Wavefront => {
            let side = (size as f64).sqrt() as usize;
            (
                side.saturating_mul(side),
                side.saturating_mul(side.saturating_sub(1))
                    .saturating_mul(2),
            )
        }
        Shape::Random => (size, size.saturating_sub(1).saturating_mul(4)),
    }
}

/// About how many bytes `run` needs for a graph of `nodes` and `edges` (saturating).
pub(super) fn estimate(nodes: usize, edges: usize) -> usize {
    estimate_graph_bytes(nodes, edges)
        .saturating_add(nodes.saturating_mul(RUN_NODE_BYTES))
        .saturating_add(edges.saturating_mul(RUN_EDGE_BYTES))
}

/// Fails, naming the estimate and the limit, when a graph of `nodes` and `edges` (`what`: how
/// the message names it) needs more than the machine has. Passes where no limit can be read.
pub(super) fn check(what: &str, nodes: usize, edges: usize) -> Result<(), String> {
    let need = estimate(nodes, edges);
    match limit() {
        Some(l) if need as u64 > l.bytes => Err(format!(
            "{what} of {nodes} nodes and {edges} edges needs about {} (estimated), more than the \
             {} this process can have ({}); give a smaller size",
            Bytes(need as u64),
            Bytes(l.bytes),
            l.source
        )),
        _ => Ok(()),
    }
}

/// The memory this process can still have, and where that figure comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Limit {
    bytes: u64,
    source: String,
}

/// The least of `MemAvailable`, each enclosing cgroup's limit less its usage, and the
/// address-space limit less the address space in use; none where none can be read.
fn limit() -> Option<Limit> {
    let read = |p: &Path| std::fs::read_to_string(p).ok();
    let mut limits = Vec::new();
    if let Some(b) = read(Path::new("/proc/meminfo")).and_then(|t| mem_available(&t)) {
        limits.push(Limit {
            bytes: b,
            source: "MemAvailable in /proc/meminfo".into(),
        });
    }
    if let Some(cgroups) = read(Path::new("/proc/self/cgroup")) {
        limits.extend(cgroup_limits(&cgroups, Path::new("/sys/fs/cgroup"), read));
    }
    let limits_text = read(Path::new("/proc/self/limits"));
    let status = read(Path::new("/proc/self/status"));
    if let (Some(max), Some(used)) = (
        limits_text.as_deref().and_then(address_space_limit),
        status.as_deref().and_then(|s| status_kb(s, "VmSize:")),
    ) {
        limits.push(Limit {
            bytes: max.saturating_sub(used),
            source: "the address-space limit (ulimit -v) less the address space in use".into(),
        });
    }
    limits.into_iter().min_by_key(|l| l.bytes)
}

/// `MemAvailable` of /proc/meminfo, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    status_kb(meminfo, "MemAvailable:")
}

/// The figure after `key` in a `/proc` file of `key value kB` lines, in bytes.
fn status_kb(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb.saturating_mul(1024))
}

/// The soft `Max address space` of /proc/self/limits, in bytes (none when unlimited).
fn address_space_limit(limits: &str) -> Option<u64> {
    limits
        .lines()
        .find_map(|l| l.strip_prefix("Max address space"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Limits at or above this are "no limit" (cgroup v1 writes its maximum, 2^63 rounded down to
/// a page, for none).
const NO_LIMIT: u64 = 1 << 62;

/// What each cgroup enclosing this process allows it, from its /proc/self/cgroup lines: a
/// cgroup v2 (`0::PATH`) and each of its ancestors under `root`, its `memory.max` less its
/// `memory.current`; a cgroup v1 memory controller (`N:memory:PATH`, or with others, as
/// `N:cpu,memory:PATH`) under `root/memory`, its `memory.limit_in_bytes` less its
/// `memory.usage_in_bytes`.
fn cgroup_limits(cgroups: &str, root: &Path, read: impl Fn(&Path) -> Option<String>) -> Vec<Limit> {
    let num = |p: PathBuf| -> Option<u64> { read(&p)?.trim().parse().ok() };
    let mut out = Vec::new();
    for line in cgroups.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let (base, max, current) = if controllers.is_empty() {
            (root.to_path_buf(), "memory.max", "memory.current")
        } else if controllers.split(',').any(|c| c == "memory") {
            (
                root.join("memory"),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        } else {
            continue;
        };
        // The cgroup and each of its ancestors: the least of their limits holds.
        let mut dir = base.join(path.trim_start_matches('/'));
        loop {
            if let (Some(m), Some(c)) = (num(dir.join(max)), num(dir.join(current))) {
                if m < NO_LIMIT {
                    out.push(Limit {
                        bytes: m.saturating_sub(c),
                        source: format!("{} less {current}", dir.join(max).display()),
                    });
                }
            }
            if dir == base || !dir.pop() {
                break;
            }
        }
    }
    out
}

/// Bytes in GiB (or TiB, PiB past a thousand of the one below).
struct Bytes(u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gib = self.0 as f64 / (1u64 << 30) as f64;
        match gib {
            g if g >= 1024.0 * 1024.0 => write!(f, "{:.1} PiB", g / (1024.0 * 1024.0)),
            g if g >= 1024.0 => write!(f, "{:.1} TiB", g / 1024.0),
            g => write!(f, "{g:.1} GiB"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use boundpool_workloads::Dag;
    use std::collections::HashMap;

    #[test]
    fn shape_counts_are_what_the_shapes_make() {
        for shape in Shape::ALL {
            for size in [0, 1, 2, 3, 4, 7, 8, 15, 16, 99, 100, 1000, 4097] {
                let dag = Dag::shape(shape, size);
                let (nodes, edges) = shape_counts(shape, size);
                assert_eq!(nodes, dag.len(), "{shape:?} {size}");
                match shape {
                    // The most a random shape may have.
                    Shape::Random => assert!(edges >= dag.edges.len(), "{shape:?} {size}"),
                    _ => assert_eq!(edges, dag.edges.len(), "{shape:?} {size}"),
                }
            }
        }
    }

    #[test]
    fn counts_and_estimates_of_a_typo_do_not_overflow() {
        let (nodes, edges) = shape_counts(Shape::Wavefront, 99_999_999_999_999);
        assert_eq!(nodes, 9_999_999 * 9_999_999);
        assert!(estimate(nodes, edges) > 1 << 50);
        for shape in Shape::ALL {
            let (n, e) = shape_counts(shape, usize::MAX);
            assert!(estimate(n, e) >= n, "{shape:?}");
        }
        assert_eq!(estimate(usize::MAX, usize::MAX), usize::MAX);
        assert_eq!(estimate(0, 0), 0);
        assert_eq!(
            estimate(10, 20),
            estimate_graph_bytes(10, 20) + 10 * 68 + 20 * 8
        );
    }

    #[test]
    fn proc_files_are_read() {
        let meminfo =
            "MemTotal:       32768000 kB\nMemFree:  100 kB\nMemAvailable:   23943620 kB\n";
        assert_eq!(mem_available(meminfo), Some(23_943_620 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max address space         unlimited            unlimited            bytes     \n";
        assert_eq!(address_space_limit(limits), None);
        let limits =
            "Max address space         4294967296           unlimited            bytes     \n";
        assert_eq!(address_space_limit(limits), Some(4 << 30));
    }

    #[test]
    fn cgroup_limits_of_v1_and_v2_and_their_ancestors() {
        let files: HashMap<&str, &str> = [
            ("/cg/a/b/memory.max", "1073741824\n"),
            ("/cg/a/b/memory.current", "73741824\n"),
            ("/cg/a/memory.max", "max\n"),
            ("/cg/a/memory.current", "5\n"),
            ("/cg/memory/p/q/memory.limit_in_bytes", "2147483648\n"),
            ("/cg/memory/p/q/memory.usage_in_bytes", "147483648\n"),
            (
                "/cg/memory/p/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
            ("/cg/memory/p/memory.usage_in_bytes", "1\n"),
        ]
        .into_iter()
        .collect();
        let read = |p: &Path| files.get(p.to_str()?).map(|s| s.to_string());
        let v2 = cgroup_limits("0::/a/b\n", Path::new("/cg"), read);
        assert_eq!(v2.len(), 1, "{v2:?}");
        assert_eq!(v2[0].bytes, 1_000_000_000);
        assert!(v2[0].source.contains("/cg/a/b/memory.max"), "{v2:?}");
        let v1 = cgroup_limits("4:memory:/p/q\n2:cpu:/\n", Path::new("/cg"), read);
        assert_eq!(v1.len(), 1, "{v1:?}");
        assert_eq!(v1[0].bytes, 2_000_000_000);
        let joint = cgroup_limits("3:cpu,memory:/p/q\n", Path::new("/cg"), read);
        assert_eq!(joint, v1);
        assert!(cgroup_limits("1:cpu:/\n", Path::new("/cg"), read).is_empty());
    }

    #[test]
    fn sizes_print_in_gib_and_up() {
        assert_eq!(Bytes(3 << 30).to_string(), "3.0 GiB");
        assert_eq!(Bytes(1536 << 30).to_string(), "1.5 TiB");
        assert_eq!(Bytes(1 << 50).to_string(), "1.0 PiB");
    }
}
