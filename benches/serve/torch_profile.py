#!/usr/bin/env python3
"""Where PyTorch's one-client request spends its device time (a diagnostic beside
torch_serve.py, for the one-client latency of boundpool's serving bench).

For the served model of torch_serve.py in bf16 and f32, CUDA-graph mode, one client: the device
time of the graph replay alone and of the whole request (H2D copy, replay, D2H copy), from CUDA
events (median of --requests), then the kernels and copies of 20 requests from torch.profiler
(name, count, mean device us). Prints plain text.

    python3 torch_profile.py [--requests N]
"""
import argparse
import os
import statistics
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch_serve as ts  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=2000)
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    for name, dtype in (("bf16", torch.bfloat16), ("f32", torch.float32)):
        model = ts.make_model(dtype)
        stream = torch.cuda.Stream()
        c = ts.Client(model, dtype, "graph", 1, stream)
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        replay, whole, wall = [], [], []
        with torch.inference_mode():
            for i in range(a.requests):
                with torch.cuda.stream(stream):
                    ev[0].record()
                    c.dev_in.copy_(c.host_in, non_blocking=True)
                    ev[1].record()
                    c.graph.replay()
                    ev[2].record()
                    c.host_out.copy_(c.dev_out, non_blocking=True)
                    ev[3].record()
                    stream.synchronize()
                if i >= 100:
                    replay.append(ev[1].elapsed_time(ev[2]) * 1e3)
                    whole.append(ev[0].elapsed_time(ev[3]) * 1e3)
                    wall.append(c.request() / 1e3)
        print(f"{name}: graph replay on the device {statistics.median(replay):.1f} us, "
              f"request on the device (copies included) {statistics.median(whole):.1f} us, "
              f"request wall time {statistics.median(wall):.1f} us (medians)")
        from torch.profiler import ProfilerActivity, profile
        with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                c.request()
        rows = [e for e in prof.key_averages() if e.device_time_total > 0]
        rows.sort(key=lambda e: -e.device_time_total)
        for e in rows[:12]:
            print(f"  {e.count:4d} x {e.device_time_total / max(e.count, 1):7.2f} us  {e.key[:110]}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
