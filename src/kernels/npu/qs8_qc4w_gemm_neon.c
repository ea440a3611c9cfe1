/* npu_qs8_qc4w_gemm__neon and npu_qs8_qc4w_gemm_qs16__neon: the w4a8 GEMM on baseline Advanced
 * SIMD: each qc4w nibble pair is decoded into the two int8 groups it holds (vandq_u8 / vshrq_n_u8
 * 4, minus 8) and goes through the int8 kernel's tile (npu_neon_gemm_tile_mlal, 2 rows x 16
 * channels). Bit-exact with npu_qs8_qc4w_gemm__scalar: the same exact int32 sums. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__aarch64__)

#include "kernels/npu/qs8_gemm_neon.h"

NPU_QS8_GEMM_NEON_ENTRY(npu_qs8_qc4w_gemm__neon, int8_t, , npu_neon_gemm_tile_mlal, 2, 1, 0)
NPU_QS8_GEMM_NEON_ENTRY(npu_qs8_qc4w_gemm_qs16__neon, int16_t, , npu_neon_gemm_tile_mlal, 2, 1, 1)

#endif /* __aarch64__ */
