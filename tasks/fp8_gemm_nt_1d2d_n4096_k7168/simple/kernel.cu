// Simple SIMT block-scaled FP8 GEMM (correct, not fast): D = (A * SF_A) @ (B * SF_B)^T.
// A [M, K] and B [N, K] are e4m3 (K contiguous); SF_A [M, K/128] holds one fp32 scale per (row,
// 128-wide K block), SF_B [N/128, K/128] one per 128x128 block of B; D [M, N] is bf16.
// Plain CUDA cores, fp32 math, dequantisation in the kernel. A block of 256 threads owns a
// 64x64 tile of D, each thread a 4x4 sub-tile (rows ty + 16*i, columns tx + 16*j). K advances
// one 128-wide scale block at a time: the block's e4m3 products are summed in fp32 (exact
// products), then multiplied by SF_A of the row times SF_B of the column's 128-block and added
// to the accumulator, the order of DeepGEMM's definition. K must be a multiple of 128 (the
// task fixes K = 7168); any M and N work: rows and columns past them are masked.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#define TILE 64       // rows of A and of B per block tile
#define KSTEP 32      // K elements per shared-memory stage
#define SCALE_K 128   // K elements per scale block (and N rows per block of SF_B)

extern "C" __global__ void
fp8_gemm_simple(const __nv_fp8_e4m3* __restrict__ A, const float* __restrict__ SF_A,
                const __nv_fp8_e4m3* __restrict__ B, const float* __restrict__ SF_B,
                __nv_bfloat16* __restrict__ D, int M, int N, int K) {
    // K-major in shared memory ([k][row]) so that the inner loop reads 4 rows of one k at once.
    __shared__ float As[KSTEP][TILE + 4];
    __shared__ float Bs[KSTEP][TILE + 4];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int m0 = blockIdx.y * TILE, n0 = blockIdx.x * TILE;
    const int num_kblock = K / SCALE_K;

    float acc[4][4] = {};
    for (int kb = 0; kb < num_kblock; ++kb) {
        float part[4][4] = {};  // this scale block's sum of products, unscaled
        for (int k0 = kb * SCALE_K; k0 < (kb + 1) * SCALE_K; k0 += KSTEP) {
            __syncthreads();  // everyone is done with the previous stage
            for (int i = threadIdx.x; i < TILE * KSTEP; i += 256) {
                const int r = i / KSTEP, c = i % KSTEP;  // consecutive threads read consecutive bytes of a row
                const int m = m0 + r, n = n0 + r;
                As[c][r] = m < M ? static_cast<float>(A[(size_t)m * K + k0 + c]) : 0.0f;
                Bs[c][r] = n < N ? static_cast<float>(B[(size_t)n * K + k0 + c]) : 0.0f;
            }
            __syncthreads();
#pragma unroll 4
            for (int c = 0; c < KSTEP; ++c) {
                float a[4], b[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    a[i] = As[c][ty + 16 * i];
                    b[i] = Bs[c][tx + 16 * i];
                }
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) part[i][j] += a[i] * b[j];
            }
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int m = m0 + ty + 16 * i;
            const float sa = m < M ? SF_A[(size_t)m * num_kblock + kb] : 0.0f;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int n = n0 + tx + 16 * j;
                const float sb = n < N ? SF_B[(size_t)(n / SCALE_K) * num_kblock + kb] : 0.0f;
                acc[i][j] += part[i][j] * (sa * sb);  // the two scales multiplied first, as DeepGEMM defines it
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int m = m0 + ty + 16 * i;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int n = n0 + tx + 16 * j;
            if (m < M && n < N) D[(size_t)m * N + n] = __float2bfloat16(acc[i][j]);
        }
    }
}
