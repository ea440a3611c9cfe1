/* The sparse FFN of a decode step (program/sparse_data.h): in a decode graph of a program with
 * sparse data, the nodes of a layer's FFN from its gate and up matmuls to its down matmul run as
 * one step that computes only the neurons the predictor and the thresholds pick, reading their
 * bundles; its output is bit for bit the dense FFN's with the other neurons' products at their
 * zero point (tests/test_sparse.c). Integer-only, on the NPU backend's threads. */
#ifndef NPU_BACKENDS_SPARSE_FFN_H
#define NPU_BACKENDS_SPARSE_FFN_H

#include <stdbool.h>
#include <stdint.h>

#include "ir/ir.h"
#include "program/sparse_data.h"

struct npu_pool;

enum npu_sparse_mode {
  NPU_SPARSE_OFF,     /* dense decode */
  NPU_SPARSE_PREDICT, /* the predictor's candidates, then the thresholds */
  NPU_SPARSE_EXACT,   /* every neuron a candidate: the thresholds on the exact gate (the bound a
                         predictor is judged against; reads every gate row) */
};

/* What of a layer step's neurons a bundle source's get asks for: its candidates' gate rows (in
 * rounds: the first, and then the next ones for those a round did not take), then of a round's
 * candidates the ones the thresholds kept, their up rows and down columns too. */
enum npu_bundle_parts { NPU_BUNDLE_GATE, NPU_BUNDLE_GATE_NEXT, NPU_BUNDLE_REST };

/* Where the neurons' weights are (the program's resident data by default; a neuron cache under a
 * memory budget). 'get' takes the first *n_given of 'ids' (all of them for NPU_BUNDLE_REST, for
 * which 'ids' are some of the round's) and sets gates[i] to where neuron ids[i]'s gate row of
 * layer 'layer' is or will be (for NPU_BUNDLE_REST: its up row, followed by its down column,
 * kp bytes each: program/sparse_data.h), reordering 'ids' so that those whose 'parts' are already
 * in memory come first, then the others it took, then those left for the next round; it returns the
 * number of the first. The others taken are being read, and are there once 'wait' returns (NULL:
 * all are always there). What a round got stays until the next gate get. */
struct npu_bundle_source {
  void *user;
  size_t (*get)(void *user, int32_t layer, enum npu_bundle_parts parts, int32_t *ids, size_t n,
                const int8_t **gates, size_t *n_given);
  void (*wait)(void *user);
};

/* Counts over the sparse steps run (one per layer and decode step). */
struct npu_sparse_stats {
  uint64_t layer_steps;
  uint64_t neurons;    /* neurons of those layers */
  uint64_t candidates; /* the predictor's picks */
  uint64_t kept;       /* computed in full (up and down) */
  /* audit: |SiLU(gate)| of the neurons kept, and of those the thresholds keep on the exact gate
   * of every neuron: their ratio is the predictor's recall */
  double kept_mass, exact_mass;
  double predict_s, ffn_s; /* time in the predictor, and in the rest */
};

struct npu_sparse_run;

/* Prepare sparse decode of program 'p' (p->sparse not NULL) in 'mode' (not OFF) for graphs of
 * width 'dim'; with 'audit', every step also computes every neuron's exact gate to measure the
 * predictor's recall (slower: for measurement). Checks that every decode graph's FFN is as sparse
 * decode replaces it. */
npulm_status npu_sparse_run_create(const struct npu_program *p, enum npu_sparse_mode mode,
                                   bool audit, struct npu_sparse_run **out, npulm_error *err);
void npu_sparse_run_free(struct npu_sparse_run *r); /* accepts NULL */

/* Read the bundles from 'src' instead of the program's resident data. */
void npu_sparse_run_set_source(struct npu_sparse_run *r, const struct npu_bundle_source *src);

/* If node 'first' of decode graph 'g' (before 'end', the end of its subgraph) starts a layer's
 * FFN (its gate and up matmuls), the number of nodes the sparse step replaces (through the down
 * matmul); else 0. */
int32_t npu_sparse_span(const struct npu_sparse_run *r, const struct npu_graph *g, int32_t first,
                        int32_t end);

/* Run the sparse FFN that replaces nodes 'first' .. 'first + count - 1' of 'g' (as
 * npu_sparse_span counted them) on the threads of 'pool'. */
void npu_sparse_ffn_exec(struct npu_sparse_run *r, const struct npu_graph *g, int32_t first,
                         int32_t count, struct npu_pool *pool, uint8_t *const arena[NPU_BE_COUNT]);

void npu_sparse_get_stats(const struct npu_sparse_run *r, struct npu_sparse_stats *out);
void npu_sparse_reset_stats(struct npu_sparse_run *r);

#endif /* NPU_BACKENDS_SPARSE_FFN_H */
