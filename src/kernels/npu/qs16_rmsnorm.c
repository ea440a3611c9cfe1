/* npu_qs16_rmsnorm_qs8__scalar: RMSNorm of int16 rows into int8, the definition of ukernels.h
 * spelled out one element at a time. */
#include <assert.h>

#include "kernels/npu/fixedpoint.h"
#include "kernels/npu/ukernels.h"

void npu_qs16_rmsnorm_qs8__scalar(size_t rows, size_t cols, const int16_t *restrict x,
                                  int8_t *restrict y,
                                  const struct npu_qs16_rmsnorm_params *restrict params) {
  assert(cols >= 1 && cols <= (size_t)NPU_QS16_RMSNORM_MAX_COLS);
  assert(params->eps >= 1 && params->eps <= ((int64_t)1 << 62));
  assert(params->shift >= -16 && params->shift <= 46);
  assert(params->y_zero_point >= INT8_MIN && params->y_zero_point <= INT8_MAX);
  for (size_t t = 0; t < rows; t++) {
    const int16_t *xt = x + t * cols;
    int8_t *yt = y + t * cols;
    int64_t v = params->eps;
    for (size_t c = 0; c < cols; c++) v += (int64_t)xt[c] * xt[c];
    int32_t e;
    const int64_t r = npu_rsqrt_q61(v, &e);
    const int32_t s = 77 - e - params->shift;
    for (size_t c = 0; c < cols; c++) {
      /* past a shift of 62 every |u * mult| < 2^62 rounds to 0 */
      yt[c] = s > 62 ? (int8_t)params->y_zero_point
                     : npu_rmsnorm_elem(xt[c], r, s, params->mult[c], params->y_zero_point);
    }
  }
}
