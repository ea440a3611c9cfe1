/* npu_qs8_rows_dot__neon: dot products of int8 rows with one int8 input (npu_ukernels.h) in plain
 * NEON, bit-exact with npu_qs8_rows_dot__scalar (integer sums that cannot overflow int32 in the
 * ranges of npu_ukernels.h, so their order does not matter). Four rows per pass (scattered rows
 * streamed side by side), 16 k per step: x - x_zero_point in int16 (vsubl_s8: it lies in
 * [-255, 255]), formed once per step and shared by the rows, times the sign-extended weights with
 * vmlal_s16 (exact int32 products); the rows left over go one at a time. A last partial step of x
 * goes through a zero-padded copy of x's tail (x is never read past k); the padding meets the
 * rows' zero padding (w = 0 past k), so it adds 0. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__aarch64__)

#include <assert.h>
#include <string.h>

#include "kernels/npu/neon_util.h"

enum { NR = 4 }; /* rows per pass */

/* acc += x (two int16 halves) times the 16 int8 at w, pairwise into 4 int32 lanes. */
NPU_INLINE_NEON int32x4_t dot16(int32x4_t acc, int16x8_t x0, int16x8_t x1, const int8_t *w) {
  const int8x16_t wv = vld1q_s8(w);
  const int16x8_t w0 = vmovl_s8(vget_low_s8(wv)), w1 = vmovl_high_s8(wv);
  acc = vmlal_s16(acc, vget_low_s16(x0), vget_low_s16(w0));
  acc = vmlal_high_s16(acc, x0, w0);
  acc = vmlal_s16(acc, vget_low_s16(x1), vget_low_s16(w1));
  return vmlal_high_s16(acc, x1, w1);
}

/* The dots of 'nr' (1 or NR, a constant after inlining) rows r[0..nr-1] into out[0..nr-1]. */
NPU_INLINE_NEON void dot_rows(const int nr, size_t k, const int8_t *x, const int8_t *xtail,
                              int8x16_t zp, const int8_t *const *r, int32_t *out) {
  const size_t kf = k & ~(size_t)15;
  int32x4_t a[NR];
#pragma GCC unroll 8
  for (int j = 0; j < nr; j++) a[j] = vdupq_n_s32(0);
  for (size_t c = 0; c < k; c += 16) { /* w read up to c + 16 <= kp */
    const int8x16_t xv = vld1q_s8(c < kf ? x + c : xtail);
    const int16x8_t x0 = vsubl_s8(vget_low_s8(xv), vget_low_s8(zp));
    const int16x8_t x1 = vsubl_high_s8(xv, zp);
#pragma GCC unroll 8
    for (int j = 0; j < nr; j++) a[j] = dot16(a[j], x0, x1, r[j] + c);
  }
  if (nr == NR) vst1q_s32(out, vpaddq_s32(vpaddq_s32(a[0], a[1]), vpaddq_s32(a[2], a[3])));
  else out[0] = vaddvq_s32(a[0]);
}

void npu_qs8_rows_dot__neon(size_t k, const int8_t *x, int32_t x_zero_point, size_t count,
                            const int8_t *const *rows, int32_t *acc) {
  assert(k >= 1 && k <= NPU_BUNDLE_MAX_K);
  assert(x_zero_point >= INT8_MIN && x_zero_point <= INT8_MAX);
  const size_t kf = k & ~(size_t)15; /* full 16-k steps of x */
  int8_t xtail[16] = {0};
  memcpy(xtail, x + kf, k - kf);
  const int8x16_t zp = vdupq_n_s8((int8_t)x_zero_point);
  size_t i = 0;
  for (; i + NR <= count; i += NR) dot_rows(NR, k, x, xtail, zp, rows + i, acc + i);
  for (; i < count; i++) dot_rows(1, k, x, xtail, zp, rows + i, acc + i);
}

#endif /* __aarch64__ */
