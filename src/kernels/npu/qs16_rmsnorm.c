/* npu_qs16_rmsnorm_qs8__scalar and npu_qs16_rmsnorm_qs16__scalar: RMSNorm of int16 rows into int8
 * or int16, the definition of npu_ukernels.h spelled out one element at a time. */
#include <assert.h>

#include "kernels/npu/fixedpoint.h"
#include "kernels/npu/npu_ukernels.h"

/* Both output types; 'y16' non-NULL selects int16. */
static void rmsnorm_scalar(size_t rows, size_t cols, const int16_t *restrict x, int8_t *restrict y8,
                           int16_t *restrict y16,
                           const struct npu_qs16_rmsnorm_params *restrict params) {
  const int32_t zp = params->y_zero_point;
  assert(cols >= 1 && cols <= (size_t)NPU_QS16_RMSNORM_MAX_COLS);
  assert(params->eps >= 1 && params->eps <= ((int64_t)1 << 62));
  assert(params->shift >= -16 && params->shift <= 46);
  assert(y16 != NULL ? zp >= INT16_MIN && zp <= INT16_MAX : zp >= INT8_MIN && zp <= INT8_MAX);
  for (size_t t = 0; t < rows; t++) {
    const int16_t *xt = x + t * cols;
    int64_t v = params->eps;
    for (size_t c = 0; c < cols; c++) v += (int64_t)xt[c] * xt[c];
    int32_t e;
    const int64_t r = npu_rsqrt_q61(v, &e);
    const int32_t s = 77 - e - params->shift;
    for (size_t c = 0; c < cols; c++) {
      /* past a shift of 62 every |u * mult| < 2^62 rounds to 0 */
      if (y16 != NULL)
        y16[t * cols + c] =
            s > 62 ? (int16_t)zp : npu_rmsnorm_elem_s16(xt[c], r, s, params->mult[c], zp);
      else
        y8[t * cols + c] = s > 62 ? (int8_t)zp : npu_rmsnorm_elem(xt[c], r, s, params->mult[c], zp);
    }
  }
}

void npu_qs16_rmsnorm_qs8__scalar(size_t rows, size_t cols, const int16_t *restrict x,
                                  int8_t *restrict y,
                                  const struct npu_qs16_rmsnorm_params *restrict params) {
  rmsnorm_scalar(rows, cols, x, y, NULL, params);
}

void npu_qs16_rmsnorm_qs16__scalar(size_t rows, size_t cols, const int16_t *restrict x,
                                   int16_t *restrict y,
                                   const struct npu_qs16_rmsnorm_params *restrict params) {
  rmsnorm_scalar(rows, cols, x, NULL, y, params);
}
