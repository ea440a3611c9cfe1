/* Sparse decode (program/sparse_data.h, compiler/sparsify.h, backends/sparse_ffn.h): every decode
 * step of a sparse session equals, bit for bit, the dense decode step with the products SiLU(gate)
 * * up of the neurons it skips set to their zero point, where the skipped set is computed here
 * independently (the thresholds in the gate's real steps, in double; the predictor by the scalar
 * reference GEMMs); the share skipped follows the level; a program file keeps the sparse data (the
 * same logits after a save and load); a program file written while in use is refused, budgeted or
 * not; and bad use is a one-line error. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

#include "backends/exec.h"
#include "compiler/compiler.h"
#include "compiler/quantize.h"
#include "compiler/sparsify.h"
#include "io/gguf.h"
#include "kernels/npu/fixedpoint.h"
#include "model/model.h"
#include "npulm.h"
#include "program/sparse_data.h"
#include "runtime/neurons.h"
#include "runtime/session_internal.h"

#define MODEL "models/tinystories-5M.gguf"

/* 'rank' 0: the default, no predictor where it does not pay (on this model, none) */
static npulm_model *compile_sparse(float level, const char *quant, int rank) {
  npulm_model *m = test_open_shared(MODEL);
  npulm_compile_params cp = npulm_compile_default_params();
  cp.quant = quant;
  cp.sparsity = level;
  cp.sparse_rank = rank;
  cp.sparse_form = NPULM_SPARSE_FORM_NEURON;
  cp.calib_tokens = 256;
  npulm_error err;
  assert_int_equal(npulm_model_compile(m, &cp, &err), NPULM_OK);
  return m;
}

/* The dense session's observer: at each layer's product (the down matmul's input) it sets the
 * neurons the sparse step skips to the zero point. */
struct masker {
  const struct npu_program *p;
  bool predict; /* the predictor's candidates too (else every neuron is one) */
  uint64_t neurons, kept;
  int8_t x[1024]; /* the FFN input of the layer running, copied when its norm writes it (its
                     memory is reused before the product is written) */
};

/* Neuron j of layer 'l' is kept for FFN input x: a candidate, and its exact gate value (the
 * accumulator with its bias, in the gate's steps) passes the thresholds. */
static bool kept(const struct masker *mk, int32_t l, const int8_t *x, int32_t j,
                 const int16_t *pred) {
  const struct npu_sparse_layer *ly = &mk->p->sparse->layers[l];
  struct npu_sparse_sites s;
  npulm_error err;
  assert_int_equal(npu_sparse_sites_of(mk->p, l, &s, &err), NPULM_OK);
  const int32_t dim = s.gate->k, zx = s.gate->gemm.x_zero_point;
  if (mk->predict && ly->rank > 0) {
    const int32_t p = pred[j];
    if (!(p >= ly->cand_hi || (p >= ly->cand_lo_a && p <= ly->cand_lo_b))) return false;
  }
  int8_t w[1024];
  npu_qs8_gemm_unpack_row((size_t)dim, s.gate->packed, (size_t)j, 0, (size_t)dim, w);
  int64_t acc = npu_qs8_gemm_bias((size_t)dim, s.gate->packed, (size_t)j);
  for (int32_t c = 0; c < dim; c++) acc += (int64_t)(x[c] - zx) * w[c];
  const double v = (double)acc * ldexp(s.gate->mult[j], s.gate->shift[j] - 31);
  return v >= ly->hi || (v >= ly->lo_a && v <= ly->lo_b);
}

static void mask_products(void *user, const struct npu_graph *g, int32_t node,
                          const struct npu_exec_ctx *ctx) {
  struct masker *mk = user;
  const struct npu_ir_tensor *t = &g->tensors[g->nodes[node].out];
  if (g->rows == 1 && t->role == NPU_ROLE_FFN_NORM) {
    memcpy(mk->x, ctx->arena[t->backend] + t->offset, (size_t)t->ne[1]);
    return;
  }
  if (g->rows != 1 || t->role != NPU_ROLE_FFN_GATE_PAR) return;
  const int32_t l = t->layer;
  const int8_t *x = mk->x;
  int8_t *prod = (int8_t *)(ctx->arena[t->backend] + t->offset);
  struct npu_sparse_sites s;
  npulm_error err;
  assert_int_equal(npu_sparse_sites_of(mk->p, l, &s, &err), NPULM_OK);
  const struct npu_sparse_layer *ly = &mk->p->sparse->layers[l];
  const int32_t n_ff = ly->n_ff, dim = s.gate->k, rank = ly->rank;
  int16_t pred[4096];
  if (mk->predict && rank > 0) { /* the predictor by the scalar reference GEMMs */
    int8_t h[512];
    const struct npu_qs8_gemm_params pb = {ly->mult, ly->shift, s.gate->gemm.x_zero_point, 0};
    const struct npu_qs8_gemm_params pa = {ly->mult + rank, ly->shift + rank, 0, 0};
    npu_qs8_gemm__scalar(1, 0, (size_t)rank, (size_t)dim, x, (size_t)dim, ly->pred_b, h,
                         (size_t)rank, &pb);
    npu_qs8_gemm_qs16__scalar(1, 0, (size_t)n_ff, (size_t)rank, h, (size_t)rank, ly->pred_a, pred,
                              (size_t)n_ff, &pa);
  }
  for (int32_t j = 0; j < n_ff; j++) {
    mk->neurons++;
    if (kept(mk, l, x, j, pred)) mk->kept++;
    else prod[j] = (int8_t)s.down->gemm.x_zero_point;
  }
}

/* Decode 'n' tokens of a text one at a time in a sparse session ('mode') and in a dense one
 * whose products are masked as the sparse step skips them: the logits agree bit for bit. Returns
 * the share of neurons kept. */
static double check_against_masked(npulm_model *m, int mode, int n) {
  const struct npu_program *p = m->program;
  npulm_session_params sp = npulm_session_default_params();
  sp.n_threads = 2;
  sp.sparse = mode;
  npulm_session *sparse, *dense;
  npulm_error err;
  assert_int_equal(npulm_session_create(m, &sp, &sparse, &err), NPULM_OK);
  sp.sparse = NPULM_SPARSE_OFF;
  assert_int_equal(npulm_session_create(m, &sp, &dense, &err), NPULM_OK);
  struct masker mk = {.p = p, .predict = mode == NPULM_SPARSE_PREDICT};
  npu_session_observe(dense, mask_products, &mk);
  int32_t ids[64];
  size_t n_ids;
  const char *text = "Once upon a time, there was a little girl named Lily. She loved to play.";
  assert_int_equal(npulm_tokenize(m, text, strlen(text), true, false, ids, 64, &n_ids, &err),
                   NPULM_OK);
  npulm_model_info info;
  npulm_model_get_info(m, &info);
  for (int i = 0; i < n && (size_t)i < n_ids; i++) {
    assert_int_equal(npulm_session_eval(sparse, &ids[i], 1, NULL, &err), NPULM_OK);
    assert_int_equal(npulm_session_eval(dense, &ids[i], 1, NULL, &err), NPULM_OK);
    assert_memory_equal(npulm_session_logits(sparse), npulm_session_logits(dense),
                        (size_t)info.n_vocab * sizeof(float));
  }
  npulm_sparse_stats st;
  npulm_session_sparse_stats(sparse, &st);
  assert_true(st.layer_steps > 0);
  assert_true(fabs(st.kept - (double)mk.kept / (double)mk.neurons) < 1e-9);
  npulm_session_free(sparse);
  npulm_session_free(dense);
  return st.kept;
}

static void test_exact_equals_masked_dense(void **state) {
  (void)state;
  npulm_model *m = compile_sparse(0.5f, "w8a8-naive", 0);
  const double kept = check_against_masked(m, NPULM_SPARSE_EXACT, 40);
  /* the thresholds skip about the share asked on text like the calibration's */
  assert_true(kept > 0.3 && kept < 0.7);
  npulm_model_close(m);
}

static void test_predict_equals_masked_dense(void **state) {
  (void)state;
  npulm_model *m = compile_sparse(0.3f, "w8a8-smooth", 16);
  for (int32_t l = 0; l < m->program->sparse->n_layers; l++) /* asked for: in every layer */
    assert_int_equal(m->program->sparse->layers[l].rank, 16);
  const double kept = check_against_masked(m, NPULM_SPARSE_PREDICT, 40);
  assert_true(kept > 0.2 && kept < 0.9);
  npulm_model_close(m);
}

/* Level 0 keeps every neuron: sparse decode is dense decode. */
static void test_level_zero_is_dense(void **state) {
  (void)state;
  npulm_model *m = compile_sparse(0.0f, "w8a8-naive", 0);
  assert_null(m->program->sparse); /* 0: no sparse data at all */
  npulm_model_close(m);
  m = compile_sparse(0.15f, "w8a8-naive", 0);
  const struct npu_sparse *sp = m->program->sparse;
  assert_non_null(sp);
  /* by default a layer has a predictor only if it reads fewer bytes than the gate rows it spares:
   * on this model at this level, none does (its candidates would be nearly every neuron) */
  for (int32_t l = 0; l < sp->n_layers; l++) {
    assert_int_equal(sp->layers[l].rank, 0);
    assert_true(sp->layers[l].cand == 1.0f && npu_sparse_predictor_bytes(sp, l) == 0);
  }
  check_against_masked(m, NPULM_SPARSE_PREDICT, 20);
  npulm_model_close(m);
}

/* Saved and loaded, the program runs its sparse decode with the same logits: without predictors
 * (rank 0: their tensors are not in the file) and with. */
static void round_trip(int rank) {
  npulm_model *m = compile_sparse(0.5f, "w8a8-smooth", rank);
  const char *path = "/tmp/npulm_test_sparse.npu";
  npulm_error err;
  assert_int_equal(npulm_model_save_program(m, path, NULL, NULL, &err), NPULM_OK);
  npulm_model *back;
  assert_int_equal(npulm_model_open(path, &back, &err), NPULM_OK);
  assert_non_null(back->program->sparse);
  assert_true(back->program->sparse->level == m->program->sparse->level);
  assert_int_equal(back->program->sparse->layers[0].rank, rank);
  npulm_session *a, *b;
  npulm_session_params sp = npulm_session_default_params();
  sp.n_threads = 1;
  assert_int_equal(npulm_session_create(m, &sp, &a, &err), NPULM_OK);
  assert_int_equal(npulm_session_create(back, &sp, &b, &err), NPULM_OK);
  const int32_t ids[6] = {1, 403, 407, 261, 378, 600 % 512};
  for (int i = 0; i < 6; i++) {
    assert_int_equal(npulm_session_eval(a, &ids[i], 1, NULL, &err), NPULM_OK);
    assert_int_equal(npulm_session_eval(b, &ids[i], 1, NULL, &err), NPULM_OK);
    assert_memory_equal(npulm_session_logits(a), npulm_session_logits(b), 512 * sizeof(float));
  }
  npulm_session_free(a);
  npulm_session_free(b);
  npulm_model_close(back);
  npulm_model_close(m);
  remove(path);
}

static void test_round_trip(void **state) {
  (void)state;
  round_trip(0);
  round_trip(16);
}

/* A layer's places: a permutation that puts the most kept first, ties in index order (the file's
 * layout, program/sparse_data.h), on counts with many ties and an awkward size. */
static void test_places(void **state) {
  (void)state;
  enum { N = 1377 };
  uint32_t freq[N];
  int32_t place[N], at[N];
  uint64_t rng = 7;
  for (int32_t j = 0; j < N; j++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    freq[j] = (uint32_t)(rng >> 58); /* 0..63: ties */
    at[j] = -1;
  }
  freq[5] = UINT32_MAX;
  assert_true(npu_sparse_places(freq, N, place));
  for (int32_t j = 0; j < N; j++) {
    assert_true(place[j] >= 0 && place[j] < N && at[place[j]] < 0);
    at[place[j]] = j;
  }
  assert_int_equal(at[0], 5);
  for (int32_t p = 1; p < N; p++) {
    const uint32_t f0 = freq[at[p - 1]], f1 = freq[at[p]];
    assert_true(f0 > f1 || (f0 == f1 && at[p - 1] < at[p]));
  }
}

/* The resident set now and at its peak (VmRSS, VmHWM), in bytes. */
static void rss(uint64_t *now, uint64_t *peak) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  *now = *peak = 0;
  while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
    unsigned long long kb;
    if (sscanf(line, "VmRSS: %llu", &kb) == 1) *now = kb * 1024;
    if (sscanf(line, "VmHWM: %llu", &kb) == 1) *peak = kb * 1024;
  }
  if (f != NULL) fclose(f);
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1 /* shadow memory: resident sets say nothing */
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif

/* Decode 'n' tokens of a text from a model opened with 'op' (NULL: none); the logits of each
 * into 'logits' (n x n_vocab). */
static void decode_with(const char *path, const npulm_open_params *op, int n, float *logits,
                        int n_vocab) {
  npulm_model *m;
  npulm_error err;
  assert_int_equal(npulm_model_open_params(path, op, &m, &err), NPULM_OK);
  npulm_session_params sp = npulm_session_default_params();
  sp.n_ctx = 64;
  sp.n_threads = 2;
  npulm_session *s;
  assert_int_equal(npulm_session_create(m, &sp, &s, &err), NPULM_OK);
  int32_t ids[64];
  size_t n_ids;
  const char *text = "Once upon a time, there was a little girl named Lily. She loved to play.";
  assert_int_equal(npulm_tokenize(m, text, strlen(text), true, false, ids, 64, &n_ids, &err),
                   NPULM_OK);
  assert_true(n_ids >= 4);
  assert_int_equal(npulm_session_eval(s, ids, 4, NULL, &err), NPULM_OK); /* a prefill */
  for (int i = 0; i < n; i++) {
    const int32_t id = ids[4 + i % ((int)n_ids - 4)];
    assert_int_equal(npulm_session_eval(s, &id, 1, NULL, &err), NPULM_OK);
    memcpy(logits + (size_t)i * (size_t)n_vocab, npulm_session_logits(s),
           (size_t)n_vocab * sizeof(float));
  }
  if (op != NULL) {
    npulm_memory_stats ms;
    npulm_session_memory_stats(s, &ms);
    assert_true(ms.budget == op->mem_budget);
    assert_true(ms.misses > 0 && ms.bytes_read > 0); /* the cache is too small for every neuron */
    /* two-phase reads: only what the steps used is read (a kept neuron's rest after its gate) */
    assert_true(ms.bytes_read <= ms.bytes_used);
    /* direct reads move whole blocks and read through close misses; buffered ones just the rows */
    if (op->buffered_io) assert_false(ms.direct_io);
    if (ms.direct_io) assert_true(ms.storage_bytes >= ms.bytes_read);
    else assert_true(ms.storage_bytes == ms.bytes_read);
    /* with slots beyond one layer's scratch, some lookups hit; the kept's pairs were looked up */
    assert_true(ms.hot_bytes + ms.cache_bytes == 0 || ms.hits + ms.kept_hits > 0);
    assert_true(ms.kept_hits + ms.kept_misses > 0);
  }
  npulm_session_free(s);
  npulm_model_close(m);
}

/* Under tiny memory budgets (the neuron cache at its minimum, one layer's neurons: all of them a
 * step's scratch; and two layers' neurons: resident ones beside the scratch), from a cold page
 * cache: the logits of every decode step equal the unbudgeted run's bit for bit, and the peak
 * resident set grows by at most the budget, the KV cache, the arenas (with the scratch logits)
 * and the program's description (its file header), and 10 %: beyond what the process's threads
 * hold once a session has run. */
static void test_memory_budget(void **state) {
  (void)state;
  /* with predictors: candidates that are not every neuron */
  npulm_model *m = compile_sparse(0.5f, "w8a8-smooth", 16);
  const char *path = "/tmp/npulm_test_sparse_budget.npu";
  npulm_error err;
  assert_int_equal(npulm_model_save_program(m, path, NULL, NULL, &err), NPULM_OK);
  const struct npu_program *p = m->program;
  const struct npu_sparse *sp = p->sparse;
  uint64_t pinned = 0, largest_ffn = 0;
  for (int32_t l = 0; l < sp->n_layers; l++) pinned += npu_sparse_predictor_bytes(sp, l);
  for (int32_t i = 0; i < p->n_qsites; i++) {
    const struct npu_qsite *s = &p->qsites[i];
    const char *dot = strrchr(s->name, '.');
    if (s->op == NPU_OP_MATMUL && s->table_site < 0 &&
        (dot == NULL || strncmp(dot, ".ffn_", 5) != 0))
      pinned += s->packed_size;
    else if (s->op == NPU_OP_MATMUL && s->packed_size > largest_ffn) largest_ffn = s->packed_size;
  }
  const uint64_t bundle = 3 * (uint64_t)sp->kp, n_ff = (uint64_t)sp->layers[0].n_ff;
  npulm_model_info info;
  npulm_model_get_info(m, &info);
  const int n = 24, n_vocab = info.n_vocab;
  /* every weight held, but for the FFN's: room for two of the largest of those (streamed in
   * prefill: one in use, the next read ahead), the I/O threads' buffers, and the neuron cache */
  const uint64_t held = (pinned * 10 + 8) / 9 + 2 * largest_ffn + npu_residency_io_bytes(sp);
  uint64_t arenas = 0;
  for (int32_t g = 0; g < p->n_graphs; g++) {
    const uint64_t a = p->graphs[g].arena_size[0] + p->graphs[g].arena_size[1];
    if (a > arenas) arenas = a;
  }
  const uint64_t kv = 2 * (uint64_t)info.n_layers * 64 * (uint64_t)info.n_kv_heads *
                      (uint64_t)info.head_dim * sizeof(float);
  /* two slots of arenas, the scratch logits of the largest chunk, and the program's description
   * (its file's header: graphs, tokenizer), which the loader turns into its records */
  struct npu_gguf *g;
  assert_int_equal(npu_gguf_open(path, &g, &err), NPULM_OK);
  const uint64_t header = g->data_offset;
  npu_gguf_close(g);
  npulm_model_close(m);
  float *want = malloc((size_t)n * (size_t)n_vocab * sizeof(float));
  float *got = malloc((size_t)n * (size_t)n_vocab * sizeof(float));
  decode_with(path, NULL, n, want, n_vocab);
  for (int run = 0; run < 3; run++) { /* one layer's, two layers'; two, buffered */
    const uint64_t layers = run == 0 ? 1 : 2;
    const npulm_open_params op = {.mem_budget = held + layers * n_ff * bundle + bundle,
                                  .cold = true,
                                  .buffered_io = run == 2};
    const uint64_t allowance =
        op.mem_budget + kv + 2 * arenas + 128 * (uint64_t)n_vocab * 4 + header;
    /* in a child, so that its peak is this run's alone */
    fflush(NULL);
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      uint64_t start, now, peak;
      /* the process's own memory first: the threads' stacks and the C library's per-thread arenas
       * (which it keeps for the next threads), as an unbudgeted session of one step leaves them */
      decode_with(path, NULL, 1, got, n_vocab);
      FILE *f = fopen("/proc/self/clear_refs", "w"); /* "5": the peak starts again from now */
      if (f != NULL) {
        fputs("5", f);
        fclose(f);
      }
      rss(&start, &peak);
      decode_with(path, &op, n, got, n_vocab);
      rss(&now, &peak);
      const bool same = memcmp(got, want, (size_t)n * (size_t)n_vocab * sizeof(float)) == 0;
      bool fits = f == NULL || peak <= start + allowance + allowance / 10;
#ifdef SANITIZED
      fits = true; /* shadow memory: the resident set says nothing */
#endif
      if (!fits) {
        fprintf(stderr, "peak RSS %llu over %llu at start: more than %llu + 10 %%\n",
                (unsigned long long)peak, (unsigned long long)start, (unsigned long long)allowance);
      }
      _exit(same && fits ? 0 : 1);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  free(want);
  free(got);
  remove(path);
}

/* Invert the byte at 'offset' of the file at 'path', in place (as another process rewriting the
 * program file would). */
static void flip_in_place(const char *path, long offset) {
  FILE *f = fopen(path, "r+b");
  assert_non_null(f);
  assert_int_equal(fseek(f, offset, SEEK_SET), 0);
  const int c = fgetc(f);
  assert_true(c != EOF);
  assert_int_equal(fseek(f, offset, SEEK_SET), 0);
  assert_int_equal(fputc(255 - c, f), 255 - c);
  assert_int_equal(fclose(f), 0);
}

/* A program file written in place while a session reads it, with a memory budget (its neurons
 * read on demand) or without (mapped): the next step is refused as an I/O error naming it, not
 * computed with other bytes; a file replaced by a rename is another file, and the session goes on
 * with the one it opened. */
static void test_file_written_in_use(void **state) {
  (void)state;
  npulm_model *m = compile_sparse(0.5f, "w8a8-smooth", 0);
  const char *path = "/tmp/npulm_test_sparse_inuse.npu", *next = "/tmp/npulm_test_sparse_next.npu";
  npulm_error err;
  assert_int_equal(npulm_model_save_program(m, path, NULL, NULL, &err), NPULM_OK);
  assert_int_equal(npulm_model_save_program(m, next, NULL, NULL, &err), NPULM_OK);
  npulm_model_close(m);
  struct npu_gguf *g;
  assert_int_equal(npu_gguf_open(path, &g, &err), NPULM_OK);
  const long data = (long)g->data_offset, size = (long)g->size;
  npu_gguf_close(g);
  for (int budgeted = 0; budgeted < 2; budgeted++) {
    /* the same budget as test_memory_budget's, loosely: most weights held, the cache small */
    const npulm_open_params op = {.mem_budget = budgeted ? (uint64_t)size * 3 / 4 : 0};
    npulm_model *pm;
    assert_int_equal(npulm_model_open_params(path, &op, &pm, &err), NPULM_OK);
    npulm_session_params sp = npulm_session_default_params();
    sp.n_ctx = 64;
    sp.n_threads = 1;
    npulm_session *s;
    assert_int_equal(npulm_session_create(pm, &sp, &s, &err), NPULM_OK);
    const int32_t ids[4] = {1, 403, 407, 261};
    assert_int_equal(npulm_session_eval(s, ids, 2, NULL, &err), NPULM_OK);
    assert_int_equal(npulm_session_eval(s, &ids[2], 1, NULL, &err), NPULM_OK);
    flip_in_place(path, data + (size - data) / 2);
    assert_int_equal(npulm_session_eval(s, &ids[3], 1, NULL, &err), NPULM_ERR_IO);
    assert_non_null(strstr(err.msg, "file was written while in use"));
    flip_in_place(path, data + (size - data) / 2); /* its bytes again, still written */
    assert_int_equal(npulm_session_eval(s, &ids[3], 1, NULL, &err), NPULM_ERR_IO);
    npulm_session_free(s);
    npulm_model_close(pm);
  }
  /* replaced whole by a rename (as compile writes): the open file is not the one written */
  npulm_model *pm;
  assert_int_equal(npulm_model_open(path, &pm, &err), NPULM_OK);
  npulm_session *s;
  npulm_session_params sp = npulm_session_default_params();
  sp.n_ctx = 64;
  assert_int_equal(npulm_session_create(pm, &sp, &s, &err), NPULM_OK);
  const int32_t id = 1;
  assert_int_equal(npulm_session_eval(s, &id, 1, NULL, &err), NPULM_OK);
  assert_int_equal(rename(next, path), 0);
  assert_int_equal(npulm_session_eval(s, &id, 1, NULL, &err), NPULM_OK);
  npulm_session_free(s);
  npulm_model_close(pm);
  remove(path);
}

static void test_errors(void **state) {
  (void)state;
  npulm_model *m = test_open_shared(MODEL);
  npulm_compile_params cp = npulm_compile_default_params();
  npulm_error err;
  cp.sparsity = 0.5f;
  cp.sparse_form = NPULM_SPARSE_FORM_NEURON;
  cp.quant = "w8a16";
  assert_int_equal(npulm_model_compile(m, &cp, &err), NPULM_ERR_UNSUPPORTED);
  assert_non_null(strstr(err.msg, "sparse decode needs"));
  cp.quant = "f32";
  assert_int_equal(npulm_model_compile(m, &cp, &err), NPULM_ERR_ARG);
  cp.quant = NULL;
  cp.sparsity = 1.0f;
  assert_int_equal(npulm_model_compile(m, &cp, &err), NPULM_ERR_ARG);
  /* a program without sparse data: exact decode and the audit are refused */
  cp.sparsity = 0.0f;
  cp.calib_tokens = 64;
  assert_int_equal(npulm_model_compile(m, &cp, &err), NPULM_OK);
  npulm_session_params sp = npulm_session_default_params();
  sp.sparse = NPULM_SPARSE_EXACT;
  npulm_session *s;
  assert_int_equal(npulm_session_create(m, &sp, &s, &err), NPULM_ERR_ARG);
  sp.sparse = 7;
  assert_int_equal(npulm_session_create(m, &sp, &s, &err), NPULM_ERR_ARG);
  npulm_model_close(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exact_equals_masked_dense),
      cmocka_unit_test(test_predict_equals_masked_dense),
      cmocka_unit_test(test_level_zero_is_dense),
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_places),
      cmocka_unit_test(test_memory_budget),
      cmocka_unit_test(test_file_written_in_use),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
