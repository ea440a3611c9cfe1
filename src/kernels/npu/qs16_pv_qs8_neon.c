/* npu_qs16_pv_qs8__neon: attention output with 16-bit multiply-accumulates. For 16 channels (then
 * 8) at a time, each key's V row loses its zero point in int16 (vsubl_s8: |v - zero_point| <=
 * 255) and vmlal_n_s16 adds its exact int32 products with the key's probability; the accumulators
 * stay in registers over the row, then are requantized on 4 lanes. Channels past the last block
 * of eight use the scalar sum; the int32 sums are exact, so the result is bit-exact with
 * npu_qs16_pv_qs8__scalar. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__aarch64__)

#include <assert.h>

#include "kernels/npu/fixedpoint.h"
#include "kernels/npu/neon_util.h"

void npu_qs16_pv_qs8__neon(const struct npu_attn_shape *restrict shape, const int16_t *restrict p,
                           const int8_t *restrict v, int8_t *restrict out,
                           const struct npu_qs16_pv_params *restrict params) {
  const int32_t heads = shape->heads, hd = shape->head_dim, rows = shape->rows;
  const int32_t group = heads / shape->kv_heads;
  const size_t q_cols = (size_t)heads * (size_t)hd, kv_cols = (size_t)shape->kv_heads * (size_t)hd;
  assert(heads % shape->kv_heads == 0 && hd >= 1);
  assert(shape->n_valid >= 1 && shape->n_valid <= rows &&
         shape->pos0 + shape->n_valid <= shape->ctx);
  const int8x16_t zv = vdupq_n_s8((int8_t)params->v_zero_point);
  const int32x4_t zy = vdupq_n_s32(params->y_zero_point);
  const struct npu_neon_rq rq = npu_neon_rq_make1(params->mult, params->shift);
  for (int32_t t = 0; t < rows; t++) {
    const int32_t len = npu_attn_len_of(shape, t);
    for (int32_t h = 0; h < heads; h++) {
      const int16_t *pr = p + ((size_t)h * (size_t)rows + (size_t)t) * (size_t)shape->ctx;
      const int8_t *vh = v + (size_t)(h / group) * (size_t)hd;
      int8_t *o = out + (size_t)t * q_cols + (size_t)h * (size_t)hd;
      int32_t i0 = 0;
      for (; i0 + 16 <= hd; i0 += 16) {
        int32x4_t a0 = vdupq_n_s32(0), a1 = a0, a2 = a0, a3 = a0;
        for (int32_t j = 0; j < len; j++) {
          const int8x16_t vj = vld1q_s8(vh + (size_t)j * kv_cols + (size_t)i0);
          const int16x8_t lo = vsubl_s8(vget_low_s8(vj), vget_low_s8(zv));
          const int16x8_t hi = vsubl_high_s8(vj, zv);
          const int16_t pj = pr[j];
          a0 = vmlal_n_s16(a0, vget_low_s16(lo), pj);
          a1 = vmlal_high_n_s16(a1, lo, pj);
          a2 = vmlal_n_s16(a2, vget_low_s16(hi), pj);
          a3 = vmlal_high_n_s16(a3, hi, pj);
        }
        vst1q_s8(o + i0, npu_neon_narrow_s8(npu_neon_add_zp(npu_neon_requantize(a0, &rq), zy),
                                            npu_neon_add_zp(npu_neon_requantize(a1, &rq), zy),
                                            npu_neon_add_zp(npu_neon_requantize(a2, &rq), zy),
                                            npu_neon_add_zp(npu_neon_requantize(a3, &rq), zy)));
      }
      if (i0 + 8 <= hd) {
        int32x4_t a0 = vdupq_n_s32(0), a1 = a0;
        for (int32_t j = 0; j < len; j++) {
          const int16x8_t vj =
              vsubl_s8(vld1_s8(vh + (size_t)j * kv_cols + (size_t)i0), vget_low_s8(zv));
          a0 = vmlal_n_s16(a0, vget_low_s16(vj), pr[j]);
          a1 = vmlal_high_n_s16(a1, vj, pr[j]);
        }
        vst1_s8(o + i0, npu_neon_narrow8_s8(npu_neon_add_zp(npu_neon_requantize(a0, &rq), zy),
                                            npu_neon_add_zp(npu_neon_requantize(a1, &rq), zy)));
        i0 += 8;
      }
      for (int32_t i = i0; i < hd; i++) {
        int32_t acc = 0;
        for (int32_t j = 0; j < len; j++)
          acc += pr[j] * (vh[(size_t)j * kv_cols + (size_t)i] - params->v_zero_point);
        o[i] = npu_requantize_s8(acc, params->mult, params->shift, params->y_zero_point);
      }
    }
  }
}

#endif /* __aarch64__ */
