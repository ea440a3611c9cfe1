/* npu_qs8_gather__scalar, npu_qs8_gather_qs16__scalar: rows of an int8 table (embeddings), each
 * requantized from its own scale into the output's. */
#include <assert.h>

#include "kernels/npu/fixedpoint.h"
#include "kernels/npu/npu_ukernels.h"

void npu_qs8_gather__scalar(size_t n_ids, const int32_t *restrict ids, size_t n_rows, size_t cols,
                            const int8_t *restrict table, int8_t *restrict y, size_t y_stride,
                            const struct npu_qs8_gather_params *restrict p) {
  for (size_t t = 0; t < n_ids; t++) {
    assert(ids[t] >= 0 && (size_t)ids[t] < n_rows);
    const size_t r = (size_t)ids[t];
    const int8_t *row = table + r * cols;
    for (size_t c = 0; c < cols; c++)
      y[t * y_stride + c] = npu_requantize_s8(row[c], p->mult[r], p->shift[r], p->y_zero_point);
  }
  (void)n_rows;
}

void npu_qs8_gather_qs16__scalar(size_t n_ids, const int32_t *restrict ids, size_t n_rows,
                                 size_t cols, const int8_t *restrict table, int16_t *restrict y,
                                 size_t y_stride, const struct npu_qs8_gather_params *restrict p) {
  for (size_t t = 0; t < n_ids; t++) {
    assert(ids[t] >= 0 && (size_t)ids[t] < n_rows);
    const size_t r = (size_t)ids[t];
    const int8_t *row = table + r * cols;
    for (size_t c = 0; c < cols; c++)
      y[t * y_stride + c] = npu_requantize_s16(row[c], p->mult[r], p->shift[r], p->y_zero_point);
  }
  (void)n_rows;
}
