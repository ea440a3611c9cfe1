/* npu_x8_lut__neon: 256-entry byte lookup with vqtbl4q_u8, which looks 16 indices up in a 64-byte
 * table (0 for an index past 63): the table is four such quarters, the index u = x + 128 is
 * offset by -64, -128, -192 (wrapping, so that only the quarter holding u answers) and the
 * answers are merged with vqtbx4q_u8, which leaves a lane as it is where its index is out of
 * range. 32 bytes per step; the tail uses the scalar definition. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__aarch64__)

#include "kernels/npu/neon_util.h"

NPU_INLINE_NEON uint8x16_t lookup16(const uint8x16x4_t t[4], uint8x16_t u) {
  const uint8x16_t step = vdupq_n_u8(64);
  uint8x16_t r = vqtbl4q_u8(t[0], u);
  u = vsubq_u8(u, step);
  r = vqtbx4q_u8(r, t[1], u);
  u = vsubq_u8(u, step);
  r = vqtbx4q_u8(r, t[2], u);
  u = vsubq_u8(u, step);
  return vqtbx4q_u8(r, t[3], u);
}

void npu_x8_lut__neon(size_t n, const int8_t *x, int8_t *y, const int8_t *restrict table) {
  uint8x16x4_t t[4];
  for (int q = 0; q < 4; q++) t[q] = vld1q_u8_x4((const uint8_t *)table + 64 * q);
  const uint8x16_t bias = vdupq_n_u8(0x80); /* x + 128 = x ^ 0x80 as a byte */
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const uint8x16_t u0 = veorq_u8(vld1q_u8((const uint8_t *)x + i), bias);
    const uint8x16_t u1 = veorq_u8(vld1q_u8((const uint8_t *)x + i + 16), bias);
    vst1q_u8((uint8_t *)y + i, lookup16(t, u0));
    vst1q_u8((uint8_t *)y + i + 16, lookup16(t, u1));
  }
  for (; i + 16 <= n; i += 16)
    vst1q_u8((uint8_t *)y + i, lookup16(t, veorq_u8(vld1q_u8((const uint8_t *)x + i), bias)));
  for (; i < n; i++) y[i] = table[x[i] + 128];
}

#endif /* __aarch64__ */
