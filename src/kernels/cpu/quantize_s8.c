/* npu_quantize_s8__scalar: float activations to int8 codes, one at a time (cpu_ukernels.h). */
#include "kernels/cpu/convert_util.h"

void npu_quantize_s8__scalar(const float *restrict x, size_t n, float scale, int32_t zero_point,
                             int8_t *restrict q_out) {
  for (size_t i = 0; i < n; i++)
    q_out[i] = (int8_t)npu_quantize_one(x[i], scale, zero_point, INT8_MIN, INT8_MAX);
}
