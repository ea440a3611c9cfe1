/* Sessions: a model plus the state of one sequence (KV cache, position, last logits). By default a
 * session runs the model's compiled program: each evaluation is cut into steps (prefill chunks,
 * decode), each step runs its specialization's graph subgraph by subgraph on the NPU and CPU
 * worker threads (a lone step on the calling thread, with the NPU's worker lending itself to its
 * loops), and consecutive chunks overlap. Everything a step touches (KV cache, arenas,
 * logits, rope table, step list) is allocated when the session is created: evaluating tokens
 * allocates nothing. With params.reference the session runs the FP32 reference forward instead. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/exec.h"
#include "backends/sparse_ffn.h"
#include "backends/sparse_input.h"
#include "base/common.h"
#include "base/pages.h"
#include "base/pool.h"
#include "kernels/cpu/kernels.h"
#include "model/model.h"
#include "program/program.h"
#include "ref/forward.h"
#include "runtime/neurons.h"
#include "runtime/scheduler.h"
#include "runtime/session_internal.h"

/* Context used when the caller asks for the model's own: capped so that models trained for very
 * long contexts do not allocate gigabytes of KV cache by default. */
#define DEFAULT_CTX_CAP 4096

/* The memory one chunk in flight works in. */
struct slot {
  uint8_t *arena[NPU_BE_COUNT]; /* activations, at the planner's offsets */
  int32_t *ids;                 /* (max_rows) the chunk's token ids, padded */
};

struct npulm_session {
  const struct npulm_model *model;
  bool reference;
  int n_ctx;
  int pos;
  int n_threads;
  float *last_logits; /* (n_vocab) of the last evaluated token */

  /* reference engine */
  struct npu_ref_state ref;

  /* compiled engine */
  struct npu_program *owned_program; /* npu_session_create_owning's, freed with the session */
  const struct npu_program *prog;
  struct npu_cpu_ukernels cpu_uk; /* the float kernels chosen for this CPU */
  int32_t max_rows;
  float *kv; /* (n_layers, 2, n_ctx, kv_dim): K then V of each layer */
  size_t kv_bytes;
  float **k_cache; /* (n_layers) into kv */
  float **v_cache; /* (n_layers) into kv */
  float *rope_cos; /* (n_ctx + max_rows, rope_dim / 2) */
  float *rope_sin;
  float *scratch_logits; /* (max_rows, n_vocab) for steps whose rows do not all go to the caller */
  float *attn_part; /* decode attention's per-tile results (npu_exec_ctx); one attention runs at a
                       time: they are CPU nodes, and the CPU's worker runs one task at a time */
  size_t scratch_bytes;
  struct slot slots[NPU_SCHED_SLOTS];
  size_t arena_bytes[NPU_BE_COUNT];     /* of each slot's arena of each backend */
  struct npu_step *steps;               /* (n_ctx) the steps of the evaluation in progress */
  const struct npu_graph **step_graphs; /* (n_ctx) */
  double *costs;       /* measured seconds of every subgraph of every graph (scheduler's) */
  int32_t *cost_off;   /* (n_graphs) where each graph's durations start in 'costs' */
  double **step_costs; /* (n_ctx) each step's graph's durations */
  struct npu_sched *sched;
  /* each backend's data-parallel loops: its worker, the other worker while it waits, and for the
   * NPU's matmuls n_threads - 2 helpers */
  struct npu_pool *pools[NPU_BE_COUNT];
  /* the evaluation in progress: read by the workers */
  const int32_t *tokens;
  float *logits_out;
  int32_t n_steps;
  /* a batch step in progress (npulm_session_eval_batch) run by this session: each row's sequence
   * (batch_rows, max_rows of them) and session, which receives the row's logits */
  struct npu_batch_row *batch_rows;
  npulm_session *const *batch_members;
  int32_t batch_n; /* 0: no batch step */
  /* error attribution (npu_session_observe) */
  npu_node_observer observe;
  void *observe_user;
  enum npu_sparse_mode sparse_mode;
  bool sparse_audit;
  struct npu_sparse_run *sparse;      /* sparse decode, or NULL */
  struct npu_input_run *input_sparse; /* input-sparse decode, or NULL */
  uint64_t input_sparse_bytes;        /* its channel-major weights */
  struct npu_residency *residency;    /* weights under the model's memory budget, or NULL */
  uint64_t
      *streamed_step; /* (n_graphs) with a budget: streamed weight bytes a step of each reads */
  _Atomic uint64_t streamed_read;
  /* accounting */
  struct npu_profile *profile; /* NULL unless params.profile */
  uint64_t n_steps_total;
  uint64_t n_transfers;
  double wall_s;
};

npulm_session_params npulm_session_default_params(void) {
  npulm_session_params p = {.n_ctx = 0, .n_threads = 0, .reference = false};
  return p;
}

/* npu_pages_alloc of a 'size' that must fit a size_t (*bytes takes it); NULL if it does not. */
static void *alloc_pages(uint64_t size, size_t *bytes) {
  *bytes = size <= SIZE_MAX ? (size_t)size : 0;
  return size <= SIZE_MAX ? npu_pages_alloc((size_t)size) : NULL;
}

/* Set up the compiled engine of 's' for a context of s->n_ctx. */
static npulm_status compiled_init(struct npulm_session *s, npulm_error *err) {
  const struct npulm_model *m = s->model;
  const struct npu_config *c = &m->cfg;
  npu_cpu_ukernels_select(npu_isa_detect(), &s->cpu_uk);
  if (s->prog == NULL) s->prog = m->program; /* else given (npu_session_create_program) */
  if (s->prog == NULL) return npu_fail(err, NPULM_ERR_ARG, "the model has no compiled program");
  const struct npu_program *p = s->prog;
  const struct npu_compile_options *o = &p->opts;
  int32_t max_bucket = o->buckets[o->n_buckets - 1];
  if (s->n_ctx > max_bucket) {
    return npu_fail(err, NPULM_ERR_ARG,
                    "context length %d exceeds the program's largest context bucket %d", s->n_ctx,
                    max_bucket);
  }
  /* the graphs this session can use: up to the smallest bucket that holds its whole context */
  int32_t top_bucket = max_bucket;
  for (int32_t i = o->n_buckets - 1; i >= 0 && o->buckets[i] >= s->n_ctx; i--) {
    top_bucket = o->buckets[i];
  }
  uint64_t arena[NPU_BE_COUNT] = {0};
  s->max_rows = 1;
  for (int32_t i = 0; i < p->n_graphs; i++) {
    const struct npu_graph *g = &p->graphs[i];
    if (g->ctx > top_bucket) continue;
    if (g->rows > s->max_rows) s->max_rows = g->rows;
    for (int be = 0; be < NPU_BE_COUNT; be++) {
      if (g->arena_size[be] > arena[be]) arena[be] = g->arena_size[be];
    }
  }

  size_t kv_dim = (size_t)c->n_kv_heads * (size_t)c->head_dim;
  size_t layer_rows = (size_t)s->n_ctx * kv_dim;
  size_t n_rope = ((size_t)s->n_ctx + (size_t)s->max_rows) * (size_t)(c->rope_dim / 2 + 1);
  s->kv = alloc_pages(2 * (uint64_t)c->n_layers * layer_rows * sizeof(float), &s->kv_bytes);
  s->k_cache = calloc((size_t)c->n_layers, sizeof(*s->k_cache));
  s->v_cache = calloc((size_t)c->n_layers, sizeof(*s->v_cache));
  s->rope_cos = malloc(n_rope * sizeof(float));
  s->rope_sin = malloc(n_rope * sizeof(float));
  s->scratch_logits =
      alloc_pages((uint64_t)s->max_rows * (uint64_t)c->n_vocab * sizeof(float), &s->scratch_bytes);
  s->attn_part = malloc(npu_exec_attn_part_floats(c, s->n_ctx) * sizeof(float));
  s->batch_rows = calloc((size_t)s->max_rows, sizeof(*s->batch_rows));
  s->steps = calloc((size_t)s->n_ctx, sizeof(*s->steps));
  s->step_graphs = calloc((size_t)s->n_ctx, sizeof(*s->step_graphs));
  s->step_costs = calloc((size_t)s->n_ctx, sizeof(*s->step_costs));
  s->cost_off = calloc((size_t)p->n_graphs + 1, sizeof(*s->cost_off));
  if (s->cost_off != NULL) {
    for (int32_t i = 0; i < p->n_graphs; i++) {
      s->cost_off[i + 1] = s->cost_off[i] + p->graphs[i].n_subgraphs;
    }
    s->costs = calloc((size_t)s->cost_off[p->n_graphs] + 1, sizeof(*s->costs));
  }
  if (s->kv == NULL || s->k_cache == NULL || s->v_cache == NULL || s->rope_cos == NULL ||
      s->rope_sin == NULL || s->scratch_logits == NULL || s->attn_part == NULL ||
      s->batch_rows == NULL || s->steps == NULL || s->step_graphs == NULL ||
      s->step_costs == NULL || s->cost_off == NULL || s->costs == NULL) {
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory allocating a %d-token KV cache (%zu MiB)",
                    s->n_ctx, (2 * (size_t)c->n_layers * layer_rows * sizeof(float)) >> 20);
  }
  for (int32_t l = 0; l < c->n_layers; l++) {
    s->k_cache[l] = s->kv + (2 * (size_t)l) * layer_rows;
    s->v_cache[l] = s->kv + (2 * (size_t)l + 1) * layer_rows;
  }
  npu_f32_rope_table(s->rope_cos, s->rope_sin, s->n_ctx + s->max_rows, c, m->w.rope_freqs);
  for (int i = 0; i < NPU_SCHED_SLOTS; i++) {
    struct slot *sl = &s->slots[i];
    sl->ids = calloc((size_t)s->max_rows, sizeof(int32_t));
    if (sl->ids == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
    for (int be = 0; be < NPU_BE_COUNT; be++) {
      sl->arena[be] = alloc_pages(arena[be], &s->arena_bytes[be]);
      if (sl->arena[be] == NULL) {
        return npu_fail(err, NPULM_ERR_NOMEM, "out of memory allocating a %s arena of %llu bytes",
                        npu_backend_name((enum npu_backend)be), (unsigned long long)arena[be]);
      }
    }
  }
  if (p->sparse != NULL && s->sparse_mode != NPU_SPARSE_OFF) {
    npulm_status st = npu_sparse_run_create(p, s->sparse_mode, s->sparse_audit, &s->sparse, err);
    if (st != NPULM_OK) return st;
  }
  if (npu_program_input_sparse(p) && s->sparse_mode != NPU_SPARSE_OFF) {
    if (m->mem_budget > 0) {
      return npu_fail(err, NPULM_ERR_UNSUPPORTED,
                      "input-sparse decode does not run under a memory budget yet: decode with "
                      "--sparse off, or compile with --sparse-form neuron");
    }
    npulm_status st =
        npu_input_run_create(p, s->n_threads, &s->input_sparse, &s->input_sparse_bytes, err);
    if (st != NPULM_OK) return st;
  }
  if (m->mem_budget > 0) {
    npulm_status st = npu_residency_create(m, &s->residency, err);
    if (st != NPULM_OK) return st;
    if (s->sparse != NULL) {
      const struct npu_bundle_source src = npu_residency_source(s->residency);
      npu_sparse_run_set_source(s->sparse, &src);
    }
    s->streamed_step = calloc((size_t)p->n_graphs, sizeof(uint64_t));
    if (s->streamed_step == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
    const uint8_t *streamed = npu_residency_streamed(s->residency);
    for (int32_t gi = 0; gi < p->n_graphs; gi++) {
      const struct npu_graph *g = &p->graphs[gi];
      for (int32_t i = 0; i < g->n_nodes; i++) {
        const int32_t site = g->node_site != NULL ? g->node_site[i] : -1;
        if (site < 0 || !streamed[site] || g->nodes[i].op != NPU_OP_MATMUL) continue;
        const int32_t role = g->tensors[g->nodes[i].out].role;
        const bool sparse_ffn =
            s->sparse != NULL && g->rows == 1 &&
            (role == NPU_ROLE_FFN_GATE || role == NPU_ROLE_FFN_UP || role == NPU_ROLE_FFN_DOWN);
        if (!sparse_ffn) s->streamed_step[gi] += p->qsites[site].packed_size;
      }
    }
  }
  if (p->sparse == NULL && (s->sparse_mode == NPU_SPARSE_EXACT || s->sparse_audit)) {
    if (s->input_sparse != NULL) {
      return npu_fail(err, NPULM_ERR_ARG,
                      "--sparse exact and --sparse-audit are for neuron sparsity: the program's "
                      "sparse form is input");
    }
    return npu_fail(err, NPULM_ERR_ARG,
                    "the program has no sparse decode data: compile it with --sparsity");
  }
  for (int be = 0; be < NPU_BE_COUNT; be++) {
    int helpers = be == NPU_BE_NPU && s->n_threads > NPU_BE_COUNT ? s->n_threads - NPU_BE_COUNT : 0;
    npulm_status st = npu_pool_create(s->n_threads, helpers, &s->pools[be], err);
    if (st != NPULM_OK) return st;
  }
  return npu_sched_create(s->pools, &s->sched, err);
}

npulm_status npu_session_check_params(const npulm_model *model, const npulm_session_params *params,
                                      npulm_error *err) {
  const npulm_session_params p = params != NULL ? *params : npulm_session_default_params();
  if (p.reference) {
    npulm_status st = npu_model_check_float(model, "the reference forward (--reference)", err);
    if (st != NPULM_OK) return st;
  }
  if (p.n_ctx < 0) return npu_fail(err, NPULM_ERR_ARG, "context length %d is negative", p.n_ctx);
  if (p.n_ctx > model->cfg.n_ctx_train) {
    return npu_fail(err, NPULM_ERR_ARG, "context length %d exceeds the model's %d", p.n_ctx,
                    model->cfg.n_ctx_train);
  }
  if (p.sparse != NPULM_SPARSE_PREDICT && p.sparse != NPULM_SPARSE_OFF &&
      p.sparse != NPULM_SPARSE_EXACT) {
    return npu_fail(err, NPULM_ERR_ARG, "unknown sparse decode mode %d", p.sparse);
  }
  return NPULM_OK;
}

npulm_status npu_session_create_program(const npulm_model *model, const struct npu_program *prog,
                                        const npulm_session_params *params,
                                        npulm_session **session_out, npulm_error *err) {
  *session_out = NULL;
  npulm_session_params p = params != NULL ? *params : npulm_session_default_params();
  const int n_ctx_train = model->cfg.n_ctx_train;
  npulm_status st = npu_session_check_params(model, &p, err);
  if (st != NPULM_OK) return st;
  if (p.n_ctx == 0) {
    p.n_ctx = n_ctx_train < DEFAULT_CTX_CAP ? n_ctx_train : DEFAULT_CTX_CAP;
    if (prog == NULL) prog = model->program;
    if (!p.reference && prog != NULL && prog->opts.n_buckets > 0 &&
        prog->opts.buckets[prog->opts.n_buckets - 1] < p.n_ctx) {
      p.n_ctx = prog->opts.buckets[prog->opts.n_buckets - 1];
    }
  }
  if (p.n_threads <= 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    p.n_threads = n > 0 ? (int)n : 1;
  }
  struct npulm_session *s = calloc(1, sizeof(*s));
  if (s == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  s->model = model;
  s->prog = p.reference ? NULL : prog;
  s->reference = p.reference;
  s->n_ctx = p.n_ctx;
  s->n_threads = p.n_threads;
  s->sparse_mode = p.sparse == NPULM_SPARSE_OFF     ? NPU_SPARSE_OFF
                   : p.sparse == NPULM_SPARSE_EXACT ? NPU_SPARSE_EXACT
                                                    : NPU_SPARSE_PREDICT;
  s->sparse_audit = p.sparse_audit;
  s->last_logits = calloc((size_t)model->cfg.n_vocab, sizeof(float));
  if (p.profile && !p.reference) s->profile = calloc(1, sizeof(*s->profile));
  if (s->last_logits == NULL || (p.profile && !p.reference && s->profile == NULL)) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
    goto fail;
  }
  st =
      s->reference ? npu_ref_state_init(&s->ref, &model->cfg, p.n_ctx, err) : compiled_init(s, err);
  if (st != NPULM_OK) goto fail;
  *session_out = s;
  return NPULM_OK;
fail:
  npulm_session_free(s);
  return st;
}

npulm_status npu_session_create_owning(const npulm_model *model, struct npu_program *prog,
                                       const npulm_session_params *params,
                                       npulm_session **session_out, npulm_error *err) {
  npulm_status st = npu_session_create_program(model, prog, params, session_out, err);
  if (st == NPULM_OK) (*session_out)->owned_program = prog;
  else npu_program_free(prog);
  return st;
}

void npulm_session_free(npulm_session *s) {
  if (s == NULL) return;
  npu_sched_free(s->sched); /* first: the workers may not outlive the memory they use */
  for (int be = 0; be < NPU_BE_COUNT; be++) npu_pool_free(s->pools[be]);
  npu_ref_state_free(&s->ref);
  for (int i = 0; i < NPU_SCHED_SLOTS; i++) {
    free(s->slots[i].ids);
    for (int be = 0; be < NPU_BE_COUNT; be++) {
      npu_pages_free(s->slots[i].arena[be], s->arena_bytes[be]);
    }
  }
  npu_pages_free(s->kv, s->kv_bytes);
  free(s->k_cache);
  free(s->v_cache);
  free(s->rope_cos);
  free(s->rope_sin);
  npu_pages_free(s->scratch_logits, s->scratch_bytes);
  free(s->attn_part);
  free(s->batch_rows);
  free(s->steps);
  free(s->step_graphs);
  free(s->step_costs);
  free(s->cost_off);
  free(s->costs);
  free(s->profile);
  npu_sparse_run_free(s->sparse);
  npu_input_run_free(s->input_sparse);
  npu_residency_free(s->residency); /* after the workers: its I/O thread serves their steps */
  free(s->streamed_step);
  npu_program_free(s->owned_program);
  free(s->last_logits);
  free(s);
}

void npulm_session_reset(npulm_session *s) { s->pos = 0; }
int npulm_session_pos(const npulm_session *s) { return s->pos; }
int npulm_session_ctx(const npulm_session *s) { return s->n_ctx; }
const float *npulm_session_logits(const npulm_session *s) { return s->last_logits; }

void npulm_session_get_stats(const npulm_session *s, npulm_session_stats *stats_out) {
  memset(stats_out, 0, sizeof(*stats_out));
  stats_out->n_steps = s->n_steps_total;
  stats_out->wall_s = s->wall_s;
  stats_out->n_transfers = s->n_transfers;
  if (s->sched != NULL) {
    struct npu_sched_stats st;
    npu_sched_get_stats(s->sched, &st);
    stats_out->npu_busy_s = st.busy_s[NPU_BE_NPU];
    stats_out->cpu_busy_s = st.busy_s[NPU_BE_CPU];
    stats_out->overlap_s = st.overlap_s;
  }
}

int npulm_session_profile(const npulm_session *s, npulm_profile_entry *out, int cap) {
  int n = 0;
  if (s->profile == NULL) return 0;
  for (int be = 0; be < NPU_BE_COUNT; be++) {
    for (int op = 0; op < NPU_OP_COUNT; op++) {
      const uint64_t calls = atomic_load_explicit(&s->profile->calls[be][op], memory_order_relaxed);
      if (calls == 0) continue;
      const npulm_profile_entry e = {
          .op = npu_op_name((enum npu_op)op),
          .backend = npu_backend_name((enum npu_backend)be),
          .calls = calls,
          .seconds =
              (double)atomic_load_explicit(&s->profile->ns[be][op], memory_order_relaxed) * 1e-9,
          .macs = atomic_load_explicit(&s->profile->macs[be][op], memory_order_relaxed),
          .weight_bytes = atomic_load_explicit(&s->profile->bytes[be][op], memory_order_relaxed),
      };
      /* insertion into the first min(n, cap) entries, the most time first */
      int at = n < cap ? n : cap;
      while (at > 0 && out[at - 1].seconds < e.seconds) {
        if (at < cap) out[at] = out[at - 1];
        at--;
      }
      if (at < cap) out[at] = e;
      n++;
    }
  }
  return n;
}

void npulm_session_profile_clear(npulm_session *s) {
  if (s->profile == NULL) return;
  for (int be = 0; be < NPU_BE_COUNT; be++) {
    for (int op = 0; op < NPU_OP_COUNT; op++) {
      atomic_store_explicit(&s->profile->ns[be][op], 0, memory_order_relaxed);
      atomic_store_explicit(&s->profile->calls[be][op], 0, memory_order_relaxed);
      atomic_store_explicit(&s->profile->macs[be][op], 0, memory_order_relaxed);
      atomic_store_explicit(&s->profile->bytes[be][op], 0, memory_order_relaxed);
    }
  }
}

/* Where step 'st' writes its logits: straight into the caller's buffer when every row of the
 * graph is a real token the caller wants, else the scratch buffer. */
static float *step_logits(const struct npulm_session *s, const struct npu_step *st) {
  if (s->logits_out != NULL && st->n_valid == st->g->rows) {
    return s->logits_out + (size_t)st->row0 * (size_t)s->model->cfg.n_vocab;
  }
  return s->scratch_logits;
}

/* Scheduler task: subgraph 'sub' of step 'step' in slot 'slot' (see scheduler.h for the order
 * guarantees this relies on: the scratch logits of step c are consumed in its last subgraph before
 * step c+1's last subgraph overwrites them). */
static void run_task(void *user, int32_t step, int32_t sub, int32_t slot) {
  struct npulm_session *s = user;
  const struct npu_step *st = &s->steps[step];
  const struct npu_graph *g = st->g;
  const struct npu_config *c = &s->model->cfg;
  struct slot *sl = &s->slots[slot];
  const size_t n_vocab = (size_t)c->n_vocab;
  if (sub == 0) {
    /* the chunk's ids, padded with a valid id */
    memcpy(sl->ids, s->tokens + st->row0, (size_t)st->n_valid * sizeof(int32_t));
    for (int32_t t = st->n_valid; t < g->rows; t++) sl->ids[t] = sl->ids[0];
  }
  float *logits = step_logits(s, st);
  struct npu_exec_ctx ctx = {
      .prog = s->prog,
      .cfg = c,
      .cpu_uk = &s->cpu_uk,
      .ids = sl->ids,
      .pos0 = st->pos0,
      .n_valid = st->n_valid,
      .arena = {sl->arena[NPU_BE_NPU], sl->arena[NPU_BE_CPU]},
      .k_cache = s->k_cache,
      .v_cache = s->v_cache,
      .logits = logits,
      .rope_cos = s->rope_cos,
      .rope_sin = s->rope_sin,
      .pool = {s->pools[NPU_BE_NPU], s->pools[NPU_BE_CPU]},
      .attn_part = s->attn_part,
      .observe = s->observe,
      .observe_user = s->observe_user,
      .profile = s->profile,
      .sparse = s->sparse,
      .input_sparse = s->input_sparse,
      .streamed = s->residency != NULL ? npu_residency_streamed(s->residency) : NULL,
      .file = s->model->gguf,
      .batch = s->batch_n > 0 ? s->batch_rows : NULL,
  };
  if (s->streamed_step != NULL && sub == 0) {
    atomic_fetch_add_explicit(&s->streamed_read, s->streamed_step[g - s->prog->graphs],
                              memory_order_relaxed);
  }
  npu_exec_subgraph(g, &g->subgraphs[sub], &ctx);
  if (sub == g->n_subgraphs - 1) {
    /* epilogue: the real rows to the caller, the last one kept */
    if (s->logits_out != NULL && logits == s->scratch_logits) {
      memcpy(s->logits_out + (size_t)st->row0 * n_vocab, logits,
             (size_t)st->n_valid * n_vocab * sizeof(float));
    }
    for (int32_t r = 0; r < s->batch_n; r++) {
      /* each session's last row only: a prompt's other rows would be copied over */
      bool last = true;
      for (int32_t q = r + 1; q < s->batch_n && last; q++) {
        last = s->batch_members[q] != s->batch_members[r];
      }
      if (last) {
        memcpy(s->batch_members[r]->last_logits, logits + (size_t)r * n_vocab,
               n_vocab * sizeof(float));
      }
    }
    if (step == s->n_steps - 1 && s->batch_n == 0) {
      /* the last real row: row n_valid - 1, or the only row of a graph for generation */
      size_t row = npu_graph_logit_rows(g) == 1 ? 0 : (size_t)st->n_valid - 1;
      memcpy(s->last_logits, logits + row * n_vocab, n_vocab * sizeof(float));
    }
  }
}

void npu_session_observe(npulm_session *s, npu_node_observer fn, void *user) {
  s->observe = fn;
  s->observe_user = user;
}

const struct npu_program *npu_session_program(const npulm_session *s) { return s->prog; }

void npulm_session_sparse_stats(const npulm_session *s, npulm_sparse_stats *out) {
  struct npu_sparse_stats st = {0};
  if (s->sparse != NULL) npu_sparse_get_stats(s->sparse, &st);
  const double n = st.neurons > 0 ? (double)st.neurons : 1.0;
  *out = (npulm_sparse_stats){
      .layer_steps = st.layer_steps,
      .kept = (double)st.kept / n,
      .candidates = (double)st.candidates / n,
      .recall = s->sparse_audit && st.exact_mass > 0.0 ? st.kept_mass / st.exact_mass : NAN,
      .predict_s = st.predict_s,
      .ffn_s = st.ffn_s,
      .bytes_share = NAN,
      .input_kept = NAN,
  };
  if (s->input_sparse == NULL) return;
  struct npu_input_stats in;
  npu_input_run_stats(s->input_sparse, &in);
  out->input_steps = in.steps;
  out->input_kept = in.channels > 0 ? (double)in.kept / (double)in.channels : NAN;
  out->bytes_share = in.bytes_dense > 0 ? (double)in.bytes_read / (double)in.bytes_dense : NAN;
  out->select_s = in.select_s;
  out->gemv_s = in.gemv_s;
  out->input_bytes = s->input_sparse_bytes;
}

bool npulm_session_is_sparse(const npulm_session *s) {
  return s->sparse != NULL || s->input_sparse != NULL;
}

void npulm_session_sparse_stats_clear(npulm_session *s) {
  if (s->input_sparse != NULL) npu_input_run_reset_stats(s->input_sparse);
  if (s->sparse != NULL) npu_sparse_reset_stats(s->sparse);
  if (s->residency != NULL) npu_residency_reset_stats(s->residency);
  atomic_store(&s->streamed_read, 0);
}

void npulm_session_memory_stats(const npulm_session *s, npulm_memory_stats *out) {
  memset(out, 0, sizeof(*out));
  if (s->residency == NULL) return;
  npu_residency_stats(s->residency, out);
  out->streamed_read = atomic_load(&s->streamed_read);
}

/* Run the steps s->steps[0 .. n_steps-1] over 'tokens' (the logits of every token to
 * 'logits_out', which may be NULL) on the session's workers. */
static void run_steps(struct npulm_session *s, const int32_t *tokens, float *logits_out,
                      int32_t n_steps) {
  for (int32_t i = 0; i < n_steps; i++) {
    s->step_graphs[i] = s->steps[i].g;
    s->step_costs[i] = s->costs + s->cost_off[s->steps[i].g - s->prog->graphs];
    s->n_transfers += (uint64_t)s->steps[i].g->n_transfers;
  }
  s->tokens = tokens;
  s->logits_out = logits_out;
  s->n_steps = n_steps;
  struct npu_sched_job job = {.n_steps = n_steps,
                              .graphs = s->step_graphs,
                              .cost = s->step_costs,
                              .run = run_task,
                              .user = s};
  npu_sched_run(s->sched, &job);
  s->tokens = NULL;
  s->logits_out = NULL;
  s->n_steps_total += (uint64_t)n_steps;
}

/* The model's file, checksummed when opened, must not have been written since: its bytes are
 * read as steps need them (mapped, and under a memory budget streamed and read by the neuron
 * cache), so another write would change the output unseen. Looked at once, after each step: a
 * write before it or during it is seen there, and the step's output refused. */
static npulm_status file_unchanged(const npulm_session *s, npulm_error *err) {
  if (!npu_gguf_changed(s->model->gguf)) return NPULM_OK;
  return npu_fail(err, NPULM_ERR_IO,
                  "the model's file was written while in use: its weights can no longer be "
                  "trusted (open it again)");
}

npulm_status npulm_session_eval(npulm_session *s, const int32_t *tokens, size_t n,
                                float *logits_out, npulm_error *err) {
  const struct npu_config *c = &s->model->cfg;
  if (n > (size_t)(s->n_ctx - s->pos)) {
    return npu_fail(err, NPULM_ERR_ARG,
                    "%zu tokens do not fit in the context: %d of %d positions are used", n, s->pos,
                    s->n_ctx);
  }
  for (size_t i = 0; i < n; i++) {
    if (tokens[i] < 0 || tokens[i] >= c->n_vocab) {
      return npu_fail(err, NPULM_ERR_ARG, "token id %d is outside the vocabulary (0..%d)",
                      tokens[i], c->n_vocab - 1);
    }
  }
  if (n == 0) return NPULM_OK;
  if (s->reference) {
    for (size_t i = 0; i < n; i++) {
      npu_ref_forward(s->model, &s->ref, tokens[i], s->pos, s->last_logits, NULL);
      s->pos++;
      if (logits_out != NULL) {
        memcpy(logits_out + i * (size_t)c->n_vocab, s->last_logits,
               (size_t)c->n_vocab * sizeof(float));
      }
    }
    return file_unchanged(s, err);
  }

  double t0 = npu_now();
  /* without logits_out only the last token's logits are kept: graphs that compute no others */
  int32_t n_steps = npu_exec_plan_steps(s->prog, s->pos, (int32_t)n, logits_out == NULL, s->steps);
  if (n_steps < 0) {
    return npu_fail(err, NPULM_ERR_UNSUPPORTED,
                    "the program has no graph for %zu tokens at position %d", n, s->pos);
  }
  run_steps(s, tokens, logits_out, n_steps);
  s->pos += (int)n;
  s->wall_s += npu_now() - t0;
  return file_unchanged(s, err);
}

/* The cache position of row r of a batch step: its session's next, plus the session's rows before
 * it (the sessions move only after the step). */
static int32_t batch_row_pos(npulm_session *const *sessions, size_t r) {
  int32_t pos = sessions[r]->pos;
  for (size_t q = 0; q < r; q++) pos += sessions[q] == sessions[r];
  return pos;
}

/* Why 'b' cannot join a batch step run by 'lead', or NULL if it can. */
static const char *batch_refusal(const struct npulm_session *lead, const struct npulm_session *b) {
  if (b->reference) return "a session of the reference forward cannot be batched";
  if (b->model != lead->model || b->prog != lead->prog) {
    return "the sessions of a batch must run one model's program";
  }
  if (b->n_ctx != lead->n_ctx) return "the sessions of a batch must have one context length";
  return NULL;
}

npulm_status npulm_session_eval_batch(npulm_session *const *sessions, const int32_t *tokens,
                                      size_t n, npulm_error *err) {
  if (n == 0) return NPULM_OK;
  if (sessions == NULL || tokens == NULL) {
    return npu_fail(err, NPULM_ERR_ARG, "no sessions or tokens given for a batch step");
  }
  struct npulm_session *lead = sessions[0];
  for (size_t r = 0; r < n; r++) {
    const struct npulm_session *b = sessions[r];
    if (b == NULL) return npu_fail(err, NPULM_ERR_ARG, "session %zu of the batch is NULL", r);
    const char *why = batch_refusal(lead, b);
    if (why != NULL) return npu_fail(err, NPULM_ERR_ARG, "%s", why);
    if (batch_row_pos(sessions, r) >= b->n_ctx) {
      return npu_fail(err, NPULM_ERR_ARG,
                      "the batch's tokens of session %zu do not fit in its context: %d of %d "
                      "positions are used",
                      r, b->pos, b->n_ctx);
    }
    if (tokens[r] < 0 || tokens[r] >= lead->model->cfg.n_vocab) {
      return npu_fail(err, NPULM_ERR_ARG, "token id %d is outside the vocabulary (0..%d)",
                      tokens[r], lead->model->cfg.n_vocab - 1);
    }
  }
  bool one_sequence = true;
  for (size_t r = 1; r < n; r++) one_sequence &= sessions[r] == lead;
  if (one_sequence) return npulm_session_eval(lead, tokens, n, NULL, err);
  const struct npu_program *p = lead->prog;
  if (!npu_attention_fused(p->opts.float_ops)) {
    return npu_fail(err, NPULM_ERR_UNSUPPORTED,
                    "batched decode needs attention kept in float on the CPU (--float-ops with "
                    "softmax, qk and pv); this program computes part of it on the NPU");
  }
  /* the smallest chunk size that holds the batch, over the longest context of its sequences */
  int32_t rows = 0, end = 0;
  for (int32_t i = 0; i < p->opts.n_chunks && rows == 0; i++) {
    if (p->opts.chunks[i] >= (int32_t)n) rows = p->opts.chunks[i];
  }
  if (rows == 0 || rows > lead->max_rows) {
    return npu_fail(err, NPULM_ERR_UNSUPPORTED,
                    "the program has no batch size for %zu tokens (its chunk sizes are the batch "
                    "sizes: compile it with --batch %zu)",
                    n, n);
  }
  for (size_t r = 0; r < n; r++) {
    const struct npulm_session *b = sessions[r];
    const int32_t pos = batch_row_pos(sessions, r);
    lead->batch_rows[r] = (struct npu_batch_row){.pos = pos,
                                                 .k_cache = b->k_cache,
                                                 .v_cache = b->v_cache,
                                                 .rope_cos = b->rope_cos,
                                                 .rope_sin = b->rope_sin};
    if (pos + 1 > end) end = pos + 1;
  }
  const struct npu_graph *g = npu_program_find(p, rows, end, false);
  if (g == NULL) {
    return npu_fail(err, NPULM_ERR_UNSUPPORTED,
                    "the program has no graph of %d rows for position %d", rows, end - 1);
  }
  const double t0 = npu_now();
  lead->steps[0] = (struct npu_step){.g = g, .row0 = 0, .pos0 = lead->pos, .n_valid = (int32_t)n};
  lead->batch_members = sessions;
  lead->batch_n = (int32_t)n;
  run_steps(lead, tokens, NULL, 1);
  lead->batch_n = 0;
  lead->batch_members = NULL;
  for (size_t r = 0; r < n; r++) sessions[r]->pos++;
  lead->wall_s += npu_now() - t0;
  return file_unchanged(lead, err);
}
