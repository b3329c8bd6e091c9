//! `/trace` beside `/metrics`: the published pool's window as Chrome trace JSON, read without
//! draining it (its own test binary: it installs the global recorder).

mod common;

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use boundpool::PoolBuilder;
use boundpool_workloads::{Dag, Shape};

fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    common::get(addr, path, Duration::from_secs(5))
}

#[test]
fn trace_and_metrics_on_one_port() {
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    boundpool::observe::serve_metrics_and_trace(addr).expect("the endpoint starts");
    assert_eq!(get(addr, "/trace").0, 404, "nothing published yet");
    let pool = PoolBuilder::new()
        .name("served")
        .workers(2)
        .trace(true)
        .trace_window(10_000)
        .build()
        .unwrap();
    assert!(boundpool::observe::publish_trace(&pool));
    let graph = Dag::shape(Shape::Wavefront, 100).to_graph("grid", |_| {});
    pool.run(&graph).unwrap();

    let (status, body) = get(addr, "/trace");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let nodes = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "grid")
        .count();
    assert_eq!(nodes, 100, "every node of the run in the window");
    assert_eq!(get(addr, "/trace?pool=served").0, 200);
    assert_eq!(get(addr, "/trace?pool=other").0, 404);
    // Serving read the window and left it: the take still has every node.
    let taken = pool.take_trace();
    let grid = taken.slices.iter().filter(|s| s.graph == "grid").count();
    assert_eq!(grid, 100);

    let (status, metrics) = get(addr, "/metrics");
    assert_eq!(status, 200);
    assert!(
        metrics.contains("# TYPE boundpool_nodes_run_total counter"),
        "{metrics}"
    );
    assert_eq!(get(addr, "/nothing").0, 404);
}
