/* npu_quantize_s16__scalar: float activations to int16 codes, one at a time (cpu_ukernels.h). */
#include "kernels/cpu/convert_util.h"

void npu_quantize_s16__scalar(const float *restrict x, size_t n, float scale, int32_t zero_point,
                              int16_t *restrict q_out) {
  for (size_t i = 0; i < n; i++)
    q_out[i] = (int16_t)npu_quantize_one(x[i], scale, zero_point, INT16_MIN, INT16_MAX);
}
