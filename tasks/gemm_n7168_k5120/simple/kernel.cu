// Simple SIMT GEMM (correct, not fast): C[M,N] = A[M,K] * B[N,K]^T, bf16 in, fp32 accumulate, bf16 out.
// Plain CUDA cores, no tensor cores: one 64x64 tile of C per 256-thread block, each thread a
// 4x4 micro-tile; K advances 16 at a time through shared memory. Every load and store is
// bounds-checked, so any M, N, K works (M = 70 or 8000 included).
#include <cuda_bf16.h>

#define TILE 64  // C tile edge
#define TK 16    // K step

extern "C" __global__ void __launch_bounds__(256)
gemm_simple(const __nv_bfloat16* __restrict__ A, const __nv_bfloat16* __restrict__ B,
            __nv_bfloat16* __restrict__ C, int M, int N, int K) {
    // Stored k-major ([k][row]) so a thread's 4 rows are 4 consecutive floats.
    __shared__ float As[TK][TILE + 4];
    __shared__ float Bs[TK][TILE + 4];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;  // 16 x 16 threads
    const int row0 = blockIdx.y * TILE, col0 = blockIdx.x * TILE;
    float acc[4][4] = {};

    for (int k0 = 0; k0 < K; k0 += TK) {
        for (int i = threadIdx.x; i < TILE * TK; i += 256) {  // 1024 elements of each operand
            const int r = i / TK, k = i % TK, gk = k0 + k;
            const int ga = row0 + r, gb = col0 + r;
            As[k][r] = (ga < M && gk < K) ? __bfloat162float(A[(size_t)ga * K + gk]) : 0.0f;
            Bs[k][r] = (gb < N && gk < K) ? __bfloat162float(B[(size_t)gb * K + gk]) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TK; ++k) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                a[i] = As[k][ty * 4 + i];
                b[i] = Bs[k][tx * 4 + i];
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();  // the tile is consumed before the next one overwrites it
    }

#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = row0 + ty * 4 + i;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int c = col0 + tx * 4 + j;
            if (r < M && c < N) C[(size_t)r * N + c] = __float2bfloat16(acc[i][j]);
        }
    }
}
