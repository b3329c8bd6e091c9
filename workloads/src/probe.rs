//! A self-test ("probe") of a GPU machine, for the `gpu_probe` example: the driver, binding a
//! device's primary context on a fresh thread, the built-in kernels of `boundpool-gpu` (their
//! PTX loaded and launched straight on the driver through [`crate::raw`], each result checked
//! on the host), the launch cost, out-of-memory handling and, on request, a sticky error.
//! `boundpool-gpu`'s own driver layer and its context checking are what its tests exercise
//! (`BOUNDPOOL_REQUIRE_GPU=1 cargo test -p boundpool-gpu`); this probe makes no call through it
//! beyond detection.

use std::ffi::{c_void, CString};
use std::time::Instant;

use boundpool_gpu::builtin;

use crate::raw::{self, Error, Func, Module, Result, StreamRef};

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
type KernelChecks = fn(StreamRef, &mut Vec<String>) -> Result<()>;

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
            let before = raw::ctx_current().ok().flatten();
            out.push(format!(
                "fresh thread: current context before binding = {before:?}"
            ));
            let primary = drv("cuDevicePrimaryCtxRetain", raw::primary_ctx_retain(ordinal))?;
            let ctx = primary.ctx();
            let bound =
                drv("cuCtxSetCurrent", raw::ctx_set_current(ctx)).and_then(|()| {
                    match drv("cuCtxGetCurrent", raw::ctx_current())? {
                        Some(c) if c == ctx => Ok(()),
                        other => Err(Error::new(format!(
                            "bound {ctx:?} but cuCtxGetCurrent says {other:?}"
                        ))),
                    }
                });
            let st = bound.and_then(|()| drv("cuStreamCreate", raw::stream_create()));
            let st = match st {
                Ok(st) => st,
                Err(e) => {
                    let _ = raw::ctx_unbind();
                    let _ = primary.release();
                    return Err(e);
                }
            };
            out.push(format!(
                "bound primary context {ctx:?}; cuCtxGetCurrent agrees"
            ));
            let r = kernels(st.view(), &mut out);
            if let Err(e) = &r {
                out.push(format!("FAILED: {e}"));
            }
            if sticky && r.is_ok() {
                probe_sticky(st.view(), &mut out);
            }
            let _ = st.destroy();
            let _ = raw::ctx_unbind();
            let _ = primary.release();
            out.push(format!(
                "after teardown: current context = {:?}",
                raw::ctx_current().ok().flatten()
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
                let primary = raw::primary_ctx_retain(ordinal)
                    .map_err(|e| Error::driver("cuDevicePrimaryCtxRetain", "re-probe", e))?;
                let c = primary.ctx();
                let st = raw::ctx_set_current(c)
                    .map_err(|e| Error::driver("cuCtxSetCurrent", "re-probe", e))
                    .and_then(|()| {
                        raw::stream_create()
                            .map_err(|e| Error::driver("cuStreamCreate", "re-probe", e))
                    });
                let res = match st {
                    Ok(st) => {
                        let _ = st.destroy();
                        "after releasing the failed context, a new retain works (stream created)"
                            .to_string()
                    }
                    Err(e) => format!("after releasing the failed context: {e}"),
                };
                let _ = raw::ctx_unbind();
                let _ = primary.release();
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

/// A module loaded on the probe's thread, unloaded on drop (after the device finished its work).
struct Loaded(Option<Module>);

impl Loaded {
    fn new(ptx: &str) -> Result<Self> {
        Ok(Loaded(Some(drv(
            "cuModuleLoadData",
            raw::module_load(ptx),
        )?)))
    }

    fn function(&self, name: &str) -> Result<Func> {
        let m = self.0.as_ref().expect("loaded until dropped");
        let c = CString::new(name).map_err(|_| Error::new(format!("kernel name {name:?}")))?;
        raw::module_function(m, &c)
            .map_err(|e| Error::driver("cuModuleGetFunction", &format!("probe: {name}"), e))
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        if let Some(m) = self.0.take() {
            let _ = raw::ctx_synchronize();
            let _ = m.unload();
        }
    }
}

fn launch(f: Func, st: StreamRef, grid: u32, block: u32, args: &mut [u64]) -> Result<()> {
    // One pointer per argument, to its slot: the driver reads the parameter's size from there
    // (a slot holds the value's little-endian bytes in its low bytes).
    let mut params: Vec<*mut c_void> = args.iter_mut().map(|a| (a as *mut u64).cast()).collect();
    // SAFETY: callers pass one 8-byte slot per kernel parameter (device addresses and the
    // probe kernels' 64-bit counts, or smaller values in the low bytes), alive for the call,
    // and device buffers that outlive the launch (they synchronise before freeing).
    drv("cuLaunchKernel", unsafe {
        raw::launch(f, (grid, 1, 1), (block, 1, 1), 0, st, &mut params)
    })
}

fn probe_kernels(st: StreamRef, out: &mut Vec<String>) -> Result<()> {
    let m = Loaded::new(builtin::PTX)?;
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
    // counting
    let buf = drv("cuMemAllocAsync", raw::mem_alloc_async(64, st))?;
    // SAFETY: `buf` holds 64 bytes.
    drv("cuMemsetD8Async", unsafe {
        raw::memset_d8_async(buf.addr(), 0, 64, st)
    })?;
    let count = m.function(builtin::COUNT)?;
    for _ in 0..1000 {
        launch(count, st, 1, 1, &mut [buf.addr()])?;
    }
    let mut host = [0u32; 1];
    // SAFETY: 4 bytes from a 64-byte allocation; read after the synchronise below.
    drv("cuMemcpyDtoHAsync", unsafe {
        raw::memcpy_dtoh_async(&mut host, buf.addr(), st)
    })?;
    drv("cuStreamSynchronize", raw::stream_synchronize(st))?;
    out.push(format!(
        "count kernel x1000 -> {} ({})",
        host[0],
        ok(host[0] == 1000)
    ));
    // set / add
    let a = buf.addr();
    let b = buf.addr() + 8;
    let (pa, pb, v7, v5) = (a, b, 7i64, 5i64);
    let set = m.function(builtin::SET_I64)?;
    launch(set, st, 1, 1, &mut [pa, v7 as u64])?;
    launch(set, st, 1, 1, &mut [pb, v5 as u64])?;
    launch(m.function(builtin::ADD_I64)?, st, 1, 1, &mut [pa, pb])?;
    let mut hv = [0i64; 1];
    // SAFETY: 8 bytes from the 64-byte allocation; read after the synchronise below.
    drv("cuMemcpyDtoHAsync", unsafe {
        raw::memcpy_dtoh_async(&mut hv, a, st)
    })?;
    drv("cuStreamSynchronize", raw::stream_synchronize(st))?;
    out.push(format!(
        "set 7, set 5, add -> {} ({})",
        hv[0],
        ok(hv[0] == 12)
    ));
    // scale + sum
    let n = 1000u32;
    let xs: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let x = drv("cuMemAllocAsync", raw::mem_alloc_async(4 * n as usize, st))?;
    let sum = drv("cuMemAllocAsync", raw::mem_alloc_async(4, st))?;
    // SAFETY: sizes match the allocations; pageable source is staged before return.
    unsafe {
        drv(
            "cuMemcpyHtoDAsync",
            raw::memcpy_htod_async(x.addr(), &xs, st),
        )?;
        drv(
            "cuMemsetD8Async",
            raw::memset_d8_async(sum.addr(), 0, 4, st),
        )?;
    }
    let (px, a2, nn, ps) = (x.addr(), 2.0f32, n, sum.addr());
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
    let mut hs = [0f32; 1];
    // SAFETY: 4 bytes from the 4-byte allocation; read after the synchronise below.
    drv("cuMemcpyDtoHAsync", unsafe {
        raw::memcpy_dtoh_async(&mut hs, sum.addr(), st)
    })?;
    drv("cuStreamSynchronize", raw::stream_synchronize(st))?;
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
    let ev = drv("cuEventCreate", raw::event_create())?;
    drv("cuEventRecord", raw::event_record(&ev, st))?;
    let mut polls = 0;
    while !drv("cuEventQuery", raw::event_query(&ev))? {
        polls += 1;
    }
    let _ = ev.destroy();
    out.push(format!(
        "event record + query: complete after {polls} not-ready polls"
    ));
    for p in [buf, x, sum] {
        drv("cuMemFreeAsync", p.free_async(st))?;
    }
    // OOM
    match raw::mem_alloc_async(1usize << 50, st) {
        Err(e) => out.push(format!(
            "1 PiB allocation -> {} (out of memory: {})",
            raw::error_name(e),
            ok(raw::is_out_of_memory(e))
        )),
        Ok(p) => {
            let _ = p.free_async(st);
            out.push("1 PiB allocation unexpectedly succeeded".into());
        }
    }
    let after = raw::stream_synchronize(st);
    out.push(format!("stream usable after OOM: {}", ok(after.is_ok())));
    let (f, t) = drv("cuMemGetInfo", raw::mem_get_info())?;
    out.push(format!("memory: {f} free of {t}"));
    Ok(())
}

fn probe_sticky(st: StreamRef, out: &mut Vec<String>) {
    let r = (|| -> Result<()> {
        let m = Loaded::new(POKE_PTX)?;
        let addr = 8u64;
        launch(m.function(POKE)?, st, 1, 1, &mut [addr])?;
        let ev = drv("cuEventCreate", raw::event_create())?;
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
                        raw::is_sticky(e)
                    ));
                    break;
                }
            }
        }
        let _ = ev.destroy();
        let again = raw::stream_create();
        out.push(format!(
            "after it: cuStreamCreate -> {:?}",
            again
                .map(|s| {
                    let _ = s.destroy();
                })
                .map_err(raw::error_name),
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

    fn failing_kernels(_: StreamRef, _: &mut Vec<String>) -> Result<()> {
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
