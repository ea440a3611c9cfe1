/* The int16-activation GEMMs on AVX512-VNNI (qs16_gemm_avx512vnni.c, qs16_qc4w_gemm_avx512vnni.c):
 * each int16 x is split into bytes, x = 256 * (hi + 128) + lo - 32768 with lo = x & 255 and
 * hi + 128 = (x >> 8) ^ 0x80, both unsigned, so that vpdpbusd (u8 x s8, 4 products per int32
 * lane) multiplies them with the int8 weights as they lie in memory (w8a16) or as decoded from
 * nibbles (w4a16):
 *   sum_k x w = 256 * A + B - 32768 * wsum,  A = sum_k (hi + 128) w,  B = sum_k lo w,
 * wsum = sum_k q w from the packed block's head (q = 1 but for the w4a16 block scales, where A
 * and B are summed per 32-k chunk and multiplied by q). A and B are int32 lanes, one per channel,
 * that cannot overflow over any k <= 32768: |A|, |B| <= 32768 * 255 * 127 < 2^31 (w8a16),
 * <= 32768 * 255 * 8 * 15 < 2^31 (w4a16; a chunk's before its q below 32 * 255 * 8 < 2^16). The
 * int64 combination, npu_narrow and npu_requantize_s16 are the scalar epilogue. x is split a
 * span of NPU_QS16_GEMM_KC k at a time into a stack buffer (no scratch memory): 4-byte groups of
 * lo and of hi + 128, each broadcast from memory by one vpbroadcastd. NEON (sdot/usdot, u8 x s8)
 * can mirror it with vuzp to split the bytes. */
#ifndef NPU_KERNELS_NPU_QS16_GEMM_VNNI_H
#define NPU_KERNELS_NPU_QS16_GEMM_VNNI_H

#if defined(__x86_64__)

#include <assert.h>
#include <string.h>

#include "kernels/npu/fixedpoint.h"
#include "kernels/npu/npu_ukernels.h"
#include "kernels/npu/vnni_util.h"

/* x[0 .. n) (any n >= 1) split into lo_out[g] and hi_out[g], the 4-byte groups of
 * x[4g .. 4g+3]'s low bytes and high bytes + 128; the last group zero-filled past n. */
NPU_INLINE_VNNI void npu_qs16_split(const int16_t *restrict x, size_t n, uint32_t *restrict lo_out,
                                    uint32_t *restrict hi_out) {
  /* per 128-bit lane of 8 int16: low bytes to bytes 0..7, high bytes to 8..15 */
  const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2,
                                         4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  const __m128i flip = _mm_set1_epi8((char)0x80);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i v = _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)(x + i)), split);
    const __m256i q = _mm256_permute4x64_epi64(v, 0xD8); /* [lo 0..15 | hi 0..15] */
    _mm_storeu_si128((__m128i *)(lo_out + i / 4), _mm256_castsi256_si128(q));
    _mm_storeu_si128((__m128i *)(hi_out + i / 4),
                     _mm_xor_si128(_mm256_extracti128_si256(q, 1), flip));
  }
  uint8_t lo[16] = {0}, hi[16] = {0};
  for (size_t j = 0; i + j < n; j++) {
    lo[j] = (uint8_t)(x[i + j] & 0xFF);
    hi[j] = (uint8_t)(((uint16_t)x[i + j] >> 8) ^ 0x80);
  }
  memcpy(lo_out + i / 4, lo, (n - i + 3) / 4 * 4);
  memcpy(hi_out + i / 4, hi, (n - i + 3) / 4 * 4);
}

/* The 16 channels of one row (first nc stored): acc = bias + 256 A + B - 32768 wsum in int64
 * (head: the packed block's bias[16], wsum[16]), then npu_narrow and npu_requantize_s16. */
NPU_INLINE_VNNI void npu_qs16_vnni_store(const uint8_t *head, __m256i a0, __m256i a1, __m256i b0,
                                         __m256i b1, size_t n0, size_t nc,
                                         const struct npu_qs16_gemm_params *restrict p,
                                         int16_t *restrict y) {
  int32_t hb[32], a[16], b[16];
  memcpy(hb, head, sizeof(hb));
  _mm256_storeu_si256((__m256i *)a, a0);
  _mm256_storeu_si256((__m256i *)(a + 8), a1);
  _mm256_storeu_si256((__m256i *)b, b0);
  _mm256_storeu_si256((__m256i *)(b + 8), b1);
  for (size_t j = 0; j < nc; j++) {
    const int64_t acc = (int64_t)hb[j] + 256 * (int64_t)a[j] + b[j] - 32768 * (int64_t)hb[16 + j];
    y[j] = npu_requantize_s16(npu_narrow(acc, p->acc_shift), p->mult[n0 + j], p->shift[n0 + j],
                              p->y_zero_point);
  }
}

#endif /* __x86_64__ */
#endif /* NPU_KERNELS_NPU_QS16_GEMM_VNNI_H */
