//! The `/metrics` + `/trace` endpoint (feature `prometheus`): HTTP/1.1 on hyper, the server the
//! exporter's own listener runs on (that listener answers every path with the metrics and takes
//! no route of ours), a task per connection so that concurrent scrapes are served together and
//! a slow client holds up no other, and the query decoded as a form (`form_urlencoded`:
//! percent-escapes and `+`).

use std::convert::Infallible;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::CONTENT_TYPE;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

use super::prometheus::{prometheus_builder, PrometheusHandle, ServerHost};
use super::{chrome_trace, ObserveError};
use crate::backend::{PoolExt, SpanRecorder};

/// How long a client may take to send a request's head before its connection is closed.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// The traces `/trace` serves: (pool name, its trace's reader), in publication order.
static PUBLISHED_TRACES: Mutex<Vec<(String, SpanRecorder)>> = Mutex::new(Vec::new());

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
pub fn publish_trace_of(name: &str, recorder: SpanRecorder) {
    let mut list = PUBLISHED_TRACES.lock().unwrap_or_else(|e| e.into_inner());
    list.retain(|(n, _)| n != name);
    list.push((name.to_string(), recorder));
}

/// Installs a Prometheus recorder as the global `metrics` recorder and serves `GET /metrics`
/// (the exposition text) and `GET /trace` (the published pool's current window as Chrome trace
/// JSON, see [`publish_trace`]; with several published pools, `/trace?pool=NAME` picks one, its
/// name percent-encoded as a form value, and `/trace` serves the first). The window is read,
/// not drained: [`Pool::take_trace`](crate::Pool::take_trace) still returns it. Any other path
/// answers 404.
///
/// Connections are served concurrently (HTTP/1.1 on hyper, a task each; a client that has not
/// sent its request's head within 5 s is disconnected). Called inside a tokio runtime, the
/// server runs as a task of that runtime (no extra OS thread); otherwise it gets one thread of
/// its own, named `boundpool-observe`, running a single-threaded tokio runtime.
///
/// Errors: the address cannot be bound, or a global recorder is already installed. The socket
/// is bound first and the recorder installed next, so an error leaves no recorder (for a bind
/// error), no bound port and no thread.
pub fn serve_metrics_and_trace(
    addr: impl Into<SocketAddr>,
) -> Result<PrometheusHandle, ObserveError> {
    let addr = addr.into();
    let err = |e: &dyn fmt::Display| {
        ObserveError(format!("cannot serve metrics and trace on {addr}: {e}"))
    };
    let host = ServerHost::new().map_err(|e| err(&e))?;
    let listener = std::net::TcpListener::bind(addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .and_then(|l| host.enter(|| tokio::net::TcpListener::from_std(l)))
        .map_err(|e| err(&e))?;
    let recorder = prometheus_builder().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|e| err(&e))?;
    host.spawn("boundpool-observe", serve(listener, handle.clone()))
        .map_err(|e| err(&e))?;
    Ok(handle)
}

/// Accepts connections on `listener` for ever, each served by a task of its own.
async fn serve(listener: tokio::net::TcpListener, metrics: PrometheusHandle) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            // Out of file descriptors, or a connection reset before it was accepted: the next
            // accept may succeed once a connection closes.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let response = respond(&req, &metrics);
                async move { Ok::<_, Infallible>(response) }
            });
            // A connection's error (the client went away, or timed out) ends only it.
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The answer to `req`: the metrics, a published trace, or 404.
fn respond(req: &Request<Incoming>, metrics: &PrometheusHandle) -> Response<Full<Bytes>> {
    let (status, kind, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => (
            StatusCode::OK,
            "text/plain; version=0.0.4",
            metrics.render(),
        ),
        (&Method::GET, "/trace") => trace(req.uri().query()),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "/metrics or /trace\n".to_string(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, hyper::header::HeaderValue::from_static(kind));
    response
}

/// `/trace` with `query`: the window of the pool its `pool` names (decoded), else of the first
/// published pool, as Chrome trace JSON; 404 when there is none.
fn trace(query: Option<&str>) -> (StatusCode, &'static str, String) {
    let want = query.and_then(|q| {
        form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "pool")
            .map(|(_, v)| v.into_owned())
    });
    let list = PUBLISHED_TRACES.lock().unwrap_or_else(|e| e.into_inner());
    let found = match &want {
        Some(name) => list.iter().find(|(n, _)| n == name),
        None => list.first(),
    }
    .map(|(_, r)| r.clone());
    drop(list);
    match found {
        Some(r) => (
            StatusCode::OK,
            "application/json",
            chrome_trace(&r.snapshot(), |_, _| {}).to_string(),
        ),
        None => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "no published trace (observe::publish_trace)\n".to_string(),
        ),
    }
}
