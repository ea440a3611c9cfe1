/* Calibration: run the FP32 reference over calibration text and record, for every activation the
 * graphs name, the statistics quantization needs: range, per-channel absolute maxima and a
 * histogram of magnitudes for percentiles. */
#ifndef NPU_COMPILER_CALIBRATE_H
#define NPU_COMPILER_CALIBRATE_H

#include <stdint.h>

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
  uint64_t hist[NPU_CALIB_BINS];
};

struct npu_calib {
  int32_t n_stats;
  struct npu_act_stats *stats;
  uint64_t n_tokens;
};

/* Run the reference over 'tokens' in windows of at most 'window' tokens (each starting a fresh
 * KV cache, with BOS first if 'bos' >= 0) and gather statistics. */
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
