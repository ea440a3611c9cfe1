/* The rotation table of RoPE (kernels.h) and npu_f32_rope__scalar, the reference's rotation of
 * each pair (cpu_ukernels.h). */
#include <math.h>

#include "kernels/cpu/f32_util.h"

void npu_f32_rope_table(float *restrict cos_out, float *restrict sin_out, int32_t n_pos,
                        const struct npu_config *c, const float *restrict freq_factors) {
  int32_t half = c->rope_dim / 2;
  for (int32_t i = 0; i < half; i++) {
    float freq = powf(c->rope_base, -2.0f * (float)i / (float)c->rope_dim);
    if (freq_factors != NULL) freq /= freq_factors[i];
    for (int32_t pos = 0; pos < n_pos; pos++) {
      float angle = (float)pos * freq;
      cos_out[(size_t)pos * (size_t)half + (size_t)i] = cosf(angle);
      sin_out[(size_t)pos * (size_t)half + (size_t)i] = sinf(angle);
    }
  }
}

/* One head: the reference's rotation of every pair. */
static void rope_head(float *restrict o, const float *restrict v, const float *restrict cs,
                      const float *restrict sn, int32_t half, bool norm) {
  rope_pairs(o, v, cs, sn, 0, half, norm);
}

void npu_f32_rope__scalar(float *restrict out, const float *restrict x,
                          const float *restrict cos_tab, const float *restrict sin_tab,
                          const struct npu_config *c, int32_t rows, int32_t heads, int32_t pos0) {
  rope_rows(out, x, cos_tab, sin_tab, c, rows, heads, pos0, rope_head);
}
