/* npu_qs8_gemm__neon and npu_qs8_gemm_qs16__neon: int8 GEMM on baseline Advanced SIMD (no dot
 * product), in tiles of 2 rows x 16 channels (16 accumulators of 4 int32), XNNPACK's
 * "mlal + padal" scheme: npu_neon_gemm_tile_mlal of qs8_gemm_neon.h. The raw int8 x enters and the
 * zero point once per channel as bias - x_zero_point * wsum; every int32 sum is exact, so the
 * result is bit-exact with npu_qs8_gemm__scalar. */
#include "kernels/npu/npu_ukernels.h"

#if defined(__aarch64__)

#include "kernels/npu/qs8_gemm_neon.h"

NPU_QS8_GEMM_NEON_ENTRY(npu_qs8_gemm__neon, int8_t, , npu_neon_gemm_tile_mlal, 2, 0, 0)
NPU_QS8_GEMM_NEON_ENTRY(npu_qs8_gemm_qs16__neon, int16_t, , npu_neon_gemm_tile_mlal, 2, 0, 1)

#endif /* __aarch64__ */
