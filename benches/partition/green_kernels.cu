// Kernels of the green-context probe (compiled to PTX on the device machine).
extern "C" __global__ void smid(unsigned int* seen, long long spin) {
    unsigned int id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    if (threadIdx.x == 0) atomicOr(&seen[id / 32], 1u << (id % 32));
    long long t0 = clock64();
    while (clock64() - t0 < spin) {}
}
