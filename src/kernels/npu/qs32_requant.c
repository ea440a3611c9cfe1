/* npu_qs32_requant_qs8__scalar, npu_qs32_requant_qs16__scalar: requantize int32 values, one
 * (mult, shift) per element, with fixedpoint.h's definition. */
#include "kernels/npu/fixedpoint.h"
#include "kernels/npu/npu_ukernels.h"

void npu_qs32_requant_qs8__scalar(size_t n, const int32_t *restrict acc,
                                  const int32_t *restrict mult, const int32_t *restrict shift,
                                  int32_t zero_point, int8_t *restrict y) {
  for (size_t i = 0; i < n; i++) y[i] = npu_requantize_s8(acc[i], mult[i], shift[i], zero_point);
}

void npu_qs32_requant_qs16__scalar(size_t n, const int32_t *restrict acc,
                                   const int32_t *restrict mult, const int32_t *restrict shift,
                                   int32_t zero_point, int16_t *restrict y) {
  for (size_t i = 0; i < n; i++) y[i] = npu_requantize_s16(acc[i], mult[i], shift[i], zero_point);
}
