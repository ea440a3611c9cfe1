/* NEON building blocks shared by the __neon NPU kernels: the requantization of fixedpoint.h on 4
 * int32 lanes in the three instructions its comment names (bit-exact with npu_requantize()), and
 * the saturating narrows to int8/int16. Advanced SIMD is baseline on AArch64, so plain NEON code
 * needs no target attribute; the dot-product (sdot) and int8 matrix-multiply (smmla) extensions
 * do: NPU_TARGET_DOTPROD / NPU_TARGET_I8MM, checked at run time (NPU_ISA_DOTPROD, NPU_ISA_I8MM). */
#ifndef NPU_KERNELS_NPU_NEON_UTIL_H
#define NPU_KERNELS_NPU_NEON_UTIL_H

#if defined(__aarch64__)

#include <arm_neon.h>
#include <stdint.h>

#if defined(__clang__)
#define NPU_TARGET_DOTPROD __attribute__((target("dotprod")))
#define NPU_TARGET_I8MM __attribute__((target("dotprod,i8mm")))
#else /* GCC 12 wants the architecture with the extension ("+dotprod" alone does not enable it) */
#define NPU_TARGET_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#define NPU_TARGET_I8MM __attribute__((target("arch=armv8.2-a+dotprod+i8mm")))
#endif
#define NPU_INLINE_NEON static inline __attribute__((always_inline))

/* Requantization constants for 4 lanes, derived once from (mult, shift) per lane. */
struct npu_neon_rq {
  int32x4_t mult;      /* [0, INT32_MAX] */
  int32x4_t left;      /* max(shift + 1, 0), in [0, 31]: vqshlq_s32's count */
  int32x4_t neg_right; /* -max(1, -shift), in [-31, -1]: vrshlq_s32's count (a right shift) */
};

/* Constants for per-lane mult in [0, INT32_MAX] and shift in [-31, 30] (fixedpoint.h). */
NPU_INLINE_NEON struct npu_neon_rq npu_neon_rq_make(int32x4_t mult, int32x4_t shift) {
  const int32x4_t left = vmaxq_s32(vaddq_s32(shift, vdupq_n_s32(1)), vdupq_n_s32(0));
  return (struct npu_neon_rq){.mult = mult, .left = left, .neg_right = vsubq_s32(shift, left)};
}

/* The same constants for one (mult, shift) in every lane. */
NPU_INLINE_NEON struct npu_neon_rq npu_neon_rq_make1(int32_t mult, int32_t shift) {
  return npu_neon_rq_make(vdupq_n_s32(mult), vdupq_n_s32(shift));
}

/* npu_requantize() on 4 lanes: x = sat_int32(acc * 2^left) (vqshlq_s32); q = floor(x * mult /
 * 2^31) (vqdmulhq_s32: the doubled high half, which saturates only for x = mult = INT32_MIN, and
 * mult >= 0); then floor((q + 2^(right - 1)) / 2^right) (vrshlq_s32 by -right, whose rounding
 * addition is exact). The nested floors are floor((x * mult + 2^(30 + right)) / 2^(31 + right)),
 * the definition. */
NPU_INLINE_NEON int32x4_t npu_neon_requantize(int32x4_t acc, const struct npu_neon_rq *rq) {
  return vrshlq_s32(vqdmulhq_s32(vqshlq_s32(acc, rq->left), rq->mult), rq->neg_right);
}

/* q + zero_point: npu_requantize() results lie in [-2^30, 2^30], so this never overflows and a
 * later saturating narrow gives sat(q + zero_point) exactly. */
NPU_INLINE_NEON int32x4_t npu_neon_add_zp(int32x4_t q, int32x4_t zero_point) {
  return vaddq_s32(q, zero_point);
}

/* 8 int32 (a = elements 0..3, b = 4..7) -> 8 int16, saturated, in order. */
NPU_INLINE_NEON int16x8_t npu_neon_narrow_s16(int32x4_t a, int32x4_t b) {
  return vqmovn_high_s32(vqmovn_s32(a), b);
}

/* 16 int32 (a, b, c, d: elements 0..3, 4..7, 8..11, 12..15) -> 16 int8, saturated, in order
 * (saturating to int16 first changes nothing: int8's range lies inside it). */
NPU_INLINE_NEON int8x16_t npu_neon_narrow_s8(int32x4_t a, int32x4_t b, int32x4_t c, int32x4_t d) {
  return vqmovn_high_s16(vqmovn_s16(npu_neon_narrow_s16(a, b)), npu_neon_narrow_s16(c, d));
}

/* 8 int32 -> 8 int8, saturated, in order. */
NPU_INLINE_NEON int8x8_t npu_neon_narrow8_s8(int32x4_t a, int32x4_t b) {
  return vqmovn_s16(npu_neon_narrow_s16(a, b));
}

#endif /* __aarch64__ */
#endif /* NPU_KERNELS_NPU_NEON_UTIL_H */
