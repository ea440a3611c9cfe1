/* The CPU's side of a transfer between the backends: float activations to the NPU's int8/int16
 * ones and back, with a tensor's per-tensor scale and zero point. */
#ifndef NPULM_CPU_CONVERT_H
#define NPULM_CPU_CONVERT_H

#include <stddef.h>
#include <stdint.h>

/* q = sat(round(x / scale) + zero_point), rounding half away from zero (NaN -> zero_point, +-inf
 * saturate), and back: x = scale * (q - zero_point). scale > 0; zero_point within the integer
 * type's range. Each uses AVX2 when the CPU has it, with the bits of the plain loop. */
void npu_quantize_s8(const float *x, size_t n, float scale, int32_t zero_point, int8_t *q_out);
void npu_quantize_s16(const float *x, size_t n, float scale, int32_t zero_point, int16_t *q_out);
void npu_dequantize_s8(const int8_t *q, size_t n, float scale, int32_t zero_point, float *x_out);
void npu_dequantize_s16(const int16_t *q, size_t n, float scale, int32_t zero_point, float *x_out);

/* The plain loops behind them, for tests. */
void npu_quantize_s8__generic(const float *x, size_t n, float scale, int32_t zero_point,
                              int8_t *q_out);
void npu_quantize_s16__generic(const float *x, size_t n, float scale, int32_t zero_point,
                               int16_t *q_out);
void npu_dequantize_s8__generic(const int8_t *q, size_t n, float scale, int32_t zero_point,
                                float *x_out);
void npu_dequantize_s16__generic(const int16_t *q, size_t n, float scale, int32_t zero_point,
                                 float *x_out);

#endif
