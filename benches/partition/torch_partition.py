#!/usr/bin/env python3
"""PyTorch anchor of boundpool's SM-partition bench.

What it measures: how long one latency-critical client waits when the rest of the GPU is kept
full, and what partitioning the SMs (CUDA green contexts) buys against stream priorities.

The latency client serves the model of benches/serve/torch_serve.py (imported from there: 4 x
(Linear(1024, 1024) + erf GELU) at batch 8, weights from torch.manual_seed(0), under
torch.inference_mode(), bf16 by default, f32 with TF32 off). It is ONE Python thread sending one
request at a time with --gap-us between requests; a request is

    H2D copy of the 8x1024 input from pinned memory (non_blocking) -> replay of the forward's
    CUDA graph (captured once, on the client's own stream) -> D2H copy into pinned memory
    (non_blocking) -> synchronise the client's stream

and its latency runs from just before the H2D copy to just after the synchronise. After
--warmup uncounted requests it sends requests for --seconds; p50/p99 are entries
round(q*(n-1)) of the sorted latencies, as torch_serve.py reports them.

The background fills the GPU: --bg-threads Python threads, each on its own stream, each
issuing --bg-n x --bg-n bf16 GEMMs (torch.mm into a preallocated output) back to back and
synchronising its stream every --bg-depth GEMMs, which bounds its queue. Every synchronise is
stamped; the background's TFLOP/s (2 n^3 per GEMM) is the GEMMs completed between the first
and the last stamp inside the measured window, over the time between those stamps, summed over
the threads.

Scenarios, per dtype, one JSON line each:
  alone            the client alone, on a stream of default priority
  alone_high       the client alone, on a stream of the device's greatest priority
  bg_only          the background alone (TFLOP/s)
  loaded           the client on its default-priority stream beside the background (also on
                   default-priority streams): the unprotected case
  loaded_priority  the client on the greatest-priority stream beside the background on
                   default-priority streams
  green_alone      (per --sms value k) the client alone on a stream of a green context of k
                   SMs, its graph captured on that stream
  green_bg_only    the background alone on the remaining SMs
  green_loaded     both at once
The client's green context comes from PyTorch's API (torch.cuda.green_contexts.GreenContext:
PyTorch 2.11 has create(num_sms, device_id) and Stream(); newer ones also SMPartition.split,
which gives the remainder as a disjoint partition and is used when present). PyTorch 2.11
cannot make a context of the remaining SMs, so there the background's green context is made
with cuda.bindings (a dependency of the PyTorch 2.11 wheels) from the remainder of the same
split that PyTorch's create() makes (cuDevSmResourceSplitByCount of the whole device into one
group of k SMs); where that fails the background runs on the whole device (bg_sms null). A
missing or failing green-context API gives one line {"scenario": "green", "skipped": why}; a
failing scenario gives its line with "error"; neither stops the others.

JSON fields of a scenario line: scenario, dtype, sms (the client's SMs asked for; null where not
partitioned), p50_us, p99_us, requests (null without a client), bg_tflops (null without
background), bg_threads, bg_n, gap_us, seconds; also priority (of the client's stream, as
CUDA reports it; null without a client), and for green lines sms_actual (the client's SMs in
the split, where known), bg_sms (the background's SMs; null: the whole device) and green_via.
A first line
{"scenario": "info", "torch", "device", "sms" (multiprocessor count), "priority_range",
"green_api"} says what was found.

--check serves one request of every client after its scenario and compares the output with a
float64 CPU run of the same weights, |got - want| <= tol (1 + |want|) with tol 3e-2 for bf16 and
1e-4 for f32 (examples/serve/model.rs's rule); the line gets max_abs_err and check_ok, and the
script exits 1 after all its lines if any client was off.

How boundpool uses it: boundpool's SM-partition bench (Rust) runs this script as a subprocess
in the same device call as its own partitioned pool (same GPU, model, request protocol and
background), reads the JSON lines from stdout and prints boundpool-vs-PyTorch ratios. Progress
goes to stderr only; stdout carries nothing but JSON lines.

    python3 torch_partition.py [--dtype bf16|f32 ...] [--seconds S] [--gap-us U]
        [--warmup N] [--bg-threads T] [--bg-n N] [--bg-depth D] [--sms 8 16 32 ...]
        [--check]
"""
import argparse
import gc
import json
import math
import os
import sys
import threading
import time

sys.dont_write_bytecode = True  # importing torch_serve leaves no __pycache__ in the tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "serve"))
import torch_serve as ts  # noqa: E402  (the served model, its client and the percentile rule)

torch = ts.torch  # None where PyTorch is missing: reported as a skip in main()

# Tolerance of a served output against the float64 reference, |got - want| <= tol (1 + |want|),
# as examples/serve/model.rs checks boundpool's outputs.
TOL = {"bf16": 3e-2, "f32": 1e-4}
DEVICE = 0
BG_WARM_TIMEOUT_S = 120.0


def log(msg):
    print(f"[torch_partition] {msg}", file=sys.stderr, flush=True)


def emit(record):
    print(json.dumps(record), flush=True)


def describe(e):
    """An exception's type and the first line of its message (CUDA errors run to many lines)."""
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first}"


# ---------------------------------------------------------------------------------------------
# Background


class Background:
    """One thread per stream, each issuing n x n bf16 GEMMs into a preallocated output back to
    back and synchronising its stream every `depth` GEMMs; each synchronise is stamped."""

    def __init__(self, streams, n, depth):
        self.streams, self.n, self.depth = list(streams), n, depth
        self.bufs = []
        for _ in self.streams:
            a = torch.empty(n, n, device="cuda", dtype=torch.bfloat16).uniform_(-1.0, 1.0)
            b = torch.empty(n, n, device="cuda", dtype=torch.bfloat16).uniform_(-1.0, 1.0)
            self.bufs.append((a, b, torch.empty(n, n, device="cuda", dtype=torch.bfloat16)))
        torch.cuda.synchronize()
        self.threads = []

    def start(self):
        """Start the threads; return once each has finished its first batch (warm)."""
        k = len(self.streams)
        self.stop = threading.Event()
        self.ready = [threading.Event() for _ in range(k)]
        self.marks = [[] for _ in range(k)]
        self.errors = []
        self.threads = [threading.Thread(target=self._work, args=(i,), daemon=True) for i in range(k)]
        for t in self.threads:
            t.start()
        for ev in self.ready:
            if not ev.wait(BG_WARM_TIMEOUT_S):
                self.finish()
                raise RuntimeError(f"background not warm after {BG_WARM_TIMEOUT_S} s")
        if self.errors:
            self.finish()

    def _work(self, i):
        stream, (a, b, c), marks = self.streams[i], self.bufs[i], self.marks[i]
        try:
            with torch.inference_mode(), torch.cuda.stream(stream):
                done = 0
                while True:
                    for _ in range(self.depth):
                        torch.mm(a, b, out=c)
                    stream.synchronize()
                    done += self.depth
                    marks.append((time.perf_counter_ns(), done))
                    self.ready[i].set()
                    if self.stop.is_set():
                        break
        except BaseException as e:  # noqa: BLE001 - raised by finish() in the main thread
            self.errors.append(e)
        finally:
            self.ready[i].set()

    def finish(self):
        """Stop and join the threads; raise the first thread's error, if any."""
        self.stop.set()
        for t in self.threads:
            t.join()
        self.threads = []
        for s in self.streams:
            s.synchronize()
        if self.errors:
            raise self.errors[0]

    def tflops(self, t0, t1):
        """TFLOP/s between the first and the last stamp in [t0, t1] of each thread, summed;
        None if a thread has fewer than two stamps there."""
        rate = 0.0
        for marks in self.marks:
            inside = [m for m in marks if t0 <= m[0] <= t1]
            if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
                return None
            (ta, ca), (tb, cb) = inside[0], inside[-1]
            rate += (cb - ca) / ((tb - ta) / 1e9)
        return round(rate * 2.0 * float(self.n) ** 3 / 1e12, 2)


def measure(client, bg, args):
    """The client (or None) beside the background (or None) for --seconds. Returns the
    client's summary (torch_serve.run_clients: sorted ns, requests) and the background's
    TFLOP/s over the same window."""
    if bg is not None:
        bg.start()
    res = None
    try:
        t0 = time.perf_counter_ns()
        if client is not None:
            _, res = ts.run_clients([], client, args.seconds, args.warmup, args.gap_us * 1e-6)
        else:
            time.sleep(args.seconds)
        t1 = time.perf_counter_ns()
    finally:
        if bg is not None:
            bg.finish()
    return res, (bg.tflops(t0, t1) if bg is not None else None)


# ---------------------------------------------------------------------------------------------
# Records


def line(scenario, dt, args, sms=None, res=None, tflops=None, **extra):
    rec = {"scenario": scenario, "dtype": dt, "sms": sms,
           "p50_us": ts.percentile_us(res["lat"], 0.50) if res else None,
           "p99_us": ts.percentile_us(res["lat"], 0.99) if res else None,
           "requests": res["requests"] if res else None,
           "bg_tflops": tflops, "bg_threads": args.bg_threads, "bg_n": args.bg_n,
           "gap_us": args.gap_us, "seconds": args.seconds}
    rec.update(extra)
    return rec


def check(model, client, dt, what, failures):
    """Serve one request; its output against the float64 reference (TOL's rule)."""
    client.request()
    ref = ts.reference(model, client.host_in)
    err = (client.host_out.double() - ref).abs()
    max_abs = float(err.max().item())
    excess = float((err - TOL[dt] * (1.0 + ref.abs())).max().item())
    ok = bool(excess <= 0.0)  # False for a NaN too
    if not ok:
        failures.append(f"{what} {dt}: max |got - want| {max_abs}, over tolerance {TOL[dt]}")
    return {"max_abs_err": max_abs if math.isfinite(max_abs) else str(max_abs), "check_ok": ok}


def scenario(name, dt, head, fn):
    """Run one scenario; print its line (or its error) and never raise."""
    log(f"running {name} {dt} {head}")
    try:
        rec = fn()
    except Exception as e:  # noqa: BLE001 - one failed scenario must not stop the rest
        rec = {"scenario": name, "dtype": dt, **head, "error": describe(e)}
    emit(rec)
    log(f"done: {rec}")
    try:
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        log(f"synchronize after {name} failed: {describe(e)}")
    return rec


# ---------------------------------------------------------------------------------------------
# Priorities and green contexts


def priority_range():
    """(least, greatest) stream priority, or None where PyTorch cannot say."""
    try:
        return tuple(int(p) for p in torch.cuda.Stream.priority_range())
    except Exception as e:  # noqa: BLE001
        log(f"no priority range: {describe(e)}")
        return None


def stream_priority(stream):
    try:
        return int(stream.priority)
    except Exception:  # noqa: BLE001
        return None


def greatest_priority():
    pr = priority_range()
    return min(pr) if pr else -1  # a lower number is a higher priority


def cuda_bindings_driver():
    """cuda.bindings' driver module, or None."""
    try:
        from cuda.bindings import driver
        return driver
    except Exception:  # noqa: BLE001
        try:
            from cuda import cuda as driver  # older cuda-python layout
            return driver
        except Exception:  # noqa: BLE001
            return None


class GreenApi:
    """What this PyTorch offers: `cls` (GreenContext, None where unusable), `mod` (its module),
    `found` (a description of what was found, or None) and `why_not` (None where usable)."""

    def __init__(self, cls, mod, found, why_not):
        self.cls, self.mod, self.found, self.why_not = cls, mod, found, why_not


def green_api():
    try:
        mod = getattr(torch.cuda, "green_contexts", None)
        if mod is None:
            import torch.cuda.green_contexts as mod  # noqa: PLW0621
        gc_cls = getattr(mod, "GreenContext", None) or getattr(torch.cuda, "GreenContext", None)
    except Exception as e:  # noqa: BLE001
        return GreenApi(None, None, None, f"no torch.cuda.green_contexts: {describe(e)}")
    if gc_cls is None:
        return GreenApi(None, mod, None, "no torch.cuda.green_contexts.GreenContext")
    parts = ["torch.cuda.green_contexts.GreenContext"]
    parts += [m for m in ("create", "Stream", "set_context", "pop_context") if hasattr(gc_cls, m)]
    if hasattr(mod, "SMPartition"):
        parts.append("SMPartition.split")
    supported = getattr(mod, "SUPPORTED", None)
    if supported is not None:
        parts.append(f"SUPPORTED={supported}")
    drv = cuda_bindings_driver()
    if drv is not None:
        try:
            from cuda.bindings import __version__ as cbv
        except Exception:  # noqa: BLE001
            cbv = "?"
        parts.append(f"cuda.bindings {cbv}")
    found = " ".join(parts)
    if supported is False:
        return GreenApi(None, mod, found, "PyTorch was built without green contexts")
    if not hasattr(gc_cls, "Stream"):
        return GreenApi(None, mod, found, "GreenContext has no Stream() (PyTorch before 2.11)")
    return GreenApi(gc_cls, mod, found, None)


class Partition:
    """The client's stream in a green context of `sms` SMs and the background's streams (None:
    ordinary streams on the whole device); `keep` holds what must outlive the streams."""

    def __init__(self, client_stream, bg_streams, sms_actual, bg_sms, via, keep):
        self.client_stream, self.bg_streams = client_stream, bg_streams
        self.sms_actual, self.bg_sms, self.via, self.keep = sms_actual, bg_sms, via, keep


def _ok(res, what):
    """A cuda.bindings result tuple (CUresult, values...) -> the values, raising on an error."""
    err = res[0]
    if int(err) != 0:
        raise RuntimeError(f"{what}: {err!r}")
    return res[1] if len(res) == 2 else tuple(res[1:])


def bindings_remainder(k, threads):
    """Green context of the SMs left by splitting the whole device into one group of k SMs
    (the split PyTorch 2.11's GreenContext.create(k) makes) and `threads` streams in it.
    Returns (streams, SMs of the group, SMs of the remainder, objects to keep)."""
    drv = cuda_bindings_driver()
    if drv is None:
        raise RuntimeError("no cuda.bindings")
    device = _ok(drv.cuDeviceGet(DEVICE), "cuDeviceGet")
    full = _ok(drv.cuDeviceGetDevResource(device, drv.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM),
               "cuDeviceGetDevResource")
    groups, n_groups, rest = _ok(drv.cuDevSmResourceSplitByCount(1, full, 0, k), "cuDevSmResourceSplitByCount")
    if n_groups != 1 or rest is None or int(rest.sm.smCount) == 0:
        raise RuntimeError(f"split of {k} SMs gave {n_groups} group(s) and no remainder")
    desc = _ok(drv.cuDevResourceGenerateDesc([rest], 1), "cuDevResourceGenerateDesc")
    gctx = _ok(drv.cuGreenCtxCreate(desc, device, drv.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM),
               "cuGreenCtxCreate")
    raw = [_ok(drv.cuGreenCtxStreamCreate(gctx, drv.CUstream_flags.CU_STREAM_NON_BLOCKING, 0),
               "cuGreenCtxStreamCreate") for _ in range(threads)]
    streams = [torch.cuda.ExternalStream(int(s), device=DEVICE) for s in raw]
    return streams, int(groups[0].sm.smCount), int(rest.sm.smCount), [full, rest, desc, gctx, raw]


def make_partition(gc_cls, mod, k, threads):
    """The client's green context of k SMs and the background's place (see the docstring)."""
    sm_partition = getattr(mod, "SMPartition", None)
    if sm_partition is not None:  # PyTorch after 2.11: a disjoint split, all in PyTorch
        try:
            (part,), rest = sm_partition.from_device(DEVICE).split(num_sms=k)
            cctx = gc_cls(sm_partition=part)
            keep, bg_streams, bg_sms = [part, rest, cctx], None, None
            if rest is not None:
                bctx = gc_cls(sm_partition=rest)
                keep.append(bctx)
                bg_streams = [bctx.Stream() for _ in range(threads)]
                bg_sms = int(rest.sm_count)
            return Partition(cctx.Stream(), bg_streams, int(part.sm_count), bg_sms,
                             "torch SMPartition.split", keep)
        except Exception as e:  # noqa: BLE001
            log(f"SMPartition.split of {k} SMs failed ({describe(e)}); trying GreenContext.create")
    # PyTorch 2.11: create(num_sms, device_id=0), a Python staticmethod (keywords work, and
    # they are what later versions take).
    cctx = gc_cls.create(num_sms=k, device_id=DEVICE)
    client_stream = cctx.Stream()
    try:
        bg_streams, sms_actual, bg_sms, keep = bindings_remainder(k, threads)
        return Partition(client_stream, bg_streams, sms_actual, bg_sms,
                         "torch GreenContext.create + cuda.bindings remainder", [cctx] + keep)
    except Exception as e:  # noqa: BLE001
        log(f"no green context of the remaining SMs ({describe(e)}); background on the whole device")
        return Partition(client_stream, None, None, None,
                         f"torch GreenContext.create; background on the whole device ({describe(e)})",
                         [cctx])


# ---------------------------------------------------------------------------------------------
# Scenarios


KEEP = []  # green contexts and their streams live until the process ends (see main's exit)


def run_dtype(dt, args, api, failures):
    dtype = getattr(torch, ts.DTYPES[dt])
    model = ts.make_model(dtype)  # outside inference mode, as torch_serve.py makes it
    with torch.inference_mode():
        run_scenarios(dt, dtype, model, args, api, failures)


def run_scenarios(dt, dtype, model, args, api, failures):
    prio = greatest_priority()

    def client_on(stream):  # the graph is captured on the stream it is replayed on
        return ts.Client(model, dtype, "graph", 0, stream, capture_stream=stream)

    def checked(client, what):
        return check(model, client, dt, what, failures) if args.check else {}

    clients = {}

    def run_alone(name, priority):
        def fn():
            stream = torch.cuda.Stream(priority=priority) if priority else torch.cuda.Stream()
            client = clients[name] = client_on(stream)
            res, _ = measure(client, None, args)
            return line(name, dt, args, res=res, priority=stream_priority(stream), **checked(client, name))
        scenario(name, dt, {"priority": priority}, fn)

    run_alone("alone", 0)
    run_alone("alone_high", prio)

    bg, bg_error = None, None
    try:
        bg = Background(ts.new_streams(args.bg_threads), args.bg_n, args.bg_depth)
    except Exception as e:  # noqa: BLE001
        bg_error = describe(e)
        log(f"background buffers failed: {bg_error}")

    def bg_only():
        if bg is None:
            raise RuntimeError(bg_error)
        _, tflops = measure(None, bg, args)
        return line("bg_only", dt, args, tflops=tflops, priority=None)

    def run_loaded(name, alone):  # the client of scenario `alone` beside the background
        if bg is None:
            raise RuntimeError(bg_error)
        client = clients.get(alone)
        if client is None:
            raise RuntimeError(f"no client ({alone} failed)")
        res, tflops = measure(client, bg, args)
        return line(name, dt, args, res=res, tflops=tflops, priority=stream_priority(client.stream))

    scenario("bg_only", dt, {}, bg_only)
    scenario("loaded", dt, {"priority": 0}, lambda: run_loaded("loaded", "alone"))
    scenario("loaded_priority", dt, {"priority": prio}, lambda: run_loaded("loaded_priority", "alone_high"))
    clients.clear()
    gc.collect()

    if api.cls is None:
        emit({"scenario": "green", "dtype": dt, "skipped": api.why_not})
        return
    for k in args.sms:
        try:
            run_green(k, dt, args, api.cls, api.mod, bg, client_on, checked)
        except Exception as e:  # noqa: BLE001 - a green failure never stops the rest
            emit({"scenario": "green", "dtype": dt, "sms": k, "skipped": describe(e)})
        gc.collect()
        try:
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            log(f"synchronize after green {k} failed: {describe(e)}")


def run_green(k, dt, args, gc_cls, mod, plain_bg, client_on, checked):
    log(f"green context of {k} SMs")
    part = make_partition(gc_cls, mod, k, args.bg_threads)
    KEEP.append(part)
    client = client_on(part.client_stream)  # a failure here is reported as skipped
    if part.bg_streams is not None:
        bg = Background(part.bg_streams, args.bg_n, args.bg_depth)
    elif plain_bg is not None:
        bg = plain_bg
    else:
        bg = Background(ts.new_streams(args.bg_threads), args.bg_n, args.bg_depth)
    head = {"sms": k, "sms_actual": part.sms_actual, "bg_sms": part.bg_sms, "green_via": part.via}

    def green_alone():
        res, _ = measure(client, None, args)
        return line("green_alone", dt, args, res=res, priority=stream_priority(client.stream), **head,
                    **checked(client, f"green_alone sms={k}"))

    def green_bg_only():
        _, tflops = measure(None, bg, args)
        return line("green_bg_only", dt, args, tflops=tflops, priority=None, **head)

    def green_loaded():
        res, tflops = measure(client, bg, args)
        return line("green_loaded", dt, args, res=res, tflops=tflops,
                    priority=stream_priority(client.stream), **head)

    scenario("green_alone", dt, head, green_alone)
    scenario("green_bg_only", dt, head, green_bg_only)
    scenario("green_loaded", dt, head, green_loaded)


# ---------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", nargs="+", choices=list(ts.DTYPES), default=["bf16"])
    p.add_argument("--seconds", type=float, default=2.0, help="measured seconds per scenario")
    p.add_argument("--gap-us", type=float, default=200.0, help="pause between the client's requests")
    p.add_argument("--warmup", type=int, default=50, help="uncounted requests before each measurement")
    p.add_argument("--bg-threads", type=int, default=1, help="background threads, one stream each")
    p.add_argument("--bg-n", type=int, default=8192, help="the background's square bf16 GEMM size")
    p.add_argument("--bg-depth", type=int, default=4, help="background GEMMs between synchronises")
    p.add_argument("--sms", nargs="+", type=int, default=[8, 16, 32],
                   help="SMs of the client's green context, one partition each")
    p.add_argument("--check", action="store_true",
                   help="check each client's output against a float64 CPU reference; exit 1 if off")
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.gap_us < 0 or args.warmup < 0:
        p.error("--seconds must be > 0, --gap-us and --warmup >= 0")
    if args.bg_threads < 1 or args.bg_n < 1 or args.bg_depth < 1:
        p.error("--bg-threads, --bg-n and --bg-depth must be >= 1")
    if any(k < 1 for k in args.sms):
        p.error("--sms must be >= 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    if torch is None:
        emit({"scenario": "info", "skipped": "no torch"})
        return 0
    if not torch.cuda.is_available():
        emit({"scenario": "info", "skipped": "no CUDA"})
        return 0
    torch.cuda.set_device(DEVICE)
    torch.backends.cuda.matmul.allow_tf32 = False  # f32 means f32; bf16 matmuls are unaffected
    props = torch.cuda.get_device_properties(DEVICE)
    api = green_api()
    pr = priority_range()
    emit({"scenario": "info", "torch": torch.__version__.split("+")[0], "cuda": torch.version.cuda,
          "device": torch.cuda.get_device_name(DEVICE), "sms": props.multi_processor_count,
          "priority_range": list(pr) if pr else None, "green_api": api.found})
    log(f"torch {torch.__version__} on {torch.cuda.get_device_name(DEVICE)}; green API: {api.found}"
        + (f" (not used: {api.why_not})" if api.why_not else ""))
    failures = []
    for dt in args.dtype:
        try:
            run_dtype(dt, args, api, failures)
        except Exception as e:  # noqa: BLE001 - e.g. the model itself failed: next dtype
            emit({"scenario": "error", "dtype": dt, "error": describe(e)})
        gc.collect()
    if failures:
        log("check failed: " + "; ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without running destructors: green contexts (and the streams, graphs and cuBLAS
    # state tied to them) are torn down with the process, not in an order PyTorch may not like.
    os._exit(rc)
