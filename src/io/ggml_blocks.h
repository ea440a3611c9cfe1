/* ggml's tensor types: one table row per type (name, values per block, bytes per block, the
 * dequantizer to F32 of the types npulm reads and the quantizer from F32 of the types it writes),
 * the half-precision conversions, one dequantizer per block format, bit for bit as llama.cpp's
 * dequantize_row_* (ggml-quants.c), and quantizers bit for bit as its quantize_row_*_ref. */
#ifndef NPU_IO_GGML_BLOCKS_H
#define NPU_IO_GGML_BLOCKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Tensor types npulm reads (ggml numbering); the others are named in errors only. */
enum npu_ggml_type {
  NPU_GGML_F32 = 0,
  NPU_GGML_F16 = 1,
  NPU_GGML_Q4_0 = 2,
  NPU_GGML_Q4_1 = 3,
  NPU_GGML_Q5_0 = 6,
  NPU_GGML_Q5_1 = 7,
  NPU_GGML_Q8_0 = 8,
  NPU_GGML_Q2_K = 10,
  NPU_GGML_Q3_K = 11,
  NPU_GGML_Q4_K = 12,
  NPU_GGML_Q5_K = 13,
  NPU_GGML_Q6_K = 14,
  NPU_GGML_IQ4_NL = 20,
  NPU_GGML_IQ4_XS = 23,
  NPU_GGML_BF16 = 30,
  NPU_GGML_TQ1_0 = 34,
  NPU_GGML_TQ2_0 = 35,
};
#define NPU_Q8_0_BLOCK 32 /* values per Q8_0 block: one f16 scale + 32 int8 */
#define NPU_Q8_0_BLOCK_BYTES (2 + NPU_Q8_0_BLOCK)
#define NPU_QK_K 256 /* values per K-quant (and IQ4_XS, TQ*) super-block */

/* Dequantize 'n_blocks' whole blocks at 'src' (n_blocks * block bytes, any alignment) to
 * n_blocks * block floats at 'dst', in ggml order. */
typedef void (*npu_ggml_to_f32_fn)(const uint8_t *restrict src, float *restrict dst,
                                   size_t n_blocks);

/* Quantize 'n_blocks' whole blocks of floats at 'src' (n_blocks * block floats, in ggml order) to
 * n_blocks * block bytes at 'dst' (any alignment). Non-finite inputs are the caller's problem. */
typedef void (*npu_ggml_from_f32_fn)(const float *restrict src, uint8_t *restrict dst,
                                     size_t n_blocks);

/* ggml's name for a tensor type ("F32", "Q4_K", ...), or NULL for an unknown id. */
const char *npu_ggml_type_name(uint32_t type);
/* Values per block and bytes per block of a ggml tensor type; false for an unknown id. */
bool npu_ggml_type_size(uint32_t type, uint32_t *block_out, uint32_t *nbytes_out);
/* The dequantizer of 'type', or NULL for a type npulm does not read (or an unknown id). */
npu_ggml_to_f32_fn npu_ggml_type_to_f32(uint32_t type);
/* The names of the types npulm reads, comma-separated in id order ("F32, F16, Q4_0, ..."), into
 * 'buf' of 'cap' bytes (NUL-terminated; truncated at a whole name if short; 160 bytes hold all). */
void npu_ggml_readable_types(char *buf, size_t cap);
/* The quantizer of 'type', or NULL for a type npulm does not write (or an unknown id). */
npu_ggml_from_f32_fn npu_ggml_type_from_f32(uint32_t type);
/* The names of the types npulm writes, as npu_ggml_readable_types ("F32, F16, Q4_0, ..."). */
void npu_ggml_writable_types(char *buf, size_t cap);

/* IEEE half and bfloat16 conversions (exact; f32 -> f16 rounds to nearest even). */
float npu_f16_to_f32(uint16_t h);
uint16_t npu_f32_to_f16(float f);
float npu_bf16_to_f32(uint16_t h);

/* One dequantizer per type (the table's entries; tests may call them directly). */
void npu_ggml_f32_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks);
void npu_ggml_f16_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks);
void npu_ggml_bf16_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks);
void npu_ggml_q4_0_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks);
void npu_ggml_q4_1_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks);
void npu_ggml_q5_0_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks);
void npu_ggml_q5_1_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks);
void npu_ggml_q8_0_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks);
void npu_ggml_q2_k_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks);
void npu_ggml_q3_k_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks);
void npu_ggml_q4_k_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks);
void npu_ggml_q5_k_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks);
void npu_ggml_q6_k_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks);
void npu_ggml_iq4_nl_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks);
void npu_ggml_iq4_xs_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks);
void npu_ggml_tq1_0_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks);
void npu_ggml_tq2_0_to_f32(const uint8_t *restrict src, float *restrict dst, size_t n_blocks);

/* One quantizer per type npulm writes (the table's entries). Each computes with the same float
 * operations in the same order as llama.cpp's reference (ggml-quants.c, ggml.c), which
 * llama-quantize uses without an importance matrix, so the bytes match llama.cpp's bit for bit
 * (tests/test_dequant.c quantizes the golden F32 model and compares with llama-quantize's files).
 * F16: round to nearest even (ggml_fp32_to_fp16_row). BF16: round to nearest even, a NaN kept
 * quiet (ggml_fp32_to_bf16_row_ref). Q4_0: d = (the value of largest magnitude, with its sign) /
 * -8, q = min(15, trunc(x * (1/d) + 8.5)). Q8_0: d = max|x| / 127, q = roundf(x * (1/d)). A block
 * of zeros has all q at the zero point and d = 0 (-0 in Q4_0: 0 / -8). Q4_K and Q6_K:
 * quantize_row_q4_K_ref and quantize_row_q6_K_ref, searches for each sub-block's scale (and min),
 * described at the code. */
void npu_ggml_f32_from_f32(const float *restrict src, uint8_t *restrict dst, size_t n_blocks);
void npu_ggml_f16_from_f32(const float *restrict src, uint8_t *restrict dst, size_t n_blocks);
void npu_ggml_bf16_from_f32(const float *restrict src, uint8_t *restrict dst, size_t n_blocks);
void npu_ggml_q4_0_from_f32(const float *restrict src, uint8_t *restrict dst, size_t n_blocks);
void npu_ggml_q8_0_from_f32(const float *restrict src, uint8_t *restrict dst, size_t n_blocks);
void npu_ggml_q4_k_from_f32(const float *restrict src, uint8_t *restrict dst, size_t n_blocks);
void npu_ggml_q6_k_from_f32(const float *restrict src, uint8_t *restrict dst, size_t n_blocks);

#endif /* NPU_IO_GGML_BLOCKS_H */
