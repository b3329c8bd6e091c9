//! A self-test ("probe") of a GPU machine, for the `gpu_probe` example: the driver, binding a
//! device's primary context on a fresh thread, the built-in kernels of `boundpool-gpu` (their
//! PTX loaded and launched straight on the driver through [`crate::raw`], each result checked
//! on the host), the launch cost, out-of-memory handling and, on request, a sticky error.
//! `boundpool-gpu`'s own driver layer and its context checking are what its tests exercise
//! (`BOUNDPOOL_REQUIRE_GPU=1 cargo test -p boundpool-gpu`); this probe makes no call through it
//! beyond detection.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;

use boundpool_gpu::builtin;
use cudarc::driver::{CudaContext, CudaModule, CudaSlice, CudaStream, DevicePtr};

use crate::raw::{self, Error, Func, Result};

/// The probe's own kernel, `bp_poke(u64 addr)`: `*(u32*)addr = 1` with a raw address (given a
/// bad one, an illegal address that poisons the context). Not a built-in: the library's
/// kernels have no use for it.
const POKE: &str = "bp_poke";

const POKE_PTX: &str = "
.version 7.0
.target sm_70
.address_size 64
.visible .entry bp_poke(.param .u64 bp_poke_p0)
{
    .reg .b64 %rd<2>;
    .reg .b32 %r<2>;
    ld.param.u64 %rd1, [bp_poke_p0];
    mov.u32 %r1, 1;
    st.global.u32 [%rd1], %r1;
    ret;
}
";

/// Runs a self-test of device `ordinal` on a fresh thread and returns a report, one line per
/// check: detection, binding, every built-in kernel loaded and launched with its result
/// checked on the host, launch cost, out-of-memory handling. With `sticky = true` it finally
/// provokes an illegal address and checks that the context can be recreated afterwards (this
/// poisons the device's primary context for the whole process while it is retained).
pub fn probe(ordinal: i32, sticky: bool) -> Result<Vec<String>> {
    probe_with(ordinal, sticky, probe_kernels)
}

/// The kernel checks of a probe, on its bound thread, enqueuing on the stream given.
type KernelChecks = fn(&Arc<CudaStream>, &mut Vec<String>) -> Result<()>;

/// [`probe`] with its kernel checks given (a test makes them fail).
fn probe_with(ordinal: i32, sticky: bool, kernels: KernelChecks) -> Result<Vec<String>> {
    let mut out = Vec::new();
    // Detection first: cudarc would panic without libcuda.
    let n = boundpool_gpu::device_count()?;
    out.push(format!(
        "driver version {} ; {n} device(s)",
        boundpool_gpu::driver_version().unwrap_or(-1)
    ));
    let info = boundpool_gpu::device_info(ordinal)?;
    out.push(format!("device {ordinal}: {info:?}"));
    let lines = std::thread::scope(|s| {
        s.spawn(move || -> Result<Vec<String>> {
            let mut out = Vec::new();
            let before = raw::current().ok().flatten();
            out.push(format!(
                "fresh thread: current context before binding = {before:?}"
            ));
            // cudarc's `CudaContext::new`: a retain of the primary context, bound to this thread.
            let ctx = drv(
                "cuDevicePrimaryCtxRetain",
                CudaContext::new(ordinal.max(0) as usize),
            )?;
            // SAFETY: the probe synchronises its stream before it reads a result or frees.
            unsafe { ctx.disable_event_tracking() };
            let st = match drv("cuCtxGetCurrent", raw::current())? {
                Some(c) if c == ctx.cu_ctx() => drv("cuStreamCreate", ctx.new_stream()),
                other => Err(Error::new(format!(
                    "bound {:?} but cuCtxGetCurrent says {other:?}",
                    ctx.cu_ctx()
                ))),
            };
            let st = match st {
                Ok(st) => st,
                Err(e) => {
                    drop(ctx);
                    let _ = raw::unbind();
                    return Err(e);
                }
            };
            out.push(format!(
                "bound primary context {:?}; cuCtxGetCurrent agrees",
                ctx.cu_ctx()
            ));
            let r = kernels(&st, &mut out);
            if let Err(e) = &r {
                out.push(format!("FAILED: {e}"));
            }
            if sticky && r.is_ok() {
                probe_sticky(&st, &mut out);
            }
            drop(st);
            drop(ctx); // the last `Arc`: the retain released
            let _ = raw::unbind();
            out.push(format!(
                "after teardown: current context = {:?}",
                raw::current().ok().flatten()
            ));
            r.map(|_| out)
        })
        .join()
        .unwrap_or_else(|_| Err(Error::new("probe thread panicked")))
    })?;
    out.extend(lines);
    if sticky {
        // Recreate the context on a fresh thread: does the device work again?
        let r = std::thread::scope(|s| {
            s.spawn(move || -> Result<String> {
                let ctx = CudaContext::new(ordinal.max(0) as usize)
                    .map_err(|e| Error::driver("cuDevicePrimaryCtxRetain", "re-probe", e))?;
                let res = match ctx.new_stream() {
                    Ok(st) => {
                        drop(st);
                        "after releasing the failed context, a new retain works (stream created)"
                            .to_string()
                    }
                    Err(e) => format!(
                        "after releasing the failed context: {}",
                        Error::driver("cuStreamCreate", "re-probe", e)
                    ),
                };
                drop(ctx);
                let _ = raw::unbind();
                Ok(res)
            })
            .join()
            .unwrap_or_else(|_| Err(Error::new("re-probe panicked")))
        });
        out.push(match r {
            Ok(s) => s,
            Err(e) => format!("re-probe failed: {e}"),
        });
    }
    Ok(out)
}

fn drv<T>(call: &str, r: raw::DResult<T>) -> Result<T> {
    r.map_err(|e| Error::driver(call, "probe", e))
}

/// A module loaded on the probe's thread, unloaded (cudarc's drop of its last `Arc`) after the
/// device finished its work.
struct Loaded(Arc<CudaModule>);

impl Loaded {
    fn new(st: &Arc<CudaStream>, ptx: &str) -> Result<Self> {
        Ok(Loaded(drv(
            "cuModuleLoadData",
            raw::load_ptx(st.context(), ptx),
        )?))
    }

    /// The function `name`, valid while `self` lives (it holds the module).
    fn function(&self, name: &str) -> Result<Func> {
        let f = self
            .0
            .load_function(name)
            .map_err(|e| Error::driver("cuModuleGetFunction", &format!("probe: {name}"), e))?;
        Ok(Func::of(&f))
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        let _ = raw::ctx_synchronize();
    }
}

fn launch(f: Func, st: &CudaStream, grid: u32, block: u32, args: &mut [u64]) -> Result<()> {
    // One pointer per argument, to its slot: the driver reads the parameter's size from there
    // (a slot holds the value's little-endian bytes in its low bytes).
    let mut params: Vec<*mut c_void> = args.iter_mut().map(|a| (a as *mut u64).cast()).collect();
    // SAFETY: callers pass a function of a module they keep loaded, one 8-byte slot per kernel
    // parameter (device addresses and the probe kernels' 64-bit counts, or smaller values in
    // the low bytes), alive for the call, and device buffers that outlive the launch (they
    // synchronise before freeing).
    drv("cuLaunchKernel", unsafe {
        raw::launch(f, (grid, 1, 1), (block, 1, 1), 0, st, &mut params)
    })
}

/// The device address of `buf` (a kernel argument).
fn addr<T>(buf: &CudaSlice<T>, st: &CudaStream) -> u64 {
    buf.device_ptr(st).0
}

fn probe_kernels(st: &Arc<CudaStream>, out: &mut Vec<String>) -> Result<()> {
    let m = Loaded::new(st, builtin::PTX)?;
    for name in [
        builtin::EMPTY,
        builtin::COUNT,
        builtin::SET_I64,
        builtin::ADD_I64,
        builtin::SPIN,
        builtin::SCALE_F32,
        builtin::SUM_F32,
    ] {
        m.function(name)?;
    }
    out.push("built-in PTX module loaded; all 7 functions found".into());
    let empty = m.function(builtin::EMPTY)?;
    launch(empty, st, 1, 1, &mut [])?;
    drv("cuStreamSynchronize", raw::stream_synchronize(st))?;
    // launch rate
    let n = 20_000;
    let t0 = Instant::now();
    for _ in 0..n {
        launch(empty, st, 1, 1, &mut [])?;
    }
    let tl = t0.elapsed();
    drv("cuStreamSynchronize", raw::stream_synchronize(st))?;
    out.push(format!(
        "empty launches: {:.0}/s enqueue ({:.2} us each), {:.0}/s incl. completion",
        n as f64 / tl.as_secs_f64(),
        tl.as_secs_f64() * 1e6 / n as f64,
        n as f64 / t0.elapsed().as_secs_f64()
    ));
    // counting (64 zeroed bytes; the count is the low half of the first i64)
    let buf = drv("cuMemAllocAsync", st.alloc_zeros::<i64>(8))?;
    let count = m.function(builtin::COUNT)?;
    for _ in 0..1000 {
        launch(count, st, 1, 1, &mut [addr(&buf, st)])?;
    }
    let host = drv("cuMemcpyDtoHAsync", st.clone_dtoh(&buf.slice(0..1)))?;
    out.push(format!(
        "count kernel x1000 -> {} ({})",
        host[0],
        ok(host[0] == 1000)
    ));
    // set / add
    let a = addr(&buf, st);
    let b = a + 8;
    let (v7, v5) = (7i64, 5i64);
    let set = m.function(builtin::SET_I64)?;
    launch(set, st, 1, 1, &mut [a, v7 as u64])?;
    launch(set, st, 1, 1, &mut [b, v5 as u64])?;
    launch(m.function(builtin::ADD_I64)?, st, 1, 1, &mut [a, b])?;
    let hv = drv("cuMemcpyDtoHAsync", st.clone_dtoh(&buf.slice(0..1)))?;
    out.push(format!(
        "set 7, set 5, add -> {} ({})",
        hv[0],
        ok(hv[0] == 12)
    ));
    // scale + sum
    let n = 1000u32;
    let xs: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let x = drv("cuMemcpyHtoDAsync", st.clone_htod(&xs))?;
    let sum = drv("cuMemAllocAsync", st.alloc_zeros::<f32>(1))?;
    let (px, a2, nn, ps) = (addr(&x, st), 2.0f32, n, addr(&sum, st));
    launch(
        m.function(builtin::SCALE_F32)?,
        st,
        n.div_ceil(256),
        256,
        &mut [px, u64::from(a2.to_bits()), u64::from(nn)],
    )?;
    launch(
        m.function(builtin::SUM_F32)?,
        st,
        n.div_ceil(256),
        256,
        &mut [px, ps, u64::from(nn)],
    )?;
    let hs = drv("cuMemcpyDtoHAsync", st.clone_dtoh(&sum))?;
    let expect = 2.0 * (n as f32 - 1.0) * n as f32 / 2.0;
    out.push(format!(
        "scale x2 + sum of 0..1000 -> {} (expect {expect}, {})",
        hs[0],
        ok((hs[0] - expect).abs() < 1.0)
    ));
    // spin
    let cycles = 2_000_000i64;
    let t0 = Instant::now();
    launch(m.function(builtin::SPIN)?, st, 1, 1, &mut [cycles as u64])?;
    drv("cuStreamSynchronize", raw::stream_synchronize(st))?;
    out.push(format!("spin 2M cycles took {:?}", t0.elapsed()));
    // events
    let ev = drv("cuEventCreate", st.context().new_event(None))?;
    drv("cuEventRecord", raw::event_record(&ev, st))?;
    let mut polls = 0;
    while !drv("cuEventQuery", raw::event_query(&ev))? {
        polls += 1;
    }
    drop(ev);
    out.push(format!(
        "event record + query: complete after {polls} not-ready polls"
    ));
    // Freed stream-ordered on `st` (cudarc's drop).
    drop((buf, x, sum));
    // OOM
    match st.alloc_zeros::<u8>(1usize << 50) {
        Err(e) => out.push(format!(
            "1 PiB allocation -> {} (out of memory: {})",
            raw::error_name(e),
            ok(raw::is_out_of_memory(e))
        )),
        Ok(p) => {
            drop(p);
            out.push("1 PiB allocation unexpectedly succeeded".into());
        }
    }
    let after = raw::stream_synchronize(st);
    out.push(format!("stream usable after OOM: {}", ok(after.is_ok())));
    let (f, t) = drv("cuMemGetInfo", raw::mem_get_info())?;
    out.push(format!("memory: {f} free of {t}"));
    Ok(())
}

fn probe_sticky(st: &Arc<CudaStream>, out: &mut Vec<String>) {
    let r = (|| -> Result<()> {
        let m = Loaded::new(st, POKE_PTX)?;
        let addr = 8u64;
        launch(m.function(POKE)?, st, 1, 1, &mut [addr])?;
        let ev = drv("cuEventCreate", st.context().new_event(None))?;
        let _ = raw::event_record(&ev, st);
        let t0 = Instant::now();
        loop {
            match raw::event_query(&ev) {
                Ok(true) => {
                    out.push("poke(8) completed without error?!".into());
                    break;
                }
                Ok(false) if t0.elapsed().as_secs() < 10 => continue,
                Ok(false) => {
                    out.push("poke(8) still not complete after 10 s".into());
                    break;
                }
                Err(e) => {
                    out.push(format!(
                        "poke(8): cuEventQuery -> {} (sticky: {})",
                        raw::error_name(e),
                        Error::driver("cuEventQuery", "probe", e).is_sticky()
                    ));
                    break;
                }
            }
        }
        drop(ev);
        // cudarc keeps a failure of a drop (the event's destroy, just now) for the context's
        // next call: cleared first, so that what follows is the stream create's own answer.
        let _ = st.context().check_err();
        let again = st.context().new_stream();
        out.push(format!(
            "after it: cuStreamCreate -> {:?}",
            again.map(drop).map_err(raw::error_name),
        ));
        Ok(())
    })();
    if let Err(e) = r {
        out.push(format!("sticky probe error: {e}"));
    }
}

fn ok(b: bool) -> &'static str {
    if b {
        "ok"
    } else {
        "WRONG"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failing_kernels(_: &Arc<CudaStream>, _: &mut Vec<String>) -> Result<()> {
        Err(Error::new("injected failure"))
    }

    /// `probe` whose kernel checks fail returns their error (after tearing down its context).
    /// Needs a GPU: skips without one.
    #[test]
    fn failed_probe_returns_the_error() {
        if let Some(why) = boundpool_gpu::gpu_unavailable_reason() {
            if std::env::var("BOUNDPOOL_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                panic!("failed_probe_returns_the_error: BOUNDPOOL_REQUIRE_GPU=1 but no GPU: {why}");
            }
            eprintln!("SKIPPED failed_probe_returns_the_error: no GPU: {why}");
            return;
        }
        let err = probe_with(0, false, failing_kernels).unwrap_err();
        assert!(err.to_string().contains("injected failure"), "{err}");
    }
}
