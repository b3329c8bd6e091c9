//! The Prometheus exporter (feature `prometheus`): the recorder, installed alone or with the
//! exporter's own listener, and where a server runs (a task of the caller's tokio runtime, or a
//! thread of its own). The `/metrics` + `/trace` endpoint is `endpoint.rs`.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;

use metrics_exporter_prometheus::PrometheusBuilder;
pub use metrics_exporter_prometheus::PrometheusHandle;

use super::ObserveError;

/// Histogram buckets, in seconds (node run times and graph latencies: 100 ns to 10 s).
pub const BUCKETS_SECONDS: &[f64] = &[
    1e-7, 3e-7, 1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0,
    10.0,
];

/// The builder both set-ups use: histograms exported as Prometheus histograms with
/// [`BUCKETS_SECONDS`] (rather than client-side summaries), so they aggregate across processes.
pub(super) fn prometheus_builder() -> PrometheusBuilder {
    PrometheusBuilder::new()
        .set_buckets(BUCKETS_SECONDS)
        .expect("the bucket list is not empty")
}

/// Where a server runs: called inside a tokio runtime, as a task of that runtime (no extra OS
/// thread); otherwise on one thread of its own running a single-threaded tokio runtime, made
/// here so that what the server needs (a bound socket) can be made in its context first.
pub(super) enum ServerHost {
    Caller(tokio::runtime::Handle),
    Own(tokio::runtime::Runtime),
}

impl ServerHost {
    pub(super) fn new() -> io::Result<Self> {
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => Ok(ServerHost::Caller(rt)),
            Err(_) => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map(ServerHost::Own),
        }
    }

    /// Runs `f` in the runtime's context (where tokio's sockets can be made).
    pub(super) fn enter<T>(&self, f: impl FnOnce() -> T) -> T {
        let _g = match self {
            ServerHost::Caller(h) => h.enter(),
            ServerHost::Own(rt) => rt.enter(),
        };
        f()
    }

    /// Starts `server`: a task of the caller's runtime, or a thread named `thread` that runs
    /// it until the process exits.
    pub(super) fn spawn(
        self,
        thread: &str,
        server: impl Future<Output = ()> + Send + 'static,
    ) -> io::Result<()> {
        match self {
            ServerHost::Caller(h) => {
                h.spawn(server);
                Ok(())
            }
            ServerHost::Own(rt) => std::thread::Builder::new()
                .name(thread.into())
                .spawn(move || rt.block_on(server))
                .map(drop),
        }
    }
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
    let err = |e: &dyn fmt::Display| {
        ObserveError(format!("cannot serve Prometheus metrics on {addr}: {e}"))
    };
    let host = ServerHost::new().map_err(|e| err(&e))?;
    // The exporter is a future: building it binds the socket, but nothing serves it until it is
    // spawned. Install the recorder first, so that its error drops the future (and the socket).
    let (recorder, exporter) = host
        .enter(|| prometheus_builder().with_http_listener(addr).build())
        .map_err(|e| err(&e))?;
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|e| err(&e))?;
    host.spawn("boundpool-prometheus", async move {
        let _ = exporter.await;
    })
    .map_err(|e| err(&e))?;
    Ok(handle)
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
