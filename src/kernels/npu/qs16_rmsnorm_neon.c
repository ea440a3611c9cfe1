/* npu_qs16_rmsnorm_qs8__neon and npu_qs16_rmsnorm_qs16__neon: RMSNorm of int16 rows into int8 or
 * int16, 16 elements per step. The row's sum
 * of squares comes from vmull_s16 squares (each at most 2^30) added pairwise into 64-bit lanes
 * with vpadalq_s32; the inverse square root is the scalar npu_rsqrt_q61, once per row; each
 * element's two products (x * r, then u * mult) are formed exactly in 64-bit lanes with
 * vmull_s32, and their rounding arithmetic shifts are vrshrq_n_s64 by 15 and vrshlq_s64 by -s,
 * whose rounding additions are exact: floor((p + 2^(s-1)) / 2^s) as the definition says. The zero
 * point is added in 64 bits before the saturating narrows, so the result is bit-exact with the
 * scalar variants; the last cols % 8 elements of a row go through the same formula in scalar code,
 * with the row's r and shift. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__aarch64__)

#include <assert.h>
#include <string.h>

#include "kernels/npu/fixedpoint.h"
#include "kernels/npu/neon_util.h"

/* sum_c x[c]^2, exact: the 64-bit lanes hold at most 2^24 * 2^30 = 2^54. */
NPU_INLINE_NEON int64_t sum_squares(const int16_t *x, size_t n) {
  int64x2_t acc0 = vdupq_n_s64(0), acc1 = vdupq_n_s64(0);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const int16x8_t v = vld1q_s16(x + i);
    acc0 = vpadalq_s32(acc0, vmull_s16(vget_low_s16(v), vget_low_s16(v)));
    acc1 = vpadalq_s32(acc1, vmull_high_s16(v, v));
  }
  int64_t sum = vaddvq_s64(vaddq_s64(acc0, acc1));
  for (; i < n; i++) sum += (int32_t)x[i] * x[i];
  return sum;
}

/* The row's constants. */
struct row_consts {
  int32x4_t r;     /* npu_rsqrt_q61 of the row */
  int64x2_t neg_s; /* -s, the row's total right shift s in [1, 62] */
  int64x2_t zp;    /* y_zero_point */
};

/* Two elements: sat_int32(((u * mult + 2^(s-1)) >> s) + zp) with u = (x * r + 2^14) >> 15 (the
 * int32 saturation keeps every int8 or int16 saturation as it is). */
NPU_INLINE_NEON int32x2_t norm2(int64x2_t xr, int32x2_t mult, const struct row_consts *k) {
  const int32x2_t u = vmovn_s64(vrshrq_n_s64(xr, 15)); /* |u| < 2^31 */
  const int64x2_t out = vaddq_s64(vrshlq_s64(vmull_s32(u, mult), k->neg_s), k->zp);
  return vqmovn_s64(out);
}

/* 8 elements -> 8 int32 outputs with the zero point (out[0..1]), for a saturating narrow. */
NPU_INLINE_NEON void norm8(int16x8_t x, const int32_t *mult, const struct row_consts *k,
                           int32x4_t out[2]) {
  const int32x4_t x0 = vmovl_s16(vget_low_s16(x)), x1 = vmovl_high_s16(x);
  const int32x4_t m0 = vld1q_s32(mult), m1 = vld1q_s32(mult + 4);
  out[0] = vcombine_s32(norm2(vmull_s32(vget_low_s32(x0), vget_low_s32(k->r)), vget_low_s32(m0), k),
                        norm2(vmull_high_s32(x0, k->r), vget_high_s32(m0), k));
  out[1] = vcombine_s32(norm2(vmull_s32(vget_low_s32(x1), vget_low_s32(k->r)), vget_low_s32(m1), k),
                        norm2(vmull_high_s32(x1, k->r), vget_high_s32(m1), k));
}

/* Both output types; 'y16' non-NULL selects int16. */
NPU_INLINE_NEON void rmsnorm(size_t rows, size_t cols, const int16_t *restrict x,
                             int8_t *restrict y8, int16_t *restrict y16,
                             const struct npu_qs16_rmsnorm_params *restrict params) {
  const int32_t *mult = params->mult, zp = params->y_zero_point;
  assert(cols >= 1 && cols <= (size_t)NPU_QS16_RMSNORM_MAX_COLS);
  assert(params->eps >= 1 && params->eps <= ((int64_t)1 << 62));
  assert(params->shift >= -16 && params->shift <= 46);
  assert(y16 != NULL ? zp >= INT16_MIN && zp <= INT16_MAX : zp >= INT8_MIN && zp <= INT8_MAX);
  struct row_consts k;
  k.zp = vdupq_n_s64(zp);
  for (size_t t = 0; t < rows; t++) {
    const int16_t *xt = x + t * cols;
    int8_t *yt8 = y16 != NULL ? NULL : y8 + t * cols;
    int16_t *yt16 = y16 != NULL ? y16 + t * cols : NULL;
    int32_t e;
    const int32_t r = npu_rsqrt_q61(sum_squares(xt, cols) + params->eps, &e);
    const int32_t s = 77 - e - params->shift; /* >= 1 for the valid shifts */
    if (s > 62) {
      /* |u * mult| < 2^62, so every element rounds to 0 */
      if (y16 != NULL)
        for (size_t c = 0; c < cols; c++) yt16[c] = (int16_t)zp;
      else memset(yt8, zp, cols);
      continue;
    }
    k.r = vdupq_n_s32(r);
    k.neg_s = vdupq_n_s64(-s);
    size_t c = 0;
    for (; c + 16 <= cols; c += 16) {
      int32x4_t lo[2], hi[2];
      norm8(vld1q_s16(xt + c), mult + c, &k, lo);
      norm8(vld1q_s16(xt + c + 8), mult + c + 8, &k, hi);
      if (y16 != NULL) {
        vst1q_s16(yt16 + c, npu_neon_narrow_s16(lo[0], lo[1]));
        vst1q_s16(yt16 + c + 8, npu_neon_narrow_s16(hi[0], hi[1]));
      } else {
        vst1q_s8(yt8 + c, npu_neon_narrow_s8(lo[0], lo[1], hi[0], hi[1]));
      }
    }
    if (c + 8 <= cols) {
      int32x4_t lo[2];
      norm8(vld1q_s16(xt + c), mult + c, &k, lo);
      if (y16 != NULL) vst1q_s16(yt16 + c, npu_neon_narrow_s16(lo[0], lo[1]));
      else vst1_s8(yt8 + c, npu_neon_narrow8_s8(lo[0], lo[1]));
      c += 8;
    }
    for (; c < cols; c++) {
      if (y16 != NULL) yt16[c] = npu_rmsnorm_elem_s16(xt[c], r, s, mult[c], zp);
      else yt8[c] = npu_rmsnorm_elem(xt[c], r, s, mult[c], zp);
    }
  }
}

void npu_qs16_rmsnorm_qs8__neon(size_t rows, size_t cols, const int16_t *restrict x,
                                int8_t *restrict y,
                                const struct npu_qs16_rmsnorm_params *restrict params) {
  rmsnorm(rows, cols, x, y, NULL, params);
}

void npu_qs16_rmsnorm_qs16__neon(size_t rows, size_t cols, const int16_t *restrict x,
                                 int16_t *restrict y,
                                 const struct npu_qs16_rmsnorm_params *restrict params) {
  rmsnorm(rows, cols, x, NULL, y, params);
}

#endif /* __aarch64__ */
