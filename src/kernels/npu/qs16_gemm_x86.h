/* The pieces of the x86 int16-activation GEMMs (qs16_gemm_avx2.c, qs16_qc4w_gemm_avx2.c) that do
 * not depend on the weight format: broadcasting 4 int16 x values, folding the int32 partial sums
 * of a 512-k span into the int64 accumulators, and the final npu_narrow + requantization.
 *
 * Accumulator layout (both kernels): per row, four ymm of int32, quarter q holding channels
 * 4q .. 4q+3 as lane pairs (2j, 2j+1) = two partial sums of channel 4q + j. That is what vpmaddwd
 * of a broadcast x group (x0 x1 x2 x3, repeated) against one 16-byte weight row [4 channels][4 k]
 * sign- or zero-extended to int16 gives: lane 2j = x0 w[j][0] + x1 w[j][1], lane 2j+1 =
 * x2 w[j][2] + x3 w[j][3]. NEON mirrors it with vmlal_s16 into int32x4 (or sdot-free pairs). */
#ifndef NPU_KERNELS_NPU_QS16_GEMM_X86_H
#define NPU_KERNELS_NPU_QS16_GEMM_X86_H

#if defined(__x86_64__)

#include <assert.h>
#include <string.h>

#include "kernels/npu/avx2_util.h"
#include "kernels/npu/fixedpoint.h"
#include "kernels/npu/npu_ukernels.h"

/* x[0 .. 3] (int16) broadcast to the four 64-bit quarters. */
NPU_INLINE_AVX2 __m256i npu_qs16_x4(const int16_t *p) {
  int64_t v;
  memcpy(&v, p, sizeof(v));
  return _mm256_set1_epi64x(v);
}

/* The first 'n' of x[0 .. 3] (n in [0, 4]), zero-filled, broadcast (a tail: the weights past k
 * are 0, and x past k may not be readable). */
NPU_INLINE_AVX2 __m256i npu_qs16_x4_tail(const int16_t *p, size_t n) {
  int64_t v = 0;
  memcpy(&v, p, n * sizeof(int16_t));
  return _mm256_set1_epi64x(v);
}

/* acc64[0 .. 15] += the channel sums of one row's four quarter accumulators. vphaddd adds each
 * channel's two lanes: below 2^31 for a span of at most NPU_QS16_GEMM_KC k (npu_ukernels.h bounds).
 * hadd(a0, a1) = [c0 c1 c4 c5 | c2 c3 c6 c7]; vpermq (0, 2, 1, 3) orders it c0 .. c7. */
NPU_INLINE_AVX2 void npu_qs16_fold(const __m256i a[4], int64_t acc64[16]) {
  int32_t t[16];
  _mm256_storeu_si256((__m256i *)t, _mm256_permute4x64_epi64(_mm256_hadd_epi32(a[0], a[1]), 0xD8));
  _mm256_storeu_si256((__m256i *)(t + 8),
                      _mm256_permute4x64_epi64(_mm256_hadd_epi32(a[2], a[3]), 0xD8));
  for (int j = 0; j < 16; j++) acc64[j] += t[j];
}

/* The first nc channels (block starting at channel n0) of one row: npu_narrow, then
 * npu_requantize_s16, exactly fixedpoint.h, in scalar code (k-independent work). */
static inline void npu_qs16_gemm_store(const int64_t acc64[16], size_t n0, size_t nc,
                                       const struct npu_qs16_gemm_params *restrict p,
                                       int16_t *restrict y) {
  for (size_t j = 0; j < nc; j++)
    y[j] = npu_requantize_s16(npu_narrow(acc64[j], p->acc_shift), p->mult[n0 + j], p->shift[n0 + j],
                              p->y_zero_point);
}

/* The accumulator start of a block: its packed bias. */
static inline void npu_qs16_gemm_init(const uint8_t *block, int64_t acc64[16]) {
  int32_t bias[16];
  memcpy(bias, block, sizeof(bias));
  for (int j = 0; j < 16; j++) acc64[j] = bias[j];
}

#endif /* __x86_64__ */
#endif /* NPU_KERNELS_NPU_QS16_GEMM_X86_H */
