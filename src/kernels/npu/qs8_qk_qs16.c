/* npu_qs8_qk_qs16__scalar: attention scores Q·K^T of int8 queries and an int8 K cache, requantized
 * to int16, with the causal / bucket mask (npu_ukernels.h). */
#include <assert.h>

#include "kernels/npu/fixedpoint.h"
#include "kernels/npu/npu_ukernels.h"

void npu_qs8_qk_qs16__scalar(const struct npu_attn_shape *restrict shape, const int8_t *restrict q,
                             const int8_t *restrict k, int16_t *restrict s,
                             const struct npu_qs8_qk_params *restrict p) {
  const int32_t heads = shape->heads, hd = shape->head_dim, rows = shape->rows, ctx = shape->ctx;
  const int32_t group = heads / shape->kv_heads;
  const size_t q_cols = (size_t)heads * (size_t)hd, kv_cols = (size_t)shape->kv_heads * (size_t)hd;
  assert(heads % shape->kv_heads == 0 && hd >= 1 && hd <= 32768);
  assert(shape->n_valid >= 1 && shape->n_valid <= rows && shape->pos0 + shape->n_valid <= ctx);
  for (int32_t h = 0; h < heads; h++) {
    const int8_t *kh = k + (size_t)(h / group) * (size_t)hd;
    for (int32_t t = 0; t < rows; t++) {
      const int8_t *qt = q + (size_t)t * q_cols + (size_t)h * (size_t)hd;
      int16_t *row = s + ((size_t)h * (size_t)rows + (size_t)t) * (size_t)ctx;
      const int32_t len = npu_attn_len_of(shape, t);
      for (int32_t j = 0; j < len; j++) {
        const int8_t *kj = kh + (size_t)j * kv_cols;
        int32_t acc = 0;
        for (int32_t i = 0; i < hd; i++)
          acc += (qt[i] - p->q_zero_point) * (kj[i] - p->k_zero_point);
        row[j] = npu_requantize_s16(acc, p->mult, p->shift, p->s_zero_point);
      }
      for (int32_t j = len; j < ctx; j++) row[j] = NPU_ATTN_MASKED;
    }
  }
}
