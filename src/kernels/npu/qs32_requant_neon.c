/* npu_qs32_requant_qs8__neon, npu_qs32_requant_qs16__neon: 16 values per step with per-lane
 * constants, the requantization of fixedpoint.h in its three NEON instructions; the tail goes
 * through the scalar definition (bit-exact by construction). */
#include "kernels/npu/npu_ukernels.h"

#if defined(__aarch64__)

#include <assert.h>

#include "kernels/npu/fixedpoint.h"
#include "kernels/npu/neon_util.h"

/* q[j] = requantized acc[4j .. 4j+3] plus the zero point, for j < 4. */
NPU_INLINE_NEON void requant16(const int32_t *acc, const int32_t *mult, const int32_t *shift,
                               int32x4_t zp, int32x4_t q[4]) {
  for (int j = 0; j < 4; j++) {
    const struct npu_neon_rq rq =
        npu_neon_rq_make(vld1q_s32(mult + 4 * j), vld1q_s32(shift + 4 * j));
    q[j] = npu_neon_add_zp(npu_neon_requantize(vld1q_s32(acc + 4 * j), &rq), zp);
  }
}

void npu_qs32_requant_qs8__neon(size_t n, const int32_t *restrict acc, const int32_t *restrict mult,
                                const int32_t *restrict shift, int32_t zero_point,
                                int8_t *restrict y) {
  assert(zero_point >= INT8_MIN && zero_point <= INT8_MAX);
  const int32x4_t zp = vdupq_n_s32(zero_point);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    int32x4_t q[4];
    requant16(acc + i, mult + i, shift + i, zp, q);
    vst1q_s8(y + i, npu_neon_narrow_s8(q[0], q[1], q[2], q[3]));
  }
  for (; i < n; i++) y[i] = npu_requantize_s8(acc[i], mult[i], shift[i], zero_point);
}

void npu_qs32_requant_qs16__neon(size_t n, const int32_t *restrict acc,
                                 const int32_t *restrict mult, const int32_t *restrict shift,
                                 int32_t zero_point, int16_t *restrict y) {
  assert(zero_point >= INT16_MIN && zero_point <= INT16_MAX);
  const int32x4_t zp = vdupq_n_s32(zero_point);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    int32x4_t q[4];
    requant16(acc + i, mult + i, shift + i, zp, q);
    vst1q_s16(y + i, npu_neon_narrow_s16(q[0], q[1]));
    vst1q_s16(y + i + 8, npu_neon_narrow_s16(q[2], q[3]));
  }
  for (; i < n; i++) y[i] = npu_requantize_s16(acc[i], mult[i], shift[i], zero_point);
}

#endif /* __aarch64__ */
