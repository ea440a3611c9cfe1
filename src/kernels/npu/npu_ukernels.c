/* Runtime choice of the NPU microkernel variants by CPU features, driven by npu_ukernels.inc. */
#include "kernels/npu/npu_ukernels.h"

#include <string.h>

void npu_ukernels_select(uint32_t isa, struct npu_ukernels *uk_out) {
#define NPU_UKERNEL(family, variant, need)                                                         \
  if (((need) & ~isa) == 0) uk_out->family = npu_##family##__##variant;
#include "kernels/npu/npu_ukernels.inc"
#undef NPU_UKERNEL
}

const char *npu_ukernels_variant(const struct npu_ukernels *uk, const char *family) {
#define NPU_UKERNEL(fam, variant, need)                                                            \
  if (strcmp(family, #fam) == 0 && uk->fam == npu_##fam##__##variant) return #variant;
#include "kernels/npu/npu_ukernels.inc"
#undef NPU_UKERNEL
  return "?";
}
