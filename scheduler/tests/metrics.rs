//! Metrics through the `metrics` facade (its own binary: it installs metrics-util's
//! `DebuggingRecorder` as the global recorder before any pool is built).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use boundpool_scheduler::{BoxError, Cores, GraphBuilder, PoolBuilder, METRICS};
use metrics::Unit;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;

/// A series: a metric name and its sorted labels.
type Series = (String, Vec<(String, String)>);

/// Everything seen so far. A snapshot drains counters and histograms, so deltas are summed.
#[derive(Default)]
struct Seen {
    counters: HashMap<Series, u64>,
    /// Every value a snapshot returned. `DebuggingRecorder` swaps a gauge to zero when it
    /// snapshots it, so a later snapshot reads 0 for a gauge set once: keep them all.
    gauges: HashMap<Series, Vec<f64>>,
    histograms: HashMap<String, Vec<f64>>,
    descriptions: HashMap<String, (MetricKind, Option<Unit>, String)>,
}

impl Seen {
    fn absorb(&mut self, snap: &Snapshotter) {
        for (ck, unit, desc, value) in snap.snapshot().into_vec() {
            let (kind, key) = ck.into_parts();
            let name = key.name().to_string();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect();
            labels.sort();
            if let Some(d) = desc {
                self.descriptions
                    .insert(name.clone(), (kind, unit, d.to_string()));
            }
            match value {
                DebugValue::Counter(v) => *self.counters.entry((name, labels)).or_default() += v,
                DebugValue::Gauge(v) => {
                    self.gauges
                        .entry((name, labels))
                        .or_default()
                        .push(v.into_inner());
                }
                DebugValue::Histogram(v) => self
                    .histograms
                    .entry(name)
                    .or_default()
                    .extend(v.into_iter().map(|x| x.into_inner())),
            }
        }
    }

    /// Sum of counter `name` over the series whose label `pool` is `pool`.
    fn counter(&self, name: &str, pool: &str) -> u64 {
        self.counters
            .iter()
            .filter(|((n, l), _)| n == name && l.iter().any(|(k, v)| k == "pool" && v == pool))
            .map(|(_, v)| v)
            .sum()
    }
}

#[test]
fn metrics_are_emitted_and_described() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("install the debugging recorder");

    let pool = PoolBuilder::new()
        .name("metered")
        .workers(2)
        .cores(Cores::Unpinned)
        .cpu_lane_threads(1)
        .build()
        .unwrap();
    // A wide graph (stealing and parking), a cpu node, and a failing graph.
    let mut g = GraphBuilder::<()>::new("wide");
    let src = g.node("src", |_| Ok(()));
    let sink = g.node("sink", |_| Ok(()));
    for i in 0..1000 {
        let n = g.node(format!("n{i}"), |_| {
            std::hint::black_box((0..50).sum::<u64>());
            Ok(())
        });
        g.edge(src, n).edge(n, sink);
    }
    let c = g.cpu_node("cpu", |_| Ok(()));
    g.edge(src, c).edge(c, sink);
    let wide = g.build().unwrap();
    let mut g = GraphBuilder::<()>::new("failing");
    let a = g.node("a", |_| -> Result<(), BoxError> { Err("no".into()) });
    let b = g.node("b", |_| Ok(()));
    let c2 = g.node("c", |_| Ok(()));
    g.edge(a, b).edge(b, c2);
    let failing = g.build().unwrap();

    let mut seen = Seen::default();
    let mut runs = 0u64;
    // Run until some node was stolen (so every counter has a value), within a deadline.
    let deadline = Instant::now() + Duration::from_secs(20);
    while runs < 5 || pool.stats().steals() == 0 {
        assert!(Instant::now() < deadline, "no steal happened");
        pool.run(&wide).unwrap();
        runs += 1;
    }
    pool.run(&failing).unwrap_err();
    let stats = pool.stats();
    let worker_nodes = stats.workers.iter().map(|w| w.nodes_run).sum::<u64>();
    assert_eq!(worker_nodes, runs * 1002 + 1);
    assert_eq!(stats.cpu_lane_nodes, runs);

    // Per-worker counters are flushed when a worker goes idle: poll until they add up.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        seen.absorb(&snapshotter);
        if seen.counter("boundpool_nodes_run_total", "metered") == worker_nodes {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "boundpool_nodes_run_total = {} after the flush deadline, expected {worker_nodes}",
            seen.counter("boundpool_nodes_run_total", "metered")
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    // nodes_run is labelled by pool and worker, one series per worker.
    let series: Vec<_> = seen
        .counters
        .keys()
        .filter(|(n, _)| n == "boundpool_nodes_run_total")
        .map(|(_, l)| l.clone())
        .collect();
    assert!(!series.is_empty());
    for l in &series {
        let keys: Vec<&str> = l.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, vec!["pool", "worker"], "{l:?}");
    }
    for (w, ws) in stats.workers.iter().enumerate() {
        let key = (
            "boundpool_nodes_run_total".to_string(),
            vec![
                ("pool".into(), "metered".into()),
                ("worker".into(), w.to_string()),
            ],
        );
        assert_eq!(
            seen.counters.get(&key).copied().unwrap_or(0),
            ws.nodes_run,
            "worker {w}"
        );
    }
    assert_eq!(
        seen.counter("boundpool_graphs_submitted_total", "metered"),
        runs + 1
    );
    assert_eq!(
        seen.counter("boundpool_graphs_completed_total", "metered"),
        runs
    );
    assert_eq!(seen.counter("boundpool_graphs_failed_total", "metered"), 1);
    assert_eq!(
        seen.counter("boundpool_nodes_cancelled_total", "metered"),
        2
    );
    assert_eq!(
        seen.counter("boundpool_cpu_lane_nodes_total", "metered"),
        runs
    );
    assert_eq!(
        seen.counter("boundpool_steals_total", "metered"),
        stats.steals()
    );
    assert!(seen.counter("boundpool_injector_pops_total", "metered") >= 1);
    assert!(seen.counter("boundpool_parks_total", "metered") >= 1);
    let workers = (
        "boundpool_workers".to_string(),
        vec![("pool".to_string(), "metered".to_string())],
    );
    assert_eq!(
        seen.gauges.get(&workers).and_then(|v| v.first()),
        Some(&2.0),
        "the workers gauge is set when the pool starts"
    );
    assert!(seen
        .gauges
        .keys()
        .any(|(n, _)| n == "boundpool_queue_depth"));
    let lat = &seen.histograms["boundpool_graph_latency_seconds"];
    assert_eq!(
        lat.len() as u64,
        runs + 1,
        "one latency sample per finished graph"
    );
    assert!(lat.iter().all(|&s| s > 0.0 && s < 20.0), "{lat:?}");
    assert!(seen
        .histograms
        .get("boundpool_node_run_seconds")
        .is_some_and(|h| !h.is_empty()));

    // Admission metrics, from a pool with a limit of one graph in flight: one admitted at once,
    // one try_submit rejected, one async submission that waited.
    let limited = PoolBuilder::new()
        .name("admitting")
        .workers(1)
        .cores(Cores::Unpinned)
        .max_graphs_in_flight(1)
        .build()
        .unwrap();
    let (open, gate) = std::sync::mpsc::channel::<()>();
    let gate = std::sync::Mutex::new(gate);
    let mut g = GraphBuilder::<()>::new("gated");
    g.node("gate", move |_| {
        let _ = gate.lock().unwrap().recv_timeout(Duration::from_secs(30));
        Ok(())
    });
    let gated = g.build().unwrap();
    let mut g = GraphBuilder::<()>::new("quick");
    g.node("q", |_| Ok(()));
    let quick = g.build().unwrap();
    let held = limited.submit(&gated).unwrap();
    limited.try_submit(&quick).unwrap_err();
    {
        use std::future::Future;
        let waker = std::task::Waker::noop();
        let mut fut = std::pin::pin!(limited.submit_async(&quick));
        assert!(fut
            .as_mut()
            .poll(&mut std::task::Context::from_waker(waker))
            .is_pending());
        seen.absorb(&snapshotter);
        let waiting = (
            "boundpool_submissions_waiting".to_string(),
            vec![("pool".to_string(), "admitting".to_string())],
        );
        assert_eq!(
            seen.gauges.get(&waiting).and_then(|v| v.last()),
            Some(&1.0),
            "one submission waiting"
        );
        open.send(()).unwrap();
        held.wait().unwrap();
        match fut
            .as_mut()
            .poll(&mut std::task::Context::from_waker(waker))
        {
            std::task::Poll::Ready(h) => h.unwrap().wait().unwrap(),
            std::task::Poll::Pending => panic!("admitted once the gated graph finished"),
        };
    }
    seen.absorb(&snapshotter);
    assert_eq!(
        seen.counter("boundpool_submissions_admitted_total", "admitting"),
        2
    );
    assert_eq!(
        seen.counter("boundpool_submissions_waited_total", "admitting"),
        1
    );
    assert_eq!(
        seen.counter("boundpool_submissions_rejected_total", "admitting"),
        1
    );

    // Every listed metric was seen, and described with its unit.
    for &(name, kind, unit, _, _) in METRICS {
        let (k, u, d) = seen
            .descriptions
            .get(name)
            .unwrap_or_else(|| panic!("{name} was not emitted with a description"));
        let want_kind = match kind {
            "counter" => MetricKind::Counter,
            "gauge" => MetricKind::Gauge,
            _ => MetricKind::Histogram,
        };
        assert_eq!(*k, want_kind, "{name}");
        let want_unit = if unit == "seconds" {
            Unit::Seconds
        } else {
            Unit::Count
        };
        assert_eq!(*u, Some(want_unit), "{name}");
        assert!(!d.is_empty(), "{name}");
        assert!(name.starts_with("boundpool_"));
        // Prometheus and OpenMetrics name an accumulating count `*_total`, and only that.
        assert_eq!(
            name.ends_with("_total"),
            kind == "counter",
            "{name} ({kind}): counters, and only counters, end in _total"
        );
    }
    // Nothing outside the list is emitted.
    let listed: Vec<&str> = METRICS.iter().map(|m| m.0).collect();
    for n in seen
        .counters
        .keys()
        .map(|(n, _)| n)
        .chain(seen.gauges.keys().map(|(n, _)| n))
        .chain(seen.histograms.keys())
    {
        assert!(
            listed.contains(&n.as_str()),
            "{n} is emitted but not in METRICS"
        );
    }
}
