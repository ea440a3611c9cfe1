/* npu_dequantize_s16__scalar: int16 codes back to floats, one at a time (cpu_ukernels.h). */
#include "kernels/cpu/cpu_ukernels.h"

void npu_dequantize_s16__scalar(const int16_t *restrict q, size_t n, float scale,
                                int32_t zero_point, float *restrict x_out) {
  for (size_t i = 0; i < n; i++) x_out[i] = scale * (float)(q[i] - zero_point);
}
