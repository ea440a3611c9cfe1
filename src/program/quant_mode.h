/* The table of quantization modes a program can be compiled in (its precision and its answer to
 * activation outliers) and the record of its SmoothQuant groups: what the compiler chooses from
 * and what every reader of a program (executor, loader, inspect, export) reads back. */
#ifndef NPU_PROGRAM_QUANT_MODE_H
#define NPU_PROGRAM_QUANT_MODE_H

#include <stdint.h>

/* How a program's NPU computes: a precision (the bits of its weights and of its activations) and
 * an answer to activation outliers, or FP32. Stored in program files as one number: 0 for f32,
 * else 1 + outliers + 3 * precision, so that w8a8's three modes keep the numbers 1, 2, 3 they had
 * before the other precisions came. */
enum npu_precision {
  NPU_PREC_W8A8,  /* int8 weights per output channel, int8 activations (asymmetric) */
  NPU_PREC_W8A16, /* int8 weights per output channel, int16 activations (symmetric) */
  NPU_PREC_W4A16, /* int4 weights per output channel, int16 activations */
  /* int4 weights in blocks of 32 along k, each block's scale an integer 0..15 times its
   * channel's (LPBQ), int16 activations */
  NPU_PREC_W4A16_BLOCK,
  NPU_PREC_W4A8, /* int4 weights per output channel, int8 activations */
  NPU_PREC_COUNT
};

enum npu_outliers { NPU_OUTLIERS_NAIVE, NPU_OUTLIERS_SHADOW, NPU_OUTLIERS_SMOOTH };

enum npu_quant_mode {
  NPU_QUANT_F32,   /* no quantization: the NPU backend computes in FP32 (the static-graph oracle) */
  NPU_QUANT_NAIVE, /* w8a8-naive */
  NPU_QUANT_SHADOW, /* w8a8-shadow */
  NPU_QUANT_SMOOTH, /* w8a8-smooth */
  NPU_QUANT_MODE_COUNT = 1 + 3 * NPU_PREC_COUNT
};

/* The mode of 'prec' with 'outliers'. */
static inline enum npu_quant_mode npu_quant_mode_of(enum npu_precision prec,
                                                    enum npu_outliers outliers) {
  return (enum npu_quant_mode)(1 + (int)outliers + 3 * (int)prec);
}

/* The outlier answer and the precision of an integer mode (not f32). */
static inline enum npu_outliers npu_quant_outliers(enum npu_quant_mode mode) {
  return (enum npu_outliers)(((int)mode - 1) % 3);
}
static inline enum npu_precision npu_quant_precision(enum npu_quant_mode mode) {
  return (enum npu_precision)(((int)mode - 1) / 3);
}

/* Bits of the matmuls' weights (8 or 4) and activations (8 or 16) in integer mode 'mode', and
 * the weights' block along k (0: one scale per output channel). */
int npu_quant_weight_bits(enum npu_quant_mode mode);
int npu_quant_act_bits(enum npu_quant_mode mode);
int npu_quant_weight_block(enum npu_quant_mode mode);

/* "f32", "w8a8-naive", "w8a8-shadow", "w8a8-smooth", "w8a16-naive", ..., "w4a8-smooth". */
const char *npu_quant_mode_name(enum npu_quant_mode mode);

/* The mode named 'name' (as npu_quant_mode_name names it, or a precision alone, "w4a16", for its
 * naive mode), or -1. */
int npu_quant_mode_parse(const char *name);

/* The precision policy (float_ops, bits 1 << enum npu_op) a program quantized in 'mode' must be
 * compiled with: 'float_ops' plus what the mode needs. w8a8-shadow computes its outlier channels
 * on the CPU from the float output of the norm in front of each matmul, so it keeps RMSNORM in
 * float; the other modes need nothing. npu_quantize_program refuses a program compiled without. */
uint32_t npu_quant_float_ops(enum npu_quant_mode mode, uint32_t float_ops);

/* Groups of a block, each with its own factors (and its own alpha when chosen). */
enum npu_smooth_group {
  NPU_SMOOTH_QKV,     /* input of q, k, v (attn_norm's output) */
  NPU_SMOOTH_GATE_UP, /* input of gate, up (ffn_norm's output) */
  NPU_SMOOTH_DOWN,    /* input of down (silu(gate) * up) */
  NPU_SMOOTH_OUT,     /* input of the attention output projection (the attention result) */
  NPU_SMOOTH_GROUPS
};

const char *npu_smooth_group_name(enum npu_smooth_group g);

/* An alpha that asks npu_smooth_choose for the alpha of least predicted error. */
#define NPU_SMOOTH_AUTO (-1.0f)
/* The alpha npu_smooth_choose reports when no smoothing (every factor 1) is predicted best. */
#define NPU_SMOOTH_NONE (-2.0f)

#endif /* NPU_PROGRAM_QUANT_MODE_H */
