//! `PoolBuilder`: invalid settings, start-hook failures (workers already started are joined),
//! core pinning and reporting, thread names, groups and placement, idle hooks.

#[allow(dead_code)]
mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use boundpool_scheduler::backend::{FromIndex, PoolBuilderExt, PoolExt};
use boundpool_scheduler::{
    BoxError, Cores, ErrorKind, GraphBuilder, GroupId, GroupSpec, PoolBuilder,
};
use common::allowed_cores;

/// The calling thread's allowed CPUs, from /proc (e.g. "0" or "0-1").
fn my_cpus_allowed() -> String {
    let s = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string()
}

#[test]
fn zero_workers_is_invalid() {
    let err = PoolBuilder::new().workers(0).build().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    assert!(err.to_string().contains("0 workers"), "{err}");
    let err = PoolBuilder::new()
        .groups(vec![GroupSpec::new("host", 1), GroupSpec::new("gpu0", 0)])
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    assert!(err.to_string().contains("gpu0"), "{err}");
    let err = PoolBuilder::new().groups(vec![]).build().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
}

#[test]
fn core_outside_the_mask_is_invalid() {
    let err = PoolBuilder::new()
        .workers(1)
        .cores(Cores::List(vec![10_000]))
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    assert!(err.to_string().contains("10000"), "{err}");
    let ok = allowed_cores()[0];
    let err = PoolBuilder::new()
        .workers(2)
        .cores(Cores::List(vec![ok, 10_001]))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("10001"), "{err}");
    let err = PoolBuilder::new()
        .workers(1)
        .cores(Cores::List(vec![]))
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    let err = PoolBuilder::new()
        .workers(1)
        .cpu_lane_threads(0)
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
}

/// A core that exists on this machine but is outside the calling thread's affinity mask (which
/// `build` reads as the process's): the test narrows its own thread's mask to one core and asks
/// for another.
#[test]
fn existing_core_outside_the_affinity_mask_is_invalid() {
    let cores = allowed_cores();
    if cores.len() < 2 {
        println!("skipped: needs 2 allowed cores, this process has {cores:?}");
        return;
    }
    let (mine, other) = (cores[0], cores[1]);
    std::thread::spawn(move || {
        assert!(core_affinity::set_for_current(core_affinity::CoreId {
            id: mine
        }));
        assert_eq!(my_cpus_allowed(), mine.to_string(), "the mask is narrowed");
        let err = PoolBuilder::new()
            .name("masked")
            .workers(1)
            .cores(Cores::List(vec![other]))
            .build()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig);
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("core {other}")) && msg.contains("affinity mask"),
            "{msg}"
        );
        // The core this thread may use is still accepted, and `All` means just that core.
        let pool = PoolBuilder::new()
            .workers(2)
            .cores(Cores::List(vec![mine]))
            .build()
            .unwrap();
        assert!(pool.workers().iter().all(|w| w.core == Some(mine)));
        let pool = PoolBuilder::new().workers(2).build().unwrap();
        assert!(pool.workers().iter().all(|w| w.core == Some(mine)));
        assert_eq!(boundpool_scheduler::default_workers(), 1);
    })
    .join()
    .unwrap();
}

#[derive(Debug)]
struct HookError;
impl std::fmt::Display for HookError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("no device for you")
    }
}
impl std::error::Error for HookError {}

#[test]
fn failing_start_hook_names_the_worker_and_joins_the_others() {
    common::with_deadline(30, "failing_start_hook", || {
        let stopped = Arc::new(Mutex::new(Vec::new()));
        let s = stopped.clone();
        let err = PoolBuilder::new()
            .name("hookfail")
            .workers(4)
            .cores(Cores::Unpinned)
            .start_hook(|info| -> Result<usize, BoxError> {
                if info.index == 2 {
                    Err(Box::new(HookError))
                } else {
                    Ok(info.index)
                }
            })
            .stop_hook(move |info, state| {
                assert_eq!(info.index, state);
                s.lock().unwrap().push(state);
            })
            .build()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::StartHook);
        let msg = err.to_string();
        assert!(msg.contains("hookfail-host-2"), "names the worker: {msg}");
        assert!(msg.contains("no device for you"), "{msg}");
        assert!(std::error::Error::source(&err)
            .unwrap()
            .downcast_ref::<HookError>()
            .is_some());
        // `build` returned after joining: the stop hooks of the workers that started have run.
        let mut got = stopped.lock().unwrap().clone();
        got.sort();
        assert_eq!(got, vec![0, 1, 3]);
        assert!(
            common::eventually(2, || common::threads_named("hookfail-") == 0),
            "no worker thread is left"
        );
    });
}

#[test]
fn panicking_start_hook() {
    common::with_deadline(30, "panicking_start_hook", || {
        let stopped = Arc::new(AtomicUsize::new(0));
        let s = stopped.clone();
        let err = PoolBuilder::new()
            .name("hookpanic")
            .workers(3)
            .cores(Cores::Unpinned)
            .thread_name(|info| format!("hp-w{}", info.index))
            .start_hook(|info| -> Result<(), BoxError> {
                if info.index == 1 {
                    panic!("hook exploded on {}", info.index);
                }
                Ok(())
            })
            .stop_hook(move |_, ()| {
                s.fetch_add(1, Ordering::SeqCst);
            })
            .build()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::StartHook);
        let msg = err.to_string();
        assert!(
            msg.contains("hp-w1") && msg.contains("hook exploded on 1"),
            "{msg}"
        );
        assert_eq!(stopped.load(Ordering::SeqCst), 2);
        assert!(common::eventually(2, || common::threads_named("hp-w") == 0));
    });
}

#[test]
fn every_worker_fails_its_hook() {
    let err = PoolBuilder::new()
        .workers(3)
        .cores(Cores::Unpinned)
        .start_hook(|info| -> Result<(), BoxError> {
            Err(format!("hook {} failed", info.index).into())
        })
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StartHook);
}

#[test]
fn start_hook_runs_on_the_worker_before_any_node() {
    let hook_threads = Arc::new(Mutex::new(HashMap::new()));
    let h = hook_threads.clone();
    let pool = PoolBuilder::new()
        .name("hookrun")
        .workers(2)
        .cores(Cores::Unpinned)
        .start_hook(move |info| {
            h.lock()
                .unwrap()
                .insert(info.index, std::thread::current().id());
            Ok(format!("state-{}", info.index))
        })
        .build()
        .unwrap();
    assert_eq!(
        hook_threads.lock().unwrap().len(),
        2,
        "every hook ran before build returned"
    );
    let mut g = GraphBuilder::<String>::new("g");
    let ht = hook_threads.clone();
    let n = g.node("n", move |ctx| {
        let i = ctx.worker_info().index;
        assert_eq!(
            ht.lock().unwrap()[&i],
            std::thread::current().id(),
            "node runs on the hook's thread"
        );
        Ok(ctx.worker_state().clone() == format!("state-{i}"))
    });
    let graph = g.build().unwrap();
    for _ in 0..20 {
        assert_eq!(pool.run(&graph).unwrap().get(n), Some(&true));
    }
}

#[test]
fn worker_info_reports_cores_and_workers_are_pinned() {
    let cores = allowed_cores();
    // All: one worker per allowed core in turn.
    let pool = PoolBuilder::new()
        .name("pinall")
        .workers(cores.len() + 1)
        .build()
        .unwrap();
    assert_eq!(pool.workers().len(), cores.len() + 1);
    for (i, w) in pool.workers().iter().enumerate() {
        assert_eq!(w.index, i);
        assert_eq!(w.core, Some(cores[i % cores.len()]), "{w:?}");
        assert_eq!(w.group, GroupId::from_index(0));
        assert_eq!(w.group_name, "host");
        assert_eq!(w.index_in_group, i);
        assert_eq!(w.name, format!("pinall-host-{i}"));
    }
    // Nodes see their worker's info, and the worker thread is really pinned to that core.
    let mut g = GraphBuilder::<()>::new("where");
    let n = g.node("n", |ctx| {
        let info = ctx.worker_info();
        Ok((
            info.core,
            my_cpus_allowed(),
            std::thread::current().name().map(str::to_string),
            info.name.clone(),
        ))
    });
    let graph = g.build().unwrap();
    for _ in 0..20 {
        let out = pool.run(&graph).unwrap();
        let (core, allowed, tname, name) = out.get(n).unwrap().clone();
        assert_eq!(
            allowed,
            core.unwrap().to_string(),
            "pinned to exactly its core"
        );
        assert_eq!(tname, Some(name));
    }
    // An explicit list, cycled.
    let last = *cores.last().unwrap();
    let pool = PoolBuilder::new()
        .workers(3)
        .cores(Cores::List(vec![last]))
        .build()
        .unwrap();
    assert!(pool.workers().iter().all(|w| w.core == Some(last)));
    // Unpinned.
    let pool = PoolBuilder::new()
        .name("free")
        .workers(2)
        .cores(Cores::Unpinned)
        .build()
        .unwrap();
    assert!(pool.workers().iter().all(|w| w.core.is_none()));
    let mut g = GraphBuilder::<()>::new("free");
    let n = g.node("n", |ctx| Ok(ctx.worker_info().core));
    assert_eq!(pool.run(&g.build().unwrap()).unwrap().get(n), Some(&None));
}

#[test]
fn default_worker_count_is_the_allowed_cores() {
    let pool = PoolBuilder::new().name("dflt").build().unwrap();
    assert_eq!(pool.workers().len(), boundpool_scheduler::default_workers());
    assert_eq!(pool.name(), "dflt");
    assert_eq!(pool.group_count(), 1);
    assert_eq!(pool.group("host"), Some(GroupId::from_index(0)));
    assert_eq!(pool.group("nope"), None);
}

#[test]
fn custom_thread_names_and_stack_size() {
    let pool = PoolBuilder::new()
        .name("named")
        .workers(2)
        .cores(Cores::Unpinned)
        .stack_size(256 * 1024)
        .thread_name(|i| format!("custom-{}-{}", i.group_name, i.index))
        .build()
        .unwrap();
    assert_eq!(pool.workers()[1].name, "custom-host-1");
    let names = common::thread_names();
    assert!(
        names.iter().any(|n| n == "custom-host-0") && names.iter().any(|n| n == "custom-host-1"),
        "{names:?}"
    );
}

/// A node's placement group and the worker that ran it.
type Seen = (Option<usize>, usize);

#[test]
fn groups_and_placement() {
    let pool = PoolBuilder::new()
        .name("grp")
        .groups(vec![
            GroupSpec::new("host", 2).cores(Cores::Unpinned),
            GroupSpec::new("gpu0", 1).cores(Cores::Unpinned),
            GroupSpec::new("gpu1", 2).cores(Cores::Unpinned),
        ])
        .build()
        .unwrap();
    assert_eq!(pool.group_count(), 3);
    let (host, gpu0, gpu1) = (
        pool.group("host").unwrap(),
        pool.group("gpu0").unwrap(),
        pool.group("gpu1").unwrap(),
    );
    assert_eq!((host.index(), gpu0.index(), gpu1.index()), (0, 1, 2));
    let groups: Vec<_> = pool
        .workers()
        .iter()
        .map(|w| (w.group.index(), w.index_in_group))
        .collect();
    assert_eq!(groups, vec![(0, 0), (0, 1), (1, 0), (2, 0), (2, 1)]);

    // Chains alternating between groups, plus free nodes; every placed node checks its worker.
    let wrong = Arc::new(AtomicUsize::new(0));
    // (placement group, worker) pairs seen.
    let seen: Arc<Mutex<HashSet<Seen>>> = Arc::new(Mutex::new(HashSet::new()));
    let mut g = GraphBuilder::<()>::new("placed");
    let root = g.node("root", |_| Ok(()));
    for chain in 0..20 {
        let mut prev = root;
        for step in 0..12 {
            let place = match (chain + step) % 4 {
                0 => Some(gpu0),
                1 => Some(gpu1),
                2 => Some(host),
                _ => None,
            };
            let (w, s) = (wrong.clone(), seen.clone());
            let n = g.node(format!("c{chain}s{step}"), move |ctx| {
                let info = ctx.worker_info();
                if place.is_some_and(|p| p != info.group)
                    || ctx.placement_of(ctx.node_id()) != place.into()
                {
                    w.fetch_add(1, Ordering::SeqCst);
                }
                s.lock()
                    .unwrap()
                    .insert((place.map(|p| p.index()), info.index));
                std::thread::sleep(Duration::from_micros(50));
                Ok(())
            });
            if let Some(p) = place {
                g.place(n, p);
            }
            g.edge(prev, n);
            prev = n;
        }
    }
    let graph = g.build().unwrap();
    for _ in 0..10 {
        pool.run(&graph).unwrap();
    }
    assert_eq!(
        wrong.load(Ordering::SeqCst),
        0,
        "a placed node ran outside its group"
    );
    let seen = seen.lock().unwrap();
    for (place, worker) in seen.iter() {
        if let Some(p) = place {
            assert_eq!(pool.workers()[*worker].group.index(), *p);
        }
    }
    // gpu1's two workers both got work at some point (placement does not pin to one worker).
    let gpu1_workers: HashSet<usize> = seen
        .iter()
        .filter(|(p, _)| *p == Some(2))
        .map(|(_, w)| *w)
        .collect();
    assert!(!gpu1_workers.is_empty());
    // A graph placed entirely on one group.
    let mut g = GraphBuilder::<()>::new("all-gpu0");
    let mut prev = None;
    for i in 0..50 {
        let n = g.node(format!("n{i}"), |ctx| {
            Ok(ctx.worker_info().group_name.clone())
        });
        g.place(n, gpu0);
        if let Some(p) = prev {
            g.edge(p, n);
        }
        prev = Some(n);
    }
    let out = pool.run(&g.build().unwrap()).unwrap();
    assert_eq!(out.get(prev.unwrap()).map(String::as_str), Some("gpu0"));
}

#[test]
fn idle_hook_and_group_waker() {
    let calls = Arc::new(Mutex::new(HashMap::<usize, usize>::new()));
    let c = calls.clone();
    let pool = PoolBuilder::new()
        .name("idler")
        .groups(vec![
            GroupSpec::new("host", 1).cores(Cores::Unpinned),
            GroupSpec::new("dev", 1).cores(Cores::Unpinned),
        ])
        .start_hook(|info| Ok(info.index * 10))
        .idle_hook(move |info, state| {
            assert_eq!(*state, info.index * 10);
            *c.lock().unwrap().entry(info.index).or_default() += 1;
        })
        .build()
        .unwrap();
    let count = |w: usize| calls.lock().unwrap().get(&w).copied().unwrap_or(0);
    let wait_for = |what: &str, f: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    wait_for(
        "both workers run the idle hook when they first go idle",
        &|| count(0) >= 1 && count(1) >= 1,
    );
    std::thread::sleep(Duration::from_millis(20));
    let before = (count(0), count(1));
    // Waking group 1 makes its idle worker run the hook again; group 0 is left alone.
    pool.group_waker(GroupId::from_index(1)).wake();
    wait_for("the woken worker ran its idle hook", &|| {
        count(1) > before.1
    });
    assert_eq!(count(0), before.0);
    // A busy worker runs it every 64 nodes.
    let mut g = GraphBuilder::<usize>::new("busy");
    let mut prev = None;
    for i in 0..640 {
        let n = g.node(format!("n{i}"), |_| Ok(()));
        g.place(n, GroupId::from_index(0));
        if let Some(p) = prev {
            g.edge(p, n);
        }
        prev = Some(n);
    }
    let b0 = count(0);
    pool.run(&g.build().unwrap()).unwrap();
    // The worker runs the hook after the node that crosses a multiple of 64 returns; the last
    // node's completion (which ends the graph and so `run`) comes before that hook call, so the
    // count may still be one short when `run` returns.
    wait_for("an idle-hook call every 64 nodes of a busy worker", &|| {
        count(0) >= b0 + 10
    });
}
