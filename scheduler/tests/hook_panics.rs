//! A panic outside a node body (the idle, stop or start hook, a waker called as a graph
//! completes) never leaves a submitter, `shutdown` or the pool's `Drop` waiting: a start hook's
//! panic fails `build`; the others abort the process with a message naming the pool, the worker
//! and the hook. The aborting cases run in a child process (this test binary, re-run with
//! `BOUNDPOOL_HOOK_CHILD` naming the scenario), and the parent checks how it ended.

#[allow(dead_code)]
mod common;

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Wake, Waker};
use std::time::{Duration, Instant};

use boundpool_scheduler::backend::PoolBuilderExt;
use boundpool_scheduler::{Cores, ErrorKind, GraphBuilder, PoolBuilder};

const CHILD_ENV: &str = "BOUNDPOOL_HOOK_CHILD";

/// Runs scenario `name` in a child process and returns its exit status and stderr. A child
/// that has not ended after 60 s (a hang) fails the test.
fn run_child(name: &str) -> (std::process::ExitStatus, String) {
    let exe = std::env::current_exe().expect("the test binary");
    let mut child = Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the child test process");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait for the child") {
            break st;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("scenario {name}: the child hung (still running after 60 s)");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (status, reader.join().expect("stderr reader"))
}

/// Asserts that scenario `name` aborted (SIGABRT) and printed a message containing every part.
fn assert_aborts(name: &str, parts: &[&str]) {
    let (status, stderr) = run_child(name);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(6),
        "scenario {name}: expected an abort, got {status}; stderr:\n{stderr}"
    );
    for p in parts {
        assert!(
            stderr.contains(p),
            "scenario {name}: stderr lacks {p:?}:\n{stderr}"
        );
    }
    assert!(
        !stderr.contains("CHILD SURVIVED"),
        "scenario {name}: the child went on after the panic:\n{stderr}"
    );
}

/// In the child: whether this test is the scenario to run (else the parent's half runs).
fn is_child(name: &str) -> bool {
    std::env::var(CHILD_ENV).is_ok_and(|v| v == name)
}

fn one_node_graph() -> boundpool_scheduler::Graph {
    let mut g = GraphBuilder::<()>::new("g");
    g.node("a", |_| Ok(()));
    g.build().unwrap()
}

#[test]
fn idle_hook_panic_when_idle_aborts() {
    const NAME: &str = "idle_hook_panic_when_idle_aborts";
    if is_child(NAME) {
        let armed = Arc::new(AtomicBool::new(false));
        let a = armed.clone();
        let pool = PoolBuilder::new()
            .name("idlepool")
            .workers(1)
            .cores(Cores::Unpinned)
            .idle_hook(move |_, _| {
                if a.load(Ordering::SeqCst) {
                    panic!("boom in the idle hook");
                }
            })
            .build()
            .unwrap();
        armed.store(true, Ordering::SeqCst);
        // The only worker goes idle after this graph (or is idle already): its hook panics.
        // Before the fix the worker thread unwound and this second run hung.
        pool.run(&one_node_graph()).ok();
        std::thread::sleep(Duration::from_millis(50));
        pool.run(&one_node_graph()).ok();
        eprintln!("CHILD SURVIVED");
        return;
    }
    assert_aborts(
        NAME,
        &[
            "pool 'idlepool'",
            "idle hook",
            "idlepool-host-0",
            "boom in the idle hook",
            "aborting",
        ],
    );
}

#[test]
fn idle_hook_panic_while_busy_aborts() {
    const NAME: &str = "idle_hook_panic_while_busy_aborts";
    if is_child(NAME) {
        let armed = Arc::new(AtomicBool::new(false));
        let a = armed.clone();
        let pool = PoolBuilder::new()
            .name("busypool")
            .workers(1)
            .cores(Cores::Unpinned)
            .idle_hook(move |_, _| {
                if a.load(Ordering::SeqCst) {
                    panic!("boom at a service point");
                }
            })
            .build()
            .unwrap();
        // A long chain: node 10 arms the hook, which panics at the next service point
        // (every 64 nodes) while the chain is still running.
        let mut g = GraphBuilder::<()>::new("long");
        let mut prev = None;
        for i in 0..10_000 {
            let a = armed.clone();
            let n = g.node(format!("n{i}"), move |_| {
                if i == 10 {
                    a.store(true, Ordering::SeqCst);
                }
                Ok(())
            });
            if let Some(p) = prev {
                g.edge(p, n);
            }
            prev = Some(n);
        }
        pool.run(&g.build().unwrap()).ok();
        eprintln!("CHILD SURVIVED");
        return;
    }
    assert_aborts(
        NAME,
        &["pool 'busypool'", "idle hook", "boom at a service point"],
    );
}

#[test]
fn stop_hook_panic_aborts_instead_of_a_silent_exit() {
    const NAME: &str = "stop_hook_panic_aborts_instead_of_a_silent_exit";
    if is_child(NAME) {
        let pool = PoolBuilder::new()
            .name("stoppool")
            .workers(2)
            .cores(Cores::Unpinned)
            .stop_hook(|info, ()| {
                if info.index == 1 {
                    panic!("boom in the stop hook");
                }
            })
            .build()
            .unwrap();
        pool.run(&one_node_graph()).unwrap();
        drop(pool);
        eprintln!("CHILD SURVIVED");
        return;
    }
    assert_aborts(
        NAME,
        &[
            "pool 'stoppool'",
            "stop hook",
            "stoppool-host-1",
            "boom in the stop hook",
        ],
    );
}

struct PanickingWaker;

impl Wake for PanickingWaker {
    fn wake(self: Arc<Self>) {
        panic!("boom in a waker");
    }
}

#[test]
fn waker_panic_while_completing_a_graph_aborts() {
    const NAME: &str = "waker_panic_while_completing_a_graph_aborts";
    if is_child(NAME) {
        let pool = PoolBuilder::new()
            .name("wakerpool")
            .workers(1)
            .cores(Cores::Unpinned)
            .build()
            .unwrap();
        let release = Arc::new(AtomicBool::new(false));
        let r = release.clone();
        let mut g = GraphBuilder::<()>::new("g");
        g.node("a", move |_| {
            while !r.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(())
        });
        let mut handle = pool.submit(&g.build().unwrap()).unwrap();
        let waker = Waker::from(Arc::new(PanickingWaker));
        let mut cx = Context::from_waker(&waker);
        assert!(std::pin::Pin::new(&mut handle).poll(&mut cx).is_pending());
        release.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(2));
        // Had the worker died quietly, this would hang.
        pool.run(&one_node_graph()).ok();
        eprintln!("CHILD SURVIVED");
        return;
    }
    assert_aborts(
        NAME,
        &["pool 'wakerpool'", "completing a graph", "boom in a waker"],
    );
}

/// A start hook's panic is not an abort: `build` fails, naming the worker and the panic, and
/// every started worker is stopped and joined (nothing hangs, no thread stays).
#[test]
fn start_hook_panic_fails_build_and_leaves_no_thread() {
    common::with_deadline(30, "start_hook_panic", || {
        let err = PoolBuilder::new()
            .name("startpool")
            .workers(4)
            .cores(Cores::Unpinned)
            .start_hook(|info| {
                if info.index == 2 {
                    panic!("boom in the start hook");
                }
                Ok(())
            })
            .build()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::StartHook);
        let msg = err.to_string();
        assert!(
            msg.contains("startpool-host-2") && msg.contains("boom in the start hook"),
            "{msg}"
        );
        // Other tests of this binary start threads at the same time: look for this pool's. A
        // joined thread can stay listed in /proc for a moment after `join` returns (the kernel
        // wakes the joiner before it reaps the thread): seen under load, so allow it that.
        let left = || -> Vec<String> {
            common::thread_names()
                .into_iter()
                .filter(|n| n.starts_with("startpool"))
                .collect()
        };
        assert!(
            common::eventually(5, || left().is_empty()),
            "worker threads left behind: {:?}",
            left()
        );
    });
}

use std::future::Future;
