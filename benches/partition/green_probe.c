// What the driver allows with green contexts, before boundpool builds on it (issue "SM
// partitions"): which context must be current to launch on a green context's stream, whether a
// module, an event, a stream-ordered allocation and a cuBLAS handle of the primary context work
// there, and whether a graph captured on a green stream keeps its partition. Each check prints
// one line; SMs used are counted from the %smid of each block.
// Build on the device machine: nvcc -ptx -arch=sm_90 green_kernels.cu -o green_kernels.ptx;
//   gcc green_probe.c -I$CUDA/include -L$CUDA/lib64 -lcuda -lcublas -lpthread -o green_probe
#include <cuda.h>
#include <cublas_v2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char* s_; cuGetErrorName(r_, &s_); printf("  %s -> %s\n", #x, s_); } } while (0)
static int ok(CUresult r, const char* what) { if (r != CUDA_SUCCESS) { const char* s; cuGetErrorName(r, &s); printf("  %s -> %s\n", what, s); return 0; } return 1; }

static CUfunction fn_primary;
static CUdeviceptr seen;
static double now_us(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }

static int count_sms(CUfunction f, CUstream s, long long spin, CUresult* err) {
    unsigned int h[16] = {0};
    cuMemsetD8(seen, 0, sizeof h);
    void* args[] = {&seen, &spin};
    *err = cuLaunchKernel(f, 1056, 1, 1, 64, 1, 1, 0, s, args, NULL);
    if (*err != CUDA_SUCCESS) return -1;
    *err = cuStreamSynchronize(s);
    if (*err != CUDA_SUCCESS) return -1;
    cuMemcpyDtoH(h, seen, sizeof h);
    int n = 0;
    for (int i = 0; i < 16; i++) n += __builtin_popcount(h[i]);
    return n;
}
static void report(const char* what, CUfunction f, CUstream s) {
    CUresult e; int n = count_sms(f, s, 20000, &e);
    if (n < 0) { const char* m; cuGetErrorName(e, &m); printf("%-60s ERROR %s\n", what, m); }
    else printf("%-60s SMs used %d\n", what, n);
}

static char* read_file(const char* p) {
    FILE* f = fopen(p, "rb"); if (!f) { perror(p); exit(1); }
    fseek(f, 0, SEEK_END); long n = ftell(f); fseek(f, 0, SEEK_SET);
    char* b = malloc(n + 1); fread(b, 1, n, f); b[n] = 0; fclose(f); return b;
}

struct thr { CUcontext ctx; CUstream s; CUfunction f; int n; CUresult err; };
static void* thread_launch(void* a) {
    struct thr* t = a;
    cuCtxSetCurrent(t->ctx);
    long long spin = 2000; void* args[] = {&seen, &spin};
    t->err = CUDA_SUCCESS;
    for (int i = 0; i < 200 && t->err == CUDA_SUCCESS; i++) t->err = cuLaunchKernel(t->f, 64, 1, 1, 64, 1, 1, 0, t->s, args, NULL);
    if (t->err == CUDA_SUCCESS) t->err = cuStreamSynchronize(t->s);
    return NULL;
}

int main(int argc, char** argv) {
    const char* ptx_path = argc > 1 ? argv[1] : "green_kernels.ptx";
    unsigned want = argc > 2 ? atoi(argv[2]) : 8;
    CK(cuInit(0));
    CUdevice dev; CK(cuDeviceGet(&dev, 0));
    int drv; cuDriverGetVersion(&drv); printf("driver API %d\n", drv);
    CUcontext primary; CK(cuDevicePrimaryCtxRetain(&primary, dev)); CK(cuCtxSetCurrent(primary));
    char* ptx = read_file(ptx_path);
    CUmodule mod; CK(cuModuleLoadData(&mod, ptx)); CK(cuModuleGetFunction(&fn_primary, mod, "smid"));
    CK(cuMemAlloc(&seen, 64));

    CUdevResource all; CK(cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
    printf("device SMs %u, min partition %u, alignment %u\n", all.sm.smCount, all.sm.minSmPartitionSize, all.sm.smCoscheduledAlignment);
    CUdevResource part[4]; unsigned nb = 1; CUdevResource rest;
    CK(cuDevSmResourceSplitByCount(part, &nb, &all, &rest, 0, want));
    printf("split by count %u: groups %u, group SMs %u, remainder SMs %u\n", want, nb, part[0].sm.smCount, rest.sm.smCount);
    CUdevResourceDesc d1, d2; CK(cuDevResourceGenerateDesc(&d1, &part[0], 1)); CK(cuDevResourceGenerateDesc(&d2, &rest, 1));
    CUgreenCtx g1, g1b, g2; CK(cuGreenCtxCreate(&g1, d1, dev, CU_GREEN_CTX_DEFAULT_STREAM));
    CK(cuGreenCtxCreate(&g1b, d1, dev, CU_GREEN_CTX_DEFAULT_STREAM));
    CK(cuGreenCtxCreate(&g2, d2, dev, CU_GREEN_CTX_DEFAULT_STREAM));
    CUcontext c1, c1b, c2; CK(cuCtxFromGreenCtx(&c1, g1)); CK(cuCtxFromGreenCtx(&c1b, g1b)); CK(cuCtxFromGreenCtx(&c2, g2));
    CUdevResource got; CK(cuGreenCtxGetDevResource(g1, &got, CU_DEV_RESOURCE_TYPE_SM));
    printf("green ctx 1 reports SMs %u; second green ctx from the same desc made: %s\n", got.sm.smCount, g1b ? "yes" : "no");
    CUstream gs1, gs2, ps; CK(cuGreenCtxStreamCreate(&gs1, g1, CU_STREAM_NON_BLOCKING, 0));
    CK(cuGreenCtxStreamCreate(&gs2, g2, CU_STREAM_NON_BLOCKING, 0));
    CK(cuStreamCreate(&ps, CU_STREAM_NON_BLOCKING));
    CUcontext sc = 0; CK(cuStreamGetCtx(gs1, &sc));
    printf("cuStreamGetCtx(green stream) == primary %d, == green ctx %d\n", sc == primary, sc == c1);

    CK(cuCtxSetCurrent(primary));
    report("T1 primary current, primary module, green stream", fn_primary, gs1);
    report("T2 primary current, primary module, plain stream", fn_primary, ps);
    report("T2b primary current, primary module, remainder green stream", fn_primary, gs2);
    CK(cuCtxSetCurrent(c1));
    report("T3 green current, primary module, green stream", fn_primary, gs1);
    CUmodule mod1; CUfunction fn1; CK(cuModuleLoadData(&mod1, ptx)); CK(cuModuleGetFunction(&fn1, mod1, "smid"));
    report("T4 green current, green module, green stream", fn1, gs1);
    report("T4b green current, green module, plain (primary) stream", fn1, ps);
    CK(cuCtxSetCurrent(primary));
    report("T4c primary current, green module, green stream", fn1, gs1);

    // Events across contexts.
    CUevent ev; CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    printf("T5 primary event recorded on green stream: %s\n", cuEventRecord(ev, gs1) == CUDA_SUCCESS ? "ok" : "error");
    printf("T5 plain stream waits on it: %s\n", cuStreamWaitEvent(ps, ev, 0) == CUDA_SUCCESS ? "ok" : "error");
    CK(cuCtxSetCurrent(c1));
    CUevent ev1; CK(cuEventCreate(&ev1, CU_EVENT_DISABLE_TIMING));
    CK(cuCtxSetCurrent(primary));
    printf("T5 green-ctx event recorded on plain stream (primary current): %s\n", cuEventRecord(ev1, ps) == CUDA_SUCCESS ? "ok" : "error");
    printf("T5 green stream waits on it: %s\n", cuStreamWaitEvent(gs1, ev1, 0) == CUDA_SUCCESS ? "ok" : "error");
    CK(cuStreamSynchronize(ps)); CK(cuStreamSynchronize(gs1));

    // Stream-ordered allocation on a green stream, primary current.
    CUdeviceptr a = 0; CUresult r = cuMemAllocAsync(&a, 1 << 20, gs1);
    printf("T6 cuMemAllocAsync on green stream (primary current): %s\n", r == CUDA_SUCCESS ? "ok" : "error");
    if (r == CUDA_SUCCESS) { CK(cuMemsetD8Async(a, 1, 1 << 20, gs1)); CK(cuMemFreeAsync(a, ps)); CK(cuStreamSynchronize(gs1)); CK(cuStreamSynchronize(ps)); }

    // cuBLAS with the primary context current, set to a green stream: time a large SGEMM.
    cublasHandle_t h; cublasCreate(&h);
    int n = 4096; CUdeviceptr A, Bm, C; CK(cuMemAlloc(&A, 4ull*n*n)); CK(cuMemAlloc(&Bm, 4ull*n*n)); CK(cuMemAlloc(&C, 4ull*n*n));
    CK(cuMemsetD32(A, 0, n*n)); CK(cuMemsetD32(Bm, 0, n*n));
    float one = 1, zero = 0;
    CUstream ss[2] = {ps, gs1}; const char* names[2] = {"plain", "green"};
    for (int k = 0; k < 2; k++) {
        cublasSetStream(h, (cudaStream_t)ss[k]);
        cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, (float*)A, n, (float*)Bm, n, &zero, (float*)C, n);
        cuStreamSynchronize(ss[k]);
        double t0 = now_us();
        for (int i = 0; i < 3; i++) cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, (float*)A, n, (float*)Bm, n, &zero, (float*)C, n);
        CUresult e = cuStreamSynchronize(ss[k]);
        printf("T7 cuBLAS handle (primary), SGEMM 4096 on %s stream: %.0f us each (%s)\n", names[k], (now_us() - t0) / 3, e == CUDA_SUCCESS ? "ok" : "error");
    }
    cublasDestroy(h);

    // Capture on the green stream; replay on the green stream and on a plain stream.
    CUgraph g; CUgraphExec ge;
    CK(cuStreamBeginCapture(gs1, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    long long spin = 20000; void* args[] = {&seen, &spin};
    CK(cuMemsetD8Async(seen, 0, 64, gs1));
    CK(cuLaunchKernel(fn_primary, 1056, 1, 1, 64, 1, 1, 0, gs1, args, NULL));
    CK(cuStreamEndCapture(gs1, &g));
    CK(cuGraphInstantiate(&ge, g, 0));
    CUstream targets[2] = {gs1, ps}; const char* tn[2] = {"green stream", "plain stream"};
    for (int k = 0; k < 2; k++) {
        unsigned hh[16] = {0};
        r = cuGraphLaunch(ge, targets[k]); cuStreamSynchronize(targets[k]);
        cuMemcpyDtoH(hh, seen, sizeof hh); int c = 0; for (int i = 0; i < 16; i++) c += __builtin_popcount(hh[i]);
        printf("T8 graph captured on green stream, launched on %s: %s, SMs used %d\n", tn[k], r == CUDA_SUCCESS ? "ok" : "error", c);
    }
    // Capture on a plain stream, launch on green.
    CUgraph gp; CUgraphExec gep;
    CK(cuStreamBeginCapture(ps, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    CK(cuMemsetD8Async(seen, 0, 64, ps));
    CK(cuLaunchKernel(fn_primary, 1056, 1, 1, 64, 1, 1, 0, ps, args, NULL));
    CK(cuStreamEndCapture(ps, &gp)); CK(cuGraphInstantiate(&gep, gp, 0));
    { unsigned hh[16] = {0}; r = cuGraphLaunch(gep, gs1); cuStreamSynchronize(gs1); cuMemcpyDtoH(hh, seen, sizeof hh); int c = 0; for (int i = 0; i < 16; i++) c += __builtin_popcount(hh[i]);
      printf("T8b graph captured on plain stream, launched on green stream: %s, SMs used %d\n", r == CUDA_SUCCESS ? "ok" : "error", c); }

    // Two threads with the same green context current at once, each on its own green stream.
    CUstream gs1x; CK(cuGreenCtxStreamCreate(&gs1x, g1, CU_STREAM_NON_BLOCKING, 0));
    struct thr t[2] = {{c1, gs1, fn1}, {c1, gs1x, fn1}}; pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, thread_launch, &t[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    printf("T9 two threads, one green ctx current on both: %s / %s\n", t[0].err ? "error" : "ok", t[1].err ? "error" : "ok");
    // Two threads with the primary current on both, launching on two green streams of one green ctx.
    struct thr u[2] = {{primary, gs1, fn_primary}, {primary, gs1x, fn_primary}};
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, thread_launch, &u[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    printf("T9b two threads, primary current, two streams of one green ctx: %s / %s\n", u[0].err ? "error" : "ok", u[1].err ? "error" : "ok");

    // Latency: a short kernel on the partition beside a long background on the remainder.
    long long bg = 2000000, sh = 5000; void* bargs[] = {&seen, &bg}; void* sargs[] = {&seen, &sh};
    CUstream tgt[3] = {ps, gs1, gs1}; CUstream bgs[3] = {ps, ps, gs2}; const char* ln[3] = {"plain beside plain", "green(8) beside plain bg", "green(8) beside green remainder bg"};
    CUstream ps2; CK(cuStreamCreate(&ps2, CU_STREAM_NON_BLOCKING)); bgs[0] = ps2;
    for (int k = 0; k < 3; k++) {
        CK(cuLaunchKernel(fn_primary, 132 * 16, 1, 1, 64, 1, 1, 0, bgs[k], bargs, NULL));
        double t0 = now_us();
        CK(cuLaunchKernel(fn_primary, 8, 1, 1, 64, 1, 1, 0, tgt[k], sargs, NULL));
        cuStreamSynchronize(tgt[k]);
        double dt = now_us() - t0;
        cuStreamSynchronize(bgs[k]);
        printf("T10 short kernel %s: %.0f us\n", ln[k], dt);
    }
    printf("probe done\n");
    return 0;
}
