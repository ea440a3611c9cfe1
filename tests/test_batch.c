/* Batched decode (npulm_session_eval_batch): sequences of different lengths, each in its own
 * session, decoded together in steps of one static graph give every sequence the logits, bit for
 * bit, of decoding it alone; as the batch's members come and go (batch sizes 2 to 7, padded to the
 * chunk sizes 2, 4, 8), on the integer NPU (int8 and int16 activations) and on FP32 graphs, across
 * context buckets. And each way the call can be misused is one error that evaluates nothing. */
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
  npulm_model_close(m);
}

static void test_batch_w8a16_5m(void **state) {
  (void)state;
  npulm_model *m = open_compiled("models/tinystories-5M.gguf", "w8a16");
  check_batched_equals_alone(m);
  npulm_model_close(m);
}

static void test_batch_f32(void **state) {
  (void)state;
  npulm_model *m = open_compiled("models/stories260K.gguf", "f32");
  check_batched_equals_alone(m);
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
  expect_refused((npulm_session *[]){a, a}, tok, 2, NPULM_ERR_ARG, "also session 0");
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
  expect_refused((npulm_session *[]){s64b, s64}, tok, 2, NPULM_ERR_ARG, "is full");

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
      cmocka_unit_test(test_batch_w8a8),
      cmocka_unit_test(test_batch_w8a16_5m),
      cmocka_unit_test(test_batch_f32),
      cmocka_unit_test(test_batch_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
