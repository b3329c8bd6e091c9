//! The `/metrics` + `/trace` endpoint under concurrent scrapes: eight threads scrape both paths
//! at once while a client that never finishes its request holds a connection open, and a pool
//! whose name needs escaping is found by its percent-encoded (or `+`-spaced) query. Its own test
//! binary: it installs the global recorder.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Barrier;
use std::time::Duration;

use boundpool::PoolBuilder;
use boundpool_workloads::{Dag, Shape};

/// A name with a space, a slash and an ampersand: each must be escaped in a query.
const POOL: &str = "grid 1/2 & more";

fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    // Less than the endpoint's 5 s allowance for a request head: a server that waited on the
    // slow client before answering anyone else would miss it.
    common::get(addr, path, Duration::from_secs(3))
}

/// The node slices of graph `grid` in a `/trace` body.
fn grid_nodes(body: &str) -> usize {
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "grid")
        .count()
}

#[test]
fn concurrent_scrapes_are_served_while_a_slow_client_holds_a_connection() {
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    boundpool::observe::serve_metrics_and_trace(addr).expect("the endpoint starts");
    let pool = PoolBuilder::new()
        .name(POOL)
        .workers(2)
        .trace(true)
        .trace_window(10_000)
        .build()
        .unwrap();
    assert!(boundpool::observe::publish_trace(&pool));
    pool.run(&Dag::shape(Shape::Wavefront, 100).to_graph("grid", |_| {}))
        .unwrap();

    // Half a request head, then nothing: served one connection at a time, no one else would be
    // answered until the server gave up on this one.
    let mut slow = TcpStream::connect(addr).unwrap();
    slow.write_all(b"GET /metrics HTTP/1.1\r\nHost: boundpool\r\n")
        .unwrap();

    let encoded = "/trace?pool=grid%201%2F2%20%26%20more";
    let threads = 8;
    let start = Barrier::new(threads);
    std::thread::scope(|s| {
        for t in 0..threads {
            let start = &start;
            s.spawn(move || {
                start.wait();
                for i in 0..10 {
                    if (t + i) % 2 == 0 {
                        let (status, body) = get(addr, "/metrics");
                        assert_eq!(status, 200, "{body}");
                        assert!(
                            body.contains("# TYPE boundpool_nodes_run_total counter"),
                            "{body}"
                        );
                    } else {
                        let (status, body) = get(addr, encoded);
                        assert_eq!(status, 200, "{body}");
                        assert_eq!(grid_nodes(&body), 100, "the whole run in the window");
                    }
                }
            });
        }
    });

    // A form value's `+` is a space too; the name not decoded, or another name, is not found.
    let (status, body) = get(addr, "/trace?pool=grid+1%2F2+%26+more");
    assert_eq!((status, grid_nodes(&body)), (200, 100));
    assert_eq!(get(addr, "/trace?pool=grid%201%2F2").0, 404);
    assert_eq!(get(addr, "/trace?pool=grid").0, 404);
    drop(slow);
}
