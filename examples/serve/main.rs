//! A model served to many clients: 4 linear layers (1024 x 1024, bias, GELU) at batch 8, in
//! bf16 and f32, its weights uploaded once. Each request brings its input to a replayed run
//! ([`RunInputs`]): an eager node uploads it into the run's instance, the forward pass (cuBLAS
//! GEMMs and a bias + GELU kernel) replays as one CUDA graph, an eager node downloads the
//! output; every output is checked against the model run on the host. Clients are threads
//! (blocking `run_with`) and tokio tasks (`submit(..).await`); the pool's metrics are exported
//! while it runs and a few are read back at the end.
//!
//! ```text
//! cargo run --release --features prometheus --example serve            # metrics on 127.0.0.1:9186
//! cargo run --release --features prometheus --example serve -- 127.0.0.1:9300
//! ```
//!
//! Without a GPU it serves the same model, smaller (128 x 128), from host workers, and says so.
//! The serving bench (`cargo bench -p boundpool-bench --bench serve`) measures this model
//! against PyTorch.

mod model;

use std::sync::Arc;
use std::time::Instant;

use boundpool::gpu::cudarc::cublas::{CudaBlas, Gemm};
use boundpool::gpu::half::bf16;
use boundpool::gpu::{gpu_unavailable_reason, Devices, GpuPool, GpuPoolBuilder, RunInputs};
use boundpool::observe::install_prometheus;
use boundpool::{Cores, GraphBuilder, PoolBuilder};
use model::{check, Elem, ServeOptions, ServedModel, Shape, Weights, LAYERS};

type Error = Box<dyn std::error::Error + Send + Sync>;

const THREAD_CLIENTS: usize = 4;
const TASK_CLIENTS: usize = 8;
const REQUESTS: usize = 64;
/// Distinct inputs per model (each checked against its host reference, computed once).
const INPUTS: u64 = 8;

fn main() -> Result<(), Error> {
    let addr: std::net::SocketAddr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9186".into())
        .parse()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let _guard = rt.enter();
    let metrics = install_prometheus(addr)?;
    println!("metrics at http://{addr}/metrics");
    if let Some(why) = gpu_unavailable_reason() {
        println!("no GPU ({why}): serving the model at 128 x 128 from host workers instead");
        return serve_on_host();
    }
    let pool = GpuPoolBuilder::new()
        .name("serve")
        .devices(Devices::List(vec![0]))
        .workers_per_device(8)
        // Tuned for latency: clients watch for their request's end (it takes about 50-100 us)
        // before parking, and workers watch for the next request as long before they park.
        .wait_spin(std::time::Duration::from_micros(200))
        .idle_spin(std::time::Duration::from_micros(200))
        .build()?;
    serve::<bf16>(&pool, &rt)?;
    serve::<f32>(&pool, &rt)?;
    let text = metrics.render();
    for name in [
        "boundpool_gpu_replays_total",
        "boundpool_gpu_captures_total",
        "boundpool_graphs_completed_total",
    ] {
        let total: f64 = text
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        println!("{name} on the endpoint: {total}");
    }
    Ok(())
}

/// Serves `REQUESTS` requests from each of `THREAD_CLIENTS` threads and `TASK_CLIENTS` tokio
/// tasks, all on one replay graph with as many instances as clients.
fn serve<T: Elem>(pool: &GpuPool, rt: &tokio::runtime::Runtime) -> Result<(), Error>
where
    CudaBlas: Gemm<T>,
{
    let shape = Shape {
        batch: 8,
        dim: 1024,
    };
    let host = Weights::<T>::new(shape, 1);
    let device = pool.device(0).expect("device 0").clone();
    let weights = model::upload_weights(pool, &device, &host)?;
    let tuning = model::tune_layers(pool, &device, shape, &weights)?;
    println!("{} layers, cuBLASLt tuned: {tuning}", T::NAME);
    let opts = ServeOptions {
        instances: THREAD_CLIENTS + TASK_CLIENTS,
        ..ServeOptions::default()
    };
    let served = Arc::new(ServedModel::new(&device, shape, weights, opts)?);
    let inputs: Vec<Arc<Vec<T>>> = (0..INPUTS).map(|k| Arc::new(host.request(k))).collect();
    let want: Arc<Vec<Vec<T>>> = Arc::new(inputs.iter().map(|x| host.reference(x)).collect());
    let inputs = Arc::new(inputs);
    let t0 = Instant::now();
    std::thread::scope(|s| -> Result<(), Error> {
        let threads: Vec<_> = (0..THREAD_CLIENTS)
            .map(|c| {
                let (served, inputs, want) = (&served, &inputs, &want);
                s.spawn(move || -> Result<(), Error> {
                    for r in 0..REQUESTS {
                        let k = (c + r) % INPUTS as usize;
                        let y = served.serve(pool, inputs[k].clone(), false)?;
                        check(&y, &want[k])
                            .map_err(|e| format!("thread client {c}, request {r}: {e}"))?;
                    }
                    Ok(())
                })
            })
            .collect();
        // The tasks borrow the pool and the model for the scope; block_on keeps them inside it.
        rt.block_on(async {
            let tasks = (0..TASK_CLIENTS).map(|c| {
                let (served, inputs, want) = (&served, &inputs, &want);
                async move {
                    for r in 0..REQUESTS {
                        let k = (c * 3 + r) % INPUTS as usize;
                        let run = RunInputs::new().set_arc(served.x, inputs[k].clone());
                        let out = served.replay.submit(pool, run)?.await?;
                        let y = out.get(served.y).expect("the download node's output");
                        check(&y, &want[k])
                            .map_err(|e| format!("task client {c}, request {r}: {e}"))?;
                    }
                    Ok::<(), Error>(())
                }
            });
            for r in futures_join(tasks.collect()).await {
                r?;
            }
            Ok::<(), Error>(())
        })?;
        for t in threads {
            t.join().expect("client thread")?;
        }
        Ok(())
    })?;
    let n = (THREAD_CLIENTS + TASK_CLIENTS) * REQUESTS;
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "{}: {n} requests from {THREAD_CLIENTS} threads and {TASK_CLIENTS} tokio tasks, all checked against the host (tolerance {}), in {:.1} ms ({:.0} requests/s); {} instances, {} captures",
        T::NAME,
        T::TOL,
        secs * 1e3,
        n as f64 / secs,
        served.replay.instances(),
        served.replay.stats().captures
    );
    Ok(())
}

/// Awaits every future concurrently (tokio's `join_all` without the `futures` crate).
async fn futures_join<F: std::future::Future>(fs: Vec<F>) -> Vec<F::Output> {
    let mut fs: Vec<_> = fs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = fs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in fs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *o = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(|o| o.expect("ready")).collect()
}

/// The model at 128 x 128 in f32 on a host pool: each request a graph of its layers, each
/// layer split by rows over 4 nodes, checked against the sequential host reference.
fn serve_on_host() -> Result<(), Error> {
    let shape = Shape { batch: 8, dim: 128 };
    let weights = Arc::new(Weights::<f32>::new(shape, 1));
    let pool = PoolBuilder::new()
        .name("serve-host")
        .workers(2)
        .cores(Cores::Unpinned)
        .build()?;
    let t0 = Instant::now();
    let n = (THREAD_CLIENTS * REQUESTS) as u64;
    std::thread::scope(|s| -> Result<(), Error> {
        let clients: Vec<_> = (0..THREAD_CLIENTS as u64)
            .map(|c| {
                let (pool, weights) = (&pool, &weights);
                s.spawn(move || -> Result<(), Error> {
                    for r in 0..REQUESTS as u64 {
                        let x = Arc::new(weights.request(c * 1000 + r));
                        let y = host_request(pool, weights, x.clone())?;
                        check(&y, &weights.reference(&x))
                            .map_err(|e| format!("client {c}, request {r}: {e}"))?;
                    }
                    Ok(())
                })
            })
            .collect();
        for c in clients {
            c.join().expect("client thread")?;
        }
        Ok(())
    })?;
    println!(
        "host: {n} requests from {THREAD_CLIENTS} threads, all checked, in {:.1} ms",
        t0.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

/// One request on host workers: per layer, 4 nodes of 2 rows each, then a join.
fn host_request(
    pool: &boundpool::Pool,
    w: &Arc<Weights<f32>>,
    x: Arc<Vec<f32>>,
) -> Result<Vec<f32>, Error> {
    const PARTS: usize = 4;
    let rows = w.shape.batch / PARTS;
    let mut g = GraphBuilder::new("request");
    let mut prev = g.node("input", move |_| Ok(x.to_vec()));
    for l in 0..LAYERS {
        let parts: Vec<_> = (0..PARTS)
            .map(|p| {
                let w = w.clone();
                let n = g.node(format!("layer {l} rows {p}"), move |ctx| {
                    Ok(w.layer(l, ctx.input(prev)?, p * rows..(p + 1) * rows))
                });
                g.edge(prev, n);
                n
            })
            .collect();
        let ps = parts.clone();
        let join = g.node(format!("layer {l}"), move |ctx| {
            let mut y = Vec::new();
            for p in &ps {
                y.extend_from_slice(ctx.input(*p)?);
            }
            Ok(y)
        });
        for p in parts {
            g.edge(p, join);
        }
        prev = join;
    }
    let mut out = pool.run(&g.build()?)?;
    Ok(out.take(prev).expect("the last layer's output"))
}
