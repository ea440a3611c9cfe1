/* AVX2 building blocks shared by the __avx2 NPU kernels: the requantization of fixedpoint.h on 8
 * int32 lanes, bit-exact with npu_requantize(), and the saturating packs to int8/int16. Functions
 * carry their own target attribute, so no file needs -mavx2 and the binary runs on any x86-64;
 * callers check NPU_ISA_AVX2 first (npu_ukernels.c). */
#ifndef NPU_KERNELS_NPU_AVX2_UTIL_H
#define NPU_KERNELS_NPU_AVX2_UTIL_H

#if defined(__x86_64__)

#include <immintrin.h>
#include <stdint.h>

#define NPU_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define NPU_INLINE_AVX2 static inline __attribute__((always_inline, target("avx2,fma")))

/* Requantization constants for 8 lanes, derived once from (mult, shift) per lane. */
struct npu_avx2_rq {
  __m256i mult_even;  /* mult; _mm256_mul_epi32 reads lanes 0, 2, 4, 6 */
  __m256i mult_odd;   /* mult of lanes 1, 3, 5, 7 moved to the even positions */
  __m256i round_even; /* int64 2^(30 + right) of lanes 0, 2, 4, 6 */
  __m256i round_odd;  /* int64 2^(30 + right) of lanes 1, 3, 5, 7 */
  __m256i right_m1;   /* right - 1, in [0, 30] */
  __m256i left;       /* left, in [0, 31] */
  int has_left;       /* some lane has left > 0 */
};

/* Constants for per-lane mult in [0, INT32_MAX] and shift in [-31, 30] (fixedpoint.h). */
NPU_INLINE_AVX2 void npu_avx2_rq_init(struct npu_avx2_rq *rq, __m256i mult, __m256i shift) {
  const __m256i left =
      _mm256_max_epi32(_mm256_add_epi32(shift, _mm256_set1_epi32(1)), _mm256_setzero_si256());
  const __m256i right = _mm256_sub_epi32(left, shift);
  const __m256i count = _mm256_add_epi32(right, _mm256_set1_epi32(30));
  const __m256i one64 = _mm256_set1_epi64x(1);
  rq->mult_even = mult;
  rq->mult_odd = _mm256_srli_epi64(mult, 32);
  rq->round_even =
      _mm256_sllv_epi64(one64, _mm256_and_si256(count, _mm256_set1_epi64x(0xFFFFFFFF)));
  rq->round_odd = _mm256_sllv_epi64(one64, _mm256_srli_epi64(count, 32));
  rq->right_m1 = _mm256_sub_epi32(right, _mm256_set1_epi32(1));
  rq->left = left;
  rq->has_left = !_mm256_testz_si256(left, left);
}

/* The same constants for one (mult, shift) in every lane. */
NPU_INLINE_AVX2 void npu_avx2_rq_init1(struct npu_avx2_rq *rq, int32_t mult, int32_t shift) {
  npu_avx2_rq_init(rq, _mm256_set1_epi32(mult), _mm256_set1_epi32(shift));
}

/* x * 2^left per lane, saturated to int32 (npu_sat_shl). */
NPU_INLINE_AVX2 __m256i npu_avx2_sat_shl(__m256i x, __m256i left) {
  const __m256i shifted = _mm256_sllv_epi32(x, left);
  const __m256i fits = _mm256_cmpeq_epi32(_mm256_srav_epi32(shifted, left), x);
  const __m256i sat = _mm256_xor_si256(_mm256_srai_epi32(x, 31), _mm256_set1_epi32(INT32_MAX));
  return _mm256_blendv_epi8(sat, shifted, fits);
}

/* npu_requantize() on 8 lanes: floor((sat_shl(acc) * mult + 2^(30 + right)) / 2^(31 + right)),
 * as floor(. / 2^32) (the high half of the 64-bit sum) then an arithmetic shift by right - 1. */
NPU_INLINE_AVX2 __m256i npu_avx2_requantize(__m256i acc, const struct npu_avx2_rq *rq) {
  if (rq->has_left) acc = npu_avx2_sat_shl(acc, rq->left);
  const __m256i pe = _mm256_add_epi64(_mm256_mul_epi32(acc, rq->mult_even), rq->round_even);
  const __m256i po =
      _mm256_add_epi64(_mm256_mul_epi32(_mm256_srli_epi64(acc, 32), rq->mult_odd), rq->round_odd);
  const __m256i hi = _mm256_blend_epi32(_mm256_srli_epi64(pe, 32), po, 0xAA);
  return _mm256_srav_epi32(hi, rq->right_m1);
}

/* q + zero_point: npu_requantize() results lie in [-2^30, 2^30], so this never overflows and a
 * later saturating pack gives sat(q + zero_point) exactly. */
NPU_INLINE_AVX2 __m256i npu_avx2_add_zp(__m256i q, __m256i zero_point) {
  return _mm256_add_epi32(q, zero_point);
}

/* 16 int32 (lo = elements 0..7, hi = 8..15) -> 16 int8, saturated, in order. */
NPU_INLINE_AVX2 __m128i npu_avx2_pack_s8(__m256i lo, __m256i hi) {
  __m256i t = _mm256_packs_epi32(lo, hi); /* int16 [lo0-3 hi0-3 | lo4-7 hi4-7] */
  t = _mm256_packs_epi16(t, t);           /* dwords [lo0-3 hi0-3 lo0-3 hi0-3 | lo4-7 hi4-7 ..] */
  t = _mm256_permutevar8x32_epi32(t, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  return _mm256_castsi256_si128(t);
}

/* 16 int32 (lo = elements 0..7, hi = 8..15) -> 16 int16, saturated, in order. */
NPU_INLINE_AVX2 __m256i npu_avx2_pack_s16(__m256i lo, __m256i hi) {
  return _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xD8);
}

#endif /* __x86_64__ */
#endif /* NPU_KERNELS_NPU_AVX2_UTIL_H */
