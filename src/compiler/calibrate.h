/* Calibration: run the FP32 reference over calibration text and record, for every activation the
 * graphs name, the statistics quantization needs: range, per-channel absolute maxima and a
 * histogram of magnitudes for percentiles. */
#ifndef NPU_COMPILER_CALIBRATE_H
#define NPU_COMPILER_CALIBRATE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/pool.h"
#include "ir/ir.h"
#include "model/model.h"

/* Magnitudes are binned on a log scale: NPU_CALIB_BINS_PER_OCTAVE bins per power of two over
 * [2^NPU_CALIB_MIN_EXP, 2^NPU_CALIB_MAX_EXP); smaller values fall in bin 0, larger in the last. */
#define NPU_CALIB_BINS_PER_OCTAVE 16
#define NPU_CALIB_MIN_EXP (-24)
#define NPU_CALIB_MAX_EXP 24
#define NPU_CALIB_BINS ((NPU_CALIB_MAX_EXP - NPU_CALIB_MIN_EXP) * NPU_CALIB_BINS_PER_OCTAVE)

struct npu_act_stats {
  char name[NPU_IR_NAME_MAX]; /* graph tensor name, e.g. "blk.3.ffn_gate_par" */
  int32_t n_channels;         /* 0 for the attention scores and probabilities ("blk.L.kq",
                                 "blk.L.kq_softmax"), whose length varies with the position */
  uint64_t count;             /* values seen */
  float min, max;
  float *chan_absmax; /* (n_channels), NULL when n_channels is 0 */
  /* (n_channels) sum of the squares of each channel's values, added row after row (so the same
   * for any cut of the rows into blocks); divided by count / n_channels it is E[x_c^2], the
   * diagonal of the calibration Hessian X^T X / rows that weighs a weight's quantization error */
  double *chan_sumsq;
  uint64_t hist[NPU_CALIB_BINS];
};

struct npu_calib {
  int32_t n_stats;
  struct npu_act_stats *stats;
  uint64_t n_tokens;
};

/* A calibration run: the windows of the calibration text (at most 'window' tokens each, every one
 * from an empty KV cache with BOS first if 'bos' >= 0) taken through the FP32 reference a layer
 * at a time: the embedding of all their rows, then each block over all of them, then the head.
 * Between two steps only the residual stream of the rows is kept, so a layer's weights are all
 * that must be in memory while it runs, and the statistics are those of npu_ref_forward token by
 * token (bit for bit: the blocks are npu_ref_block, their matmuls the CPU kernels' float matmul,
 * which has the reference's bits, cut across the threads of 'pool'). */
struct npu_calib_run;

/* 'pool' may be NULL (one thread); it must outlive the run. With 'scores' the run gathers the
 * statistics of the attention scores and probabilities too ("blk.L.kq", "blk.L.kq_softmax": a
 * softmax per head and row, needed only where the NPU computes attention); without, attention
 * runs as the CPU kernels' fused attention, cut across the pool's threads. */
npulm_status npu_calib_run_create(const struct npu_config *cfg, const int32_t *tokens,
                                  size_t n_tokens, int32_t window, int32_t bos, bool scores,
                                  struct npu_pool *pool, struct npu_calib_run **out,
                                  npulm_error *err);
void npu_calib_run_free(struct npu_calib_run *r); /* accepts NULL */

/* The statistics gathered so far (owned by the run). */
const struct npu_calib *npu_calib_run_stats(const struct npu_calib_run *r);

/* Rows [row0, row0 + n_rows) of a weight matrix as floats: at '*rows_out', in 'scratch' (room for
 * n_rows rows) or wherever they already are. */
typedef npulm_status npu_calib_rows_fn(void *user, int64_t row0, int64_t n_rows, float *scratch,
                                       const float **rows_out, npulm_error *err);

/* The first step: each row's token embedding, read from the table by 'embd' ("embd"). */
npulm_status npu_calib_embed(struct npu_calib_run *r, npu_calib_rows_fn *embd, void *user,
                             npulm_error *err);
/* Block 'layer' over every row (its activations, "blk.L.*"); blocks go in order. */
npulm_status npu_calib_layer(struct npu_calib_run *r, const struct npu_layer_weights *lw,
                             const float *rope_freqs, int layer, npulm_error *err);
/* The last step: the output norm ("output_norm") and the logits ("logits"), the classifier
 * read by 'output' a block of rows at a time. */
npulm_status npu_calib_head(struct npu_calib_run *r, const float *output_norm,
                            npu_calib_rows_fn *output, void *user, npulm_error *err);

/* The whole run over model 'm' (its weights all read), scores included: embedding, blocks,
 * head. Progress in layers. */
npulm_status npu_calibrate(const struct npulm_model *m, const int32_t *tokens, size_t n_tokens,
                           int32_t window, int32_t bos, npulm_progress_fn progress, void *user,
                           struct npu_calib **out, npulm_error *err);
void npu_calib_free(struct npu_calib *c); /* accepts NULL */

/* Statistics of the activation 'name', or NULL. */
const struct npu_act_stats *npu_calib_find(const struct npu_calib *c, const char *name);

/* The magnitude below which a fraction 'p' (0..1] of the values fall (an upper bound at the
 * histogram's resolution); p = 1 gives the absolute maximum. */
float npu_calib_percentile(const struct npu_act_stats *s, double p);

/* A built-in calibration text (plain English prose), used when the user gives none. */
extern const char npu_calib_default_text[];

#endif /* NPU_COMPILER_CALIBRATE_H */
