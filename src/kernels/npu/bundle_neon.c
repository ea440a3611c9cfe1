/* npu_qs8_cols_down__neon: the down projection of sparse decode over neuron bundles
 * (npu_ukernels.h) in plain NEON, bit-exact with the scalar reference (integer sums that cannot
 * overflow int32 in the ranges of npu_ukernels.h, so their order does not matter).
 *
 * Up to four bundles per pass over the columns, the 16 int32 accumulators of a step loaded
 * and stored once per pass; each down column sign-extended (vmovl_s8) and multiplied by its
 * coefficient with vmlal_n_s16 (|coef| <= 255 fits int16, the product 32385 int32). A partial
 * last step goes through a copy of acc's tail (acc is not touched past k); the columns are read
 * up to kp. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__aarch64__)

#include <assert.h>
#include <string.h>

#include "kernels/npu/neon_util.h"

/* acc[0..15] += sum_{j < n} coef[j] * d[j][c .. c + 15]. */
NPU_INLINE_NEON void down16(size_t n, const int8_t *const *d, const int16_t *coef, size_t c,
                            int32_t *acc) {
  int32x4_t a0 = vld1q_s32(acc), a1 = vld1q_s32(acc + 4);
  int32x4_t a2 = vld1q_s32(acc + 8), a3 = vld1q_s32(acc + 12);
  for (size_t j = 0; j < n; j++) {
    const int8x16_t wv = vld1q_s8(d[j] + c);
    const int16x8_t w0 = vmovl_s8(vget_low_s8(wv)), w1 = vmovl_high_s8(wv);
    a0 = vmlal_n_s16(a0, vget_low_s16(w0), coef[j]);
    a1 = vmlal_high_n_s16(a1, w0, coef[j]);
    a2 = vmlal_n_s16(a2, vget_low_s16(w1), coef[j]);
    a3 = vmlal_high_n_s16(a3, w1, coef[j]);
  }
  vst1q_s32(acc, a0), vst1q_s32(acc + 4, a1), vst1q_s32(acc + 8, a2), vst1q_s32(acc + 12, a3);
}

void npu_qs8_cols_down__neon(size_t k, size_t count, const int8_t *const *cols, const int32_t *coef,
                             int32_t *acc) {
  assert(count <= NPU_BUNDLE_DOWN_MAX_COUNT);
  const size_t kf = k & ~(size_t)15;
  for (size_t i = 0; i < count; i += 4) {
    const size_t n = count - i < 4 ? count - i : 4;
    const int8_t *d[4];
    int16_t cf[4];
    for (size_t j = 0; j < n; j++) {
      assert(coef[i + j] >= -255 && coef[i + j] <= 255);
      d[j] = cols[i + j];
      cf[j] = (int16_t)coef[i + j];
    }
    size_t c = 0;
    for (; c < kf; c += 16) down16(n, d, cf, c, acc + c);
    if (c < k) { /* columns read up to c + 16 <= kp; acc through a copy of its tail */
      int32_t tail[16] = {0};
      memcpy(tail, acc + c, (k - c) * sizeof(int32_t));
      down16(n, d, cf, c, tail);
      memcpy(acc + c, tail, (k - c) * sizeof(int32_t));
    }
  }
}

#endif /* __aarch64__ */
