/* npu_qs8_vmul__scalar, npu_qs16_vmul__scalar: element-wise product with requantization. */
#include <assert.h>

#include "kernels/npu/fixedpoint.h"
#include "kernels/npu/npu_ukernels.h"

void npu_qs8_vmul__scalar(size_t n, const int8_t *a, const int8_t *b, int8_t *y,
                          const struct npu_qmul_params *restrict p) {
  assert(p->a_zero_point >= INT8_MIN && p->a_zero_point <= INT8_MAX);
  assert(p->b_zero_point >= INT8_MIN && p->b_zero_point <= INT8_MAX);
  for (size_t i = 0; i < n; i++)
    y[i] = npu_requantize_s8((a[i] - p->a_zero_point) * (b[i] - p->b_zero_point), p->y_mult,
                             p->y_shift, p->y_zero_point);
}

void npu_qs16_vmul__scalar(size_t n, const int16_t *a, const int16_t *b, int16_t *y,
                           const struct npu_qmul_params *restrict p) {
  assert(p->a_zero_point == 0 && p->b_zero_point == 0);
  for (size_t i = 0; i < n; i++)
    y[i] = npu_requantize_s16(a[i] * b[i], p->y_mult, p->y_shift, p->y_zero_point);
}
