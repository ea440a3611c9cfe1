/* npu_qs8_bundle_dot__neondot: the neuron-bundle dot product (ukernels.h) with the Armv8.2 dot
 * product. sdot multiplies signed by signed bytes, so the raw int8 x enters and the zero point
 * once per row: sum (x - x_zero_point) w = sum x w - x_zero_point sum w, where sum w is one more
 * sdot against a vector of ones. Both sums and the result are exact in int32 (|sum x w| and
 * |x_zero_point sum w| are at most 32768 * 128 * 127 < 2^29), so the result is bit-exact with
 * npu_qs8_bundle_dot__scalar. One bundle at a time (gate and up rows: 2 kp contiguous bytes, one
 * stream), 16 k per step; a last partial step of x goes through a zero-padded copy of x's tail (x
 * is never read past k), which meets the bundle's zero padding (w = 0 past k) and adds 0 to both
 * sums. */
#include "kernels/npu/ukernels.h"

#if defined(__aarch64__) && NPU_NEON_DOTPROD_VARIANTS /* ukernels.h */

#include <assert.h>
#include <string.h>

#include "kernels/npu/neon_util.h"

NPU_TARGET_DOTPROD void npu_qs8_bundle_dot__neondot(size_t k, const int8_t *x, int32_t x_zero_point,
                                                    size_t count, const int8_t *const *bundles,
                                                    int32_t *acc) {
  assert(k >= 1 && k <= NPU_BUNDLE_MAX_K);
  assert(x_zero_point >= INT8_MIN && x_zero_point <= INT8_MAX);
  const size_t kp = npu_bundle_kp(k), kf = k & ~(size_t)15; /* full 16-k steps of x */
  int8_t xtail[16] = {0};
  memcpy(xtail, x + kf, k - kf);
  const int8x16_t ones = vdupq_n_s8(1);
  for (size_t i = 0; i < count; i++) {
    const int8_t *g = bundles[i], *u = bundles[i] + kp;
    int32x4_t gx = vdupq_n_s32(0), ux = gx, gs = gx, us = gx;
    for (size_t c = 0; c < k; c += 16) { /* w read up to c + 16 <= kp */
      const int8x16_t xv = vld1q_s8(c < kf ? x + c : xtail);
      const int8x16_t gv = vld1q_s8(g + c), uv = vld1q_s8(u + c);
      gx = vdotq_s32(gx, xv, gv);
      ux = vdotq_s32(ux, xv, uv);
      gs = vdotq_s32(gs, ones, gv);
      us = vdotq_s32(us, ones, uv);
    }
    acc[2 * i] = vaddvq_s32(gx) - x_zero_point * vaddvq_s32(gs);
    acc[2 * i + 1] = vaddvq_s32(ux) - x_zero_point * vaddvq_s32(us);
  }
}

#endif /* __aarch64__ && NPU_NEON_DOTPROD_VARIANTS */
