/* npu_qs8_qc4w_gemm__neondot and npu_qs8_qc4w_gemm_qs16__neondot: the w4a8 GEMM with the dot
 * product: each qc4w nibble pair is decoded into the two int8 groups it holds (vandq_u8 /
 * vshrq_n_u8 4, minus 8) and goes through the int8 kernel's sdot tile (npu_neon_gemm_tile_dot,
 * 4 rows x 16 channels). Bit-exact with npu_qs8_qc4w_gemm__scalar: the same exact int32 sums. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__aarch64__) && NPU_NEON_DOTPROD_VARIANTS /* npu_ukernels.h */

#include "kernels/npu/qs8_gemm_neon.h"

NPU_QS8_GEMM_NEON_ENTRY(npu_qs8_qc4w_gemm__neondot, int8_t, NPU_TARGET_DOTPROD,
                        npu_neon_gemm_tile_dot, 4, 1, 0)
NPU_QS8_GEMM_NEON_ENTRY(npu_qs8_qc4w_gemm_qs16__neondot, int16_t, NPU_TARGET_DOTPROD,
                        npu_neon_gemm_tile_dot, 4, 1, 1)

#endif /* __aarch64__ && NPU_NEON_DOTPROD_VARIANTS */
