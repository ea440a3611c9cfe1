/* Run-time choice of the CPU's float microkernel variants by CPU features, driven by
 * cpu_ukernels.inc. */
#include "kernels/cpu/cpu_ukernels.h"

#include <string.h>

void npu_cpu_ukernels_select(uint32_t isa, struct npu_cpu_ukernels *uk_out) {
#define CPU_UKERNEL(family, variant, need)                                                         \
  if (((need) & ~isa) == 0) uk_out->family = npu_##family##__##variant;
#include "kernels/cpu/cpu_ukernels.inc"
#undef CPU_UKERNEL
}

const char *npu_cpu_ukernels_variant(const struct npu_cpu_ukernels *uk, const char *family) {
#define CPU_UKERNEL(fam, variant, need)                                                            \
  if (strcmp(family, #fam) == 0 && uk->fam == npu_##fam##__##variant) return #variant;
#include "kernels/cpu/cpu_ukernels.inc"
#undef CPU_UKERNEL
  return "?";
}
