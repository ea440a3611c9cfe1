/* What include/npulm.h promises about threads, run under ThreadSanitizer by `make TSAN=1 test`:
 * one open model shared by sessions in several threads at once — created at the same moment
 * (a model without a program: each compiles graphs of its own), each tokenizing, evaluating and
 * generating greedily, while other threads read the model (info, token texts, its program's
 * description and traffic) — gives every thread the tokens, text and final logits, bit for bit,
 * of a single-threaded run; on a model compiled in process, on one opened from a program file,
 * and for the FP32 reference; and a session handed from one thread to another carries on as if
 * it had stayed. */
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "npulm.h"
#include "npulm_bench.h"
#include "test_util.h"

enum {
  N_WORKERS = 3, /* sessions generating at once on one model */
  N_READERS = 1, /* threads reading the model meanwhile */
  N_GEN = 24,    /* tokens generated after the prompt */
  N_CTX = 64,
  MAX_TOKENS = 32,
  TEXT_MAX = 1024,
};

static const char prompt[] = "Once upon a time";
/* perplexity's text: several windows of 16 tokens */
static const char story[] =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
    "One day, she saw a big, red ball. She wanted to play with it, but it was too high. She asked "
    "her mom to help her. Her mom smiled and got the ball down. Lily was very happy and said thank "
    "you. They played with the ball all day long.";

/* What a run produced: the prompt's ids, the generated ids and their text, the final logits. */
struct run {
  int32_t prompt_ids[MAX_TOKENS];
  size_t n_prompt;
  int32_t gen[N_GEN];
  char text[TEXT_MAX];
  float *logits;                      /* (n_vocab) after the last token */
  char failure[NPULM_ERROR_MAX + 64]; /* empty when the run went through */
};

struct shared {
  const npulm_model *model;
  bool reference;
  pthread_barrier_t start; /* every thread begins at once */
};

/* What a reader found: the model's perplexity on 'story', and anything that failed. */
struct reader {
  struct shared *sh;
  double ppl;
  char failure[NPULM_ERROR_MAX + 64];
};

struct worker {
  struct shared *sh;
  int n_threads; /* the session's */
  struct run run;
};

static void run_fail(struct run *r, const char *what, const npulm_error *err) {
  snprintf(r->failure, sizeof(r->failure), "%s: %s", what, err != NULL ? err->msg : "failed");
}

/* Create a session on 'model' and generate greedily from the prompt into 'r'; every call a
 * separate thread may make at the same time as others on the same model. Failures are recorded
 * in r->failure (cmocka's asserts belong to the main thread). */
static void generate(const npulm_model *model, bool reference, int n_threads, struct run *r) {
  npulm_error err;
  npulm_model_info info;
  npulm_model_get_info(model, &info);
  r->logits = calloc((size_t)info.n_vocab, sizeof(float));
  if (r->logits == NULL) return run_fail(r, "logits", NULL);
  if (npulm_tokenize(model, prompt, strlen(prompt), info.add_bos, false, r->prompt_ids, MAX_TOKENS,
                     &r->n_prompt, &err) != NPULM_OK) {
    return run_fail(r, "tokenize", &err);
  }
  npulm_session_params sp = npulm_session_default_params();
  sp.n_ctx = N_CTX;
  sp.n_threads = n_threads;
  sp.reference = reference;
  npulm_session *s = NULL;
  if (npulm_session_create(model, &sp, &s, &err) != NPULM_OK) {
    return run_fail(r, "session_create", &err);
  }
  npulm_sampler_params pp = npulm_sampler_default_params();
  pp.temp = 0.0f;
  npulm_sampler *greedy = NULL;
  if (npulm_sampler_create(&pp, info.n_vocab, &greedy, &err) != NPULM_OK) {
    npulm_session_free(s);
    return run_fail(r, "sampler_create", &err);
  }
  npulm_status st = npulm_session_eval(s, r->prompt_ids, r->n_prompt, NULL, &err);
  size_t len = 0;
  int32_t prev = -1;
  for (int i = 0; i < N_GEN && st == NPULM_OK; i++) {
    r->gen[i] = npulm_sampler_sample(greedy, npulm_session_logits(s));
    len += npulm_token_to_piece(model, prev, r->gen[i], r->text + len, TEXT_MAX - 1 - len);
    prev = r->gen[i];
    st = npulm_session_eval(s, &r->gen[i], 1, NULL, &err);
  }
  r->text[len] = '\0';
  if (st != NPULM_OK) {
    run_fail(r, "session_eval", &err);
  } else {
    memcpy(r->logits, npulm_session_logits(s), (size_t)info.n_vocab * sizeof(float));
  }
  npulm_sampler_free(greedy);
  npulm_session_free(s);
}

static void *worker_main(void *arg) {
  struct worker *w = arg;
  pthread_barrier_wait(&w->sh->start);
  generate(w->sh->model, w->sh->reference, w->n_threads, &w->run);
  return NULL;
}

/* The model's perplexity on 'story' in windows of 16 on two threads of its own (its sessions of
 * one thread each); 0 with 'failure' set on an error. */
static double story_ppl(const npulm_model *m, bool reference, char *failure, size_t cap) {
  npulm_ppl_result r;
  npulm_error err;
  npulm_status st =
      reference ? npulm_perplexity_reference(m, story, strlen(story), 16, 2, NULL, NULL, &r, &err)
                : npulm_perplexity(m, story, strlen(story), 16, 2, NULL, NULL, &r, &err);
  if (st != NPULM_OK) snprintf(failure, cap, "perplexity: %s", err.msg);
  return st == NPULM_OK ? r.ppl : 0.0;
}

/* A reader: what a model answers without a session of its own, while the workers run. */
static void *reader_main(void *arg) {
  struct reader *rd = arg;
  struct shared *sh = rd->sh;
  pthread_barrier_wait(&sh->start);
  rd->ppl = story_ppl(sh->model, sh->reference, rd->failure, sizeof(rd->failure));
  npulm_model_info info;
  size_t sum = 0;
  for (int k = 0; k < 20; k++) {
    npulm_model_get_info(sh->model, &info);
    for (int32_t id = 0; id < info.n_vocab; id += 7) {
      const char *t = npulm_token_text(sh->model, id);
      sum += t != NULL ? strlen(t) : 0;
      sum += npulm_token_is_eog(sh->model, id);
    }
    if (npulm_model_has_program(sh->model)) {
      FILE *null = fopen("/dev/null", "w");
      npulm_error err;
      npulm_decode_traffic traffic;
      if (null != NULL) (void)npulm_model_print_program(sh->model, null, &err);
      if (null != NULL) fclose(null);
      (void)npulm_decode_traffic_at(sh->model, k, &traffic, &err);
      sum += (size_t)npulm_program_max_rows(sh->model);
    }
  }
  return (void *)(uintptr_t)sum;
}

static void assert_same_run(const struct run *want, const struct run *got, int n_vocab) {
  if (got->failure[0] != '\0') fail_msg("%s", got->failure);
  assert_int_equal(got->n_prompt, want->n_prompt);
  assert_memory_equal(got->prompt_ids, want->prompt_ids, want->n_prompt * sizeof(int32_t));
  assert_memory_equal(got->gen, want->gen, sizeof(want->gen));
  assert_string_equal(got->text, want->text);
  assert_memory_equal(got->logits, want->logits, (size_t)n_vocab * sizeof(float));
}

/* The single-threaded run (one session on one thread, nothing else running), then N_WORKERS
 * sessions on threads of their own with N_READERS readers, all starting at once: every worker
 * must match it. */
static void check_shared(const npulm_model *m, bool reference) {
  npulm_model_info info;
  npulm_model_get_info(m, &info);
  struct run *alone = calloc(1, sizeof(*alone));
  assert_non_null(alone);
  generate(m, reference, 1, alone);
  if (alone->failure[0] != '\0') fail_msg("%s", alone->failure);
  assert_true(alone->n_prompt > 1);
  assert_true(strlen(alone->text) > 0);

  char failure[NPULM_ERROR_MAX + 64] = "";
  double ppl = story_ppl(m, reference, failure, sizeof(failure));
  if (failure[0] != '\0') fail_msg("%s", failure);
  assert_true(ppl > 1.0);

  struct shared sh = {.model = m, .reference = reference};
  struct reader rd[N_READERS];
  assert_int_equal(pthread_barrier_init(&sh.start, NULL, N_WORKERS + N_READERS), 0);
  struct worker *w = calloc(N_WORKERS, sizeof(*w));
  assert_non_null(w);
  pthread_t threads[N_WORKERS + N_READERS];
  for (int i = 0; i < N_WORKERS; i++) {
    w[i].sh = &sh;
    w[i].n_threads = 1 + i; /* one thread; the two workers; a helper in the NPU's loops too */
    assert_int_equal(pthread_create(&threads[i], NULL, worker_main, &w[i]), 0);
  }
  for (int i = 0; i < N_READERS; i++) {
    rd[i] = (struct reader){.sh = &sh};
    assert_int_equal(pthread_create(&threads[N_WORKERS + i], NULL, reader_main, &rd[i]), 0);
  }
  for (int i = 0; i < N_WORKERS + N_READERS; i++)
    assert_int_equal(pthread_join(threads[i], NULL), 0);
  pthread_barrier_destroy(&sh.start);
  for (int i = 0; i < N_WORKERS; i++) {
    assert_same_run(alone, &w[i].run, info.n_vocab);
    free(w[i].run.logits);
  }
  for (int i = 0; i < N_READERS; i++) {
    if (rd[i].failure[0] != '\0') fail_msg("%s", rd[i].failure);
    assert_true(rd[i].ppl == ppl); /* the same windows, the same bits */
  }
  free(w);
  free(alone->logits);
  free(alone);
}

/* A model without a program: every session compiles FP32 graphs of its own, all at once. */
static void test_sessions_compile_at_once(void **state) {
  (void)state;
  npulm_model *m = test_open_shared("models/stories260K.gguf");
  assert_false(npulm_model_has_program(m));
  check_shared(m, false);
  assert_false(npulm_model_has_program(m)); /* the sessions' graphs were their own */
  npulm_model_close(m);
}

/* The FP32 reference forward, sessions sharing the model's weights. */
static void test_reference_sessions(void **state) {
  (void)state;
  npulm_model *m = test_open_shared("models/stories260K.gguf");
  check_shared(m, true);
  npulm_model_close(m);
}

/* An integer program compiled in this process: prefill chunks of 4 (a prompt of several steps
 * runs on both workers), and the one shared program read by every session. */
static npulm_model *open_compiled(void) {
  npulm_model *m = test_open_shared("models/stories260K.gguf");
  npulm_compile_params cp = npulm_compile_default_params();
  cp.chunks[0] = 4;
  cp.n_chunks = 1;
  cp.buckets[0] = N_CTX;
  cp.n_buckets = 1;
  cp.calib_tokens = 64;
  cp.quant = "w8a8-shadow";
  cp.shadow_threshold = 2.0f; /* outlier channels computed on the CPU: more of both backends */
  npulm_error err;
  if (npulm_model_compile(m, &cp, &err) != NPULM_OK) fail_msg("%s", err.msg);
  return m;
}

static void test_compiled_program_shared(void **state) {
  (void)state;
  npulm_model *m = open_compiled();
  check_shared(m, false);
  npulm_model_close(m);
}

/* The same program saved and opened again: its packed weights are the file's mapping. */
static void test_program_file_shared(void **state) {
  (void)state;
  npulm_model *c = open_compiled();
  char path[] = "/tmp/npulm-test-threads-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  npulm_error err;
  if (npulm_model_save_program(c, path, NULL, NULL, &err) != NPULM_OK) fail_msg("%s", err.msg);
  npulm_model_close(c);
  npulm_model *m = NULL;
  npulm_status st = npulm_model_open(path, &m, &err);
  unlink(path);
  if (st != NPULM_OK) fail_msg("%s", err.msg);
  assert_true(npulm_model_has_program(m));
  check_shared(m, false);
  npulm_model_close(m);
}

/* A session used by one thread at a time, not always the same one: each step (the prompt, then
 * each generated token) on a thread of its own, as a server's request handlers would take turns. */
struct handoff {
  npulm_session *s;
  npulm_sampler *greedy;
  const int32_t *prompt;
  size_t n_prompt;
  int step;
  int32_t gen[N_GEN];
  npulm_status st;
  npulm_error err;
};

static void *step_main(void *arg) {
  struct handoff *h = arg;
  if (h->step == 0) {
    h->st = npulm_session_eval(h->s, h->prompt, h->n_prompt, NULL, &h->err);
  } else {
    h->st = npulm_session_eval(h->s, &h->gen[h->step - 1], 1, NULL, &h->err);
  }
  if (h->st == NPULM_OK && h->step < N_GEN) {
    h->gen[h->step] = npulm_sampler_sample(h->greedy, npulm_session_logits(h->s));
  }
  return NULL;
}

static void test_session_between_threads(void **state) {
  (void)state;
  npulm_model *m = open_compiled();
  npulm_model_info info;
  npulm_model_get_info(m, &info);
  struct run *alone = calloc(1, sizeof(*alone));
  assert_non_null(alone);
  generate(m, false, 3, alone);
  if (alone->failure[0] != '\0') fail_msg("%s", alone->failure);

  npulm_session_params sp = npulm_session_default_params();
  sp.n_ctx = N_CTX;
  sp.n_threads = 3;
  npulm_sampler_params pp = npulm_sampler_default_params();
  pp.temp = 0.0f;
  struct handoff h = {.prompt = alone->prompt_ids, .n_prompt = alone->n_prompt};
  assert_int_equal(npulm_session_create(m, &sp, &h.s, &h.err), NPULM_OK);
  assert_int_equal(npulm_sampler_create(&pp, info.n_vocab, &h.greedy, &h.err), NPULM_OK);
  for (h.step = 0; h.step <= N_GEN; h.step++) {
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, step_main, &h), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    if (h.st != NPULM_OK) fail_msg("step %d: %s", h.step, h.err.msg);
  }
  assert_memory_equal(h.gen, alone->gen, sizeof(h.gen));
  assert_memory_equal(npulm_session_logits(h.s), alone->logits,
                      (size_t)info.n_vocab * sizeof(float));
  npulm_sampler_free(h.greedy);
  npulm_session_free(h.s);
  free(alone->logits);
  free(alone);
  npulm_model_close(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sessions_compile_at_once), cmocka_unit_test(test_reference_sessions),
      cmocka_unit_test(test_compiled_program_shared),  cmocka_unit_test(test_program_file_shared),
      cmocka_unit_test(test_session_between_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
