// Times every cuBLASLt algorithm the heuristic offers for the served model's layer GEMM
// (y^T = W x^T + b: m = dim, n = batch, k = dim, A transposed, bias epilogue), f32 and bf16.
// nvcc -O2 lt_probe.c -lcublasLt -lcudart -o lt_probe && ./lt_probe [dim] [batch]
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#define CK(x) do { int s_ = (int)(x); if (s_) { printf("%s:%d %s = %d\n", __FILE__, __LINE__, #x, s_); exit(1); } } while (0)

static void probe(cublasLtHandle_t h, cudaDataType ty, size_t esz, const char* name, int dim, int batch) {
  void *W, *X, *Y, *B, *ws; size_t wsb = 32 << 20;
  CK(cudaMalloc(&W, (size_t)dim * dim * esz)); CK(cudaMalloc(&X, (size_t)dim * batch * esz));
  CK(cudaMalloc(&Y, (size_t)dim * batch * esz)); CK(cudaMalloc(&B, dim * esz)); CK(cudaMalloc(&ws, wsb));
  cudaMemset(W, 0, (size_t)dim * dim * esz); cudaMemset(X, 0, (size_t)dim * batch * esz); cudaMemset(B, 0, dim * esz);
  cublasLtMatmulDesc_t d; CK(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  int t = 1, n = 0; CK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &t, 4));
  CK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &n, 4));
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS; CK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  CK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &B, sizeof B));
  cublasLtMatrixLayout_t la, lb, lc;
  CK(cublasLtMatrixLayoutCreate(&la, ty, dim, dim, dim)); CK(cublasLtMatrixLayoutCreate(&lb, ty, dim, batch, dim));
  CK(cublasLtMatrixLayoutCreate(&lc, ty, dim, batch, dim));
  cublasLtMatmulPreference_t p; CK(cublasLtMatmulPreferenceCreate(&p));
  CK(cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
  cublasLtMatmulHeuristicResult_t r[64]; int got = 0;
  CK(cublasLtMatmulAlgoGetHeuristic(h, d, la, lb, lc, lc, p, 64, r, &got));
  float alpha = 1, beta = 0; cudaStream_t s; CK(cudaStreamCreate(&s)); cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  printf("%s dim %d batch %d: %d algorithms\n", name, dim, batch, got);
  for (int i = 0; i < got; i++) {
    if (r[i].state) continue;
    int ok = 1;
    for (int w = 0; w < 5; w++) if (cublasLtMatmul(h, d, &alpha, W, la, X, lb, &beta, Y, lc, Y, lc, &r[i].algo, ws, wsb, s)) ok = 0;
    if (!ok) { printf("  #%d failed\n", i); continue; }
    // 4 back to back (as the model's layers), in a graph, timed by events
    cudaGraph_t g; cudaGraphExec_t ge; CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int l = 0; l < 4; l++) cublasLtMatmul(h, d, &alpha, W, la, X, lb, &beta, Y, lc, Y, lc, &r[i].algo, ws, wsb, s);
    CK(cudaStreamEndCapture(s, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
    float best = 1e9;
    for (int rep = 0; rep < 50; rep++) {
      cudaEventRecord(e0, s); cudaGraphLaunch(ge, s); cudaEventRecord(e1, s); cudaEventSynchronize(e1);
      float ms; cudaEventElapsedTime(&ms, e0, e1); if (ms < best) best = ms;
    }
    float tot = 0; for (int rep = 0; rep < 50; rep++) {
      cudaEventRecord(e0, s); cudaGraphLaunch(ge, s); cudaEventRecord(e1, s); cudaEventSynchronize(e1);
      float ms; cudaEventElapsedTime(&ms, e0, e1); tot += ms; }
    int splitk = 0, tile = 0, id = 0; size_t sz;
    cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_ID, &id, 4, &sz);
    cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, 4, &sz);
    cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, 4, &sz);
    printf("  #%2d id %3d tile %3d splitk %2d ws %8zu: 4 GEMMs min %.1f us mean %.1f us\n", i, id, tile, splitk, r[i].workspaceSize, best * 1e3, tot / 50 * 1e3);
    cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
  }
}

int main(int argc, char** argv) {
  int dim = argc > 1 ? atoi(argv[1]) : 1024, batch = argc > 2 ? atoi(argv[2]) : 8;
  cublasLtHandle_t h; CK(cublasLtCreate(&h));
  probe(h, CUDA_R_32F, 4, "f32", dim, batch);
  probe(h, CUDA_R_16BF, 2, "bf16", dim, batch);
  return 0;
}
