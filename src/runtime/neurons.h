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
 * - the rest of B, less room for two of the largest streamed weights (one in use, the next read
 *   ahead), is the neuron cache. It holds a neuron's parts apart: its gate row (kp bytes), read
 *   whenever the neuron is a candidate, and its pair, up row and down column (2 kp), read when
 *   the thresholds keep it. Calibration counts how often each neuron was kept
 *   (npu_sparse_layer.freq); a candidate is kept at most as often, so per byte a gate row is worth
 *   at least twice its own pair. The cache holds, over all layers, the parts of highest worth per
 *   byte (gate rows at 2 freq, pairs at freq, merged; ties: the gate row) while they fit beside a
 *   scratch of max(64, n_ff / 16) gate rows and as many pairs (less where a layer has fewer parts
 *   out of memory), which takes a step's other misses, in rounds when they outnumber it (so the
 *   scratch is the minimum budget);
 * - of the pairs held, the 3/4 most kept are pinned (hot); the other 1/4 is a window over recent
 *   use (LLM in a flash's windowing), shared by the layers: each neuron has a history of its
 *   layer's last 8 steps (bit set if it was kept), and a kept neuron whose pair misses takes the
 *   window slot of the least kept of the 8 after the window's clock hand (not used in this round)
 *   if it was kept more often itself (strictly), else a scratch slot;
 * - reads are two-phase (PowerInfer-2): a step's candidates that miss have their gate rows read
 *   first; of those the thresholds keep, the pairs that miss. Four I/O threads read them while
 *   the step computes with the neurons already in memory. The file holds a layer's gate rows
 *   together and its pairs together, each in calibration's order, most kept first
 *   (program/sparse_data.h): the misses are the least kept, near each other at the end. By
 *   default with O_DIRECT (a second open of the file, where its file system allows: the page
 *   cache neither serves nor holds them), each request the span from one miss to the next ones
 *   of the same layer and part while the bytes between are at most 24 KiB and the span 128 KiB,
 *   widened to the block size; with npulm_open_params.buffered_io, one pread per run of adjacent
 *   parts, dropped from the page cache after. */
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

/* The bytes the I/O threads' buffers take of a budget, for sparse data 'sp'. */
uint64_t npu_residency_io_bytes(const struct npu_sparse *sp);

/* The sites to let go of after each use (n_qsites flags, 1 = streamed). */
const uint8_t *npu_residency_streamed(const struct npu_residency *r);

/* The bundle source of sparse decode over the neuron cache. */
struct npu_bundle_source npu_residency_source(struct npu_residency *r);

void npu_residency_stats(const struct npu_residency *r, npulm_memory_stats *out);
void npu_residency_reset_stats(struct npu_residency *r);

#endif /* NPU_RUNTIME_NEURONS_H */
