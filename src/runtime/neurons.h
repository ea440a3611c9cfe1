/* Weights under a memory budget (a model opened with npulm_open_params.mem_budget): which weights
 * stay in memory, which are read from the program file at every use, and the neuron cache
 * through which sparse decode reads the FFN's bundles (PowerInfer-2's hot/cold split).
 *
 * Policy, for a budget B:
 * - the weights every step reads in full (attention, norms, the classifier, the predictors; the
 *   token embedding is read a row at a time and never counted) stay in memory, smallest first,
 *   while they fit in 90 % of B: a decode step reads all of them, every step; the others are
 *   "streamed": read through the mapping when used, with the next one's readahead started, and
 *   let go of (process and page cache) right after;
 * - the FFN's dense weights (read by prefill only) are streamed;
 * - the rest of B, less the largest streamed weight (in memory while it is used), is the neuron
 *   cache, of S bundle slots (a neuron's gate row, up row and down column): each of the L layers
 *   keeps r = (S - n_ff) / (L - 1) of its neurons resident (all, if S holds every layer), and the
 *   n_ff - r others are a scratch that any layer's step uses for the misses it does not keep (so
 *   S >= n_ff, one layer's neurons, is the minimum). A layer's resident slots start with the
 *   neurons that the most calibration inputs kept (npu_sparse_layer.freq); the first 3/4 of them
 *   are pinned (hot), the rest is a window over recent use (LLM in a flash's windowing): each
 *   neuron has a history of the layer's last 8 steps (bit set if it was kept), and a miss takes
 *   the window slot of the least kept of the 8 after the layer's clock hand (not used in this
 *   step) if it was kept more often itself (strictly), else a scratch slot;
 * - reads are two-phase (PowerInfer-2): a step's candidates that miss have their gate rows read
 *   first; of those the thresholds keep, the up rows and down columns (a window slot that holds
 *   only its gate row is completed when its neuron is kept). Reads go to an I/O thread with preadv
 *   (adjacent neurons of a cluster in one call per part), their pages dropped from the page cache
 *   after, while the step computes with the neurons already in memory. */
#ifndef NPU_RUNTIME_NEURONS_H
#define NPU_RUNTIME_NEURONS_H

#include <stdbool.h>
#include <stdint.h>

#include "backends/sparse_ffn.h"
#include "npulm.h"

struct npulm_model;
struct npu_residency;

/* Plan the residency of 'model''s program (loaded under m->mem_budget, not placed): which sites
 * stream (out: n_qsites flags, owned by the residency) and the neuron cache, its hot neurons read
 * now. NPULM_ERR_ARG if the budget cannot hold the neuron cache's minimum. */
npulm_status npu_residency_create(const struct npulm_model *model, struct npu_residency **out,
                                  npulm_error *err);
void npu_residency_free(struct npu_residency *r); /* accepts NULL */

/* The sites to let go of after each use (n_qsites flags, 1 = streamed). */
const uint8_t *npu_residency_streamed(const struct npu_residency *r);

/* The bundle source of sparse decode over the neuron cache. */
struct npu_bundle_source npu_residency_source(struct npu_residency *r);

void npu_residency_stats(const struct npu_residency *r, npulm_memory_stats *out);
void npu_residency_reset_stats(struct npu_residency *r);

#endif /* NPU_RUNTIME_NEURONS_H */
