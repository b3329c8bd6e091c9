//! The served model of `examples/serve` (also used by the serving bench, `bench_serve`): 4
//! linear layers (`dim` x `dim`, bias, GELU) at batch `batch`, in bf16 or f32, its weights
//! uploaded once, served from a replay graph whose runs each bring their input and take their
//! output through pinned buffers of their instance, the layers handing two activation buffers
//! on (each takes its predecessor's, `ReplayCtx::take`, and writes the one it does not read);
//! and the same model on the host, the reference every served output is checked against.
#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use boundpool::gpu::cudarc::cublas::sys::cublasOperation_t;
use boundpool::gpu::cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use boundpool::gpu::cudarc::cublaslt::MatmulConfig;
use boundpool::gpu::half::bf16;
use boundpool::gpu::{
    BoxError, DeviceBuffer, DeviceCopy, GpuCtx, GpuDevice, GpuGraphBuilder, GpuGraphExt, GpuPool,
    GpuResult, Kernel, KernelArg, LaunchConfig, LtElement, LtTuning, Module, PinnedBuffer,
    Priority, RNode, ReplayBuilder, ReplayCtx, Replayable, RunInputs,
};

/// Linear layers in the model.
pub const LAYERS: usize = 4;

/// The bias + GELU kernels (erf form, as `torch.nn.functional.gelu`), in place over a
/// row-major `rows` x `cols` activation; bf16 converted by hand (no headers under NVRTC).
const KERNELS: &str = r#"
__device__ float bf2f(unsigned short h) { return __uint_as_float(((unsigned)h) << 16); }
__device__ unsigned short f2bf(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
__device__ float gelu(float v) { return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)); }
extern "C" __global__ void bias_gelu_f32(float* y, const float* bias, unsigned rows, unsigned cols) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) y[i] = gelu(y[i] + bias[i % cols]);
}
extern "C" __global__ void bias_gelu_bf16(unsigned short* y, const unsigned short* bias,
                                          unsigned rows, unsigned cols) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) y[i] = f2bf(gelu(bf2f(y[i]) + bf2f(bias[i % cols])));
}
extern "C" __global__ void gelu_f32(float* y, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = gelu(y[i]);
}
extern "C" __global__ void gelu_bf16(unsigned short* y, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = f2bf(gelu(bf2f(y[i])));
}
extern "C" __global__ void copy_words(unsigned* dst, const unsigned* src, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}
"#;

/// The options of a served model's graph.
#[derive(Clone, Copy, Debug)]
pub struct ServeOptions {
    /// Replayed instances (concurrent runs).
    pub instances: usize,
    /// Every run's level.
    pub priority: Priority,
    /// How the GEMMs run.
    pub gemm: GemmPath,
    /// Whether the copies in and out are in the CUDA graph (one launch per request) or eager
    /// nodes around it (a copy-free graph, as PyTorch's).
    pub copies_in_graph: bool,
    /// In the graph, whether a kernel reads the input from and writes the output to the
    /// pinned buffers directly (`PinnedBuffer::device_ptr`: zero-copy, the graph all kernels)
    /// rather than copy nodes.
    pub zero_copy: bool,
    /// Whether the host nodes (staging the input, reading the output) run on the model's
    /// device's workers only (`ReplayBuilder::host_node_on`), or on any worker.
    pub host_on_device: bool,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            instances: 8,
            priority: Priority::Normal,
            gemm: GemmPath::Lt,
            copies_in_graph: true,
            zero_copy: true,
            host_on_device: true,
        }
    }
}

/// How a layer's GEMM runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmPath {
    /// cuBLASLt with the bias in its epilogue (as PyTorch's `Linear`), then a GELU kernel.
    Lt,
    /// cuBLAS (`cublasGemmEx` / `cublasSgemm`), then a bias + GELU kernel.
    Cublas,
}

/// An element type the model runs in.
pub trait Elem:
    DeviceCopy + LtElement + Copy + PartialEq + Send + Sync + std::fmt::Debug + 'static
{
    /// "bf16" or "f32".
    const NAME: &'static str;
    /// The bias + GELU kernel's entry point.
    const KERNEL: &'static str;
    /// The GELU kernel's entry point (after a cuBLASLt GEMM with the bias in its epilogue).
    const GELU: &'static str;
    /// Tolerance of a served output against the host reference: |got - want| <= tol (1 + |want|).
    const TOL: f32;
    fn from_f32(v: f32) -> Self;
    fn to_f32(self) -> f32;
}

impl Elem for f32 {
    const NAME: &'static str = "f32";
    const KERNEL: &'static str = "bias_gelu_f32";
    const GELU: &'static str = "gelu_f32";
    const TOL: f32 = 1e-4;
    fn from_f32(v: f32) -> Self {
        v
    }
    fn to_f32(self) -> f32 {
        self
    }
}

impl Elem for bf16 {
    const NAME: &'static str = "bf16";
    const KERNEL: &'static str = "bias_gelu_bf16";
    const GELU: &'static str = "gelu_bf16";
    // One bf16 rounding (2^-8) of a different accumulation order may flip per layer.
    const TOL: f32 = 3e-2;
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

/// The model's shape.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub batch: usize,
    pub dim: usize,
}

/// Weights and biases, row-major `[out][in]` as `torch.nn.Linear` keeps them, already rounded
/// to `T`; seeded, so every process makes the same model.
pub struct Weights<T> {
    pub shape: Shape,
    pub w: Vec<Vec<T>>,
    pub b: Vec<Vec<T>>,
}

/// A small seeded generator (no dependency): uniform in [-1, 1).
pub struct Lcg(u64);

impl Lcg {
    pub fn new(seed: u64) -> Self {
        Lcg(seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407))
    }
    pub fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

impl<T: Elem> Weights<T> {
    pub fn new(shape: Shape, seed: u64) -> Self {
        let mut r = Lcg::new(seed);
        let scale = 1.0 / (shape.dim as f32).sqrt();
        let (mut w, mut b) = (Vec::new(), Vec::new());
        for _ in 0..LAYERS {
            w.push(
                (0..shape.dim * shape.dim)
                    .map(|_| T::from_f32(r.next() * scale))
                    .collect(),
            );
            b.push(
                (0..shape.dim)
                    .map(|_| T::from_f32(r.next() * 0.1))
                    .collect(),
            );
        }
        Self { shape, w, b }
    }

    /// A request's input: `batch` x `dim`, seeded by `k`.
    pub fn request(&self, k: u64) -> Vec<T> {
        let mut r = Lcg::new(k ^ 0x5eed);
        (0..self.shape.batch * self.shape.dim)
            .map(|_| T::from_f32(r.next()))
            .collect()
    }

    /// One layer on the host as the device computes it: the GEMM rounded to `T`, then bias and
    /// GELU in f32, rounded to `T`. Rows `rows` of the output only (the host-worker model splits
    /// a layer by rows).
    pub fn layer(&self, l: usize, x: &[T], rows: std::ops::Range<usize>) -> Vec<T> {
        let d = self.shape.dim;
        let mut y = Vec::with_capacity(rows.len() * d);
        for bi in rows {
            let xr = &x[bi * d..(bi + 1) * d];
            for n in 0..d {
                let wr = &self.w[l][n * d..(n + 1) * d];
                let acc: f64 = xr
                    .iter()
                    .zip(wr)
                    .map(|(a, b)| a.to_f32() as f64 * b.to_f32() as f64)
                    .sum();
                let v = T::from_f32(acc as f32).to_f32() + self.b[l][n].to_f32();
                y.push(T::from_f32(gelu(v)));
            }
        }
        y
    }

    /// The whole forward pass on the host.
    pub fn reference(&self, x: &[T]) -> Vec<T> {
        let mut h = x.to_vec();
        for l in 0..LAYERS {
            h = self.layer(l, &h, 0..self.shape.batch);
        }
        h
    }
}

/// GELU, erf form, with an erf good to ~1e-7 (Abramowitz and Stegun 7.1.26 is not enough for
/// the f32 tolerance; this is W. J. Cody's rational form via erfc for |x| >= 0.5).
pub fn gelu(v: f32) -> f32 {
    let x = v as f64 * std::f64::consts::FRAC_1_SQRT_2;
    (0.5 * v as f64 * (1.0 + erf(x))) as f32
}

fn erf(x: f64) -> f64 {
    // Numerical Recipes' erfc (Chebyshev fit, fractional error < 1.2e-7).
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.26551223
            + t * (1.00002368
                + t * (0.37409196
                    + t * (0.09678418
                        + t * (-0.18628806
                            + t * (0.27886807
                                + t * (-1.13520398
                                    + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))))
            .exp();
    if x >= 0.0 {
        1.0 - r
    } else {
        r - 1.0
    }
}

/// Whether `got` is `want` within `T`'s tolerance; else the first element off.
pub fn check<T: Elem>(got: &[T], want: &[T]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} values, want {}", got.len(), want.len()));
    }
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let (g, w) = (g.to_f32(), w.to_f32());
        // A NaN fails too.
        let within = (g - w).abs() <= T::TOL * (1.0 + w.abs());
        if !within {
            return Err(format!("element {i}: {g}, want {w} (tolerance {})", T::TOL));
        }
    }
    Ok(())
}

/// The model on a device: weights uploaded once, and a replay graph whose runs take an input
/// and give the output.
pub struct ServedModel<T: DeviceCopy> {
    pub replay: Replayable,
    pub x: RNode<Vec<T>>,
    pub y: RNode<Vec<T>>,
    /// When each run's read-out node ran, while asked for (a probe of the path after the
    /// device).
    pub reads: Arc<ReadLog>,
}

/// The read-out node's start and end per run, recorded only while `on`.
#[derive(Default)]
pub struct ReadLog {
    pub on: AtomicBool,
    pub stamps: Mutex<Vec<(std::time::Instant, std::time::Instant)>>,
}

impl ReadLog {
    /// Records from now on (`true`) or not; what was recorded is taken with `take`.
    pub fn record(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    /// The recorded (start, end) pairs, oldest first.
    pub fn take(&self) -> Vec<(std::time::Instant, std::time::Instant)> {
        std::mem::take(&mut *self.stamps.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Each layer's weight and bias on the device, shared by every instance.
pub type DeviceWeights<T> = Arc<Vec<(DeviceBuffer<T>, DeviceBuffer<T>)>>;

/// Uploads the weights to `device` once (a one-node graph), shared by every instance.
pub fn upload_weights<T: Elem>(
    pool: &GpuPool,
    device: &GpuDevice,
    weights: &Weights<T>,
) -> Result<DeviceWeights<T>, BoxError> {
    let (w, b) = (weights.w.clone(), weights.b.clone());
    let mut g = GpuGraphBuilder::new("upload weights");
    let up = g.gpu_node(device, "upload weights", move |gpu| {
        let mut out = Vec::new();
        for (w, b) in w.iter().zip(&b) {
            out.push((gpu.upload(w)?, gpu.upload(b)?));
        }
        Ok(out)
    });
    let mut out = pool.submit(&g.build()?)?.wait()?;
    Ok(Arc::new(out.take(up).expect("the upload node's output")))
}

/// A request's way in and out: the input staged in pinned memory and copied to the device, the
/// output copied back into pinned memory, both copies inside the replayed CUDA graph.
pub struct Io<T: DeviceCopy> {
    pin_in: PinnedBuffer<T>,
    pin_out: PinnedBuffer<T>,
    /// With the copies as eager nodes only: the device input the "stage input" node fills every
    /// run, read by the first layer (in the graph, the first layer copies the input into an
    /// activation buffer of its own).
    dev_in: Option<DeviceBuffer<T>>,
}

/// The free sets of the model's instances and eager runs. It stays a `Mutex`: it is a free
/// list shared by every instance and eager run (pinned allocations are slow, so eager runs
/// reuse sets), locked when an instance captures and around an eager run, never by a replayed
/// request, and no write to a buffer goes through it.
type IoPool<T> = Arc<Mutex<Vec<Io<T>>>>;

/// A layer's output `y`, and `spare`, the buffer the next layer writes (this layer's input):
/// handed from layer to layer, each taking its predecessor's (their only reader) and writing
/// the buffer it does not read, so the four layers write into two buffers they hold.
pub struct Activations<T: DeviceCopy> {
    y: DeviceBuffer<T>,
    spare: DeviceBuffer<T>,
}

/// An [`Io`] lent to a replay instance (for its life) or an eager run (for the run): back to
/// the model's pool when dropped, if the last run that used it read its output (so no copy
/// of it can be in flight); else freed.
pub struct Lent<T: DeviceCopy> {
    io: Option<Io<T>>,
    pool: IoPool<T>,
    idle: AtomicBool,
}

impl<T: DeviceCopy> Drop for Lent<T> {
    fn drop(&mut self) {
        if let Some(io) = self.io.take() {
            if self.idle.load(Ordering::Acquire) {
                self.pool.lock().unwrap_or_else(|e| e.into_inner()).push(io);
            }
        }
    }
}

impl<T: DeviceCopy> Lent<T> {
    fn io(&self) -> &Io<T> {
        self.io.as_ref().expect("lent I/O buffers")
    }
}

impl<T: Elem> ServedModel<T>
where
    CudaBlas: Gemm<T>,
{
    /// The forward pass as a replay graph: input `x` written by a host node into the pinned
    /// buffer of the run's instance; the copy to the device, the 4 layers (GEMM with bias, then
    /// GELU) and the copy back captured in one segment; the output read by a host node once the
    /// segment is done. A replayed request makes one driver call: the graph launch. (With
    /// `copies_in_graph` off, eager GPU nodes make the two copies around a copy-free graph.)
    pub fn new(
        device: &GpuDevice,
        shape: Shape,
        weights: DeviceWeights<T>,
        opts: ServeOptions,
    ) -> GpuResult<Self> {
        let ServeOptions {
            instances,
            priority,
            gemm,
            copies_in_graph,
            zero_copy,
            host_on_device,
        } = opts;
        let module = Module::from_cuda_source("serve", KERNELS)?;
        let kernel = module.kernel(match gemm {
            GemmPath::Lt => T::GELU,
            GemmPath::Cublas => T::KERNEL,
        })?;
        let copy = (copies_in_graph && zero_copy)
            .then(|| module.kernel("copy_words"))
            .transpose()?;
        let n = shape.batch * shape.dim;
        let pool: IoPool<T> = Arc::default();
        let high = if priority == Priority::High {
            " high"
        } else {
            ""
        };
        let mut g = ReplayBuilder::new(&format!("serve {}{high}", T::NAME));
        g.instances(instances).priority(priority);
        let x = g.input::<Vec<T>>("x");
        let io = g.gpu_node(device, "io buffers", move |c: &ReplayCtx<'_, '_>| {
            lend_io(c, &pool, n, !copies_in_graph)
        });
        let stage_body = move |c: &ReplayCtx<'_, '_>| -> Result<(), BoxError> {
            let lent = c.input(io)?;
            lent.idle.store(false, Ordering::Release);
            // SAFETY: the run holds the instance (or, eager, the lent buffers) alone, and the
            // previous run's copies finished before its "read output" node ran.
            unsafe { lent.io().pin_in.write(&c.input(x)?)? };
            if !copies_in_graph {
                let io = lent.io();
                let dev_in = io
                    .dev_in
                    .as_ref()
                    .expect("lent with copies outside the graph");
                // Through `&`, not a take: the captured first layer reads this buffer too.
                c.gpu()?.copy_from_pinned(&io.pin_in, dev_in)?;
            }
            Ok(())
        };
        // The host nodes run on the device's workers (its partition's, on a split device): a
        // batch model's never hold up a latency-critical partition's workers.
        let host_device = host_on_device.then_some(device);
        let stage = if copies_in_graph {
            host_node(&mut g, host_device, "stage input", stage_body)
        } else {
            g.eager_gpu_node(device, "stage input", stage_body)
        };
        g.edge(x, stage).edge(io, stage);
        let layers = LayerNodes {
            device,
            weights: &weights,
            kernel: &kernel,
            shape,
            gemm,
            copies_in_graph,
            copy: copy.as_ref(),
        };
        let last = layers.add(&mut g, io, stage);
        let copy_out = (!copies_in_graph).then(|| {
            let out = g.eager_gpu_node(device, "copy out", move |c: &ReplayCtx<'_, '_>| {
                c.gpu()?
                    .copy_to_pinned(&c.input(last)?.y, &c.input(io)?.io().pin_out)?;
                Ok(())
            });
            g.edge(last, out).edge(io, out);
            out
        });
        let reads = Arc::new(ReadLog::default());
        let log = reads.clone();
        let y = host_node(
            &mut g,
            host_device,
            "read output",
            move |c: &ReplayCtx<'_, '_>| {
                let start = std::time::Instant::now();
                let lent = c.input(io)?;
                // SAFETY: a host node after the node that copies into `pin_out` (the last layer,
                // or "copy out") runs once that GPU work is done.
                let y = unsafe { lent.io().pin_out.to_vec() };
                lent.idle.store(true, Ordering::Release);
                if log.on.load(Ordering::Relaxed) {
                    let end = std::time::Instant::now();
                    let mut stamps = log.stamps.lock().unwrap_or_else(|p| p.into_inner());
                    stamps.push((start, end));
                }
                Ok(y)
            },
        );
        match copy_out {
            Some(out) => g.edge(out, y),
            None => g.edge(last, y),
        };
        g.edge(io, y);
        Ok(Self {
            replay: g.build()?,
            x,
            y,
            reads,
        })
    }

    /// One request, replayed (or eager): its output. The input is shared, not copied, until
    /// the run's staging node writes it into its instance's pinned buffer.
    pub fn serve(&self, pool: &GpuPool, x: Arc<Vec<T>>, eager: bool) -> GpuResult<Arc<Vec<T>>> {
        let inputs = RunInputs::new().set_arc(self.x, x);
        let out = if eager {
            self.replay.run_eager_with(pool, inputs)?
        } else {
            self.replay.run_with(pool, inputs)?
        };
        Ok(out.get(self.y).expect("the read output node's output"))
    }
}

/// A host node on `device`'s workers, or on any worker.
fn host_node<T, F>(
    g: &mut ReplayBuilder,
    device: Option<&GpuDevice>,
    name: &str,
    body: F,
) -> RNode<T>
where
    T: Send + Sync + 'static,
    F: Fn(&ReplayCtx<'_, '_>) -> Result<T, BoxError> + Send + Sync + 'static,
{
    match device {
        Some(d) => g.host_node_on(d, name, body),
        None => g.host_node(name, body),
    }
}

/// A layer's cuBLASLt product: `y^T = W x^T + b` (column-major `dim` x `batch`).
fn lt_layer(shape: Shape) -> MatmulConfig {
    let (bt, d) = (shape.batch as u64, shape.dim as u64);
    MatmulConfig {
        transa: true,
        transb: false,
        transc: false,
        m: d,
        n: bt,
        k: d,
        alpha: 1.0,
        lda: d as i64,
        ldb: d as i64,
        beta: 0.0,
        ldc: d as i64,
        stride_a: None,
        stride_b: None,
        stride_c: None,
        stride_bias: None,
        batch_size: None,
    }
}

/// Times cuBLASLt's candidates for the layers' product (one problem: every layer has the same
/// shapes) on the device's first layer weights, in a one-node graph, so that the replays
/// captured after it run the fastest (`CublasLt::tune`).
pub fn tune_layers<T: Elem>(
    pool: &GpuPool,
    device: &GpuDevice,
    shape: Shape,
    weights: &DeviceWeights<T>,
) -> Result<LtTuning, BoxError> {
    let w = weights.clone();
    let mut g = GpuGraphBuilder::new("tune layers");
    let t = g.gpu_node(device, "tune layers", move |gpu| {
        let n = shape.batch * shape.dim;
        let x = gpu.upload(&vec![T::from_f32(0.5); n])?;
        let mut y = gpu.alloc::<T>(n)?;
        let (w0, b0) = &w[0];
        // SAFETY: `w0` is dim x dim, `x` and `y` batch x dim, `b0` dim, as `lt_layer` says; the
        // buffers outlive the node's work (the graph's end waits for it).
        let t = unsafe {
            gpu.cublaslt()?.tune(
                lt_layer(shape),
                w0.as_cuda_slice(),
                x.as_cuda_slice(),
                &mut y,
                Some(b0.as_cuda_slice()),
                None,
            )?
        };
        Ok(t)
    });
    let mut out = pool.submit(&g.build()?)?.wait()?;
    Ok(out.take(t).expect("the tune node's output"))
}

/// `y = GELU(x W^T + b)` for a row-major `batch` x `dim` `x`, into `y`: the BLAS sees the
/// column-major `dim` x `batch` `y^T = W x^T` (`W` transposed from its row-major `[out][in]`).
fn layer<T: Elem>(
    c: &ReplayCtx<'_, '_>,
    (w, b): &(DeviceBuffer<T>, DeviceBuffer<T>),
    x: &DeviceBuffer<T>,
    y: &mut DeviceBuffer<T>,
    kernel: &Kernel,
    shape: Shape,
    gemm: GemmPath,
) -> Result<(), BoxError>
where
    CudaBlas: Gemm<T>,
{
    let gpu = c.gpu()?;
    let (bt, d) = (shape.batch, shape.dim);
    match gemm {
        GemmPath::Lt => {
            let cfg = lt_layer(shape);
            // SAFETY: `w` is d x d, `x` and `y` batch x d, `b` d (one per output row of the
            // column-major product), as the configuration says.
            unsafe {
                gpu.cublaslt()?.matmul(
                    cfg,
                    w.as_cuda_slice(),
                    x.as_cuda_slice(),
                    &mut *y,
                    Some(b.as_cuda_slice()),
                    None,
                )?
            };
            // SAFETY: `(T* y, u32 n)` over `y`'s batch x d elements, a node output.
            unsafe {
                gpu.launch(kernel, LaunchConfig::for_elements(bt * d))
                    .arg(&mut *y)
                    .arg((bt * d) as u32)
                    .launch()?;
            }
        }
        GemmPath::Cublas => {
            let cfg = GemmConfig {
                transa: cublasOperation_t::CUBLAS_OP_T,
                transb: cublasOperation_t::CUBLAS_OP_N,
                m: d as i32,
                n: bt as i32,
                k: d as i32,
                alpha: T::from_f32(1.0),
                lda: d as i32,
                ldb: d as i32,
                beta: T::from_f32(0.0),
                ldc: d as i32,
            };
            let blas = gpu.cublas()?;
            // SAFETY: `w` is d x d, `x` and `y` batch x d, as the configuration says.
            unsafe { blas.gemm(cfg, w.as_cuda_slice(), x.as_cuda_slice(), &mut *y)? };
            drop(blas);
            // SAFETY: `(T* y, const T* bias, u32 rows, u32 cols)` over `y`'s batch x d
            // elements and `b`'s d; both outlive the launch (node outputs and the weights).
            unsafe {
                gpu.launch(kernel, LaunchConfig::for_elements(bt * d))
                    .arg(&mut *y)
                    .arg(b)
                    .arg(bt as u32)
                    .arg(d as u32)
                    .launch()?;
            }
        }
    }
    Ok(())
}

/// The "io buffers" node's body: a set from the model's pool, or a new one.
fn lend_io<T: Elem>(
    c: &ReplayCtx<'_, '_>,
    pool: &IoPool<T>,
    n: usize,
    dev_in: bool,
) -> Result<Lent<T>, BoxError> {
    let free = pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
    let io = match free {
        Some(io) => io,
        None => {
            let gpu = c.gpu()?;
            Io {
                pin_in: gpu.alloc_pinned::<T>(n)?,
                pin_out: gpu.alloc_pinned::<T>(n)?,
                dev_in: dev_in.then(|| gpu.alloc::<T>(n)).transpose()?,
            }
        }
    };
    Ok(Lent {
        io: Some(io),
        pool: pool.clone(),
        idle: AtomicBool::new(true),
    })
}

/// Copies `len` elements of `T` from `src` to `dst` (a device buffer the node holds and a mapped
/// pinned buffer, either way) with the copy kernel, 4 bytes a thread. A pinned buffer is
/// written through `&`: the run's host nodes share it (their access is the `unsafe` part).
fn copy_words<T: Elem>(
    gpu: &GpuCtx<'_, '_>,
    copy: &Kernel,
    dst: impl KernelArg,
    src: impl KernelArg,
    len: usize,
) -> Result<(), BoxError> {
    let words = len * std::mem::size_of::<T>() / 4;
    // SAFETY: `copy_words(unsigned* dst, const unsigned* src, unsigned n)`: both buffers hold
    // `len` elements, `words` 4-byte words (the model's sizes are multiples of 4 bytes), and
    // live for the graph.
    unsafe {
        gpu.launch(copy, LaunchConfig::for_elements(words))
            .arg(dst)
            .arg(src)
            .arg(words as u32)
            .launch()?
    };
    Ok(())
}

/// What the layer nodes share.
struct LayerNodes<'m, T: DeviceCopy> {
    device: &'m GpuDevice,
    weights: &'m DeviceWeights<T>,
    kernel: &'m Kernel,
    shape: Shape,
    gemm: GemmPath,
    copies_in_graph: bool,
    /// The copy kernel of zero-copy I/O (None: copy nodes).
    copy: Option<&'m Kernel>,
}

impl<T: Elem> LayerNodes<'_, T>
where
    CudaBlas: Gemm<T>,
{
    /// The 4 captured layers after `stage`, the first copying the input in and the last the
    /// output out when the copies are in the graph; returns the last.
    fn add(
        &self,
        g: &mut ReplayBuilder,
        io: RNode<Lent<T>>,
        stage: RNode<()>,
    ) -> RNode<Activations<T>> {
        let mut prev: Option<RNode<Activations<T>>> = None;
        for l in 0..LAYERS {
            let (w, k) = (self.weights.clone(), self.kernel.clone());
            let (shape, gemm, copies_in_graph) = (self.shape, self.gemm, self.copies_in_graph);
            let copy = self.copy.cloned();
            let n = shape.batch * shape.dim;
            let node = g.gpu_node(
                self.device,
                &format!("layer {l}"),
                move |c: &ReplayCtx<'_, '_>| {
                    let gpu = c.gpu()?;
                    let lent = c.input(io)?;
                    let io = lent.io();
                    let acts = match prev {
                        // The previous layer's output is this one's input; its input buffer,
                        // which nothing reads any more, takes this one's output.
                        Some(p) => {
                            let Activations { y: x, spare: mut y } = c.take(p)?;
                            layer(c, &w[l], &x, &mut y, &k, shape, gemm)?;
                            Activations { y, spare: x }
                        }
                        None => {
                            let mut y = gpu.alloc::<T>(n)?;
                            let spare = match &copy {
                                Some(cp) => {
                                    let mut x = gpu.alloc::<T>(n)?;
                                    copy_words::<T>(gpu, cp, &mut x, &io.pin_in, n)?;
                                    layer(c, &w[l], &x, &mut y, &k, shape, gemm)?;
                                    x
                                }
                                None if copies_in_graph => {
                                    let x = gpu.alloc::<T>(n)?;
                                    gpu.copy_from_pinned(&io.pin_in, &x)?;
                                    layer(c, &w[l], &x, &mut y, &k, shape, gemm)?;
                                    x
                                }
                                None => {
                                    let x = io.dev_in.as_ref().expect("lent with copies outside");
                                    layer(c, &w[l], x, &mut y, &k, shape, gemm)?;
                                    gpu.alloc::<T>(n)?
                                }
                            };
                            Activations { y, spare }
                        }
                    };
                    if l == LAYERS - 1 {
                        match &copy {
                            Some(cp) => copy_words::<T>(gpu, cp, &io.pin_out, &acts.y, n)?,
                            None if copies_in_graph => gpu.copy_to_pinned(&acts.y, &io.pin_out)?,
                            None => {}
                        }
                    }
                    Ok(acts)
                },
            );
            g.edge(io, node);
            match prev {
                Some(p) => g.hand_on(p, node),
                None => g.edge(stage, node),
            };
            prev = Some(node);
        }
        prev.expect("layers")
    }
}
