/* Batched decode (npulm_session_eval_batch): sequences of different lengths, each in its own
 * session, decoded together in steps of one static graph give every sequence the logits, bit for
 * bit, of decoding it alone; as the batch's members come and go (batch sizes 2 to 7, padded to the
 * chunk sizes 2, 4, 8), on the integer NPU (int8 and int16 activations) and on FP32 graphs, across
 * context buckets. Prompts fed a few tokens per step among the others' decode tokens (rows of one
 * session interleaved with other sessions' rows) give each session the logits of evaluating the
 * same tokens alone. Sessions that decode sparse batch with their FFNs dense. And each way the
 * call can be misused is one error that evaluates nothing. */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "npulm.h"
#include "test_util.h"

enum { N_SEQ = 7, N_CTX = 192, N_STEPS = 130, MAX_PROMPT = 48 };

static const char *const prompts[N_SEQ] = {
    "Once upon a time",
    "Lily and Ben went to the park. They saw a big dog",
    "The cat",
    "One day, a little bird wanted to fly high in the sky. It flapped its wings and",
    "Tom had a red ball. He liked to play with it every day, and his friend Sue liked it too. One",
    "Mom said",
    "There was a boy named Tim. Tim loved",
};

/* A sequence decoded greedily: its session, and the tokens it is fed. */
struct seq {
  npulm_session *s;
  int32_t next;
};

static int32_t argmax(const float *x, int n) {
  int32_t best = 0;
  for (int i = 1; i < n; i++) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

static npulm_session *new_session(const npulm_model *m, int n_ctx) {
  npulm_session_params sp = npulm_session_default_params();
  sp.n_ctx = n_ctx;
  sp.n_threads = 2;
  sp.sparse = NPULM_SPARSE_OFF;
  npulm_session *s = NULL;
  npulm_error err;
  if (npulm_session_create(m, &sp, &s, &err) != NPULM_OK) fail_msg("%s", err.msg);
  return s;
}

/* Start sequence i: its prompt evaluated, its first token picked. */
static void start(const npulm_model *m, struct seq *q, int i) {
  npulm_model_info info;
  npulm_model_get_info(m, &info);
  int32_t ids[MAX_PROMPT];
  size_t n;
  npulm_error err;
  q->s = new_session(m, N_CTX);
  if (npulm_tokenize(m, prompts[i], strlen(prompts[i]), info.add_bos, false, ids, MAX_PROMPT, &n,
                     &err) != NPULM_OK) {
    fail_msg("%s", err.msg);
  }
  if (npulm_session_eval(q->s, ids, n, NULL, &err) != NPULM_OK) fail_msg("%s", err.msg);
  q->next = argmax(npulm_session_logits(q->s), info.n_vocab);
}

/* Whether sequence i takes part in step 'step': members come and go, so that the batch size
 * and the positions of its rows change from step to step. */
static bool member(int i, int step) { return i == 0 || (step + i) % (i + 2) != 0; }

/* Decode N_SEQ sequences N_STEPS steps each, batched and alone, and compare every logit. */
static void check_batched_equals_alone(npulm_model *m) {
  npulm_model_info info;
  npulm_model_get_info(m, &info);
  struct seq batched[N_SEQ], alone[N_SEQ];
  for (int i = 0; i < N_SEQ; i++) {
    start(m, &batched[i], i);
    start(m, &alone[i], i);
  }
  npulm_error err;
  int sizes_seen = 0; /* bit b: a batch of b sequences ran */
  for (int step = 0; step < N_STEPS; step++) {
    npulm_session *members[N_SEQ];
    int32_t tokens[N_SEQ];
    int idx[N_SEQ], n = 0;
    for (int i = 0; i < N_SEQ; i++) {
      if (!member(i, step)) continue;
      members[n] = batched[i].s;
      tokens[n] = batched[i].next;
      idx[n++] = i;
    }
    sizes_seen |= 1 << n;
    if (npulm_session_eval_batch(members, tokens, (size_t)n, &err) != NPULM_OK) {
      fail_msg("%s", err.msg);
    }
    for (int k = 0; k < n; k++) {
      struct seq *b = &batched[idx[k]], *a = &alone[idx[k]];
      if (npulm_session_eval(a->s, &a->next, 1, NULL, &err) != NPULM_OK) fail_msg("%s", err.msg);
      assert_int_equal(npulm_session_pos(b->s), npulm_session_pos(a->s));
      const float *lb = npulm_session_logits(b->s), *la = npulm_session_logits(a->s);
      if (memcmp(lb, la, (size_t)info.n_vocab * sizeof(float)) != 0) {
        fail_msg("sequence %d, step %d (batch of %d): batched logits differ from alone", idx[k],
                 step, n);
      }
      b->next = a->next = argmax(la, info.n_vocab);
    }
  }
  /* the steps covered batch sizes up to N_SEQ, and the sequences crossed a context bucket */
  assert_true((sizes_seen & (1 << N_SEQ)) != 0);
  assert_true(npulm_session_pos(batched[0].s) > 128);
  for (int i = 0; i < N_SEQ; i++) {
    npulm_session_free(batched[i].s);
    npulm_session_free(alone[i].s);
  }
}

enum { RAGGED_STEPS = 48, MAX_ROWS = 16 };

/* Feed the prompts a few tokens per step (1 to 5, their rows interleaved round robin with the
 * other sessions' rows, up to MAX_ROWS a step), each session decoding greedily once its prompt is
 * in, and compare each session's logits after every step with a session fed the same tokens
 * alone. */
static void check_ragged_equals_alone(npulm_model *m) {
  npulm_model_info info;
  npulm_model_get_info(m, &info);
  npulm_session *batched[N_SEQ], *alone[N_SEQ];
  int32_t ids[N_SEQ][MAX_PROMPT], next[N_SEQ];
  size_t n_ids[N_SEQ], fed[N_SEQ];
  npulm_error err;
  for (int i = 0; i < N_SEQ; i++) {
    batched[i] = new_session(m, N_CTX);
    alone[i] = new_session(m, N_CTX);
    if (npulm_tokenize(m, prompts[i], strlen(prompts[i]), info.add_bos, false, ids[i], MAX_PROMPT,
                       &n_ids[i], &err) != NPULM_OK) {
      fail_msg("%s", err.msg);
    }
    fed[i] = 0;
  }
  bool mixed = false; /* a step held prompt rows of one session and decode rows of another */
  for (int step = 0; step < RAGGED_STEPS; step++) {
    npulm_session *rows[MAX_ROWS];
    int32_t tokens[MAX_ROWS], want[N_SEQ] = {0}, took[N_SEQ] = {0}, own[N_SEQ][5];
    for (int i = 0; i < N_SEQ; i++) {
      if (!member(i, step)) continue;
      const size_t left = n_ids[i] - fed[i], piece = (size_t)(1 + (step + i) % 5);
      want[i] = left == 0 ? 1 : (int)(piece < left ? piece : left);
    }
    int n = 0;
    for (int round = 0; round < 5; round++) { /* round robin: one row of each, while room */
      for (int i = 0; i < N_SEQ && n < MAX_ROWS; i++) {
        if (took[i] >= want[i] || took[i] != round) continue;
        const int32_t tok = fed[i] < n_ids[i] ? ids[i][fed[i] + (size_t)took[i]] : next[i];
        own[i][took[i]++] = tok;
        rows[n] = batched[i];
        tokens[n++] = tok;
      }
    }
    bool prompt_rows = false, decode_rows = false;
    for (int i = 0; i < N_SEQ; i++) {
      if (took[i] == 0) continue;
      prompt_rows |= fed[i] < n_ids[i];
      decode_rows |= fed[i] == n_ids[i];
    }
    mixed |= prompt_rows && decode_rows;
    if (npulm_session_eval_batch(rows, tokens, (size_t)n, &err) != NPULM_OK) {
      fail_msg("%s", err.msg);
    }
    for (int i = 0; i < N_SEQ; i++) {
      if (took[i] == 0) continue;
      if (npulm_session_eval(alone[i], own[i], (size_t)took[i], NULL, &err) != NPULM_OK) {
        fail_msg("%s", err.msg);
      }
      assert_int_equal(npulm_session_pos(batched[i]), npulm_session_pos(alone[i]));
      const float *lb = npulm_session_logits(batched[i]), *la = npulm_session_logits(alone[i]);
      if (memcmp(lb, la, (size_t)info.n_vocab * sizeof(float)) != 0) {
        fail_msg("sequence %d, step %d (%d of the step's %d rows): logits differ from alone", i,
                 step, took[i], n);
      }
      if (fed[i] < n_ids[i]) fed[i] += (size_t)took[i];
      if (fed[i] == n_ids[i]) next[i] = argmax(la, info.n_vocab);
    }
  }
  assert_true(mixed);
  for (int i = 0; i < N_SEQ; i++) {
    assert_int_equal(fed[i], n_ids[i]);
    npulm_session_free(batched[i]);
    npulm_session_free(alone[i]);
  }
}

/* Compile 'rel' with the batch sizes as chunks, context buckets 128 and 256. */
static npulm_model *open_compiled(const char *rel, const char *quant) {
  npulm_model *m = test_open_shared(rel);
  npulm_compile_params cp = npulm_compile_default_params();
  const int chunks[] = {2, 4, 8, 16};
  memcpy(cp.chunks, chunks, sizeof(chunks));
  cp.n_chunks = 4;
  cp.buckets[0] = 128;
  cp.buckets[1] = 256;
  cp.n_buckets = 2;
  cp.quant = quant;
  cp.calib_tokens = 256;
  npulm_error err;
  if (npulm_model_compile(m, &cp, &err) != NPULM_OK) fail_msg("%s", err.msg);
  return m;
}

static void test_batch_w8a8(void **state) {
  (void)state;
  npulm_model *m = open_compiled("models/stories260K.gguf", "w8a8-smooth");
  check_batched_equals_alone(m);
  check_ragged_equals_alone(m);
  npulm_model_close(m);
}

static void test_batch_w8a16_5m(void **state) {
  (void)state;
  npulm_model *m = open_compiled("models/tinystories-5M.gguf", "w8a16");
  check_batched_equals_alone(m);
  check_ragged_equals_alone(m);
  npulm_model_close(m);
}

static void test_batch_f32(void **state) {
  (void)state;
  npulm_model *m = open_compiled("models/stories260K.gguf", "f32");
  check_batched_equals_alone(m);
  check_ragged_equals_alone(m);
  npulm_model_close(m);
}

/* Sessions that decode sparse in a batch of several: the batch runs their FFNs dense, so its
 * logits are those of the same batch of dense sessions, bit for bit, and it counts no sparse FFN
 * step; a step of one such session alone is sparse (what serve relies on). */
static void test_batch_sparse(void **state) {
  (void)state;
  npulm_model *m = test_open_shared("models/tinystories-5M.gguf");
  npulm_compile_params cp = npulm_compile_default_params();
  const int chunks[] = {2, 4};
  memcpy(cp.chunks, chunks, sizeof(chunks));
  cp.n_chunks = 2;
  cp.buckets[0] = 256;
  cp.n_buckets = 1;
  cp.calib_tokens = 256;
  cp.sparsity = 0.5f;
  cp.sparse_form = NPULM_SPARSE_FORM_NEURON;
  npulm_error err;
  if (npulm_model_compile(m, &cp, &err) != NPULM_OK) fail_msg("%s", err.msg);
  npulm_model_info info;
  npulm_model_get_info(m, &info);
  enum { N = 3, PROMPT = 3, STEPS = 24 };
  npulm_session *sparse[N], *dense[N];
  int32_t next[N], ids[N][MAX_PROMPT];
  for (int i = 0; i < N; i++) {
    npulm_session_params sp = npulm_session_default_params();
    sp.n_ctx = 128;
    sp.n_threads = 2;
    if (npulm_session_create(m, &sp, &sparse[i], &err) != NPULM_OK) fail_msg("%s", err.msg);
    dense[i] = new_session(m, 128);
    assert_true(npulm_session_is_sparse(sparse[i]) && !npulm_session_is_sparse(dense[i]));
    size_t n;
    if (npulm_tokenize(m, prompts[i], strlen(prompts[i]), info.add_bos, false, ids[i], MAX_PROMPT,
                       &n, &err) != NPULM_OK) {
      fail_msg("%s", err.msg);
    }
    assert_true(n >= PROMPT);
  }
  /* the prompts' first tokens in batched steps too: one session's rows alone would take a
   * one-row (sparse) step for a prompt that no chunk holds */
  for (int step = 0; step < PROMPT + STEPS; step++) {
    if (step < PROMPT) {
      for (int i = 0; i < N; i++) next[i] = ids[i][step];
    }
    if (npulm_session_eval_batch(sparse, next, N, &err) != NPULM_OK ||
        npulm_session_eval_batch(dense, next, N, &err) != NPULM_OK) {
      fail_msg("%s", err.msg);
    }
    for (int i = 0; i < N; i++) {
      const float *ls = npulm_session_logits(sparse[i]), *ld = npulm_session_logits(dense[i]);
      if (memcmp(ls, ld, (size_t)info.n_vocab * sizeof(float)) != 0) {
        fail_msg("sequence %d, step %d: a batch of sparse sessions differs from dense", i, step);
      }
      next[i] = argmax(ld, info.n_vocab);
    }
  }
  npulm_sparse_stats st;
  npulm_session_sparse_stats(sparse[0], &st);
  assert_true(st.layer_steps == 0);
  if (npulm_session_eval(sparse[0], &next[0], 1, NULL, &err) != NPULM_OK) fail_msg("%s", err.msg);
  npulm_session_sparse_stats(sparse[0], &st);
  assert_true(st.layer_steps == (uint64_t)info.n_layers);
  for (int i = 0; i < N; i++) {
    npulm_session_free(sparse[i]);
    npulm_session_free(dense[i]);
  }
  npulm_model_close(m);
}

/* Evaluate a batch expected to fail with 'want', checking that nothing moved. */
static void expect_refused(npulm_session *const *s, const int32_t *tokens, size_t n,
                           npulm_status want, const char *msg_part) {
  int pos[8];
  for (size_t i = 0; i < n; i++) pos[i] = s[i] != NULL ? npulm_session_pos(s[i]) : 0;
  npulm_error err;
  npulm_status st = npulm_session_eval_batch(s, tokens, n, &err);
  if (st != want || strstr(err.msg, msg_part) == NULL) {
    fail_msg("got %s \"%s\", want %s with \"%s\"", npulm_status_name(st), err.msg,
             npulm_status_name(want), msg_part);
  }
  for (size_t i = 0; i < n; i++) {
    if (s[i] != NULL) assert_int_equal(npulm_session_pos(s[i]), pos[i]);
  }
}

static void test_batch_refusals(void **state) {
  (void)state;
  npulm_model *m = open_compiled("models/stories260K.gguf", "w8a8-naive");
  npulm_model *other = open_compiled("models/stories260K.gguf", "w8a8-naive");
  npulm_session *a = new_session(m, N_CTX), *b = new_session(m, N_CTX);
  npulm_session *short_ctx = new_session(m, 64), *foreign = new_session(other, N_CTX);
  npulm_session_params rp = npulm_session_default_params();
  rp.n_ctx = N_CTX;
  rp.reference = true;
  npulm_session *ref = NULL;
  npulm_error err;
  if (npulm_session_create(m, &rp, &ref, &err) != NPULM_OK) fail_msg("%s", err.msg);
  const int32_t tok[] = {1, 2, 3, 4};
  expect_refused((npulm_session *[]){a, NULL}, tok, 2, NPULM_ERR_ARG, "is NULL");
  expect_refused((npulm_session *[]){a, short_ctx}, tok, 2, NPULM_ERR_ARG, "context length");
  expect_refused((npulm_session *[]){a, foreign}, tok, 2, NPULM_ERR_ARG, "one model");
  expect_refused((npulm_session *[]){a, ref}, tok, 2, NPULM_ERR_ARG, "reference");
  expect_refused((npulm_session *[]){a, b}, (const int32_t[]){1, 1 << 20}, 2, NPULM_ERR_ARG,
                 "outside the vocabulary");
  assert_int_equal(npulm_session_eval_batch(NULL, tok, 2, &err), NPULM_ERR_ARG);
  assert_int_equal(npulm_session_eval_batch((npulm_session *[]){a, b}, tok, 0, &err), NPULM_OK);

  /* a full context: the whole batch is refused */
  int32_t fill[64] = {0};
  npulm_session_reset(short_ctx);
  npulm_session *s64 = new_session(m, 64);
  npulm_session *s64b = new_session(m, 64);
  if (npulm_session_eval(s64, fill, 64, NULL, &err) != NPULM_OK) fail_msg("%s", err.msg);
  expect_refused((npulm_session *[]){s64b, s64}, tok, 2, NPULM_ERR_ARG, "do not fit");
  npulm_session_reset(s64);
  if (npulm_session_eval(s64, fill, 63, NULL, &err) != NPULM_OK) fail_msg("%s", err.msg);
  expect_refused((npulm_session *[]){s64, s64b, s64}, tok, 3, NPULM_ERR_ARG, "do not fit");

  /* more sequences than the largest chunk size */
  npulm_model *small = test_open_shared("models/stories260K.gguf");
  npulm_compile_params cp = npulm_compile_default_params();
  cp.chunks[0] = 2;
  cp.n_chunks = 1;
  cp.quant = "w8a8-naive";
  cp.calib_tokens = 64;
  if (npulm_model_compile(small, &cp, &err) != NPULM_OK) fail_msg("%s", err.msg);
  npulm_session *t[3] = {new_session(small, 64), new_session(small, 64), new_session(small, 64)};
  expect_refused(t, tok, 3, NPULM_ERR_UNSUPPORTED, "--batch 3");
  /* tokens of one session alone are an evaluation of them */
  npulm_session *one[3] = {t[0], t[0], t[0]};
  if (npulm_session_eval_batch(one, tok, 3, &err) != NPULM_OK) fail_msg("%s", err.msg);
  assert_int_equal(npulm_session_pos(t[0]), 3);
  /* attention on the NPU */
  npulm_model *npu_attn = test_open_shared("models/stories260K.gguf");
  cp.chunks[0] = 4;
  cp.float_ops = "none";
  if (npulm_model_compile(npu_attn, &cp, &err) != NPULM_OK) fail_msg("%s", err.msg);
  npulm_session *u[2] = {new_session(npu_attn, 64), new_session(npu_attn, 64)};
  expect_refused(u, tok, 2, NPULM_ERR_UNSUPPORTED, "attention");

  for (int i = 0; i < 3; i++) npulm_session_free(t[i]);
  for (int i = 0; i < 2; i++) npulm_session_free(u[i]);
  npulm_session_free(s64);
  npulm_session_free(s64b);
  npulm_session_free(a);
  npulm_session_free(b);
  npulm_session_free(short_ctx);
  npulm_session_free(foreign);
  npulm_session_free(ref);
  npulm_model_close(small);
  npulm_model_close(npu_attn);
  npulm_model_close(other);
  npulm_model_close(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_batch_w8a8),     cmocka_unit_test(test_batch_w8a16_5m),
      cmocka_unit_test(test_batch_f32),      cmocka_unit_test(test_batch_sparse),
      cmocka_unit_test(test_batch_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
