/* SmoothQuant for the quantizer: per input channel factors s divide a matmul's input activation
 * (folded into the op that writes it) and multiply the matmul's weight columns, so that the
 * product is unchanged and the activation's outlier channels shrink before its one per-tensor
 * int8 scale is chosen. Four groups per block, each with its own factors: the inputs of q/k/v
 * (folded into attn_norm), of gate/up (ffn_norm), of down (up's rows) and of the attention output
 * projection (V's rows). */
#ifndef NPU_COMPILER_SMOOTH_H
#define NPU_COMPILER_SMOOTH_H

#include <stdint.h>

#include "compiler/calibrate.h"
#include "compiler/program.h"

/* Smooth block 'l' of program 'p' (compiled from 'm', its block's weights in memory) with the
 * factors s = amax^alpha / wmax^(1-alpha) from the block's statistics in 'cal': the weights it
 * changes become copies the program owns (p->owned). */
npulm_status npu_smooth_layer(const struct npulm_model *m, struct npu_program *p,
                              const struct npu_calib *cal, float alpha, int32_t l,
                              npulm_error *err);

#endif /* NPU_COMPILER_SMOOTH_H */
