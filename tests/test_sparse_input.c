/* Input-sparse decode (program/sparse_data.h, backends/sparse_input.h): in every integer mode, a
 * decode step's sparsified matmuls give bit for bit what the dense scalar GEMMs give on their
 * input with the skipped channels at the zero point; the calibrated thresholds skip about the
 * share asked; the thresholds survive a program file; and what input sparsity cannot do is
 * refused. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "backends/exec.h"
#include "npulm.h"
#include "program/program.h"
#include "program/sparse_data.h"
#include "runtime/session_internal.h"
#include "test_util.h"

#define MODEL "models/tinystories-5M.gguf"

static npulm_model *compile_input(const char *model, const char *quant, float level) {
  npulm_model *m = test_open_shared(model);
  npulm_compile_params cp = npulm_compile_default_params();
  cp.quant = quant;
  cp.sparsity = level;
  cp.calib_tokens = 256;
  npulm_error err;
  if (npulm_model_compile(m, &cp, &err) != NPULM_OK) fail_msg("%s: %s", quant, err.msg);
  return m;
}

/* After each sparsified matmul of a decode step: the dense scalar GEMM of its site on its input
 * with the skipped channels at the zero point, against what the step wrote. */
struct checker {
  const struct npu_program *p;
  struct npu_ukernels ref; /* the scalar kernels */
  uint64_t matmuls, channels, kept, mismatches;
};

static void check_matmul(void *user, const struct npu_graph *g, int32_t node,
                         const struct npu_exec_ctx *ctx) {
  struct checker *c = user;
  const struct npu_ir_node *n = &g->nodes[node];
  if (g->rows != 1 || n->op != NPU_OP_MATMUL || n->backend != NPU_BE_NPU || g->node_site == NULL)
    return;
  const struct npu_qsite *s = &c->p->qsites[g->node_site[node]];
  if (s->skip_below <= 0) return;
  const struct npu_ir_tensor *xt = &g->tensors[n->in[0]], *yt = &g->tensors[n->out];
  const size_t k = (size_t)xt->ne[1], cols = (size_t)yt->ne[1];
  const bool x16 = xt->dtype == NPU_DT_I16, wide = yt->dtype == NPU_DT_I16;
  const void *x = ctx->arena[xt->backend] + xt->offset;
  const void *y = ctx->arena[yt->backend] + yt->offset;
  int16_t *xm16 = malloc(k * sizeof(int16_t));
  int8_t *xm8 = malloc(k);
  int16_t *want = malloc(cols * sizeof(int16_t));
  assert_non_null(xm16);
  assert_non_null(xm8);
  assert_non_null(want);
  const int32_t zx = x16 ? 0 : s->gemm.x_zero_point;
  for (size_t i = 0; i < k; i++) {
    const int32_t v = x16 ? ((const int16_t *)x)[i] : ((const int8_t *)x)[i];
    bool outlier = false;
    for (int32_t o = 0; o < s->n_outliers; o++) outlier |= s->outliers[o] == (int32_t)i;
    const bool keep = abs(v - zx) >= s->skip_below || outlier;
    c->channels++;
    c->kept += keep;
    xm16[i] = (int16_t)(keep ? v : zx);
    xm8[i] = (int8_t)(keep ? v : zx);
  }
  if (x16 && s->w_bits == 8) {
    c->ref.qs16_gemm_qs16(1, 0, cols, k, xm16, k, s->packed, want, cols, &s->gemm16);
  } else if (x16) {
    c->ref.qs16_qc4w_gemm_qs16(1, 0, cols, k, xm16, k, s->packed, want, cols, &s->gemm16);
  } else if (s->w_bits == 8 && wide) {
    c->ref.qs8_gemm_qs16(1, 0, cols, k, xm8, k, s->packed, want, cols, &s->gemm);
  } else if (s->w_bits == 8) {
    c->ref.qs8_gemm(1, 0, cols, k, xm8, k, s->packed, (int8_t *)want, cols, &s->gemm);
  } else if (wide) {
    c->ref.qs8_qc4w_gemm_qs16(1, 0, cols, k, xm8, k, s->packed, want, cols, &s->gemm);
  } else {
    c->ref.qs8_qc4w_gemm(1, 0, cols, k, xm8, k, s->packed, (int8_t *)want, cols, &s->gemm);
  }
  const size_t bytes = cols * (x16 || wide ? 2 : 1);
  if (memcmp(want, y, bytes) != 0) c->mismatches++;
  c->matmuls++;
  free(xm16);
  free(xm8);
  free(want);
}

static const char TEXT[] = "Once upon a time, there was a little girl named Lily. She loved";

static size_t tokenize(const npulm_model *m, int32_t ids[64]) {
  size_t n = 0;
  npulm_error err;
  assert_int_equal(npulm_tokenize(m, TEXT, strlen(TEXT), true, false, ids, 64, &n, &err), 0);
  assert_true(n > 4);
  return n;
}

/* The last logits of decoding TEXT one token at a time (sparse) into 'out' (n_vocab). */
static void decode_logits(const npulm_model *m, float *out) {
  npulm_session *s;
  npulm_error err;
  assert_int_equal(npulm_session_create(m, NULL, &s, &err), NPULM_OK);
  int32_t ids[64];
  const size_t n = tokenize(m, ids);
  for (size_t i = 0; i < n; i++) assert_int_equal(npulm_session_eval(s, &ids[i], 1, out, &err), 0);
  npulm_session_free(s);
}

/* Decode a text one token at a time, checking every sparsified matmul; the share kept. */
static double check_decode(npulm_model *m, uint64_t *matmuls) {
  struct checker c = {.p = m->program};
  npu_ukernels_select(0, &c.ref);
  npulm_session_params sp = npulm_session_default_params();
  sp.n_threads = 2;
  npulm_session *s;
  npulm_error err;
  assert_int_equal(npulm_session_create(m, &sp, &s, &err), NPULM_OK);
  assert_true(npulm_session_is_sparse(s));
  npu_session_observe(s, check_matmul, &c);
  int32_t ids[64];
  size_t n = tokenize(m, ids);
  for (size_t i = 0; i < n; i++) assert_int_equal(npulm_session_eval(s, &ids[i], 1, NULL, &err), 0);
  npulm_sparse_stats st;
  npulm_session_sparse_stats(s, &st);
  assert_true(st.input_steps > 0);
  assert_true(st.bytes_share > 0.0 && st.bytes_share < 1.0);
  /* the session's own count of channels read agrees with the checker's */
  assert_true(fabs(st.input_kept - (double)c.kept / (double)c.channels) < 1e-9);
  npulm_session_free(s);
  assert_int_equal(c.mismatches, 0);
  *matmuls = c.matmuls;
  return (double)c.kept / (double)c.channels;
}

static void test_bit_exact_every_mode(void **state) {
  (void)state;
  static const char *const modes[] = {"w8a8-naive", "w8a8-smooth", "w8a8-shadow", "w8a16",
                                      "w4a16",      "w4a16-block", "w4a8"};
  for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
    npulm_model *m = compile_input(MODEL, modes[i], 0.4f);
    assert_true(npu_program_input_sparse(m->program));
    /* every block matmul is sparsified, the classifier is not */
    int32_t sparsified = 0;
    for (int32_t j = 0; j < m->program->n_qsites; j++) {
      const struct npu_qsite *s = &m->program->qsites[j];
      if (s->skip_below > 0) sparsified++;
      if (strcmp(s->name, "output") == 0) assert_int_equal(s->skip_below, 0);
    }
    npulm_model_info info;
    npulm_model_get_info(m, &info);
    assert_true(sparsified >= 7 * info.n_layers);
    uint64_t matmuls = 0;
    const double kept = check_decode(m, &matmuls);
    assert_true(matmuls >= 7 * (uint64_t)info.n_layers);
    /* calibrated for 40 % skipped: on other text it skips a share near it */
    if (kept < 0.4 || kept > 0.8) fail_msg("%s: kept %.3f of the channels", modes[i], kept);
    npulm_model_close(m);
  }
}

/* Thresholds and the level survive a program file; dense decode of it (--sparse off) is the
 * dense program's. */
static void test_file_and_off(void **state) {
  (void)state;
  npulm_model *m = compile_input(MODEL, "w8a8-smooth", 0.5f);
  char path[] = "/tmp/npulm-sparse-input-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  npulm_error err;
  assert_int_equal(npulm_model_save_program(m, path, NULL, NULL, &err), NPULM_OK);
  npulm_model *f;
  assert_int_equal(npulm_model_open(path, &f, &err), NPULM_OK);
  const struct npu_program *a = m->program, *b = f->program;
  assert_int_equal(a->n_qsites, b->n_qsites);
  assert_true(fabsf(a->input_sparsity - b->input_sparsity) == 0.0f);
  for (int32_t i = 0; i < a->n_qsites; i++) {
    assert_int_equal(a->qsites[i].skip_below, b->qsites[i].skip_below);
    assert_true(a->qsites[i].skip_keep == b->qsites[i].skip_keep);
  }
  /* the same logits from the file as from memory, sparse */
  npulm_model_info info;
  npulm_model_get_info(m, &info);
  float *l1 = malloc((size_t)info.n_vocab * sizeof(float));
  float *l2 = malloc((size_t)info.n_vocab * sizeof(float));
  assert_non_null(l1);
  assert_non_null(l2);
  decode_logits(m, l1);
  decode_logits(f, l2);
  assert_memory_equal(l1, l2, (size_t)info.n_vocab * sizeof(float));
  free(l1);
  free(l2);
  /* inspect names every threshold */
  char *buf = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&buf, &len);
  assert_int_equal(npulm_model_print_program(f, out, &err), NPULM_OK);
  fclose(out);
  assert_non_null(strstr(buf, "input-sparse decode: skips 50%"));
  assert_non_null(strstr(buf, "blk.0.ffn_down"));
  free(buf);
  /* --sparse off decodes dense: no input-sparse steps */
  npulm_session_params sp = npulm_session_default_params();
  sp.sparse = NPULM_SPARSE_OFF;
  npulm_session *s;
  assert_int_equal(npulm_session_create(f, &sp, &s, &err), NPULM_OK);
  assert_false(npulm_session_is_sparse(s));
  npulm_session_free(s);
  /* exact decode is for the neuron form */
  sp.sparse = NPULM_SPARSE_EXACT;
  assert_int_equal(npulm_session_create(f, &sp, &s, &err), NPULM_ERR_ARG);
  assert_non_null(strstr(err.msg, "sparse form is input"));
  npulm_model_close(f);
  npulm_model_close(m);
  unlink(path);
}

static void test_errors(void **state) {
  (void)state;
  npulm_model *m = test_open_shared(MODEL);
  npulm_compile_params cp = npulm_compile_default_params();
  npulm_error err;
  cp.calib_tokens = 64;
  cp.sparsity = 0.5f;
  cp.sparse_form = 7;
  assert_int_equal(npulm_model_compile(m, &cp, &err), NPULM_ERR_ARG);
  assert_non_null(strstr(err.msg, "sparse form"));
  cp.sparse_form = NPULM_SPARSE_FORM_INPUT;
  cp.quant = "f32";
  assert_int_equal(npulm_model_compile(m, &cp, &err), NPULM_ERR_ARG);
  npulm_model_close(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bit_exact_every_mode),
      cmocka_unit_test(test_file_and_off),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
