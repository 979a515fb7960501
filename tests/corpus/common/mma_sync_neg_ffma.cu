// mma_sync negative (and wgmma / tcgen05_mma negative): a tiled FFMA GEMM in shared memory.
// features:
// negative control for: mma_sync wgmma tcgen05_mma
extern "C" __global__ void mma_sync_neg_ffma(const float* A, const float* B, float* C, int n) {
  __shared__ float As[16][16], Bs[16][16];
  int row = blockIdx.y * 16 + threadIdx.y, col = blockIdx.x * 16 + threadIdx.x;
  float acc = 0.f;
  for (int k0 = 0; k0 < n; k0 += 16) {
    As[threadIdx.y][threadIdx.x] = A[row * n + k0 + threadIdx.x];
    Bs[threadIdx.y][threadIdx.x] = B[(k0 + threadIdx.y) * n + col];
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 16; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
    __syncthreads();
  }
  C[row * n + col] = acc;
}
