//! The Prometheus exporter and the `/metrics` + `/trace` endpoint (feature `prometheus`).

use crate::backend::PoolExt;
use std::fmt;
use std::net::SocketAddr;

use metrics_exporter_prometheus::PrometheusBuilder;
pub use metrics_exporter_prometheus::PrometheusHandle;

use super::{chrome_trace, ObserveError};

/// Histogram buckets, in seconds (node run times and graph latencies: 100 ns to 10 s).
pub const BUCKETS_SECONDS: &[f64] = &[
    1e-7, 3e-7, 1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0,
    10.0,
];

/// The builder both set-ups use: histograms exported as Prometheus histograms with
/// [`BUCKETS_SECONDS`] (rather than client-side summaries), so they aggregate across processes.
fn prometheus_builder() -> PrometheusBuilder {
    PrometheusBuilder::new()
        .set_buckets(BUCKETS_SECONDS)
        .expect("the bucket list is not empty")
}

/// Installs a Prometheus recorder as the process's global `metrics` recorder and serves the
/// exposition text at `http://ADDR/metrics` (any path answers) until the process exits.
///
/// Called inside a tokio runtime, the listener runs as a task of that runtime (no extra OS
/// thread); otherwise it gets one thread of its own, named `boundpool-prometheus`, running a
/// single-threaded tokio runtime. The returned handle renders the same text in process.
///
/// Errors: the address cannot be bound, or a global recorder is already installed. On an error
/// nothing is left running: the socket is bound but not served until the recorder is installed,
/// and the listener's task or thread starts only after that, so a failed call closes the port
/// again and starts no thread.
pub fn install_prometheus(addr: impl Into<SocketAddr>) -> Result<PrometheusHandle, ObserveError> {
    let addr = addr.into();
    let builder = prometheus_builder().with_http_listener(addr);
    let err = |e: &dyn fmt::Display| {
        ObserveError(format!("cannot serve Prometheus metrics on {addr}: {e}"))
    };
    // The exporter is a future: building it binds the socket, but nothing serves it until it is
    // spawned. Install the recorder first, so that its error drops the future (and the socket).
    let install = |recorder: metrics_exporter_prometheus::PrometheusRecorder| {
        let handle = recorder.handle();
        metrics::set_global_recorder(recorder).map_err(|e| err(&e))?;
        Ok::<_, ObserveError>(handle)
    };
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        let (recorder, exporter) = {
            let _g = rt.enter();
            builder.build().map_err(|e| err(&e))?
        };
        let handle = install(recorder)?;
        rt.spawn(exporter);
        Ok(handle)
    } else {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| err(&e))?;
        let (recorder, exporter) = {
            let _g = rt.enter();
            builder.build().map_err(|e| err(&e))?
        };
        let handle = install(recorder)?;
        std::thread::Builder::new()
            .name("boundpool-prometheus".into())
            .spawn(move || {
                let _ = rt.block_on(exporter);
            })
            .map_err(|e| err(&e))?;
        Ok(handle)
    }
}

/// Installs a Prometheus recorder as the global `metrics` recorder without any listener (no
/// thread, no socket): read the exposition text with [`PrometheusHandle::render`].
///
/// Errors: a global recorder is already installed.
pub fn install_prometheus_recorder() -> Result<PrometheusHandle, ObserveError> {
    prometheus_builder()
        .install_recorder()
        .map_err(|e| ObserveError(format!("cannot install the Prometheus recorder: {e}")))
}

/// The traces `/trace` serves: (pool name, its trace's reader), in publication order.
static PUBLISHED_TRACES: std::sync::Mutex<Vec<(String, crate::backend::SpanRecorder)>> =
    std::sync::Mutex::new(Vec::new());

/// Makes `pool`'s timeline (its rolling window, see
/// [`PoolBuilder::trace_window`](crate::PoolBuilder::trace_window)) what the `/trace` path of
/// [`serve_metrics_and_trace`] serves, under the pool's name (a later pool of the same name
/// replaces it). Holds the trace, not the pool.
/// Returns whether the pool records a trace (nothing is published otherwise).
pub fn publish_trace<S: Send + 'static>(pool: &crate::Pool<S>) -> bool {
    match pool.span_recorder() {
        Some(r) => {
            publish_trace_of(pool.name(), r);
            true
        }
        None => false,
    }
}

/// [`publish_trace`] for a trace's reader without its pool ([`Pool::span_recorder`](crate::Pool::span_recorder)),
/// under `name`; a later one of the same name replaces it. (A GPU pool: `publish_trace(gpu_pool.pool())`.)
pub fn publish_trace_of(name: &str, recorder: crate::backend::SpanRecorder) {
    let mut list = PUBLISHED_TRACES.lock().unwrap_or_else(|e| e.into_inner());
    list.retain(|(n, _)| n != name);
    list.push((name.to_string(), recorder));
}

/// Installs a Prometheus recorder as the global `metrics` recorder and serves, on one thread of
/// its own (`boundpool-observe`), `GET /metrics` (the exposition text) and `GET /trace` (the
/// published pool's current window as Chrome trace JSON, see [`publish_trace`]; with several
/// published pools, `/trace?pool=NAME` picks one, and `/trace` serves the first). The window is
/// read, not drained: [`Pool::take_trace`](crate::Pool::take_trace) still returns it. Any other
/// path answers 404.
///
/// Errors: the address cannot be bound, or a global recorder is already installed; the recorder
/// is installed before the socket is bound and the thread starts last, so an error leaves no
/// thread and no bound port (but, for a bind error, the recorder installed).
pub fn serve_metrics_and_trace(
    addr: impl Into<SocketAddr>,
) -> Result<PrometheusHandle, ObserveError> {
    let addr = addr.into();
    let err = |e: &dyn fmt::Display| {
        ObserveError(format!("cannot serve metrics and trace on {addr}: {e}"))
    };
    let recorder = prometheus_builder().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|e| err(&e))?;
    let listener = std::net::TcpListener::bind(addr).map_err(|e| err(&e))?;
    let served = handle.clone();
    std::thread::Builder::new()
        .name("boundpool-observe".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                // One connection at a time: a slow client cannot hold it for long.
                let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(5)));
                let _ = answer(stream, &served);
            }
        })
        .map_err(|e| err(&e))?;
    Ok(handle)
}

/// Reads one HTTP request from `stream` and answers it (`Connection: close`).
fn answer(mut stream: std::net::TcpStream, metrics: &PrometheusHandle) -> std::io::Result<()> {
    use std::io::{BufRead, BufReader, Write};
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    // The rest of the head, up to the empty line.
    let mut header = String::new();
    while reader.read_line(&mut header)? > 2 {
        header.clear();
    }
    let mut words = line.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let (status, kind, body) = match (method, path) {
        ("GET", "/metrics") => ("200 OK", "text/plain; version=0.0.4", metrics.render()),
        ("GET", "/trace") => {
            let want = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("pool="))
                .map(str::to_string);
            let list = PUBLISHED_TRACES.lock().unwrap_or_else(|e| e.into_inner());
            let found = match &want {
                Some(name) => list.iter().find(|(n, _)| n == name),
                None => list.first(),
            }
            .map(|(_, r)| r.clone());
            drop(list);
            match found {
                Some(r) => (
                    "200 OK",
                    "application/json",
                    chrome_trace(&r.snapshot(), |_, _| {}).to_string(),
                ),
                None => (
                    "404 Not Found",
                    "text/plain",
                    "no published trace (observe::publish_trace)\n".to_string(),
                ),
            }
        }
        _ => (
            "404 Not Found",
            "text/plain",
            "/metrics or /trace\n".to_string(),
        ),
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    stream.write_all(body.as_bytes())?;
    stream.flush()
}
