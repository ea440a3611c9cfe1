/* The quantization modes' names and properties (see quant_mode.h). */
#include "program/quant_mode.h"

#include <string.h>

#include "ir/ir.h"
#include "kernels/npu/npu_ukernels.h"

static const char *const precision_names[NPU_PREC_COUNT] = {"w8a8", "w8a16", "w4a16", "w4a16-block",
                                                            "w4a8"};

const char *npu_quant_mode_name(enum npu_quant_mode mode) {
  static const char *const names[NPU_QUANT_MODE_COUNT] = {"f32",
                                                          "w8a8-naive",
                                                          "w8a8-shadow",
                                                          "w8a8-smooth",
                                                          "w8a16-naive",
                                                          "w8a16-shadow",
                                                          "w8a16-smooth",
                                                          "w4a16-naive",
                                                          "w4a16-shadow",
                                                          "w4a16-smooth",
                                                          "w4a16-block-naive",
                                                          "w4a16-block-shadow",
                                                          "w4a16-block-smooth",
                                                          "w4a8-naive",
                                                          "w4a8-shadow",
                                                          "w4a8-smooth"};
  return (unsigned)mode < NPU_QUANT_MODE_COUNT ? names[mode] : "?";
}

int npu_quant_mode_parse(const char *name) {
  for (int i = 0; i < NPU_QUANT_MODE_COUNT; i++) {
    if (strcmp(name, npu_quant_mode_name((enum npu_quant_mode)i)) == 0) return i;
  }
  for (int i = 0; i < NPU_PREC_COUNT; i++) {
    if (strcmp(name, precision_names[i]) == 0) {
      return npu_quant_mode_of((enum npu_precision)i, NPU_OUTLIERS_NAIVE);
    }
  }
  return -1;
}

int npu_quant_weight_bits(enum npu_quant_mode mode) {
  const enum npu_precision p = npu_quant_precision(mode);
  return p == NPU_PREC_W8A8 || p == NPU_PREC_W8A16 ? 8 : 4;
}

int npu_quant_act_bits(enum npu_quant_mode mode) {
  const enum npu_precision p = npu_quant_precision(mode);
  return p == NPU_PREC_W8A8 || p == NPU_PREC_W4A8 ? 8 : 16;
}

int npu_quant_weight_block(enum npu_quant_mode mode) {
  return npu_quant_precision(mode) == NPU_PREC_W4A16_BLOCK ? NPU_QC4W_BLOCK : 0;
}

uint32_t npu_quant_float_ops(enum npu_quant_mode mode, uint32_t float_ops) {
  return mode != NPU_QUANT_F32 && npu_quant_outliers(mode) == NPU_OUTLIERS_SHADOW
             ? float_ops | 1u << NPU_OP_RMSNORM
             : float_ops;
}

const char *npu_smooth_group_name(enum npu_smooth_group g) {
  static const char *const names[NPU_SMOOTH_GROUPS] = {"qkv", "gate_up", "down", "out"};
  return (unsigned)g < NPU_SMOOTH_GROUPS ? names[g] : "?";
}
