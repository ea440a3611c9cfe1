/* npu_qs8_rows_dot__neondot: dot products of int8 rows with one int8 input (npu_ukernels.h) with
 * the Armv8.2 dot product, bit-exact with npu_qs8_rows_dot__scalar. sdot multiplies signed by
 * signed bytes. When every d = x[c] - x_zero_point fits int8 (always for x_zero_point = 0; checked
 * once per call) d enters directly: one sdot per row and step. Otherwise the raw x enters and the
 * zero point once per row: sum d w = sum x w - x_zero_point sum w, sum w by one more sdot against a
 * vector of ones. Every sum is exact in int32 (at most 32768 * 128 * 127 < 2^29 in magnitude).
 * Four rows per pass (scattered rows streamed side by side), 16 k per step, the x vector shared
 * by the rows; the rows left over go one at a time. A last partial step goes through a
 * zero-padded copy of x's tail (d's tail on the fast path; x is never read past k), which meets
 * the rows' zero padding (w = 0 past k) and adds 0. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__aarch64__) && NPU_NEON_DOTPROD_VARIANTS /* npu_ukernels.h */

#include <assert.h>
#include <string.h>

#include "kernels/npu/neon_util.h"

enum { NR = 4 }; /* rows per pass */

#define NPU_INLINE_DOT static inline __attribute__((always_inline)) NPU_TARGET_DOTPROD

/* The lane sums of a[0..nr-1] (1 or NR) into out. */
NPU_INLINE_NEON void store_sums(const int nr, const int32x4_t *a, int32_t *out) {
  if (nr == NR) vst1q_s32(out, vpaddq_s32(vpaddq_s32(a[0], a[1]), vpaddq_s32(a[2], a[3])));
  else out[0] = vaddvq_s32(a[0]);
}

/* Fast path: sum d w of rows r[0..nr-1] into out; 'dtail' the d of the last partial step. */
NPU_INLINE_DOT void dot_rows_d8(const int nr, size_t k, const int8_t *x, int8x16_t zp,
                                const int8_t *dtail, const int8_t *const *r, int32_t *out) {
  const size_t kf = k & ~(size_t)15;
  int32x4_t a[NR];
#pragma GCC unroll 8
  for (int j = 0; j < nr; j++) a[j] = vdupq_n_s32(0);
  for (size_t c = 0; c < k; c += 16) { /* w read up to c + 16 <= kp */
    const int8x16_t d = c < kf ? vsubq_s8(vld1q_s8(x + c), zp) : vld1q_s8(dtail);
#pragma GCC unroll 8
    for (int j = 0; j < nr; j++) a[j] = vdotq_s32(a[j], d, vld1q_s8(r[j] + c));
  }
  store_sums(nr, a, out);
}

/* General path: sum x w - x_zero_point sum w of rows r[0..nr-1] into out. */
NPU_INLINE_DOT void dot_rows_x(const int nr, size_t k, const int8_t *x, int32x4_t zp32,
                               const int8_t *xtail, const int8_t *const *r, int32_t *out) {
  const size_t kf = k & ~(size_t)15;
  const int8x16_t ones = vdupq_n_s8(1);
  int32x4_t a[NR], s[NR];
#pragma GCC unroll 8
  for (int j = 0; j < nr; j++) a[j] = s[j] = vdupq_n_s32(0);
  for (size_t c = 0; c < k; c += 16) {
    const int8x16_t xv = vld1q_s8(c < kf ? x + c : xtail);
#pragma GCC unroll 8
    for (int j = 0; j < nr; j++) {
      const int8x16_t w = vld1q_s8(r[j] + c);
      a[j] = vdotq_s32(a[j], xv, w);
      s[j] = vdotq_s32(s[j], ones, w);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < nr; j++) a[j] = vmlsq_s32(a[j], s[j], zp32); /* per lane, < 2^30 */
  store_sums(nr, a, out);
}

NPU_TARGET_DOTPROD void npu_qs8_rows_dot__neondot(size_t k, const int8_t *x, int32_t x_zero_point,
                                                  size_t count, const int8_t *const *rows,
                                                  int32_t *acc) {
  assert(k >= 1 && k <= NPU_BUNDLE_MAX_K);
  assert(x_zero_point >= INT8_MIN && x_zero_point <= INT8_MAX);
  const size_t kf = k & ~(size_t)15; /* full 16-k steps of x */
  int32_t dmin = 0, dmax = 0;        /* whether every x - x_zero_point fits int8 */
  for (size_t c = 0; c < k; c++) {
    const int32_t d = x[c] - x_zero_point;
    dmin = d < dmin ? d : dmin;
    dmax = d > dmax ? d : dmax;
  }
  int8_t tail[16] = {0};
  size_t i = 0;
  if (dmin >= INT8_MIN && dmax <= INT8_MAX) {
    for (size_t c = kf; c < k; c++) tail[c - kf] = (int8_t)(x[c] - x_zero_point);
    const int8x16_t zp = vdupq_n_s8((int8_t)x_zero_point);
    for (; i + NR <= count; i += NR) dot_rows_d8(NR, k, x, zp, tail, rows + i, acc + i);
    for (; i < count; i++) dot_rows_d8(1, k, x, zp, tail, rows + i, acc + i);
  } else {
    memcpy(tail, x + kf, k - kf);
    const int32x4_t zp32 = vdupq_n_s32(x_zero_point);
    for (; i + NR <= count; i += NR) dot_rows_x(NR, k, x, zp32, tail, rows + i, acc + i);
    for (; i < count; i++) dot_rows_x(1, k, x, zp32, tail, rows + i, acc + i);
  }
}

#endif /* __aarch64__ && NPU_NEON_DOTPROD_VARIANTS */
