/* Predicted sparse decode (PowerInfer-2, training-free): per layer, a low-rank predictor of the
 * FFN gate and thresholds on |SiLU(gate)| that pick the neurons a decode step computes, and the
 * neurons' weights as bundles (gate row, up row, down column) so that a step reads few runs.
 *
 * The selection of a decode step, layer L, FFN input x (the int8 output of its FFN norm):
 *   1. candidates: the predictor's estimate of each neuron's gate value, p = A (B (x - zx)) in
 *      int8 x int8 GEMMs (B [rank, dim], A [n_ff, rank], requantized through an int8 middle),
 *      against the candidate bounds: p >= cand_hi, or cand_lo_a <= p <= cand_lo_b (SiLU's
 *      negative lobe). A neuron the predictor misses is not computed.
 *   2. the gate of each candidate is computed exactly (its int32 accumulator, as the dense GEMM
 *      forms it); it is kept if its value passes the layer's thresholds (the same intervals for
 *      |SiLU(g)| >= tau): the skipped neurons are those with the smallest |SiLU(gate)|, as with
 *      the exact gate, less those the predictor missed.
 *   3. the kept neurons' up rows and down columns are read: the product SiLU(gate) * up of the
 *      others is taken as zero, which in the int8 domain is the down input's zero point, so the
 *      result is bit for bit the dense FFN with those products set to their zero point.
 * Gate values are in units of the gate output's int8 step (its scale): v = acc * M_j with M_j =
 * mult_j * 2^(shift_j - 31), the requantization of the dense gate GEMM; the predictor's output is
 * int16 in units of 1/256 of that step.
 *
 * All is built at compile time (compiler/sparsify.h). */
#ifndef NPU_PROGRAM_SPARSE_DATA_H
#define NPU_PROGRAM_SPARSE_DATA_H

#include <stdbool.h>
#include <stdint.h>

#include "program/program.h"

struct npu_sparse_layer {
  int32_t n_ff, rank; /* rank 0: no predictor (every neuron a candidate), and the four NULL */
  /* the predictor: packed int8 GEMM weights (npu_qs8_gemm_pack) of B [rank, dim] (input the FFN
   * norm output, int8 output of zero point 0) and A [n_ff, rank] (int16 output, units 1/256 of
   * the gate's step), their per-channel multipliers and shifts (rank + n_ff each: B's, then A's) */
  void *pred_b, *pred_a;
  int32_t *mult, *shift;
  int32_t cand_hi, cand_lo_a, cand_lo_b; /* candidate bounds on the predictor's int16 output */
  float hi, lo_a, lo_b; /* kept: gate value v >= hi or lo_a <= v <= lo_b (v in gate steps) */
  /* calibration figures, for inspect: the share of neurons the thresholds keep, of candidates,
   * and the candidates' recall (kept |SiLU| mass covered) */
  float keep, cand, recall;
  /* the neurons' gate rows, up rows and down columns (npu_sparse_gate_at, npu_sparse_pair_at):
   * int8, zero-padded from dim to kp = npu_bundle_kp(dim) */
  int8_t *bundles;
  int32_t *place; /* (n_ff) each neuron's place in 'bundles' (npu_sparse_places) */
  /* (2 n_ff) each neuron's gate and up bias as the dense GEMMs add them, less the FFN input's
   * zero point times the row's weight sum: bias + sum x w (qs8_rows_dot at zero point 0, its
   * fast path) is the dense GEMM's accumulator bias + sum (x - zx) w */
  int32_t *bias;
  uint32_t *freq; /* (n_ff) how many calibration inputs kept each neuron: the hot ones first */
};

/* A layer's bundles: the gate rows of its n_ff neurons (kp bytes each), then their pairs, each an
 * up row followed by its down column (2 kp), both in the neurons' places: by calibration's kept
 * count, most kept first (npu_sparse_places). A step reads the gate rows of its candidates, then
 * the pairs of those the thresholds keep: under a memory budget the neurons not in memory are
 * the least kept, whose parts lie together at the end of each half, and a kept neuron's pair is
 * one read. */
static inline size_t npu_sparse_gate_at(size_t kp, int32_t place) { return (size_t)place * kp; }
static inline size_t npu_sparse_pair_at(size_t kp, int32_t n_ff, int32_t place) {
  return ((size_t)n_ff + 2 * (size_t)place) * kp;
}

/* The places of a layer's neurons by their kept counts 'freq' (n_ff): most kept first, ties in
 * index order, into 'place' (n_ff); false if out of memory. The loader derives them as the
 * compiler did, so that a file's layout follows from its checksummed counts. */
bool npu_sparse_places(const uint32_t *freq, int32_t n_ff, int32_t *place);

/* The levels --sparsity auto tries, largest first. */
#define NPU_SPARSE_AUTO_LEVELS 4
static const float npu_sparse_auto_levels[NPU_SPARSE_AUTO_LEVELS] = {0.7f, 0.5f, 0.3f, 0.15f};

struct npu_sparse {
  float level; /* the share of neurons the thresholds skip on the calibration inputs */
  /* --sparsity auto: the decode perplexity on the calibration text at each level tried over
   * dense's (0: not tried) */
  float auto_ratio[NPU_SPARSE_AUTO_LEVELS];
  int32_t n_layers, dim, kp;
  struct npu_sparse_layer *layers;
  /* true when the arrays point into a program file's mapping (not to be freed) */
  bool mapped;
  /* where npu_sparse_place put the bundles and predictors (huge pages), or NULL */
  uint8_t *arena;
  size_t arena_size;
  bool bundles_placed; /* the bundles too (else only the predictors) */
};

/* Move every layer's predictor weights, and with 'bundles' its bundles, into one block of huge
 * pages (as the dense weights are, npu_quant_place_packed), letting go of the file mapping's
 * pages or the heap copies as it goes: held in memory, not in page cache the kernel may reclaim
 * (under a memory budget the bundles stay in the file, for the neuron cache). */
npulm_status npu_sparse_place(struct npu_sparse *s, bool bundles, npulm_error *err);

/* Bytes of one layer's bundles and of its predictor (packed weights and multipliers). */
uint64_t npu_sparse_bundle_bytes(const struct npu_sparse *s, int32_t layer);
uint64_t npu_sparse_predictor_bytes(const struct npu_sparse *s, int32_t layer);

/* The sites of layer 'layer''s gate, up, SiLU, product and down of program 'p' (NULL if any is
 * missing or not of the kind sparse decode needs: int8 weights per channel, int8 activations). */
struct npu_sparse_sites {
  const struct npu_qsite *gate, *up, *silu, *mul, *down;
  float gate_scale; /* the gate output's scale */
};
npulm_status npu_sparse_sites_of(const struct npu_program *p, int32_t layer,
                                 struct npu_sparse_sites *out, npulm_error *err);

/* Under a memory budget of 'budget' bytes, which matmul sites of 'p' are read from the file at
 * each use ('streamed_out[i]' = 1, n_qsites flags) rather than held in memory: the layers' dense
 * FFN (prefill's: sparse decode reads the bundles), and of the weights every decode step reads
 * whole (attention, classifier), those beyond 90 % of the budget when held smallest first after
 * the predictors. Returns the bytes held (predictors included). */
uint64_t npu_sparse_streamed(const struct npu_program *p, uint64_t budget, uint8_t *streamed_out);

void npu_sparse_free(struct npu_sparse *s); /* accepts NULL */

/* ---- Input-sparse decode (TEAL, training-free) ------------------------------------------------
 * The other sparse form: a decode step thresholds the integer input of each of a layer's matmuls
 * (q, k, v on the attention norm's output, o on the attention's, gate and up on the FFN norm's,
 * down on the product SiLU(gate) x up, which is computed exactly before it: CATS's magnitudes) by
 * magnitude, d = x[c] - x_zero_point (0 for int16 inputs), and reads only the weights of the
 * channels with |d| >= the site's skip_below: the product is bit for bit the dense matmul's with
 * the skipped inputs at their zero point. Thresholds are integers in the input's units, one per
 * matmul (the same for the matmuls of one input), chosen at compile time so that each skips the
 * same share of its input channels on the calibration text (--sparsity S); shadow outlier
 * channels are never skipped. The classifier stays dense. The runtime keeps a channel-major copy
 * of each sparsified matmul's weights (backends/sparse_input.h), so that a kept channel is one
 * contiguous run of bytes. */

/* The levels input-sparse --sparsity auto tries, largest first. */
static const float npu_input_auto_levels[NPU_INPUT_AUTO_LEVELS] = {0.5f, 0.4f, 0.25f, 0.1f};

/* Whether program 'p' decodes input-sparse (some matmul site has a threshold). */
bool npu_program_input_sparse(const struct npu_program *p);

#endif /* NPU_PROGRAM_SPARSE_DATA_H */
