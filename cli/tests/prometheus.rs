//! The Prometheus endpoint, scraped over loopback with a real HTTP client (`ureq`): from the
//! library's one-line set-up, and from `boundpool run --prometheus`.

use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use boundpool::PoolBuilder;
use boundpool_workloads::{Dag, Shape};

/// A loopback port that was free a moment ago.
fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// `GET /metrics`; returns the body of a 200 answer.
fn scrape(addr: SocketAddr) -> Result<String, Box<dyn std::error::Error>> {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(5))
        .build();
    let resp = agent.get(&format!("http://{addr}/metrics")).call()?;
    if resp.status() != 200 {
        return Err(format!("status {}", resp.status()).into());
    }
    Ok(resp.into_string()?)
}

/// The sum of a metric's samples (over its label sets), if it appears.
fn total(text: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter(|l| {
            l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b'{') | Some(b' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// Scrapes until `name`'s total reaches `want` (workers flush their counters when they go idle,
/// just after a graph's handle returns), for at most 10 s.
fn scrape_until(addr: SocketAddr, name: &str, want: f64) -> String {
    let t0 = Instant::now();
    loop {
        let text = scrape(addr).expect("the endpoint answers");
        if total(&text, name).is_some_and(|v| v >= want) || t0.elapsed() > Duration::from_secs(10) {
            return text;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn library_endpoint_serves_every_kind_and_counters_grow() {
    let addr = free_port();
    let handle = boundpool::observe::install_prometheus(addr).expect("the endpoint starts");
    let pool = PoolBuilder::new()
        .name("scraped")
        .workers(2)
        .cpu_lane_threads(1)
        .build()
        .unwrap();
    let graph = Dag::shape(Shape::Wavefront, 400).to_graph("grid", |_| {});
    for _ in 0..3 {
        pool.run(&graph).unwrap();
    }
    let first = scrape_until(addr, "boundpool_nodes_run_total", 1200.0);
    // Every metric of the table is served with its type, including counters that have not
    // moved yet (a pool registers its series at zero) and the cpu lane's.
    for &(name, kind, ..) in boundpool::METRICS {
        assert!(
            first.contains(&format!("# TYPE {name} {kind}\n")),
            "no `# TYPE {name} {kind}` in:\n{first}"
        );
        // Counters are named as Prometheus names accumulating counts, and the exporter (its
        // recommended naming is off) serves the name as it is: no `_total_total`.
        if kind == "counter" {
            assert!(
                name.ends_with("_total"),
                "counter {name} does not end in _total"
            );
            assert!(
                first.contains(&format!("\n{name}{{")),
                "no sample of {name} in:\n{first}"
            );
        }
    }
    assert!(!first.contains("_total_total"), "{first}");
    assert!(
        first.contains("boundpool_graphs_failed_total{pool=\"scraped\"} 0"),
        "{first}"
    );
    assert!(
        first.contains("boundpool_workers{pool=\"scraped\"} 2"),
        "{first}"
    );
    assert!(
        first.contains("worker=\"0\"") && first.contains("worker=\"1\""),
        "per-worker labels:\n{first}"
    );
    assert!(
        first.contains("boundpool_graph_latency_seconds_bucket{pool=\"scraped\",le=\"0.001\"}"),
        "{first}"
    );
    let nodes1 = total(&first, "boundpool_nodes_run_total").unwrap();
    let graphs1 = total(&first, "boundpool_graphs_completed_total").unwrap();
    assert_eq!(nodes1, 1200.0, "3 runs of a 20x20 grid");
    assert_eq!(graphs1, 3.0);

    for _ in 0..2 {
        pool.run(&graph).unwrap();
    }
    let second = scrape_until(addr, "boundpool_nodes_run_total", 2000.0);
    let nodes2 = total(&second, "boundpool_nodes_run_total").unwrap();
    assert_eq!(
        nodes2, 2000.0,
        "the counter grew by the 800 nodes run in between"
    );
    assert_eq!(
        total(&second, "boundpool_graphs_completed_total"),
        Some(5.0)
    );
    assert_eq!(
        total(&second, "boundpool_graph_latency_seconds_count"),
        Some(5.0)
    );
    // The in-process handle renders the same figures.
    assert_eq!(
        total(&handle.render(), "boundpool_nodes_run_total"),
        Some(2000.0)
    );
}

#[test]
fn cli_serves_metrics_while_it_runs() {
    let addr = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_boundpool"))
        .args([
            "run",
            "--shape",
            "chain",
            "--size",
            "2000",
            "--threads",
            "2",
            "--repeat",
            "2",
            "--quiet",
            "--linger",
            "3",
        ])
        .args(["--prometheus", &addr.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    // The endpoint stays up for 3 s after the runs: scrape until both runs are counted.
    let t0 = Instant::now();
    let text = loop {
        match scrape(addr) {
            Ok(t) if total(&t, "boundpool_nodes_run_total") == Some(4000.0) => break t,
            _ if t0.elapsed() > Duration::from_secs(20) => {
                let _ = child.kill();
                panic!("no scrape counted 4000 nodes");
            }
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    assert!(
        text.contains("# TYPE boundpool_graphs_submitted_total counter"),
        "{text}"
    );
    assert_eq!(total(&text, "boundpool_graphs_submitted_total"), Some(2.0));
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
