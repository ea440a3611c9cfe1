/* The one definition of integer requantization on the NPU: int32 accumulator times a 32-bit
 * fixed-point multiplier, one rounding right shift, zero point, saturation. Every NPU kernel,
 * scalar or SIMD, computes exactly these functions, bit for bit. Integer-only by contract. */
#ifndef NPU_KERNELS_NPU_FIXEDPOINT_H
#define NPU_KERNELS_NPU_FIXEDPOINT_H

#include <assert.h>
#include <stdint.h>

/* A real multiplier r > 0 is represented by (mult, shift) with
 *
 *     r ~= mult * 2^(shift - 31),   mult in [2^30, 2^31 - 1] (a Q31 number in [0.5, 1)),
 *
 * exactly as TFLite and CMSIS-NN do; npu_quantize_multiplier() in src/program/qparams.h makes
 * them.
 *
 * Requantization uses TFLite's single rounding (TFLITE_SINGLE_ROUNDING, CMSIS-NN's
 * CMSIS_NN_USE_SINGLE_ROUNDING), not gemmlowp's two-step rounding: one rounding step, so the error
 * is at most half an output LSB, and it maps onto three NEON instructions. With
 *
 *     left  = max(shift + 1, 0)        in [0, 31]
 *     right = left - shift             in [1, 31]   (= max(1, -shift))
 *
 * the result is
 *
 *     x = sat_int32(acc * 2^left)                                  (saturating left shift)
 *     npu_requantize(acc, mult, shift) = floor((x * mult + 2^(30 + right)) / 2^(31 + right))
 *
 * computed exactly (x * mult needs 63 bits). Whenever acc * 2^left fits in int32 -- always when
 * shift <= -1, i.e. r < 0.5 -- this is round(acc * mult * 2^(shift - 31)) with ties rounded
 * towards +infinity (2.5 -> 3, -2.5 -> -2). When the left shift saturates, |result| >= mult / 2,
 * which for a normalized mult (>= 2^30) saturates any int8 or int16 output anyway.
 *
 * Valid ranges (asserted): mult in [0, INT32_MAX]; shift in [-31, 30]; any int32 acc. A mult
 * below 2^30 is valid (npu_quantize_multiplier makes one only for r < 2^-32, with shift = -31 and
 * so no left shift); the saturation remark above assumes mult >= 2^30 when shift >= 0.
 * NEON: vqshlq_s32(acc, left); vqdmulhq_s32(x, mult) (= floor(x * mult / 2^31), never saturating
 * since mult >= 0); vrshlq_s32(q, -right) -- three instructions, exactly this definition. AVX2:
 * see npu_avx2_requantize() in src/kernels/npu/avx2_util.h. */

/* x * 2^left saturated to int32; left in [0, 31]. */
static inline int32_t npu_sat_shl(int32_t x, int32_t left) {
  assert(left >= 0 && left <= 31);
  const int64_t v = (int64_t)x * ((int64_t)1 << left);
  return v > INT32_MAX ? INT32_MAX : v < INT32_MIN ? INT32_MIN : (int32_t)v;
}

/* Left shift of the single-rounding scheme: max(shift + 1, 0). */
static inline int32_t npu_requant_left(int32_t shift) { return shift >= 0 ? shift + 1 : 0; }

/* Right shift of the single-rounding scheme: max(1, -shift), always >= 1. */
static inline int32_t npu_requant_right(int32_t shift) { return shift >= 0 ? 1 : -shift; }

/* round(acc * mult * 2^(shift - 31)), ties up, as defined above; mult in [0, INT32_MAX],
 * shift in [-31, 30]. The result lies in [-2^30, 2^30] (|x * mult| < 2^62, divided by at least
 * 2^32), so adding any int16 zero point to it cannot overflow int32. */
static inline int32_t npu_requantize(int32_t acc, int32_t mult, int32_t shift) {
  assert(mult >= 0);
  assert(shift >= -31 && shift <= 30);
  const int32_t right = npu_requant_right(shift);
  const int64_t p = (int64_t)npu_sat_shl(acc, npu_requant_left(shift)) * mult; /* |p| < 2^62 */
  /* Arithmetic right shift of a negative int64: implementation-defined in C11, arithmetic on every
   * compiler npulm supports (gcc, clang). */
  return (int32_t)((p + ((int64_t)1 << (30 + right))) >> (31 + right));
}

/* Saturate an int64 to [lo, hi]. */
static inline int32_t npu_clamp_i64(int64_t v, int32_t lo, int32_t hi) {
  return v < lo ? lo : v > hi ? hi : (int32_t)v;
}

/* sat_int8(npu_requantize(acc, mult, shift) + zero_point); zero_point in [-128, 127]. */
static inline int8_t npu_requantize_s8(int32_t acc, int32_t mult, int32_t shift,
                                       int32_t zero_point) {
  assert(zero_point >= INT8_MIN && zero_point <= INT8_MAX);
  return (int8_t)npu_clamp_i64((int64_t)npu_requantize(acc, mult, shift) + zero_point, INT8_MIN,
                               INT8_MAX);
}

/* sat_int16(npu_requantize(acc, mult, shift) + zero_point); zero_point in [-32768, 32767]. */
static inline int16_t npu_requantize_s16(int32_t acc, int32_t mult, int32_t shift,
                                         int32_t zero_point) {
  assert(zero_point >= INT16_MIN && zero_point <= INT16_MAX);
  return (int16_t)npu_clamp_i64((int64_t)npu_requantize(acc, mult, shift) + zero_point, INT16_MIN,
                                INT16_MAX);
}

/* The inverse square root of an RMSNorm's row (npu_ukernels.h, qs16_rmsnorm_qs8): for v in
 * [1, 2^63), an even normalization v' = v * 4^e in [2^60, 2^62) (e in [-1, 30]; a right shift
 * when e = -1, which drops bits below the 62 kept), q = floor(sqrt(v')) in [2^30, 2^31) by the
 * exact digit-by-digit method, and r = min(floor(2^61 / q), 2^31 - 1), so that
 * 1 / sqrt(v) ~ r * 2^(e - 61) with r in [2^30, 2^31). Integer-only; every variant calls this
 * once per row. */
static inline int32_t npu_rsqrt_q61(int64_t v, int32_t *e_out) {
  assert(v >= 1);
  uint64_t w = (uint64_t)v;
  int32_t e = 0;
  if (w >= ((uint64_t)1 << 62)) {
    w >>= 2;
    e = -1;
  }
  while (w < ((uint64_t)1 << 60)) {
    w <<= 2;
    e++;
  }
  uint64_t q = 0, rem = w;
  for (uint64_t bit = (uint64_t)1 << 62; bit != 0; bit >>= 2) {
    if (rem >= q + bit) {
      rem -= q + bit;
      q = (q >> 1) + bit;
    } else {
      q >>= 1;
    }
  }
  const uint64_t r = ((uint64_t)1 << 61) / q;
  *e_out = e;
  return r > INT32_MAX ? INT32_MAX : (int32_t)r;
}

/* One element of an RMSNorm row (npu_ukernels.h) before its zero point and saturation:
 * ((x * r + 2^14) >> 15) * mult rounded right by s, for the row's r and total shift s in [1, 62].
 * The one definition of the row arithmetic; npu_rmsnorm_elem (int8) and npu_rmsnorm_elem_s16
 * (int16) only differ in the saturation. |result| < 2^61. */
static inline int64_t npu_rmsnorm_value(int16_t x, int64_t r, int32_t s, int32_t mult) {
  assert(s >= 1 && s <= 62);
  const int64_t u = ((int64_t)x * r + (1 << 14)) >> 15;
  return (u * mult + ((int64_t)1 << (s - 1))) >> s;
}

/* sat_int8(npu_rmsnorm_value(x, r, s, mult) + zp), zp in [-128, 127]. */
static inline int8_t npu_rmsnorm_elem(int16_t x, int64_t r, int32_t s, int32_t mult, int32_t zp) {
  return (int8_t)npu_clamp_i64(npu_rmsnorm_value(x, r, s, mult) + zp, INT8_MIN, INT8_MAX);
}

/* sat_int16(npu_rmsnorm_value(x, r, s, mult) + zp), zp in [-32768, 32767]. */
static inline int16_t npu_rmsnorm_elem_s16(int16_t x, int64_t r, int32_t s, int32_t mult,
                                           int32_t zp) {
  return (int16_t)npu_clamp_i64(npu_rmsnorm_value(x, r, s, mult) + zp, INT16_MIN, INT16_MAX);
}

/* A wide accumulator narrowed to int32 by a rounding right shift of 'acc_shift' bits (round half
 * up, like npu_requantize), saturated; acc_shift in [0, 32] is chosen at compile time so that the
 * bound of |acc| fits int32 after it (then nothing saturates). The int16-activation GEMMs
 * (npu_ukernels.h: qs16_gemm_qs16, qs16_qc4w_gemm_qs16) sum exactly in int64 and pass the result
 * through this before npu_requantize: together they are the requantization of a wide
 * accumulator,
 *
 *     npu_requantize(npu_narrow(acc, acc_shift), mult, shift)
 *       ~ round(round(acc / 2^acc_shift) * mult * 2^(shift - 31)),
 *
 * i.e. the real multiplier mult * 2^(shift - 31 + acc_shift) in two roundings (the first one
 * exact when acc_shift = 0). Computed as floor(acc / 2^s) + bit s - 1 of acc, which is
 * floor((acc + 2^(s - 1)) / 2^s) without the sum (no int64 overflow for any acc).
 * NEON: vrshrq_n_s64 / vrshlq_s64 by -acc_shift (rounding shift, ties up), then vqmovn_s64. */
static inline int32_t npu_narrow(int64_t acc, int32_t acc_shift) {
  assert(acc_shift >= 0 && acc_shift <= 32);
  /* Arithmetic right shift of a negative int64: as in npu_requantize. */
  const int64_t v = acc_shift == 0 ? acc : (acc >> acc_shift) + ((acc >> (acc_shift - 1)) & 1);
  return npu_clamp_i64(v, INT32_MIN, INT32_MAX);
}

#endif /* NPU_KERNELS_NPU_FIXEDPOINT_H */
