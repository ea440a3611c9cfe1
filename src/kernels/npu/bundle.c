/* npu_bundle_kp and the plain-C references of the sparse-decode kernels,
 * npu_qs8_cols_down__scalar and npu_qs8_rows_dot__scalar: the definitions of npu_ukernels.h written
 * out, one bundle or row and one column at a time. Every SIMD variant is held to their bits
 * (tests/test_npu_kernels.c). */
#include <assert.h>

#include "kernels/npu/npu_ukernels.h"

size_t npu_bundle_kp(size_t k) {
  return (k + NPU_BUNDLE_ALIGN - 1) / NPU_BUNDLE_ALIGN * NPU_BUNDLE_ALIGN;
}

void npu_qs8_cols_down__scalar(size_t k, size_t count, const int8_t *const *cols,
                               const int32_t *coef, int32_t *acc) {
  assert(count <= NPU_BUNDLE_DOWN_MAX_COUNT);
  for (size_t i = 0; i < count; i++) {
    const int8_t *down = cols[i];
    const int32_t cf = coef[i];
    assert(cf >= -255 && cf <= 255);
    for (size_t c = 0; c < k; c++) acc[c] += cf * down[c];
  }
}

void npu_qs8_rows_dot__scalar(size_t k, const int8_t *x, int32_t x_zero_point, size_t count,
                              const int8_t *const *rows, int32_t *acc) {
  assert(k >= 1 && k <= NPU_BUNDLE_MAX_K);
  assert(x_zero_point >= INT8_MIN && x_zero_point <= INT8_MAX);
  for (size_t i = 0; i < count; i++) {
    const int8_t *w = rows[i];
    int32_t s = 0; /* |sum| <= 32768 * 255 * 127 < 2^30 */
    for (size_t c = 0; c < k; c++) s += (x[c] - x_zero_point) * w[c];
    acc[i] = s;
  }
}
