/* Runtime choice of the NPU microkernel variants by CPU features, driven by ukernels.inc. */
#include "npu/ukernels.h"

#include <string.h>

uint32_t npu_isa_detect(void) {
  uint32_t isa = 0;
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    isa |= NPU_ISA_AVX2;
  if ((isa & NPU_ISA_AVX2) && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vnni"))
    isa |= NPU_ISA_AVX512VNNI;
#elif defined(__aarch64__)
  isa |= NPU_ISA_NEON;
#endif
  return isa;
}

void npu_ukernels_select(uint32_t isa, struct npu_ukernels *uk_out) {
#define NPU_UKERNEL(family, variant, need)                                                         \
  if (((need) & ~isa) == 0)                                                                        \
    uk_out->family = npu_##family##__##variant;
#include "npu/ukernels.inc"
#undef NPU_UKERNEL
}

const char *npu_ukernels_variant(const struct npu_ukernels *uk, const char *family) {
#define NPU_UKERNEL(fam, variant, need)                                                            \
  if (strcmp(family, #fam) == 0 && uk->fam == npu_##fam##__##variant)                              \
    return #variant;
#include "npu/ukernels.inc"
#undef NPU_UKERNEL
  return "?";
}
