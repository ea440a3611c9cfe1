/* npu_compile(): one graph per specialization (decode and each prefill chunk size, times each
 * context bucket), each built, partitioned, planned and validated. */
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "compiler/compiler.h"
#include "compiler/quantize.h"

/* Bytes of the distinct weights (a tied output shares the embedding's, and its name). */
static uint64_t weight_bytes(const struct npu_weight *w, int32_t n) {
  uint64_t total = 0;
  for (int32_t i = 0; i < n; i++) {
    bool seen = w[i].data == NULL && !w[i].deferred;
    for (int32_t j = 0; j < i && !seen; j++) seen = strcmp(w[j].name, w[i].name) == 0;
    if (!seen) total += (uint64_t)w[i].ne0 * (uint64_t)w[i].ne1 * sizeof(float);
  }
  return total;
}

npulm_status npu_compile(const struct npulm_model *m, const struct npu_compile_options *o,
                         npulm_phase_progress_fn progress, void *user, struct npu_program **out,
                         npulm_error *err) {
  *out = NULL;
  const struct npu_config *c = &m->cfg;
  npulm_status st = npu_config_check_weights(c, err);
  if (st == NPULM_OK) st = npu_model_check_float(m, "compiling", err);
  if (st == NPULM_OK) st = npu_compile_check_options(c, o, err);
  if (st != NPULM_OK) return st;
  struct npu_program *p = calloc(1, sizeof(*p));
  if (p == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  p->opts = *o;
  int32_t max_graphs = (1 + 2 * o->n_chunks) * o->n_buckets;
  p->graphs = calloc((size_t)max_graphs, sizeof(*p->graphs));
  if (p->graphs == NULL) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
    goto fail;
  }
  if ((st = npu_weight_table(m, &p->weights, &p->n_weights, err)) != NPULM_OK) goto fail;
  /* decode, then each chunk twice: with the logits of every row (scoring a text) and of the last
   * row only (generating) */
  uint64_t n_graphs = 0;
  for (int32_t r = -1; r < 2 * o->n_chunks; r++) {
    for (int32_t b = 0; b < o->n_buckets; b++)
      n_graphs += o->buckets[b] >= (r < 0 ? 1 : o->chunks[r / 2]);
  }
  if (progress != NULL) progress(user, "graphs", "graphs", 0, n_graphs);
  for (int32_t r = -1; r < 2 * o->n_chunks; r++) {
    int32_t rows = r < 0 ? 1 : o->chunks[r / 2];
    bool last_logits = r >= 0 && r % 2 == 1;
    for (int32_t b = 0; b < o->n_buckets; b++) {
      if (o->buckets[b] < rows) continue; /* a chunk larger than the context serves nothing */
      struct npu_graph *g = &p->graphs[p->n_graphs];
      if ((st = npu_build_graph(m, p->weights, p->n_weights, rows, o->buckets[b], o->float_ops,
                                last_logits, g, err)) ||
          (st = npu_partition(g, o->float_ops, err)) || (st = npu_plan(g, err)) ||
          (st = npu_ir_validate(g, p->n_weights, c->n_layers, err))) {
        p->n_graphs++; /* freed with the program */
        goto fail;
      }
      p->n_graphs++;
      if (progress != NULL) progress(user, "graphs", "graphs", (uint64_t)p->n_graphs, n_graphs);
    }
  }
  p->weight_bytes = weight_bytes(p->weights, p->n_weights);
  p->kv_bytes = 2ull * (uint64_t)c->n_layers * (uint64_t)o->buckets[o->n_buckets - 1] *
                (uint64_t)(c->n_kv_heads * c->head_dim) * sizeof(float);
  *out = p;
  return NPULM_OK;
fail:
  npu_program_free(p);
  return st;
}
