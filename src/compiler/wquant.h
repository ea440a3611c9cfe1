/* Weight quantization that minimises the error of the products, not of the weights: symmetric
 * int8 or int4 per output channel, or int4 in blocks along k whose scales are small integers times
 * the channel's (Qualcomm's LPBQ). A weight's error costs in proportion to how large the input it
 * multiplies is: the output error of row w of a matmul over calibration inputs x_t is
 *     sum_t (x_t . (w - w_q))^2  ~  sum_c E[x_c^2] (w_c - w_q,c)^2
 * keeping the diagonal of the calibration Hessian X^T X (the approximation llama.cpp's imatrix
 * quantization makes), which is what the scales here are chosen to minimise. Compile time only:
 * plain float code, deterministic (the same bits on every machine). */
#ifndef NPU_COMPILER_WQUANT_H
#define NPU_COMPILER_WQUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* How to quantize a matrix's rows. */
struct npu_wquant {
  int bits;         /* 8: values in [-127, 127]; 4: values in [-8, 7] */
  size_t block;     /* 0: one scale per row; else (bits 4) blocks of this many columns, each with
                       an integer scale in [0, 15] times the row's */
  const float *imp; /* (cols) E[x_c^2] of the input channel each column multiplies, or NULL
                       (every column alike) */
  bool search;      /* choose the scales by the weighted error (else the row's maximum) */
};

/* Quantize w [rows, cols] (row r at w + r * cols) as 'how' says: q_out [rows, cols], the rows'
 * scales (real w ~ scale[r] * bscale[r][c / block] * q[r][c]; an all-zero row has scale 0), and
 * for blocks bscale_out [rows, ceil(cols / block)] (else unused, may be NULL). Without search,
 * int8 is absmax / 127 (what npu_quantize_weights_per_channel gives) and int4 absmax / 7; with
 * it, the scale of each row (and each block's integer) minimises the weighted squared error over
 * a grid of clipping ratios, each refined by least squares. Return false if a weight is not
 * finite. */
bool npu_quantize_weights(const float *w, size_t rows, size_t cols, const struct npu_wquant *how,
                          int8_t *q_out, float *scales_out, uint8_t *bscale_out);

#endif /* NPU_COMPILER_WQUANT_H */
