/* npu_qs8_qk_qs16__neon: attention scores with 16-bit multiply-accumulates. Four keys at a time
 * share each load of the query: 8 channels of q and of each key lose their zero points in int16
 * (vsubl_s8: |x - zero_point| <= 255) and vmlal_s16 adds the exact int32 products into one
 * accumulator per key; vpaddq_s32 folds the four accumulators into the four keys' sums, which are
 * requantized on 4 lanes. Channels past the last block of eight and keys past the last block of
 * four go through the same integer sums in plain C, so every variant computes the same exact
 * int32 sums (bit-exact by construction). */
#include "kernels/npu/npu_ukernels.h"

#if defined(__aarch64__)

#include <assert.h>

#include "kernels/npu/fixedpoint.h"
#include "kernels/npu/neon_util.h"

/* Sums of (q - zq) . (k_l - zk) over the hd channels for the 'nk' (1..4, a constant after
 * inlining) keys at k0, k0 + kv_cols, ...: lane l of the result is key l's sum (0 past nk). */
NPU_INLINE_NEON int32x4_t dots(const int nk, const int8_t *qt, const int8_t *k0, size_t kv_cols,
                               int32_t hd, int8x8_t zq, int8x8_t zk, int32_t zq32, int32_t zk32) {
  int32x4_t acc[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
  int32_t i = 0;
  for (; i + 8 <= hd; i += 8) {
    const int16x8_t qv = vsubl_s8(vld1_s8(qt + i), zq);
    for (int l = 0; l < nk; l++) {
      const int16x8_t kv = vsubl_s8(vld1_s8(k0 + (size_t)l * kv_cols + (size_t)i), zk);
      acc[l] = vmlal_s16(acc[l], vget_low_s16(qv), vget_low_s16(kv));
      acc[l] = vmlal_high_s16(acc[l], qv, kv);
    }
  }
  int32_t rest[4] = {0, 0, 0, 0};
  for (; i < hd; i++)
    for (int l = 0; l < nk; l++) rest[l] += (qt[i] - zq32) * (k0[(size_t)l * kv_cols + i] - zk32);
  return vaddq_s32(vpaddq_s32(vpaddq_s32(acc[0], acc[1]), vpaddq_s32(acc[2], acc[3])),
                   vld1q_s32(rest));
}

void npu_qs8_qk_qs16__neon(const struct npu_attn_shape *restrict shape, const int8_t *restrict q,
                           const int8_t *restrict k, int16_t *restrict s,
                           const struct npu_qs8_qk_params *restrict p) {
  const int32_t heads = shape->heads, hd = shape->head_dim, rows = shape->rows, ctx = shape->ctx;
  const int32_t group = heads / shape->kv_heads;
  const size_t q_cols = (size_t)heads * (size_t)hd, kv_cols = (size_t)shape->kv_heads * (size_t)hd;
  assert(heads % shape->kv_heads == 0 && hd >= 1 && hd <= 32768);
  assert(shape->n_valid >= 1 && shape->n_valid <= rows && shape->pos0 + shape->n_valid <= ctx);
  const int8x8_t zq = vdup_n_s8((int8_t)p->q_zero_point), zk = vdup_n_s8((int8_t)p->k_zero_point);
  const int32x4_t zs = vdupq_n_s32(p->s_zero_point);
  const int16x8_t masked = vdupq_n_s16(NPU_ATTN_MASKED);
  const struct npu_neon_rq rq = npu_neon_rq_make1(p->mult, p->shift);
  for (int32_t h = 0; h < heads; h++) {
    const int8_t *kh = k + (size_t)(h / group) * (size_t)hd;
    for (int32_t t = 0; t < rows; t++) {
      const int8_t *qt = q + (size_t)t * q_cols + (size_t)h * (size_t)hd;
      int16_t *row = s + ((size_t)h * (size_t)rows + (size_t)t) * (size_t)ctx;
      const int32_t len = npu_attn_len_of(shape, t);
      int32_t j = 0;
      for (; j + 4 <= len; j += 4) {
        const int32x4_t acc = dots(4, qt, kh + (size_t)j * kv_cols, kv_cols, hd, zq, zk,
                                   p->q_zero_point, p->k_zero_point);
        const int32x4_t y = npu_neon_add_zp(npu_neon_requantize(acc, &rq), zs);
        vst1_s16(row + j, vqmovn_s32(y));
      }
      for (; j < len; j++) {
        const int32x4_t acc = dots(1, qt, kh + (size_t)j * kv_cols, kv_cols, hd, zq, zk,
                                   p->q_zero_point, p->k_zero_point);
        row[j] = npu_requantize_s16(vgetq_lane_s32(acc, 0), p->mult, p->shift, p->s_zero_point);
      }
      for (; j + 8 <= ctx; j += 8) vst1q_s16(row + j, masked);
      for (; j < ctx; j++) row[j] = NPU_ATTN_MASKED;
    }
  }
}

#endif /* __aarch64__ */
