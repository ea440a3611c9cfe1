/* npu_qs8_vadd__scalar, npu_qs16_vadd__scalar: element-wise add of two tensors with different
 * scales and zero points, TFLite's integer scheme (npu_ukernels.h), on fixedpoint.h. */
#include <assert.h>

#include "kernels/npu/fixedpoint.h"
#include "kernels/npu/npu_ukernels.h"

static inline int32_t add_one(int32_t a, int32_t b, const struct npu_qadd_params *restrict p) {
  const int32_t ta =
      npu_requantize((a - p->a_zero_point) * (1 << p->left_shift), p->a_mult, p->a_shift);
  const int32_t tb =
      npu_requantize((b - p->b_zero_point) * (1 << p->left_shift), p->b_mult, p->b_shift);
  return npu_requantize(ta + tb, p->y_mult, p->y_shift);
}

/* The input multipliers must be at most 0.5 (npu_ukernels.h). */
static inline bool input_mult_ok(int32_t mult, int32_t shift) {
  return shift <= -1 || (shift == 0 && mult <= (1 << 30));
}

static void check_params(const struct npu_qadd_params *p) {
  assert(p->left_shift >= 0 && p->left_shift <= 22);
  assert(input_mult_ok(p->a_mult, p->a_shift) && input_mult_ok(p->b_mult, p->b_shift));
  (void)p;
}

void npu_qs8_vadd__scalar(size_t n, const int8_t *a, const int8_t *b, int8_t *y,
                          const struct npu_qadd_params *restrict params) {
  check_params(params);
  assert(params->y_zero_point >= INT8_MIN && params->y_zero_point <= INT8_MAX);
  for (size_t i = 0; i < n; i++)
    y[i] = (int8_t)npu_clamp_i64((int64_t)add_one(a[i], b[i], params) + params->y_zero_point,
                                 INT8_MIN, INT8_MAX);
}

void npu_qs16_vadd__scalar(size_t n, const int16_t *a, const int16_t *b, int16_t *y,
                           const struct npu_qadd_params *restrict params) {
  check_params(params);
  assert(params->left_shift <= 14);
  assert(params->y_zero_point >= INT16_MIN && params->y_zero_point <= INT16_MAX);
  for (size_t i = 0; i < n; i++)
    y[i] = (int16_t)npu_clamp_i64((int64_t)add_one(a[i], b[i], params) + params->y_zero_point,
                                  INT16_MIN, INT16_MAX);
}
