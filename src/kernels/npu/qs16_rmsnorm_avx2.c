/* npu_qs16_rmsnorm_qs8__avx2 and npu_qs16_rmsnorm_qs16__avx2: RMSNorm of int16 rows into int8 or
 * int16, 16 elements per step (one code path; only the final pack and the scalar tail's
 * saturation differ). The row's
 * sum of squares comes from vpmaddwd pair sums widened into 64-bit accumulators; the inverse
 * square root is the scalar npu_rsqrt_q61, once per row; each element's two products
 * (x * r, then u * mult) are formed exactly in 64-bit lanes with vpmuldq on the even and odd
 * lanes, and their rounding arithmetic shifts (which AVX2 lacks for 64 bits) are done as logical
 * shifts of the value biased to be non-negative. Every step is exact integer arithmetic, so the
 * result is bit-exact with the scalar kernels; the last cols % 8 elements of a row go
 * through the same formula in scalar code, with the row's r and shift. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__x86_64__)

#include <assert.h>

#include "kernels/npu/avx2_util.h"
#include "kernels/npu/fixedpoint.h"

/* The per-row constants of the two rounding shifts, in 64-bit lanes unless said otherwise. */
struct row_consts {
  __m256i r;       /* npu_rsqrt_q61 of the row, in the low half of each 64-bit lane */
  __m256i u_round; /* 2^46 + 2^14: makes x * r (|x * r| < 2^46) non-negative, plus the rounding */
  __m256i u_bias;  /* 2^31 = 2^46 >> 15, the bias to take back after the shift */
  __m256i p_round; /* 2^62 + 2^(s - 1): makes u * mult (|.| < 2^62) non-negative, plus rounding */
  __m256i p_bias;  /* 2^(62 - s) = 2^62 >> s */
  __m256i lo, hi;  /* -2^16, 2^16: any clamp wider than int16 minus the zero point will do */
  __m256i zp;      /* y_zero_point in 32-bit lanes */
  __m128i s;       /* the row's total right shift, in [1, 62] */
};

/* floor((x * r + 2^14) / 2^15) of the products in the even 32-bit positions; the result is in
 * (-2^31, 2^31), so its low 32 bits are u as an int32, which the next vpmuldq reads. */
NPU_INLINE_AVX2 __m256i scale_u(__m256i xr, const struct row_consts *k) {
  return _mm256_sub_epi64(_mm256_srli_epi64(_mm256_add_epi64(xr, k->u_round), 15), k->u_bias);
}

/* floor((p + 2^(s - 1)) / 2^s), clamped to [-2^16, 2^16]: the sum with 2^62 stays below 2^64, so
 * the logical shift is the arithmetic one plus 2^(62 - s), exactly. */
NPU_INLINE_AVX2 __m256i shift_out(__m256i p, const struct row_consts *k) {
  __m256i q = _mm256_sub_epi64(_mm256_srl_epi64(_mm256_add_epi64(p, k->p_round), k->s), k->p_bias);
  q = _mm256_blendv_epi8(q, k->hi, _mm256_cmpgt_epi64(q, k->hi));
  return _mm256_blendv_epi8(q, k->lo, _mm256_cmpgt_epi64(k->lo, q));
}

/* 8 elements widened to int32 and their 8 multipliers -> 8 int32 outputs with the zero point,
 * within [-2^16 - 2^15, 2^16 + 2^15), for a saturating pack to int8 or int16. */
NPU_INLINE_AVX2 __m256i norm8(__m256i x, __m256i mult, const struct row_consts *k) {
  const __m256i ue = scale_u(_mm256_mul_epi32(x, k->r), k);
  const __m256i uo = scale_u(_mm256_mul_epi32(_mm256_srli_epi64(x, 32), k->r), k);
  const __m256i ye = shift_out(_mm256_mul_epi32(ue, mult), k);
  const __m256i yo = shift_out(_mm256_mul_epi32(uo, _mm256_srli_epi64(mult, 32)), k);
  /* the clamped results fit their low 32 bits: even lanes stay, odd ones move up */
  return _mm256_add_epi32(_mm256_blend_epi32(ye, _mm256_slli_epi64(yo, 32), 0xAA), k->zp);
}

/* sum_c x[c]^2, exact. Each vpmaddwd pair sum is in [0, 2^31] (2^31 only for two -32768s), so it
 * is read as unsigned 32 bits; the 64-bit accumulators hold at most 2^24 * 2^30 = 2^54. */
NPU_INLINE_AVX2 int64_t sum_squares(const int16_t *x, size_t n) {
  const __m256i low32 = _mm256_set1_epi64x(0xFFFFFFFF);
  __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)(x + i));
    const __m256i m = _mm256_madd_epi16(v, v);
    acc0 = _mm256_add_epi64(acc0, _mm256_and_si256(m, low32));
    acc1 = _mm256_add_epi64(acc1, _mm256_srli_epi64(m, 32));
  }
  const __m256i acc = _mm256_add_epi64(acc0, acc1);
  const __m128i a = _mm_add_epi64(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
  int64_t sum = _mm_cvtsi128_si64(a) + _mm_extract_epi64(a, 1);
  for (; i < n; i++) sum += (int32_t)x[i] * x[i];
  return sum;
}

/* Both output types: y16 non-NULL selects int16 (else y8). */
NPU_INLINE_AVX2 void rmsnorm_avx2(size_t rows, size_t cols, const int16_t *restrict x,
                                  int8_t *restrict y8, int16_t *restrict y16,
                                  const struct npu_qs16_rmsnorm_params *restrict params) {
  const int32_t *mult = params->mult, zp = params->y_zero_point;
  assert(cols >= 1 && cols <= ((size_t)1 << 24));
  assert(params->eps >= 1 && params->eps <= ((int64_t)1 << 62));
  assert(params->shift >= -16 && params->shift <= 46);
  assert(y16 != NULL ? zp >= INT16_MIN && zp <= INT16_MAX : zp >= INT8_MIN && zp <= INT8_MAX);
  struct row_consts k;
  k.u_round = _mm256_set1_epi64x(((int64_t)1 << 46) + (1 << 14));
  k.u_bias = _mm256_set1_epi64x((int64_t)1 << 31);
  k.lo = _mm256_set1_epi64x(-(1 << 16));
  k.hi = _mm256_set1_epi64x(1 << 16);
  k.zp = _mm256_set1_epi32(zp);
  for (size_t t = 0; t < rows; t++) {
    const int16_t *xt = x + t * cols;
    int8_t *yt8 = y16 != NULL ? NULL : y8 + t * cols;
    int16_t *yt16 = y16 != NULL ? y16 + t * cols : NULL;
    int32_t e;
    const int32_t r = npu_rsqrt_q61(sum_squares(xt, cols) + params->eps, &e);
    const int32_t s = 77 - e - params->shift; /* >= 1 for the valid shifts */
    if (s > 62) {
      /* |u * mult| < 2^62, so every element rounds to 0 */
      for (size_t c = 0; c < cols; c++)
        if (y16 != NULL) yt16[c] = (int16_t)zp;
        else yt8[c] = (int8_t)zp;
      continue;
    }
    k.r = _mm256_set1_epi32(r);
    k.p_round = _mm256_set1_epi64x(((int64_t)1 << 62) + ((int64_t)1 << (s - 1)));
    k.p_bias = _mm256_set1_epi64x((int64_t)1 << (62 - s));
    k.s = _mm_cvtsi32_si128(s);
    size_t c = 0;
    for (; c + 16 <= cols; c += 16) {
      const __m256i v = _mm256_loadu_si256((const __m256i *)(xt + c));
      const __m256i y0 = norm8(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(v)),
                               _mm256_loadu_si256((const __m256i *)(mult + c)), &k);
      const __m256i y1 = norm8(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(v, 1)),
                               _mm256_loadu_si256((const __m256i *)(mult + c + 8)), &k);
      if (y16 != NULL) _mm256_storeu_si256((__m256i *)(yt16 + c), npu_avx2_pack_s16(y0, y1));
      else _mm_storeu_si128((__m128i *)(yt8 + c), npu_avx2_pack_s8(y0, y1));
    }
    if (c + 8 <= cols) {
      const __m256i y0 = norm8(_mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i *)(xt + c))),
                               _mm256_loadu_si256((const __m256i *)(mult + c)), &k);
      if (y16 != NULL)
        _mm_storeu_si128((__m128i *)(yt16 + c), _mm256_castsi256_si128(npu_avx2_pack_s16(y0, y0)));
      else _mm_storel_epi64((__m128i *)(yt8 + c), npu_avx2_pack_s8(y0, y0));
      c += 8;
    }
    for (; c < cols; c++)
      if (y16 != NULL) yt16[c] = npu_rmsnorm_elem_s16(xt[c], r, s, mult[c], zp);
      else yt8[c] = npu_rmsnorm_elem(xt[c], r, s, mult[c], zp);
  }
}

NPU_TARGET_AVX2 void
npu_qs16_rmsnorm_qs8__avx2(size_t rows, size_t cols, const int16_t *restrict x, int8_t *restrict y,
                           const struct npu_qs16_rmsnorm_params *restrict params) {
  rmsnorm_avx2(rows, cols, x, y, NULL, params);
}

NPU_TARGET_AVX2 void
npu_qs16_rmsnorm_qs16__avx2(size_t rows, size_t cols, const int16_t *restrict x,
                            int16_t *restrict y,
                            const struct npu_qs16_rmsnorm_params *restrict params) {
  rmsnorm_avx2(rows, cols, x, NULL, y, params);
}

#endif /* __x86_64__ */
