/* The graph executor: runs the nodes of one subgraph of a compiled graph for one step, given
 * where that step's memory is. It never allocates and cannot fail: the graph was validated when
 * it was compiled or loaded, and the session checks the step (tokens, positions) before it runs.
 * Also here: how a session cuts n tokens into steps, each served by one specialization. */
#ifndef NPU_BACKENDS_EXEC_H
#define NPU_BACKENDS_EXEC_H

#include <stdatomic.h>
#include <stdint.h>

#include "kernels/cpu/cpu_ukernels.h"
#include "model/model.h"
#include "program/program.h"

struct npu_pool;
struct npu_sparse_run;
struct npu_input_run;
struct npu_gguf;

/* Where node time goes (a session's params.profile): per backend and op, the wall time inside its
 * nodes, their number, and the multiply-accumulates and weight bytes they do, which the workers
 * add as they go (relaxed atomics: the two workers may finish nodes of one op at once). */
struct npu_profile {
  _Atomic uint64_t ns[NPU_BE_COUNT][NPU_OP_COUNT];
  _Atomic uint64_t calls[NPU_BE_COUNT][NPU_OP_COUNT];
  _Atomic uint64_t macs[NPU_BE_COUNT][NPU_OP_COUNT];
  _Atomic uint64_t bytes[NPU_BE_COUNT][NPU_OP_COUNT];
};

/* Row r of a batch step (npulm_session_eval_batch): the decode token of a sequence of its own. */
struct npu_batch_row {
  int32_t pos;                      /* its cache position */
  float *const *k_cache;            /* (n_layers) its sequence's caches */
  float *const *v_cache;            /* */
  const float *rope_cos, *rope_sin; /* tables covering 'pos' */
};

/* Everything one step of one graph reads and writes, apart from the graph itself. */
struct npu_exec_ctx {
  const struct npu_program *prog; /* weights: WEIGHT tensor 'ref' is prog->weights[ref].data */
  const struct npu_config *cfg;
  const struct npu_cpu_ukernels *cpu_uk; /* the float kernels chosen for this CPU */
  const int32_t *ids;           /* (g->rows) token ids, the padded rows holding any valid id */
  int32_t pos0;                 /* cache position of row 0 */
  int32_t n_valid;              /* rows 0 .. n_valid-1 are real tokens; the rest are padding */
  uint8_t *arena[NPU_BE_COUNT]; /* ACT tensor t lives at arena[t.backend] + t.offset */
  float *const *k_cache; /* (n_layers) K rows of each layer, row stride n_kv_heads * head_dim */
  float *const *v_cache; /* (n_layers) V rows, same layout */
  float *logits;         /* (g->rows, n_vocab) the step's output */
  const float *rope_cos; /* (positions, rope_dim / 2): must cover pos0 + g->rows - 1 */
  const float *rope_sin;
  struct npu_pool *pool[NPU_BE_COUNT]; /* each backend's threads (NULL: its worker alone) */
  /* Room for a decode step's attention split by keys across threads: npu_f32_attention_tiles'
   * results for every tile of the step's keys (see npu_exec_attn_part_floats) */
  float *attn_part;
  /* Called after every node when not NULL (error attribution): sees the node's output. */
  void (*observe)(void *user, const struct npu_graph *g, int32_t node,
                  const struct npu_exec_ctx *ctx);
  void *observe_user;
  struct npu_profile *profile; /* NULL: not profiling */
  /* sparse decode (NULL: dense): in a decode graph each layer's FFN runs as one sparse step */
  struct npu_sparse_run *sparse;
  /* input-sparse decode (NULL: none): a decode step's sparsified matmul groups read only the
   * weights of the input channels they keep, and every decode matmul's bytes are counted */
  struct npu_input_run *input_sparse;
  /* under a memory budget (NULL: none): the sites whose packed weights are read from the file
   * at each use (prog->n_qsites flags): the next one's readahead is started as a matmul of one
   * begins, and its pages let go of (process and page cache) when it ends */
  const uint8_t *streamed;
  const struct npu_gguf *file;
  /* A batch step (NULL: the rows are the consecutive tokens of one sequence at pos0): real row
   * r < n_valid is batch[r]'s token, and RoPE, the KV writes and attention (which must be the fused
   * ATTN) use its position and caches; pos0, k_cache, v_cache and the rope tables are unused. A
   * padded row repeats the last real row's attention and writes nothing. */
  const struct npu_batch_row *batch;
};

/* The floats ctx->attn_part must hold for decode steps over up to 'n_ctx' cache positions. */
size_t npu_exec_attn_part_floats(const struct npu_config *cfg, int32_t n_ctx);

/* Run nodes sg->first .. sg->first + sg->count - 1 of 'g' in order. */
void npu_exec_subgraph(const struct npu_graph *g, const struct npu_subgraph *sg,
                       const struct npu_exec_ctx *ctx);

/* Run every subgraph of 'g' in order on the calling thread. */
void npu_exec_graph(const struct npu_graph *g, const struct npu_exec_ctx *ctx);

/* One step of an evaluation: graph 'g' on tokens row0 .. row0 + n_valid - 1 of the call, at cache
 * positions pos0 .. pos0 + n_valid - 1. */
struct npu_step {
  const struct npu_graph *g;
  int32_t row0;
  int32_t pos0;
  int32_t n_valid;
};

/* Cut 'n' tokens starting at cache position 'pos' into steps: while at least the largest chunk
 * remains, take it; a single remaining token takes the decode graph; otherwise the smallest chunk
 * that holds the rest, padded. Each step uses the smallest context bucket that holds its last
 * token, and with 'last_logits' a graph that computes only the last real row's logits where the
 * program has one. Writes at most 'n' steps (no step is empty) and returns their number, or -1 if
 * the program has no graph for some step (then nothing is to be run). */
int32_t npu_exec_plan_steps(const struct npu_program *p, int32_t pos, int32_t n, bool last_logits,
                            struct npu_step *steps_out);

#endif /* NPU_BACKENDS_EXEC_H */
