//! A self-test ("probe") of the driver layer, for `boundpool-bench`'s `gpu_probe` example and
//! the bench builds only (feature `bench-internals`): it exercises the driver layer directly.

use std::time::Instant;

use crate::device::DeviceShared;
use crate::driver::{self, StreamRef};
use crate::error::{GpuError, GpuResult};
use crate::module::{builtin, Kernel, Module};

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

/// Context checking switched on for as long as it lives; dropping it (on any return path,
/// an early `?` or a panic included) restores the setting found at creation, so a function
/// that turns checking on for its own calls leaves nothing switched on after an error.
struct CheckingOn {
    was: bool,
}

impl CheckingOn {
    fn new() -> Self {
        let was = driver::checking();
        driver::set_checking(true);
        CheckingOn { was }
    }
}

impl Drop for CheckingOn {
    fn drop(&mut self) {
        driver::set_checking(self.was);
    }
}

/// Runs a self-test of the driver layer on device `ordinal` on a fresh thread and returns a
/// report, one line per check: detection, binding, every built-in kernel loaded and launched
/// with its result checked on the host, launch cost, out-of-memory handling. With
/// `sticky = true` it finally provokes an illegal address and checks that the context can be
/// recreated afterwards (this poisons the device's primary context for the whole process while
/// it is retained).
pub fn probe(ordinal: i32, sticky: bool) -> GpuResult<Vec<String>> {
    probe_with(ordinal, sticky, probe_kernels)
}

/// The kernel checks of a probe, on its bound thread.
type KernelChecks = fn(&DeviceShared, StreamRef, &mut Vec<String>) -> GpuResult<()>;

/// [`probe`] with its kernel checks given (a test makes them fail).
fn probe_with(ordinal: i32, sticky: bool, kernels: KernelChecks) -> GpuResult<Vec<String>> {
    let mut out = Vec::new();
    let n = crate::detect::detect()?;
    out.push(format!(
        "driver version {} ; {n} device(s)",
        driver::driver_version().unwrap_or(-1)
    ));
    let (dev, info) = crate::detect::open_device(ordinal)?;
    out.push(format!("device {ordinal}: {info:?}"));
    let _checking = CheckingOn::new();
    let wrong0 = driver::wrong_calls();
    let shared = std::sync::Arc::new(DeviceShared::new(info, dev, false));
    let sh = shared.clone();
    let lines = std::thread::scope(|s| {
        s.spawn(move || -> GpuResult<Vec<String>> {
            let mut out = Vec::new();
            let before = driver::ctx_current().ok().flatten();
            out.push(format!(
                "fresh thread: current context before binding = {before:?}"
            ));
            let (ctx, cuda) = sh.bind_worker()?;
            out.push(format!(
                "bound primary context {ctx:?}; cuCtxGetCurrent agrees"
            ));
            let st = cuda
                .new_stream()
                .map_err(|e| GpuError::driver("cuStreamCreate", "probe", e))?;
            // Owned by the device table from here on (destroyed at its teardown).
            let st = sh.register_stream(st);
            let r = kernels(&sh, st, &mut out);
            if let Err(e) = &r {
                out.push(format!("FAILED: {e}"));
            }
            if sticky && r.is_ok() {
                probe_sticky(&sh, st, &mut out);
            }
            sh.worker_stopped(st);
            out.push(format!(
                "after teardown: current context = {:?}",
                driver::ctx_current().ok().flatten()
            ));
            r.map(|_| out)
        })
        .join()
        .unwrap_or_else(|_| {
            Err(GpuError::new(
                crate::GpuErrorKind::Driver,
                "probe thread panicked",
            ))
        })
    })?;
    out.extend(lines);
    if sticky {
        // Recreate the context on a fresh thread: does the device work again?
        let r = std::thread::scope(|s| {
            s.spawn(move || -> GpuResult<String> {
                let primary = driver::primary_ctx_retain(dev)
                    .map_err(|e| GpuError::driver("cuDevicePrimaryCtxRetain", "re-probe", e))?;
                let c = primary.ctx();
                let st = driver::ctx_set_current(c)
                    .map_err(|e| GpuError::driver("cuCtxSetCurrent", "re-probe", e))
                    .and_then(|()| {
                        driver::stream_create(c)
                            .map_err(|e| GpuError::driver("cuStreamCreate", "re-probe", e))
                    });
                let res = match st {
                    Ok(st) => {
                        let _ = st.destroy(c);
                        "after releasing the failed context, a new retain works (stream created)"
                            .to_string()
                    }
                    Err(e) => format!("after releasing the failed context: {e}"),
                };
                let _ = driver::ctx_unbind();
                let _ = primary.release();
                Ok(res)
            })
            .join()
            .unwrap_or_else(|_| {
                Err(GpuError::new(
                    crate::GpuErrorKind::Driver,
                    "re-probe panicked",
                ))
            })
        });
        out.push(match r {
            Ok(s) => s,
            Err(e) => format!("re-probe failed: {e}"),
        });
    }
    out.push(format!(
        "context check: {} checked calls, {} wrong ({:?})",
        driver::checked_calls(),
        driver::wrong_calls() - wrong0,
        driver::wrong_samples()
    ));
    Ok(out)
}

fn drv<T>(call: &str, r: driver::DResult<T>) -> GpuResult<T> {
    r.map_err(|e| GpuError::driver(call, "probe", e))
}

fn launch(
    sh: &DeviceShared,
    k: &Kernel,
    st: StreamRef,
    grid: u32,
    block: u32,
    params: &mut [u64],
) -> GpuResult<()> {
    let f = sh.function(k)?;
    // SAFETY: callers pass one 8-byte slot per kernel parameter (device addresses and the
    // probe kernels' 64-bit counts), and device buffers that outlive the launch (they
    // synchronise before freeing).
    drv("cuLaunchKernel", unsafe {
        driver::launch(sh.ctx(), f, (grid, 1, 1), (block, 1, 1), 0, st, params)
    })
}

fn probe_kernels(sh: &DeviceShared, st: StreamRef, out: &mut Vec<String>) -> GpuResult<()> {
    let ctx = sh.ctx();
    let m = Module::builtin();
    for name in [
        builtin::EMPTY,
        builtin::COUNT,
        builtin::SET_I64,
        builtin::ADD_I64,
        builtin::SPIN,
        builtin::SCALE_F32,
        builtin::SUM_F32,
    ] {
        sh.function(&m.kernel(name)?)?;
    }
    out.push("built-in PTX module loaded; all 7 functions found".into());
    let empty = m.kernel(builtin::EMPTY)?;
    launch(sh, &empty, st, 1, 1, &mut [])?;
    drv("cuStreamSynchronize", driver::stream_synchronize(ctx, st))?;
    // launch rate
    let n = 20_000;
    let t0 = Instant::now();
    for _ in 0..n {
        launch(sh, &empty, st, 1, 1, &mut [])?;
    }
    let tl = t0.elapsed();
    drv("cuStreamSynchronize", driver::stream_synchronize(ctx, st))?;
    out.push(format!(
        "empty launches via device table: {:.0}/s enqueue ({:.2} us each), {:.0}/s incl. completion",
        n as f64 / tl.as_secs_f64(),
        tl.as_secs_f64() * 1e6 / n as f64,
        n as f64 / t0.elapsed().as_secs_f64()
    ));
    // counting
    let buf = drv("cuMemAllocAsync", driver::mem_alloc_async(ctx, 64, st))?;
    // SAFETY: `buf` holds 64 bytes.
    drv("cuMemsetD8Async", unsafe {
        driver::memset_d8_async(ctx, buf.addr(), 0, 64, st)
    })?;
    let count = m.kernel(builtin::COUNT)?;
    for _ in 0..1000 {
        launch(sh, &count, st, 1, 1, &mut [buf.addr()])?;
    }
    let mut host = [0u32; 1];
    // SAFETY: 4 bytes into a 4-byte host array from a 64-byte allocation.
    drv("cuMemcpyDtoHAsync", unsafe {
        driver::memcpy_dtoh_async(ctx, host.as_mut_ptr() as *mut u8, buf.addr(), 4, st)
    })?;
    drv("cuStreamSynchronize", driver::stream_synchronize(ctx, st))?;
    out.push(format!(
        "count kernel x1000 -> {} ({})",
        host[0],
        ok(host[0] == 1000)
    ));
    // set / add
    let a = buf.addr();
    let b = buf.addr() + 8;
    let (pa, pb, v7, v5) = (a, b, 7i64, 5i64);
    launch(
        sh,
        &m.kernel(builtin::SET_I64)?,
        st,
        1,
        1,
        &mut [pa, v7 as u64],
    )?;
    launch(
        sh,
        &m.kernel(builtin::SET_I64)?,
        st,
        1,
        1,
        &mut [pb, v5 as u64],
    )?;
    launch(sh, &m.kernel(builtin::ADD_I64)?, st, 1, 1, &mut [pa, pb])?;
    let mut hv = [0i64; 1];
    // SAFETY: 8 bytes into an 8-byte host array.
    drv("cuMemcpyDtoHAsync", unsafe {
        driver::memcpy_dtoh_async(ctx, hv.as_mut_ptr() as *mut u8, a, 8, st)
    })?;
    drv("cuStreamSynchronize", driver::stream_synchronize(ctx, st))?;
    out.push(format!(
        "set 7, set 5, add -> {} ({})",
        hv[0],
        ok(hv[0] == 12)
    ));
    // scale + sum
    let n = 1000u32;
    let xs: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let x = drv(
        "cuMemAllocAsync",
        driver::mem_alloc_async(ctx, 4 * n as usize, st),
    )?;
    let sum = drv("cuMemAllocAsync", driver::mem_alloc_async(ctx, 4, st))?;
    // SAFETY: sizes match the allocations; pageable source is staged before return.
    unsafe {
        drv(
            "cuMemcpyHtoDAsync",
            driver::memcpy_htod_async(ctx, x.addr(), xs.as_ptr() as *const u8, 4 * n as usize, st),
        )?;
        drv(
            "cuMemsetD8Async",
            driver::memset_d8_async(ctx, sum.addr(), 0, 4, st),
        )?;
    }
    let (px, a2, nn, ps) = (x.addr(), 2.0f32, n, sum.addr());
    launch(
        sh,
        &m.kernel(builtin::SCALE_F32)?,
        st,
        n.div_ceil(256),
        256,
        &mut [px, u64::from(a2.to_bits()), u64::from(nn)],
    )?;
    launch(
        sh,
        &m.kernel(builtin::SUM_F32)?,
        st,
        n.div_ceil(256),
        256,
        &mut [px, ps, u64::from(nn)],
    )?;
    let mut hs = [0f32; 1];
    // SAFETY: 4 bytes into a 4-byte host array.
    drv("cuMemcpyDtoHAsync", unsafe {
        driver::memcpy_dtoh_async(ctx, hs.as_mut_ptr() as *mut u8, sum.addr(), 4, st)
    })?;
    drv("cuStreamSynchronize", driver::stream_synchronize(ctx, st))?;
    let expect = 2.0 * (n as f32 - 1.0) * n as f32 / 2.0;
    out.push(format!(
        "scale x2 + sum of 0..1000 -> {} (expect {expect}, {})",
        hs[0],
        ok((hs[0] - expect).abs() < 1.0)
    ));
    // spin
    let cycles = 2_000_000i64;
    let t0 = Instant::now();
    launch(
        sh,
        &m.kernel(builtin::SPIN)?,
        st,
        1,
        1,
        &mut [cycles as u64],
    )?;
    drv("cuStreamSynchronize", driver::stream_synchronize(ctx, st))?;
    out.push(format!("spin 2M cycles took {:?}", t0.elapsed()));
    // events
    let ev = sh
        .take_event()
        .map_err(|e| GpuError::driver("cuEventCreate", "probe", e))?;
    drv("cuEventRecord", driver::event_record(ctx, &ev, st))?;
    let mut polls = 0;
    while !drv("cuEventQuery", driver::event_query(ctx, &ev))? {
        polls += 1;
    }
    sh.put_event(ev);
    out.push(format!(
        "event record + query: complete after {polls} not-ready polls"
    ));
    for p in [buf, x, sum] {
        drv("cuMemFreeAsync", p.free_async(ctx, st))?;
    }
    // OOM
    match driver::mem_alloc_async(ctx, 1usize << 50, st) {
        Err(e) => out.push(format!(
            "1 PiB allocation -> {} (out of memory: {})",
            driver::error_name(e),
            ok(driver::is_out_of_memory(e))
        )),
        Ok(p) => {
            let _ = p.free_async(ctx, st);
            out.push("1 PiB allocation unexpectedly succeeded".into());
        }
    }
    let after = driver::stream_synchronize(ctx, st);
    out.push(format!("stream usable after OOM: {}", ok(after.is_ok())));
    let (f, t) = drv("cuMemGetInfo", driver::mem_get_info(ctx))?;
    out.push(format!("memory: {f} free of {t}"));
    Ok(())
}

fn probe_sticky(sh: &DeviceShared, st: StreamRef, out: &mut Vec<String>) {
    let ctx = sh.ctx();
    let r = (|| -> GpuResult<()> {
        let m = Module::from_ptx("probe", POKE_PTX)?;
        let addr = 8u64;
        launch(sh, &m.kernel(POKE)?, st, 1, 1, &mut [addr])?;
        let ev = sh
            .take_event()
            .map_err(|e| GpuError::driver("cuEventCreate", "probe", e))?;
        let _ = driver::event_record(ctx, &ev, st);
        let t0 = Instant::now();
        loop {
            match driver::event_query(ctx, &ev) {
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
                        driver::error_name(e),
                        driver::is_sticky(e)
                    ));
                    let _ = sh.driver_error("cuEventQuery", "probe", e);
                    break;
                }
            }
        }
        sh.put_event(ev);
        let again = driver::stream_create(ctx);
        out.push(format!(
            "after it: cuStreamCreate -> {:?}; device failed = {:?}",
            again
                .map(|s| {
                    let _ = s.destroy(ctx);
                })
                .map_err(driver::error_name),
            sh.failed()
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

    /// Context checking is process-wide: the tests that switch it run one at a time.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn failing_kernels(_: &DeviceShared, _: StreamRef, _: &mut Vec<String>) -> GpuResult<()> {
        Err(GpuError::new(
            crate::GpuErrorKind::Driver,
            "injected failure",
        ))
    }

    /// The guard restores the setting on an early `?` return and on a panic, and leaves an
    /// already enabled setting on.
    #[test]
    fn checking_guard_restores_after_error_and_panic() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let was = driver::checking();
        fn fails_early() -> GpuResult<()> {
            let _on = CheckingOn::new();
            assert!(driver::checking());
            Err(GpuError::new(crate::GpuErrorKind::Driver, "early"))?;
            unreachable!()
        }
        driver::set_checking(false);
        assert!(fails_early().is_err());
        assert!(!driver::checking(), "checking left on after an early error");
        let r = std::panic::catch_unwind(|| {
            let _on = CheckingOn::new();
            panic!("inside");
        });
        assert!(r.is_err());
        assert!(!driver::checking(), "checking left on after a panic");
        driver::set_checking(true);
        assert!(fails_early().is_err());
        assert!(
            driver::checking(),
            "checking switched off though it was on before"
        );
        driver::set_checking(was);
    }

    /// `probe` whose kernel checks fail returns the error and leaves checking as it found it
    /// (it used to return early with checking on). Needs a GPU: skips without one.
    #[test]
    fn failed_probe_leaves_checking_off() {
        if let Some(why) = crate::detect::gpu_unavailable_reason() {
            if std::env::var("BOUNDPOOL_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                panic!(
                    "failed_probe_leaves_checking_off: BOUNDPOOL_REQUIRE_GPU=1 but no GPU: {why}"
                );
            }
            eprintln!("SKIPPED failed_probe_leaves_checking_off: no GPU: {why}");
            return;
        }
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let was = driver::checking();
        driver::set_checking(false);
        let err = probe_with(0, false, failing_kernels).unwrap_err();
        assert!(err.to_string().contains("injected failure"), "{err}");
        assert!(
            !driver::checking(),
            "probe left context checking on after an error"
        );
        driver::set_checking(was);
    }
}
