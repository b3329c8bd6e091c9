#!/usr/bin/env python3
"""PyTorch peer of boundpool's serving benchmark.

What it measures: many clients serving small inference requests on one GPU. The model is
4 x (torch.nn.Linear(1024, 1024) + erf GELU) at batch 8, weights made once on the GPU with
torch.manual_seed(0) (weight ~ U(-1,1)/sqrt(1024), bias ~ U(-0.1,0.1)), run under
torch.inference_mode() in bf16 or f32 (TF32 off). Each client is a Python thread with its
own CUDA stream and its own pinned input/output; one request is

    H2D copy of the 8x1024 input (non_blocking) -> forward -> D2H copy into pinned
    memory (non_blocking) -> synchronise the client's stream

and its latency runs from just before the H2D copy to just after the synchronise. Mode
"eager" runs the forward eagerly on the client's stream; mode "graph" replays one CUDA
graph per client (captured one client at a time in the main thread, before the threads
start). Clients warm up (--warmup requests), meet at a barrier, then send requests back to
back for --seconds. Per configuration it prints one JSON line with requests/s and the
p50/p99 latency over all requests (index round(q*(n-1)) of the sorted list).

--high runs the priority scenario instead: a latency-critical client on a stream of the
device's greatest priority, sending one request at a time with --high-gap-us between them,
first alone, then beside --clients batch clients (normal priority); the batch clients are
also run once without it. It prints the high client's p50/p99 alone and loaded, and the
batch clients' requests/s with and without it.

How boundpool uses it: boundpool's `bench_serve` runs this script as a subprocess in the
same device call as its own serving bench (same GPU, same shapes and request protocol),
reads the JSON lines from stdout and prints boundpool-vs-PyTorch ratios. Progress goes to
stderr only; stdout carries nothing but JSON lines.

    python3 torch_serve.py [--dtype bf16|f32 ...] [--clients 1 8 32 ...]
        [--mode eager graph ...] [--seconds S] [--warmup N] [--high]
        [--high-gap-us U] [--check]
"""
import argparse
import gc
import json
import math
import sys
import threading
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # reported as a skip in main()
    torch = None

HIDDEN, BATCH, LAYERS = 1024, 8, 4
DTYPES = {"bf16": "bfloat16", "f32": "float32"}


def log(msg):
    print(f"[torch_serve] {msg}", file=sys.stderr, flush=True)


def emit(record):
    print(json.dumps(record), flush=True)


def percentile_us(sorted_ns, q):
    """Entry round(q*(n-1)) of a sorted list of ns (half away from zero, as Rust rounds), in µs."""
    if not sorted_ns:
        return None
    return round(sorted_ns[int(math.floor(q * (len(sorted_ns) - 1) + 0.5))] / 1000.0, 2)


def make_model(dtype):
    """The served model, made in f32 on the GPU from seed 0, then cast to `dtype`."""

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(
                torch.nn.Linear(HIDDEN, HIDDEN, bias=True, device="cuda") for _ in range(LAYERS))

        def forward(self, x):
            for layer in self.layers:
                x = F.gelu(layer(x))
            return x

    torch.manual_seed(0)
    model = MLP()
    with torch.no_grad():
        for layer in model.layers:
            layer.weight.uniform_(-1.0, 1.0).div_(math.sqrt(HIDDEN))
            layer.bias.uniform_(-0.1, 0.1)
    return model.to(dtype).eval().requires_grad_(False)


def reference(model, host_in):
    """The model's output for `host_in` computed in float64 on the CPU from the same weights."""
    ref = host_in.double()
    for layer in model.layers:
        ref = F.gelu(ref @ layer.weight.double().cpu().t() + layer.bias.double().cpu())
    return ref


def max_abs_err(model, client):
    """Serve one request, compare its output with a float64 CPU run of the same weights."""
    client.request()
    ref = reference(model, client.host_in)
    return float((client.host_out.double() - ref).abs().max().item())


class Client:
    """One client's stream, pinned host buffers, device input and (graph mode) CUDA graph,
    captured on `capture_stream` (None: PyTorch's own side stream, as this script does)."""

    def __init__(self, model, dtype, mode, seed, stream, capture_stream=None):
        self.model, self.stream = model, stream
        gen = torch.Generator().manual_seed(seed)
        self.host_in = torch.randn(BATCH, HIDDEN, generator=gen).to(dtype).pin_memory()
        self.host_out = torch.empty(BATCH, HIDDEN, dtype=dtype).pin_memory()
        self.dev_in = torch.empty(BATCH, HIDDEN, dtype=dtype, device="cuda")
        self.dev_in.copy_(self.host_in)
        self.graph = self.dev_out = None
        if mode == "graph":
            # Warm up on a side stream (the client's own) as the CUDA-graph docs require.
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    model(self.dev_in)
            torch.cuda.current_stream().wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            # H2D-free: static dev_in -> static dev_out
            with torch.cuda.graph(self.graph, stream=capture_stream):
                self.dev_out = model(self.dev_in)
            torch.cuda.synchronize()

    def request(self):
        """Serve one request on this client's stream; returns its latency in ns."""
        with torch.cuda.stream(self.stream):
            t0 = time.perf_counter_ns()
            self.dev_in.copy_(self.host_in, non_blocking=True)
            if self.graph is not None:
                self.graph.replay()
                out = self.dev_out
            else:
                out = self.model(self.dev_in)
            self.host_out.copy_(out, non_blocking=True)
            self.stream.synchronize()
            return time.perf_counter_ns() - t0


def run_clients(batch, high, seconds, warmup, gap_s):
    """Run the batch clients back to back and `high` (or None) with `gap_s` between requests,
    all released by one barrier after their warm-up. Returns (batch, high) summaries, each
    {"lat": sorted ns, "requests": n, "seconds": s} or None for an empty group."""
    workers = [(c, 0.0) for c in batch] + ([(high, gap_s)] if high is not None else [])
    start = [0]
    barrier = threading.Barrier(len(workers), action=lambda: start.__setitem__(0, time.perf_counter_ns()))
    lats, ends, errors = [None] * len(workers), [0] * len(workers), []

    def work(i, client, gap):
        try:
            with torch.inference_mode():
                for _ in range(warmup):
                    client.request()
                barrier.wait()
                deadline, mine = start[0] + int(seconds * 1e9), []
                while time.perf_counter_ns() < deadline:
                    mine.append(client.request())
                    if gap:
                        time.sleep(gap)
                ends[i], lats[i] = time.perf_counter_ns(), mine
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(i, c, g), daemon=True) for i, (c, g) in enumerate(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])

    def summary(idx):
        if not idx:
            return None
        lat = sorted(x for i in idx for x in lats[i])
        return {"lat": lat, "requests": len(lat), "seconds": (max(ends[i] for i in idx) - start[0]) / 1e9}

    return summary(list(range(len(batch)))), summary([len(batch)] if high is not None else [])


def new_streams(n):
    """n normal-priority streams, made back to back so PyTorch's 32-stream pool gives distinct ones."""
    streams = [torch.cuda.Stream() for _ in range(n)]
    distinct = len({s.cuda_stream for s in streams})
    if distinct < n:
        log(f"warning: {n} clients share {distinct} CUDA streams (PyTorch's stream pool)")
    return streams


def rps(s):
    return round(s["requests"] / s["seconds"], 1) if s and s["seconds"] > 0 else 0.0


def run_config(model, dtype, mode, n, args):
    clients = [Client(model, dtype, mode, i + 1, s) for i, s in enumerate(new_streams(n))]
    res, _ = run_clients(clients, None, args.seconds, args.warmup, 0.0)
    rec = {"requests": res["requests"], "seconds": round(res["seconds"], 3), "rps": rps(res),
           "p50_us": percentile_us(res["lat"], 0.50), "p99_us": percentile_us(res["lat"], 0.99)}
    if args.check:
        rec["max_abs_err"] = max_abs_err(model, clients[0])
    return rec


def run_priority(model, dtype, mode, n, args):
    prio = min(torch.cuda.Stream.priority_range())  # lower number = higher priority
    batch = [Client(model, dtype, mode, i + 1, s) for i, s in enumerate(new_streams(n))]
    high = Client(model, dtype, mode, 0, torch.cuda.Stream(priority=prio))
    gap = args.high_gap_us * 1e-6
    _, alone = run_clients([], high, args.seconds, args.warmup, gap)
    batch_alone, _ = run_clients(batch, None, args.seconds, args.warmup, 0.0)
    batch_loaded, loaded = run_clients(batch, high, args.seconds, args.warmup, gap)
    rec = {"high_priority": prio, "high_gap_us": args.high_gap_us, "seconds": args.seconds,
           "high_alone_p50_us": percentile_us(alone["lat"], 0.50),
           "high_alone_p99_us": percentile_us(alone["lat"], 0.99),
           "high_loaded_p50_us": percentile_us(loaded["lat"], 0.50),
           "high_loaded_p99_us": percentile_us(loaded["lat"], 0.99),
           "high_alone_requests": alone["requests"], "high_loaded_requests": loaded["requests"],
           "batch_rps": rps(batch_loaded), "batch_alone_rps": rps(batch_alone)}
    if args.check:
        rec["max_abs_err"] = max(max_abs_err(model, c) for c in (high, batch[0]))
    return rec


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", nargs="+", choices=list(DTYPES), default=["bf16", "f32"])
    p.add_argument("--clients", nargs="+", type=int, default=[1, 8, 32],
                   help="client counts (batch clients with --high)")
    p.add_argument("--mode", nargs="+", choices=["eager", "graph"], default=["eager", "graph"])
    p.add_argument("--seconds", type=float, default=3.0, help="measured seconds per run")
    p.add_argument("--warmup", type=int, default=50, help="uncounted requests per client first")
    p.add_argument("--high", action="store_true", help="run the priority scenario")
    p.add_argument("--high-gap-us", type=float, default=200.0, help="pause between high requests")
    p.add_argument("--check", action="store_true", help="add max_abs_err vs a float64 CPU reference")
    args = p.parse_args(argv)
    if any(n < 1 for n in args.clients):
        p.error("--clients must be >= 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    if torch is None:
        emit({"impl": "pytorch", "skipped": "no torch"})
        return 0
    if not torch.cuda.is_available():
        emit({"impl": "pytorch", "skipped": "no CUDA"})
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False  # f32 means f32; bf16 matmuls are unaffected
    meta = {"torch": torch.__version__.split("+")[0], "device": torch.cuda.get_device_name(0)}
    log(f"torch {torch.__version__} on {meta['device']}")
    for dt in args.dtype:
        dtype = getattr(torch, DTYPES[dt])
        model = make_model(dtype)
        for mode in args.mode:
            for n in args.clients:
                head = {"impl": "pytorch"}
                if args.high:
                    head.update(scenario="priority", dtype=dt, mode=mode, batch_clients=n)
                else:
                    head.update(dtype=dt, mode=mode, clients=n)
                log(f"running {head}")
                try:
                    with torch.inference_mode():
                        rec = (run_priority if args.high else run_config)(model, dtype, mode, n, args)
                    rec = {**head, **rec, **meta}
                except Exception as e:  # noqa: BLE001 - one failed configuration must not stop the rest
                    rec = {**head, "error": f"{type(e).__name__}: {e}"}
                emit(rec)
                log(f"done: {rec}")
                gc.collect()  # drop this configuration's clients, graphs and buffers
                try:
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001
                    log(f"synchronize after configuration failed: {e}")
        del model
    return 0


if __name__ == "__main__":
    sys.exit(main())
