/* Perplexity by llama.cpp's llama-perplexity method, so figures compare one to one: tokenize the
 * text with BOS, cut it into non-overlapping windows of n_ctx tokens, make the first token of each
 * window BOS, evaluate the window from an empty cache and score the second half of it. Windows are
 * independent, so worker threads take them in turn, each with its own session; per-window sums are
 * added in window order, so the result does not depend on the thread count. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/perplexity.h"
#include "base/common.h"
#include "model/model.h"

struct ppl_job {
  const npulm_model *model;
  const int32_t *tokens;
  int n_ctx;
  int n_chunks;
  int n_vocab;
  int32_t bos;
  npulm_session_params session; /* each worker's sessions' (n_ctx and n_threads set here) */
  bool decode;                  /* every token a decode step of its own */
  npulm_sparse_stats sparse;    /* the sessions' sparse statistics, added up (guarded by 'lock') */
  double *nll;                  /* (n_chunks) summed negative log-likelihood of each window */
  double *nll2;                 /* (n_chunks) summed squares */
  bool *finished;               /* (n_chunks) guarded by 'lock' */
  pthread_mutex_t lock;
  pthread_cond_t progress;
  int next_chunk; /* guarded by 'lock' */
  int done;       /* guarded by 'lock' */
  npulm_status status;
  npulm_error err;
};

/* -log softmax(logits)[target], with the sum of exponentials in double as llama.cpp does. */
static double nll_of(const float *logits, int n_vocab, int32_t target) {
  float max = logits[0];
  for (int i = 1; i < n_vocab; i++) max = logits[i] > max ? logits[i] : max;
  double sum = 0.0;
  for (int i = 0; i < n_vocab; i++) sum += expf(logits[i] - max);
  return -((double)(logits[target] - max) - log(sum));
}

/* Add one session's sparse statistics to 'sum' (shares weighted by their steps; recall by the
 * same, an approximation of the mass ratio over all). */
static void add_sparse(npulm_sparse_stats *sum, const npulm_sparse_stats *one) {
  const double ia = (double)sum->input_steps, ib = (double)one->input_steps;
  if (ib > 0.0) {
    sum->input_kept =
        ia == 0.0 ? one->input_kept : (sum->input_kept * ia + one->input_kept * ib) / (ia + ib);
    sum->bytes_share =
        ia == 0.0 ? one->bytes_share : (sum->bytes_share * ia + one->bytes_share * ib) / (ia + ib);
    sum->input_steps += one->input_steps;
    sum->select_s += one->select_s;
    sum->gemv_s += one->gemv_s;
    sum->input_bytes = one->input_bytes;
  }
  const double a = (double)sum->layer_steps, b = (double)one->layer_steps;
  if (b == 0.0) return;
  sum->kept = (sum->kept * a + one->kept * b) / (a + b);
  sum->candidates = (sum->candidates * a + one->candidates * b) / (a + b);
  sum->recall = a == 0.0 ? one->recall : (sum->recall * a + one->recall * b) / (a + b);
  sum->layer_steps += one->layer_steps;
  sum->predict_s += one->predict_s;
  sum->ffn_s += one->ffn_s;
}

static void *ppl_worker(void *arg) {
  struct ppl_job *job = arg;
  npulm_session *session = NULL;
  npulm_session_params sp = job->session;
  sp.n_ctx = job->n_ctx;
  sp.n_threads = 1;
  npulm_error err;
  size_t n_ctx = (size_t)job->n_ctx;
  float *logits = malloc(n_ctx * (size_t)job->n_vocab * sizeof(float));
  int32_t *window = malloc(n_ctx * sizeof(int32_t));
  npulm_status st = logits && window ? npulm_session_create(job->model, &sp, &session, &err)
                                     : npu_fail(&err, NPULM_ERR_NOMEM, "out of memory");
  for (;;) {
    pthread_mutex_lock(&job->lock);
    if (st != NPULM_OK && job->status == NPULM_OK) {
      job->status = st;
      job->err = err;
    }
    int chunk = job->status == NPULM_OK ? job->next_chunk++ : job->n_chunks;
    pthread_mutex_unlock(&job->lock);
    if (chunk >= job->n_chunks) break;

    memcpy(window, job->tokens + (size_t)chunk * n_ctx, n_ctx * sizeof(int32_t));
    if (job->bos >= 0) window[0] = job->bos;
    npulm_session_reset(session);
    if (job->decode) {
      for (size_t j = 0; j < n_ctx && st == NPULM_OK; j++)
        st = npulm_session_eval(session, window + j, 1, logits + j * (size_t)job->n_vocab, &err);
    } else {
      st = npulm_session_eval(session, window, n_ctx, logits, &err);
    }
    if (st != NPULM_OK) continue;
    /* score tokens first+1 .. n_ctx-1 of the window from the logits before them */
    double nll = 0.0, nll2 = 0.0;
    for (size_t j = n_ctx / 2; j + 1 < n_ctx; j++) {
      int32_t target = job->tokens[(size_t)chunk * n_ctx + j + 1];
      double v = nll_of(logits + j * (size_t)job->n_vocab, job->n_vocab, target);
      nll += v;
      nll2 += v * v;
    }
    pthread_mutex_lock(&job->lock);
    job->nll[chunk] = nll;
    job->nll2[chunk] = nll2;
    job->finished[chunk] = true;
    job->done++;
    pthread_cond_signal(&job->progress);
    pthread_mutex_unlock(&job->lock);
  }
  npulm_sparse_stats sparse = {0};
  if (session != NULL) npulm_session_sparse_stats(session, &sparse);
  npulm_session_free(session);
  free(logits);
  free(window);
  pthread_mutex_lock(&job->lock);
  add_sparse(&job->sparse, &sparse);
  pthread_cond_signal(&job->progress);
  pthread_mutex_unlock(&job->lock);
  return NULL;
}

npulm_status npulm_perplexity(const npulm_model *model, const char *text, size_t len, int n_ctx,
                              int n_threads, npulm_ppl_progress_fn progress, void *user,
                              npulm_ppl_result *result_out, npulm_error *err) {
  npulm_session_params sp = npulm_session_default_params();
  return npu_perplexity_run(model, text, len, n_ctx, n_threads, &sp, false, progress, user,
                            result_out, NULL, err);
}

npulm_status npulm_perplexity_decode(const npulm_model *model, const char *text, size_t len,
                                     int n_ctx, int n_threads, const npulm_session_params *session,
                                     npulm_ppl_progress_fn progress, void *user,
                                     npulm_ppl_result *result_out, npulm_sparse_stats *sparse_out,
                                     npulm_error *err) {
  return npu_perplexity_run(model, text, len, n_ctx, n_threads, session, true, progress, user,
                            result_out, sparse_out, err);
}

npulm_status npulm_perplexity_reference(const npulm_model *model, const char *text, size_t len,
                                        int n_ctx, int n_threads, npulm_ppl_progress_fn progress,
                                        void *user, npulm_ppl_result *result_out,
                                        npulm_error *err) {
  npulm_session_params sp = npulm_session_default_params();
  sp.reference = true;
  return npu_perplexity_run(model, text, len, n_ctx, n_threads, &sp, false, progress, user,
                            result_out, NULL, err);
}

npulm_status npu_perplexity_run(const npulm_model *model, const char *text, size_t len, int n_ctx,
                                int n_threads, const npulm_session_params *session, bool decode,
                                npulm_ppl_progress_fn progress, void *user,
                                npulm_ppl_result *result_out, npulm_sparse_stats *sparse_out,
                                npulm_error *err) {
  memset(result_out, 0, sizeof(*result_out));
  if (sparse_out != NULL) memset(sparse_out, 0, sizeof(*sparse_out));
  const bool reference = session->reference;
  npulm_status st = npu_config_check_weights(&model->cfg, err);
  if (st == NPULM_OK && reference) {
    st = npu_model_check_float(model, "the reference forward (--reference)", err);
  }
  if (st != NPULM_OK) return st;
  npulm_model_info info;
  npulm_model_get_info(model, &info);
  if (n_ctx < 4 || n_ctx > info.n_ctx_train) {
    return npu_fail(err, NPULM_ERR_ARG, "perplexity context %d must be between 4 and %d", n_ctx,
                    info.n_ctx_train);
  }
  double t0 = npu_now();
  struct ppl_job job = {.model = model,
                        .n_ctx = n_ctx,
                        .n_vocab = info.n_vocab,
                        .bos = info.add_bos ? info.bos_id : -1,
                        .session = *session,
                        .decode = decode};
  job.sparse.recall = NAN;
  job.sparse.input_kept = job.sparse.bytes_share = NAN;
  size_t n_tokens = 0;
  int32_t *tokens = NULL;
  st = npu_tokenize_alloc(model, text, len, info.add_bos, &tokens, &n_tokens, err);
  if (st != NPULM_OK) goto done;
  if (n_tokens < 2 * (size_t)n_ctx) {
    st = npu_fail(err, NPULM_ERR_ARG,
                  "the text has %zu tokens; perplexity with context %d needs at least %d", n_tokens,
                  n_ctx, 2 * n_ctx);
    goto done;
  }
  job.tokens = tokens;
  job.n_chunks = (int)(n_tokens / (size_t)n_ctx);
  job.nll = calloc((size_t)job.n_chunks, sizeof(double));
  job.nll2 = calloc((size_t)job.n_chunks, sizeof(double));
  job.finished = calloc((size_t)job.n_chunks, sizeof(bool));
  if (job.nll == NULL || job.nll2 == NULL || job.finished == NULL) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
    goto done;
  }
  if (n_threads <= 0) n_threads = 1;
  if (n_threads > job.n_chunks) n_threads = job.n_chunks;
  pthread_mutex_init(&job.lock, NULL);
  pthread_cond_init(&job.progress, NULL);
  pthread_t threads[64];
  int n_started = 0;
  for (; n_started < n_threads && n_started < 64; n_started++) {
    if (pthread_create(&threads[n_started], NULL, ppl_worker, &job) != 0) break;
  }
  if (n_started == 0) {
    ppl_worker(&job); /* no thread could start: do the work here */
  }
  /* report progress as windows finish: the running estimate over the windows done in order */
  pthread_mutex_lock(&job.lock);
  int reported = 0;
  while (n_started > 0 && reported < job.n_chunks && job.status == NPULM_OK) {
    while (job.done == reported && job.status == NPULM_OK)
      pthread_cond_wait(&job.progress, &job.lock);
    reported = job.done;
    if (progress != NULL && job.status == NPULM_OK) {
      double sum = 0.0;
      int prefix = 0; /* windows 0..prefix-1 are all finished */
      while (prefix < job.n_chunks && job.finished[prefix]) {
        sum += job.nll[prefix++];
      }
      int per_chunk = n_ctx - n_ctx / 2 - 1;
      double running = prefix > 0 ? exp(sum / ((double)prefix * per_chunk)) : 0.0;
      pthread_mutex_unlock(&job.lock);
      progress(user, reported, job.n_chunks, running);
      pthread_mutex_lock(&job.lock);
    }
  }
  pthread_mutex_unlock(&job.lock);
  for (int i = 0; i < n_started; i++) pthread_join(threads[i], NULL);
  pthread_mutex_destroy(&job.lock);
  pthread_cond_destroy(&job.progress);
  if ((st = job.status) != NPULM_OK) {
    if (err != NULL) *err = job.err;
    goto done;
  }
  /* final estimate and its standard error, as llama-perplexity computes them */
  double nll = 0.0, nll2 = 0.0;
  for (int c = 0; c < job.n_chunks; c++) {
    nll += job.nll[c];
    nll2 += job.nll2[c];
  }
  uint64_t count = (uint64_t)job.n_chunks * (uint64_t)(n_ctx - n_ctx / 2 - 1);
  nll /= (double)count;
  nll2 = nll2 / (double)count - nll * nll;
  result_out->ppl = exp(nll);
  result_out->ppl_stderr = nll2 > 0 ? sqrt(nll2 / (double)(count - 1)) * result_out->ppl : 0.0;
  result_out->n_chunks = job.n_chunks;
  result_out->n_ctx = n_ctx;
  result_out->n_scored = count;
  result_out->seconds = npu_now() - t0;
  if (sparse_out != NULL) *sparse_out = job.sparse;
done:
  free(tokens);
  free(job.nll);
  free(job.nll2);
  free(job.finished);
  return st;
}
