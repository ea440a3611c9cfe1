/* npu_qs8_qk_qs16__neondot: attention scores with the dot product. The zero points come out of the
 * sum as sum (q - zq)(k - zk) = sum q k - zk sum q - zq sum k + n zq zk over the n channels of
 * whole 8-byte blocks: sdot forms sum q k (q loaded once for four keys) and, against a vector of
 * ones, each key's sum k; the int32 wraparound of the terms is harmless since the exact result
 * fits (255^2 * 32768 < 2^31). Channels past the last block of eight go through the plain
 * integer sum, so every variant computes the same exact int32 sums (bit-exact by construction). */
#include "kernels/npu/npu_ukernels.h"

#if defined(__aarch64__) && NPU_NEON_DOTPROD_VARIANTS /* npu_ukernels.h */

#include <assert.h>

#include "kernels/npu/fixedpoint.h"
#include "kernels/npu/neon_util.h"

/* Lane l of the result: sum over the hd channels of (q - zq) . (k_l - zk) for the 'nk' (1..4, a
 * constant after inlining) keys at k0, k0 + kv_cols, ... (0 past nk); qsum8 = sum of q over the
 * channels of whole 8-byte blocks (hd8 of them). */
static inline __attribute__((always_inline)) NPU_TARGET_DOTPROD int32x4_t
dots(const int nk, const int8_t *qt, const int8_t *k0, size_t kv_cols, int32_t hd, int32_t hd8,
     int32_t qsum8, int32_t zq, int32_t zk) {
  const int8x16_t ones = vdupq_n_s8(1);
  int32x4_t qk[4], ks[4];
  for (int l = 0; l < 4; l++) qk[l] = ks[l] = vdupq_n_s32(0);
  int32_t i = 0;
  for (; i + 16 <= hd8; i += 16) {
    const int8x16_t qv = vld1q_s8(qt + i);
    for (int l = 0; l < nk; l++) {
      const int8x16_t kv = vld1q_s8(k0 + (size_t)l * kv_cols + (size_t)i);
      qk[l] = vdotq_s32(qk[l], qv, kv);
      ks[l] = vdotq_s32(ks[l], ones, kv);
    }
  }
  if (i < hd8) { /* one block of 8 */
    const int8x16_t qv = vcombine_s8(vld1_s8(qt + i), vdup_n_s8(0));
    for (int l = 0; l < nk; l++) {
      const int8x16_t kv = vcombine_s8(vld1_s8(k0 + (size_t)l * kv_cols + (size_t)i), vdup_n_s8(0));
      qk[l] = vdotq_s32(qk[l], qv, kv);
      ks[l] = vdotq_s32(ks[l], ones, kv);
    }
  }
  int32_t rest[4] = {0, 0, 0, 0};
  for (i = hd8; i < hd; i++)
    for (int l = 0; l < nk; l++) rest[l] += (qt[i] - zq) * (k0[(size_t)l * kv_cols + i] - zk);
  const int32x4_t sqk = vpaddq_s32(vpaddq_s32(qk[0], qk[1]), vpaddq_s32(qk[2], qk[3]));
  const int32x4_t sk = vpaddq_s32(vpaddq_s32(ks[0], ks[1]), vpaddq_s32(ks[2], ks[3]));
  /* sum q k - zq sum k + (n zq zk - zk sum q) + rest, in wrapping int32 lanes */
  const int32_t c =
      (int32_t)((uint32_t)hd8 * (uint32_t)zq * (uint32_t)zk - (uint32_t)zk * (uint32_t)qsum8);
  return vaddq_s32(vaddq_s32(vmlsq_n_s32(sqk, sk, zq), vdupq_n_s32(c)), vld1q_s32(rest));
}

NPU_TARGET_DOTPROD void npu_qs8_qk_qs16__neondot(const struct npu_attn_shape *restrict shape,
                                                 const int8_t *restrict q, const int8_t *restrict k,
                                                 int16_t *restrict s,
                                                 const struct npu_qs8_qk_params *restrict p) {
  const int32_t heads = shape->heads, hd = shape->head_dim, rows = shape->rows, ctx = shape->ctx;
  const int32_t group = heads / shape->kv_heads, hd8 = hd / 8 * 8;
  const size_t q_cols = (size_t)heads * (size_t)hd, kv_cols = (size_t)shape->kv_heads * (size_t)hd;
  assert(heads % shape->kv_heads == 0 && hd >= 1 && hd <= 32768);
  assert(shape->n_valid >= 1 && shape->n_valid <= rows && shape->pos0 + shape->n_valid <= ctx);
  const int32_t zq = p->q_zero_point, zk = p->k_zero_point;
  const int32x4_t zs = vdupq_n_s32(p->s_zero_point);
  const int16x8_t masked = vdupq_n_s16(NPU_ATTN_MASKED);
  const struct npu_neon_rq rq = npu_neon_rq_make1(p->mult, p->shift);
  for (int32_t h = 0; h < heads; h++) {
    const int8_t *kh = k + (size_t)(h / group) * (size_t)hd;
    for (int32_t t = 0; t < rows; t++) {
      const int8_t *qt = q + (size_t)t * q_cols + (size_t)h * (size_t)hd;
      int16_t *row = s + ((size_t)h * (size_t)rows + (size_t)t) * (size_t)ctx;
      const int32_t len = npu_attn_len_of(shape, t);
      int32_t qsum8 = 0;
      for (int32_t i = 0; i < hd8; i++) qsum8 += qt[i];
      int32_t j = 0;
      for (; j + 4 <= len; j += 4) {
        const int32x4_t acc =
            dots(4, qt, kh + (size_t)j * kv_cols, kv_cols, hd, hd8, qsum8, zq, zk);
        const int32x4_t y = npu_neon_add_zp(npu_neon_requantize(acc, &rq), zs);
        vst1_s16(row + j, vqmovn_s32(y));
      }
      for (; j < len; j++) {
        const int32x4_t acc =
            dots(1, qt, kh + (size_t)j * kv_cols, kv_cols, hd, hd8, qsum8, zq, zk);
        row[j] = npu_requantize_s16(vgetq_lane_s32(acc, 0), p->mult, p->shift, p->s_zero_point);
      }
      for (; j + 8 <= ctx; j += 8) vst1q_s16(row + j, masked);
      for (; j < ctx; j++) row[j] = NPU_ATTN_MASKED;
    }
  }
}

#endif /* __aarch64__ && NPU_NEON_DOTPROD_VARIANTS */
