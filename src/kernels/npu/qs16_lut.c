/* npu_qs16_lut__scalar: the piecewise-linear int16 lookup of npu_ukernels.h, one element at a time.
 */
#include "kernels/npu/npu_ukernels.h"

void npu_qs16_lut__scalar(size_t n, const int16_t *x, int16_t *y, const int16_t *restrict table) {
  for (size_t j = 0; j < n; j++) {
    const int32_t u = x[j] + 32768, i = u >> 7, f = u & 127;
    const int32_t d = table[i + 1] - table[i];
    /* arithmetic shift of a negative int32: as in fixedpoint.h */
    y[j] = (int16_t)(table[i] + ((d * f + 64) >> 7));
  }
}
