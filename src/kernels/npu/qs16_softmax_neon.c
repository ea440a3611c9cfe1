/* npu_qs16_softmax__neon: the integer softmax of npu_ukernels.h on 4 lanes: the maximum with
 * vmaxq_s16, the exponent's multiplier with the shared NEON requantization, the table with four
 * lane loads (NEON has no gather) and the per-lane shift with vshlq_u32 by -n (which gives 0 for
 * counts of 32, as the definition does past 30; counts are clamped to 32 first, since vshl reads
 * only the low byte), the normalization with 32 x 32 -> 64-bit products and vrshlq_u64, whose
 * rounding addition is exact. The reciprocal is one scalar division per row; tails use the scalar
 * steps, so the result is bit-exact with npu_qs16_softmax__scalar. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__aarch64__)

#include <assert.h>

#include "kernels/npu/fixedpoint.h"
#include "kernels/npu/neon_util.h"

/* e_j of 4 scores x (sign-extended to int32) against the maximum m, as uint32 (< 2^31). */
NPU_INLINE_NEON uint32x4_t exp4(int32x4_t x, int32x4_t m, uint32x4_t r,
                                const struct npu_neon_rq *rq) {
  const uint32x4_t u = vreinterpretq_u32_s32(npu_neon_requantize(vsubq_s32(m, x), rq)); /* >= 0 */
  const uint32x4_t n = vminq_u32(vaddq_u32(vshrq_n_u32(u, 8), r), vdupq_n_u32(32));
  const uint32x4_t f = vandq_u32(u, vdupq_n_u32(255));
  uint32x4_t t = vdupq_n_u32(0);
  t = vld1q_lane_u32((const uint32_t *)&npu_exp2_q30[vgetq_lane_u32(f, 0)], t, 0);
  t = vld1q_lane_u32((const uint32_t *)&npu_exp2_q30[vgetq_lane_u32(f, 1)], t, 1);
  t = vld1q_lane_u32((const uint32_t *)&npu_exp2_q30[vgetq_lane_u32(f, 2)], t, 2);
  t = vld1q_lane_u32((const uint32_t *)&npu_exp2_q30[vgetq_lane_u32(f, 3)], t, 3);
  return vshlq_u32(t, vnegq_s32(vreinterpretq_s32_u32(n)));
}

static inline int32_t exp1(int32_t x, int32_t m, int32_t r,
                           const struct npu_qs16_softmax_params *restrict params) {
  const int32_t u = npu_requantize(m - x, params->mult, params->shift);
  const int32_t n = (u >> 8) + r;
  return n < 31 ? npu_exp2_q30[u & 255] >> n : 0;
}

static int32_t bit_width(int32_t x) {
  int32_t r = 0;
  while (r < 31 && (x >> r) != 0) r++;
  return r;
}

/* min(round(e * inv / 2^shift), 32767) of 4 lanes (e * inv < 2^60; shift in [21, 45]). */
NPU_INLINE_NEON uint16x4_t normalize4(uint32x4_t e, uint32x2_t inv, int64x2_t neg_shift) {
  const uint64x2_t lo = vrshlq_u64(vmull_u32(vget_low_u32(e), inv), neg_shift);
  const uint64x2_t hi = vrshlq_u64(vmull_high_u32(e, vcombine_u32(inv, inv)), neg_shift);
  const uint32x4_t q = vqmovn_high_u64(vqmovn_u64(lo), hi);
  return vmovn_u32(vminq_u32(q, vdupq_n_u32(INT16_MAX)));
}

void npu_qs16_softmax__neon(const struct npu_attn_shape *restrict shape, const int16_t *restrict s,
                            int16_t *restrict p,
                            const struct npu_qs16_softmax_params *restrict params) {
  const int32_t rows = shape->rows, ctx = shape->ctx;
  assert(shape->n_valid >= 1 && shape->n_valid <= rows && shape->pos0 + shape->n_valid <= ctx);
  const struct npu_neon_rq rq = npu_neon_rq_make1(params->mult, params->shift);
  for (int32_t h = 0; h < shape->heads; h++) {
    for (int32_t t = 0; t < rows; t++) {
      const size_t off = ((size_t)h * (size_t)rows + (size_t)t) * (size_t)ctx;
      const int16_t *x = s + off;
      int16_t *y = p + off;
      const int32_t len = npu_attn_len_of(shape, t), r = bit_width(len);
      assert(len < (1 << 24));
      /* the maximum */
      int32_t j = 0, m = x[0];
      if (len >= 8) {
        int16x8_t mv = vld1q_s16(x);
        for (j = 8; j + 8 <= len; j += 8) mv = vmaxq_s16(mv, vld1q_s16(x + j));
        m = vmaxvq_s16(mv);
      }
      for (; j < len; j++) m = x[j] > m ? x[j] : m;
      /* the sum of the exponentials (< 2^30) */
      const int32x4_t mv = vdupq_n_s32(m);
      const uint32x4_t rv = vdupq_n_u32((uint32_t)r);
      uint32x4_t acc = vdupq_n_u32(0);
      for (j = 0; j + 4 <= len; j += 4)
        acc = vaddq_u32(acc, exp4(vmovl_s16(vld1_s16(x + j)), mv, rv, &rq));
      int32_t sum = (int32_t)vaddvq_u32(acc);
      for (; j < len; j++) sum += exp1(x[j], m, r, params);
      /* normalize */
      const int64_t inv = ((int64_t)1 << (60 - r)) / sum; /* <= 2^30 */
      const int32_t shift = 45 - r;
      const uint32x2_t invv = vdup_n_u32((uint32_t)inv);
      const int64x2_t neg_shift = vdupq_n_s64(-shift);
      for (j = 0; j + 4 <= len; j += 4) {
        const uint32x4_t e = exp4(vmovl_s16(vld1_s16(x + j)), mv, rv, &rq);
        vst1_s16(y + j, vreinterpret_s16_u16(normalize4(e, invv, neg_shift)));
      }
      for (; j < len; j++) {
        const int64_t q =
            ((int64_t)exp1(x[j], m, r, params) * inv + ((int64_t)1 << (shift - 1))) >> shift;
        y[j] = (int16_t)(q < INT16_MAX ? q : INT16_MAX);
      }
      const int16x8_t zero = vdupq_n_s16(0);
      for (; j + 8 <= ctx; j += 8) vst1q_s16(y + j, zero);
      for (; j < ctx; j++) y[j] = 0;
    }
  }
}

#endif /* __aarch64__ */
