//! A graph's memory: `estimate_graph_bytes` against what building and running a graph really
//! allocates (a counting global allocator over the built-in shapes; not a timed test), and a
//! graph whose records cannot be allocated is an `ErrorKind::TooLarge` error naming the
//! estimate and the limit, not an abort.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use boundpool_scheduler::{estimate_graph_bytes, ErrorKind, GraphBuilder, NodeId, PoolBuilder};

/// The system allocator, counting the bytes live and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// The tests of this binary one at a time: the counts are process-wide.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn grew(bytes: usize) {
    let now = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call forwards to the system allocator with the caller's arguments, whose
// contracts are `GlobalAlloc`'s; the counters only add and subtract sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            grew(l.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            grew(l.size());
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: forwarded contract.
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            if new > l.size() {
                grew(new - l.size());
            } else {
                LIVE.fetch_sub(l.size() - new, Ordering::Relaxed);
            }
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The benches' shapes (`boundpool_bench::workloads::Dag::shape`) of about `n` nodes, as
/// (nodes, edges).
fn shape(name: &str, n: usize) -> (usize, Vec<(u32, u32)>) {
    let mut e = Vec::new();
    let nodes = match name {
        "chain" => {
            e.extend((1..n as u32).map(|i| (i - 1, i)));
            n
        }
        "tree" => {
            e.extend((1..n as u32).map(|i| ((i - 1) / 2, i)));
            n
        }
        "wide" => {
            let sink = (n - 1) as u32;
            for i in 1..sink {
                e.push((0, i));
                e.push((i, sink));
            }
            n
        }
        "wavefront" => {
            let side = (n as f64).sqrt() as usize;
            for r in 0..side {
                for c in 0..side {
                    let i = (r * side + c) as u32;
                    if c > 0 {
                        e.push((i - 1, i));
                    }
                    if r > 0 {
                        e.push((i - side as u32, i));
                    }
                }
            }
            side * side
        }
        "random" => {
            let mut rng = 0x2545_F491_4F6C_DD1Du64;
            for i in 1..n as u32 {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                for j in 0..(rng % 5) as u32 {
                    let p = i - 1 - ((rng >> (8 * j + 3)) as u32 % i.min(64));
                    e.push((p, i));
                }
            }
            e.sort_unstable();
            e.dedup();
            n
        }
        _ => unreachable!("no shape {name}"),
    };
    (nodes, e)
}

/// The peak bytes allocated, above what was live before, while building `shape` with `n`
/// nodes (names of up to 16 bytes, bodies capturing 16 bytes, `u64` outputs when `valued`)
/// and running it once on `pool`, and the graph's (nodes, edges).
fn measured_peak(
    pool: &boundpool_scheduler::Pool,
    shape_name: &str,
    n: usize,
    valued: bool,
) -> (usize, usize, usize) {
    let (nodes, edges) = shape(shape_name, n);
    let names: Vec<String> = (0..nodes).map(|i| format!("{shape_name}-{i:09}")).collect();
    let mut ids: Vec<NodeId> = Vec::with_capacity(nodes);
    let base = LIVE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    {
        let mut g = GraphBuilder::new(shape_name.to_string());
        for (i, name) in names.iter().enumerate() {
            let captured = [i as u64, 1];
            let id = if valued {
                g.node(name.clone(), move |_| Ok(captured[0] + captured[1]))
                    .id()
            } else {
                g.node(name.clone(), move |_| {
                    std::hint::black_box(captured);
                    Ok(())
                })
                .id()
            };
            ids.push(id);
        }
        for &(f, t) in &edges {
            g.edge(ids[f as usize], ids[t as usize]);
        }
        let graph = g.build().unwrap();
        let out = pool.run(&graph).unwrap();
        assert_eq!(out.graph_name(), shape_name);
    }
    let peak = PEAK.load(Ordering::SeqCst) - base;
    (peak, nodes, edges.len())
}

#[test]
fn the_estimate_bounds_what_building_and_running_a_graph_allocates() {
    let _one = ONE_AT_A_TIME.lock().unwrap();
    let pool = PoolBuilder::new()
        .workers(2)
        .cores(boundpool_scheduler::Cores::Unpinned)
        .build()
        .unwrap();
    let n = if cfg!(miri) { 2_000 } else { 100_000 };
    for shape_name in ["chain", "tree", "wide", "wavefront", "random"] {
        for valued in [true, false] {
            let (peak, nodes, edges) = measured_peak(&pool, shape_name, n, valued);
            let estimate = estimate_graph_bytes(nodes, edges);
            let share = peak as f64 / estimate as f64;
            eprintln!(
                "{shape_name:9} valued={valued:5} nodes={nodes} edges={edges}: peak {peak} B, \
                 estimate {estimate} B ({share:.2})"
            );
            // An upper bound for such graphs...
            assert!(
                peak <= estimate,
                "{shape_name} valued={valued}: {peak} > {estimate}"
            );
            // ... and not a loose one: at least 0.7 of it for nodes with values, a quarter for
            // nodes returning `()` (which store nothing).
            let floor = if valued { 0.7 } else { 0.25 };
            assert!(
                share >= floor,
                "{shape_name} valued={valued}: {share:.2} of the estimate"
            );
        }
    }
}

#[test]
fn a_capacity_no_allocation_can_hold_is_an_error_at_build() {
    let _one = ONE_AT_A_TIME.lock().unwrap();
    let mut inner = GraphBuilder::<()>::new("inner");
    let x = inner.node("x", |_| Ok(1u8));
    let y = inner.node("y", move |ctx| Ok(ctx.take(x)? + 1));
    inner.hand_on(x, y);
    let inner = inner.build().unwrap();
    let mut g = GraphBuilder::<()>::with_capacity("huge", usize::MAX / 16, 3);
    // The builder goes on counting (and accepting ids and settings) after the failure.
    let a = g.node("a", |_| Ok(()));
    let b = g.node("b", |_| Ok(()));
    g.edge(a, b)
        .hand_on(a, b)
        .place(a, boundpool_scheduler::Placement::Any);
    g.node_priority(b, boundpool_scheduler::Priority::High);
    let s = g.subgraph(&inner);
    g.edge(b, s.node(x));
    assert_eq!(g.len(), 4);
    let err = g.build().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooLarge);
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!(
            "graph 'huge' is too large: its records for {} node(s) and 4 edge(s) need about \
             16.0 EiB (estimate_graph_bytes), and its node records need more than one \
             allocation can hold ({} bytes)",
            usize::MAX / 16,
            isize::MAX
        )),
        "{msg}"
    );
}

#[test]
fn a_graph_larger_than_the_machine_is_an_error_at_build() {
    let _one = ONE_AT_A_TIME.lock().unwrap();
    // 2^40 node records (24 TiB) fit an allocation's size but not this machine, unless the
    // kernel hands out address space it does not have (overcommit mode 1).
    let overcommit = std::fs::read_to_string("/proc/sys/vm/overcommit_memory").unwrap_or_default();
    if overcommit.trim() == "1" {
        eprintln!("SKIPPED a_graph_larger_than_the_machine_is_an_error_at_build: vm.overcommit_memory = 1");
        return;
    }
    let nodes = 1usize << 40;
    let g = GraphBuilder::<()>::with_capacity("too big", nodes, 2 * nodes);
    let err = g.build().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooLarge);
    let msg = err.to_string();
    assert!(
        msg.starts_with(
            "graph 'too big' is too large: its records for 1099511627776 node(s) and \
             2199023255552 edge(s) need about 208 TiB (estimate_graph_bytes), and the \
             allocator refused 24.0 TiB for its node records"
        ),
        "{msg}"
    );
    if cfg!(target_os = "linux") {
        assert!(msg.contains("; this machine has "), "{msg}");
    }
}
