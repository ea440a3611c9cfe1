/* npu_qs16_lut__neon: the piecewise-linear int16 lookup of npu_ukernels.h, 8 elements per step.
 * NEON has no gather: each element's knot pair (t[i], t[i + 1]) is read as one 32-bit word into a
 * small buffer, which vld2q_s16 splits into the 8 left knots and the 8 right ones; the
 * interpolation is vrshrq_n_s32((t[i + 1] - t[i]) * f, 7), whose rounding addition of 64 is exact,
 * so the result is bit-exact with npu_qs16_lut__scalar; the tail uses the scalar definition. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__aarch64__)

#include <string.h>

#include "kernels/npu/neon_util.h"

void npu_qs16_lut__neon(size_t n, const int16_t *x, int16_t *y, const int16_t *restrict table) {
  size_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const uint16x8_t u = veorq_u16(vreinterpretq_u16_s16(vld1q_s16(x + j)), vdupq_n_u16(0x8000));
    uint16_t idx[8];
    vst1q_u16(idx, vshrq_n_u16(u, 7)); /* i = u >> 7 in [0, 511] */
    int16_t pairs[16];
    for (int l = 0; l < 8; l++) memcpy(pairs + 2 * l, table + idx[l], 2 * sizeof(int16_t));
    const int16x8x2_t t = vld2q_s16(pairs); /* val[0]: t[i], val[1]: t[i + 1] */
    const int16x8_t f = vreinterpretq_s16_u16(vandq_u16(u, vdupq_n_u16(127)));
    const int32x4_t d0 = vsubl_s16(vget_low_s16(t.val[1]), vget_low_s16(t.val[0]));
    const int32x4_t d1 = vsubl_high_s16(t.val[1], t.val[0]);
    const int32x4_t y0 = vaddw_s16(vrshrq_n_s32(vmulq_s32(d0, vmovl_s16(vget_low_s16(f))), 7),
                                   vget_low_s16(t.val[0]));
    const int32x4_t y1 =
        vaddw_high_s16(vrshrq_n_s32(vmulq_s32(d1, vmovl_high_s16(f)), 7), t.val[0]);
    /* between t[i] and t[i + 1]: the narrowing keeps the value */
    vst1q_s16(y + j, vmovn_high_s32(vmovn_s32(y0), y1));
  }
  if (j < n) npu_qs16_lut__scalar(n - j, x + j, y + j, table);
}

#endif /* __aarch64__ */
