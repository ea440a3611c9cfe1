/* npu_x8_lut__scalar: y[i] = table[x[i] + 128], any int8 -> int8 function. */
#include "kernels/npu/npu_ukernels.h"

void npu_x8_lut__scalar(size_t n, const int8_t *x, int8_t *y, const int8_t *restrict table) {
  for (size_t i = 0; i < n; i++) y[i] = table[x[i] + 128];
}
