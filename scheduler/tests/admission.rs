//! Admission control: at the limit `submit` blocks and resumes when a graph finishes,
//! `try_submit` fails with `WouldBlock`, `submit_async` waits without a thread, a dropped waiting
//! submission leaves nothing behind (and passes on a wake-up it was given), nested submissions
//! from a worker are admitted at once, and the counters say what happened.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use boundpool_scheduler::{Cores, ErrorKind, Graph, GraphBuilder, GraphHandle, Pool, PoolBuilder};

fn limited(limit: usize) -> Pool {
    PoolBuilder::new()
        .name("limited")
        .workers(2)
        .cores(Cores::Unpinned)
        .max_graphs_in_flight(limit)
        .build()
        .unwrap()
}

/// A graph whose one node waits for the returned sender (or its drop).
fn gated() -> (Graph, mpsc::Sender<()>) {
    let (tx, rx) = mpsc::channel::<()>();
    let rx = Mutex::new(rx);
    let mut g = GraphBuilder::new("gated");
    g.node("gate", move |_| {
        let _ = rx.lock().unwrap().recv_timeout(Duration::from_secs(30));
        Ok(())
    });
    (g.build().unwrap(), tx)
}

fn quick() -> Graph {
    let mut g = GraphBuilder::new("quick");
    g.node("q", |_| Ok(()));
    g.build().unwrap()
}

struct CountingWaker(AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn counting() -> (Arc<CountingWaker>, Waker) {
    let w = Arc::new(CountingWaker(AtomicUsize::new(0)));
    (w.clone(), Waker::from(w))
}

fn poll<F: Future + Unpin>(f: &mut F, waker: &Waker) -> Poll<F::Output> {
    Pin::new(f).poll(&mut Context::from_waker(waker))
}

#[test]
fn zero_limit_is_a_config_error() {
    let e = PoolBuilder::new()
        .workers(1)
        .cores(Cores::Unpinned)
        .max_graphs_in_flight(0)
        .build()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig);
    assert!(e.to_string().contains("max_graphs_in_flight"), "{e}");
}

#[test]
fn try_submit_at_the_limit_would_block() {
    let pool = limited(1);
    let (g, open) = gated();
    let h = pool.submit(&g).unwrap();
    let e = pool.try_submit(&quick()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::WouldBlock);
    assert!(
        e.to_string().contains("limited") && e.to_string().contains("quick"),
        "{e}"
    );
    open.send(()).unwrap();
    h.wait().unwrap();
    pool.try_submit(&quick()).unwrap().wait().unwrap();
    let s = pool.stats();
    assert_eq!(s.submissions_rejected, 1);
    assert_eq!(s.submissions_admitted, 2);
    assert_eq!(s.submissions_waited, 0);
}

#[test]
fn submit_blocks_until_a_graph_finishes() {
    let pool = Arc::new(limited(1));
    let (g, open) = gated();
    let h = pool.submit(&g).unwrap();
    let (done_tx, done_rx) = mpsc::channel::<GraphHandle>();
    let p = pool.clone();
    let t = std::thread::spawn(move || {
        let h = p.submit(&quick()).unwrap();
        done_tx.send(h).unwrap();
    });
    // It is waiting (and counted so) while the gated graph holds the only slot.
    let mut waiting = false;
    for _ in 0..3000 {
        if pool.stats().submissions_waiting == 1 {
            waiting = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(waiting, "the second submit never waited");
    assert!(
        done_rx.try_recv().is_err(),
        "submit returned over the limit"
    );
    assert_eq!(pool.graphs_in_flight(), 1);
    open.send(()).unwrap();
    h.wait().unwrap();
    let h2 = done_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the blocked submit resumed");
    h2.wait().unwrap();
    t.join().unwrap();
    let s = pool.stats();
    assert_eq!(s.submissions_waited, 1);
    assert_eq!(s.submissions_admitted, 2);
    assert_eq!(s.submissions_waiting, 0);
}

#[test]
fn async_submit_waits_without_blocking_and_resumes() {
    let pool = limited(1);
    let (g, open) = gated();
    let h = pool.submit(&g).unwrap();
    let q = quick();
    let mut fut = pool.submit_async(&q);
    let (count, waker) = counting();
    assert!(poll(&mut fut, &waker).is_pending());
    assert!(
        poll(&mut fut, &waker).is_pending(),
        "a second poll re-queues nothing"
    );
    assert_eq!(pool.stats().submissions_waiting, 1);
    open.send(()).unwrap();
    h.wait().unwrap();
    assert_eq!(
        count.0.load(Ordering::SeqCst),
        1,
        "woken once by the release"
    );
    match poll(&mut fut, &waker) {
        Poll::Ready(r) => r.unwrap().wait().unwrap(),
        Poll::Pending => panic!("admitted after the release"),
    };
    let s = pool.stats();
    assert_eq!((s.submissions_admitted, s.submissions_waited), (2, 1));
    assert_eq!(s.submissions_waiting, 0);
}

#[test]
fn dropped_waiting_submission_leaves_nothing_behind() {
    let pool = limited(1);
    let (g, open) = gated();
    let h = pool.submit(&g).unwrap();
    let q = quick();
    let (count, waker) = counting();
    {
        let mut fut = pool.submit_async(&q);
        assert!(poll(&mut fut, &waker).is_pending());
        assert_eq!(pool.stats().submissions_waiting, 1);
    }
    assert_eq!(pool.stats().submissions_waiting, 0);
    open.send(()).unwrap();
    h.wait().unwrap();
    assert_eq!(
        count.0.load(Ordering::SeqCst),
        0,
        "a withdrawn waiter is never woken"
    );
    // Its slot was not taken: the pool admits the next graph at once.
    pool.try_submit(&quick()).unwrap().wait().unwrap();
    assert_eq!(pool.graphs_in_flight(), 0);
    let s = pool.stats();
    assert_eq!(s.submissions_admitted, 2);
    assert_eq!(s.graphs_submitted, 2);
}

#[test]
fn a_woken_submission_dropped_before_it_polls_wakes_the_next() {
    let pool = limited(1);
    let (g, open) = gated();
    let h = pool.submit(&g).unwrap();
    let q = quick();
    let (count_a, waker_a) = counting();
    let (count_b, waker_b) = counting();
    let mut a = pool.submit_async(&q);
    let mut b = pool.submit_async(&q);
    assert!(poll(&mut a, &waker_a).is_pending());
    assert!(poll(&mut b, &waker_b).is_pending());
    open.send(()).unwrap();
    h.wait().unwrap();
    assert_eq!(count_a.0.load(Ordering::SeqCst), 1);
    assert_eq!(count_b.0.load(Ordering::SeqCst), 0);
    drop(a);
    assert_eq!(
        count_b.0.load(Ordering::SeqCst),
        1,
        "the wake-up went on to b"
    );
    match poll(&mut b, &waker_b) {
        Poll::Ready(r) => r.unwrap().wait().unwrap(),
        Poll::Pending => panic!("b admitted"),
    };
    assert_eq!(pool.stats().submissions_waiting, 0);
}

#[test]
fn nested_submissions_are_admitted_over_the_limit() {
    let pool = limited(1);
    let inner = quick();
    let mut g = GraphBuilder::new("outer");
    let n = g.node("nest", move |ctx| {
        // The outer graph holds the only slot: waiting for one would deadlock.
        ctx.submit(&inner)?.wait()?;
        Ok(7u32)
    });
    let out = pool.run(&g.build().unwrap()).unwrap();
    assert_eq!(out.get(n), Some(&7));
    assert_eq!(pool.stats().submissions_admitted, 2);
    pool.try_submit(&quick()).unwrap().wait().unwrap();
}

#[test]
fn a_flood_never_exceeds_the_limit() {
    let pool = Arc::new(limited(3));
    let mut g = GraphBuilder::new("slow");
    g.node("s", |_| {
        std::thread::sleep(Duration::from_micros(200));
        Ok(())
    });
    let g = g.build().unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let monitor = {
        let (pool, stop) = (pool.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut peak = 0;
            while !stop.load(Ordering::SeqCst) {
                peak = peak.max(pool.graphs_in_flight());
                std::thread::yield_now();
            }
            peak
        })
    };
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (pool, g) = (pool.clone(), g.clone());
            std::thread::spawn(move || {
                let hs: Vec<_> = (0..25).map(|_| pool.submit(&g).unwrap()).collect();
                for h in hs {
                    h.wait().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    let peak = monitor.join().unwrap();
    assert!(
        (1..=3).contains(&peak),
        "peak of {peak} graphs in flight, limit 3"
    );
    let s = pool.stats();
    assert_eq!(s.submissions_admitted, 100);
    assert!(
        s.submissions_waited > 0,
        "a flood of 100 over 3 slots waited"
    );
    assert_eq!(pool.graphs_in_flight(), 0);
}
