/* FP32 reference forward: building blocks against double-precision definitions, and whole models
 * against their documented greedy outputs. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/expf.h"
#include "model/model.h"
#include "npulm.h"
#include "ref/forward.h"
#include "test_util.h"

static void test_matvec_matches_double(void **state) {
  (void)state;
  uint64_t rng = 1;
  for (int trial = 0; trial < 200; trial++) {
    int n_in = 1 + (int)(test_rand(&rng) % 300), n_out = 1 + (int)(test_rand(&rng) % 40);
    bool with_bias = trial % 2;
    float *w = malloc((size_t)n_in * (size_t)n_out * sizeof(float));
    float *x = malloc((size_t)n_in * sizeof(float)), *b = malloc((size_t)n_out * sizeof(float));
    float *y = malloc((size_t)n_out * sizeof(float));
    for (int i = 0; i < n_in * n_out; i++)
      w[i] = (float)((int)(test_rand(&rng) % 2001) - 1000) / 1000.0f;
    for (int i = 0; i < n_in; i++) x[i] = (float)((int)(test_rand(&rng) % 2001) - 1000) / 500.0f;
    for (int i = 0; i < n_out; i++) b[i] = (float)((int)(test_rand(&rng) % 2001) - 1000) / 100.0f;
    npu_ref_matvec(y, w, with_bias ? b : NULL, x, n_in, n_out);
    for (int o = 0; o < n_out; o++) {
      double ref = with_bias ? b[o] : 0.0, mag = fabs(ref);
      for (int i = 0; i < n_in; i++) {
        ref += (double)w[(size_t)o * (size_t)n_in + (size_t)i] * x[i];
        mag += fabs((double)w[(size_t)o * (size_t)n_in + (size_t)i] * x[i]);
      }
      assert_true(fabs(y[o] - ref) <= 1e-6 * mag + 1e-6);
    }
    free(w);
    free(x);
    free(b);
    free(y);
  }
}

static void test_rmsnorm_and_softmax(void **state) {
  (void)state;
  float x[7] = {1, -2, 3, 0.5f, -0.25f, 4, 0}, w[7] = {1, 2, 0.5f, 1, 1, -1, 3}, out[7];
  double ss = 0;
  for (int i = 0; i < 7; i++) ss += (double)x[i] * x[i];
  double scale = 1.0 / sqrt(ss / 7 + 1e-5);
  npu_ref_rmsnorm(out, x, w, 7, 1e-5f);
  for (int i = 0; i < 7; i++) assert_true(fabs(out[i] - x[i] * scale * w[i]) < 1e-5);
  float p[5] = {1000, 1001, 999, -1e30f, 1000};
  npu_ref_softmax(p, 5);
  double sum = 0;
  for (int i = 0; i < 5; i++) sum += p[i];
  assert_true(fabs(sum - 1.0) < 1e-6);
  assert_true(p[1] > p[0] && p[0] == p[4] && p[3] == 0.0f);
}

/* Distance in units in the last place between two finite floats of the same sign. */
static int64_t ulps(float a, float b) {
  int32_t ia, ib;
  memcpy(&ia, &a, sizeof(ia));
  memcpy(&ib, &b, sizeof(ib));
  return ia > ib ? (int64_t)ia - ib : (int64_t)ib - ia;
}

/* npu_expf (attention's exponential, base/expf.h) against double-precision exp, rounded once to
 * float: within 1 ulp at two million points from -103.9 (deep in the subnormal results) to 88.72
 * (just below overflow); the edges; and the eight lanes of npu_expf8 each its own scalar value. */
static void test_expf_within_one_ulp(void **state) {
  (void)state;
  int64_t worst = 0;
  enum { STEPS = 2000000 };
  for (int i = 0; i <= STEPS; i++) {
    const float x = -103.9f + (88.72f + 103.9f) * (float)i / (float)STEPS;
    const int64_t u = ulps(npu_expf(x), (float)exp((double)x));
    worst = u > worst ? u : worst;
  }
  assert_true(worst <= 1);
  assert_true(npu_expf(0.0f) == 1.0f && npu_expf(-0.0f) == 1.0f);
  assert_true(npu_expf(-INFINITY) == 0.0f && npu_expf(-104.0f) == 0.0f);
  assert_true(npu_expf(-1e30f) == 0.0f);
  assert_true(isinf(npu_expf(INFINITY)) && isinf(npu_expf(88.8f)) && isinf(npu_expf(1e30f)));
  assert_true(isnan(npu_expf(NAN)));
  float x[8] = {-3.5f, 0.25f, NAN, -90.0f, 10.0f, -0.0f, 88.8f, -200.0f}, y[8];
  npu_expf8(y, x);
  for (int l = 0; l < 8; l++) {
    const float one = npu_expf(x[l]);
    assert_true(memcmp(&y[l], &one, sizeof(one)) == 0);
  }
}

/* npu_ref_attention (online softmax over tiles) against softmax attention in double: lengths
 * around the tile size and many tiles, odd head dims, a key stride wider than a head, scores
 * whose maximum rises tile after tile (every tile rescales) or comes first, spread scores. Each
 * output within the float rounding bound (see test_graph's fused-attention test) of its scale
 * sum_j p_j |v_j|; the scores it reports are the scaled dots. */
static void test_attention_matches_double(void **state) {
  (void)state;
  uint64_t rng = 5;
  const int lens[] = {1,   2,  NPU_REF_ATTN_TILE - 1, NPU_REF_ATTN_TILE, NPU_REF_ATTN_TILE + 1,
                      100, 517};
  const int hds[] = {1, 7, 8, 64, 97};
  for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
    for (size_t hi = 0; hi < sizeof(hds) / sizeof(hds[0]); hi++) {
      for (int kind = 0; kind < 3; kind++) {
        const int len = lens[li], hd = hds[hi], stride = hd + 3;
        float *keys = malloc((size_t)len * (size_t)stride * sizeof(float));
        float *values = malloc((size_t)len * (size_t)stride * sizeof(float));
        float *q = malloc((size_t)hd * sizeof(float)), *out = malloc((size_t)hd * sizeof(float));
        float *att = malloc((size_t)len * sizeof(float));
        double *p = malloc((size_t)len * sizeof(double));
        for (int j = 0; j < len; j++) {
          /* kind 1: keys grow with j (rising maximum); kind 2: the first key dominates */
          float gain = kind == 1 ? 1.0f + 0.02f * (float)j : kind == 2 && j == 0 ? 4.0f : 1.0f;
          for (int i = 0; i < stride; i++) {
            keys[j * stride + i] = gain * (float)((int)(test_rand(&rng) % 2001) - 1000) / 1000.0f;
            values[j * stride + i] = (float)((int)(test_rand(&rng) % 2001) - 1000) / 1000.0f;
          }
        }
        for (int i = 0; i < hd; i++) q[i] = (float)((int)(test_rand(&rng) % 2001) - 1000) / 250.0f;
        float scale = 1.0f / sqrtf((float)hd);
        npu_ref_attention(out, att, q, keys, values, (size_t)stride, hd, len, scale);
        double max = -INFINITY, sum = 0.0, s_mag = 0.0;
        for (int j = 0; j < len; j++) {
          assert_true(att[j] == npu_ref_dot(keys + j * stride, q, hd) * scale);
          double dot = 0.0, mag = 0.0;
          for (int i = 0; i < hd; i++) {
            dot += (double)q[i] * keys[j * stride + i];
            mag += fabs((double)q[i] * keys[j * stride + i]);
          }
          p[j] = dot * scale;
          max = fmax(max, p[j]);
          s_mag = fmax(s_mag, mag * scale);
        }
        for (int j = 0; j < len; j++) sum += (p[j] = exp(p[j] - max));
        const double tol = ((hd / 8 + 4) * s_mag + 32.0) * FLT_EPSILON;
        for (int i = 0; i < hd; i++) {
          double want = 0.0, mag = 0.0;
          for (int j = 0; j < len; j++) {
            double x = p[j] / sum * values[j * stride + i];
            want += x;
            mag += fabs(x);
          }
          if (!(fabs(out[i] - want) <= tol * mag)) {
            fail_msg("len %d hd %d kind %d: out[%d] = %.9g, want %.9g", len, hd, kind, i, out[i],
                     want);
          }
        }
        free(keys);
        free(values);
        free(q);
        free(out);
        free(att);
        free(p);
      }
    }
  }
}

/* RoPE rotates the right pairs by pos * base^(-2i/d) and preserves each pair's norm. */
static void test_rope_pairs(void **state) {
  (void)state;
  struct npu_config c = {.head_dim = 8, .rope_dim = 8, .rope_base = 10000.0f};
  for (int type = 0; type < 2; type++) {
    c.rope_type = type == 0 ? NPU_ROPE_NORM : NPU_ROPE_NEOX;
    float v[16], orig[16];
    for (int i = 0; i < 16; i++) orig[i] = v[i] = (float)(i + 1);
    npu_ref_rope(v, 2, &c, NULL, 3);
    for (int h = 0; h < 2; h++) {
      for (int i = 0; i < 4; i++) {
        int a = type == 0 ? 2 * i : i, b = type == 0 ? 2 * i + 1 : i + 4;
        double ang = 3.0 * pow(10000.0, -2.0 * i / 8.0);
        double x0 = orig[h * 8 + a], x1 = orig[h * 8 + b];
        assert_true(fabs(v[h * 8 + a] - (x0 * cos(ang) - x1 * sin(ang))) < 1e-4);
        assert_true(fabs(v[h * 8 + b] - (x0 * sin(ang) + x1 * cos(ang))) < 1e-4);
      }
    }
  }
}

static void test_stories260k_config(void **state) {
  (void)state;
  npulm_model *m = test_open_shared("models/stories260K.gguf");
  npulm_model_info info;
  npulm_model_get_info(m, &info);
  assert_string_equal(info.arch, "llama");
  assert_int_equal(info.dim, 64);
  assert_int_equal(info.n_layers, 5);
  assert_int_equal(info.n_heads, 8);
  assert_int_equal(info.n_kv_heads, 4);
  assert_int_equal(info.ffn_dim, 172);
  assert_int_equal(info.n_vocab, 512);
  assert_int_equal(info.n_ctx_train, 512);
  assert_true(info.tied_output);
  assert_int_equal(info.n_params, 260032);
  assert_int_equal(info.bos_id, 1);
  assert_int_equal(info.eos_id, 2);
  npulm_model_close(m);
}

/* Greedy continuation of 'prompt', decoded to text (prompt included). */
static void greedy(npulm_model *m, const char *prompt, int n, char *out, size_t cap) {
  npulm_model_info info;
  npulm_model_get_info(m, &info);
  npulm_session *s;
  npulm_error err;
  assert_int_equal(npulm_session_create(m, NULL, &s, &err), NPULM_OK);
  int32_t ids[256];
  size_t n_ids;
  assert_int_equal(npulm_tokenize(m, prompt, strlen(prompt), true, false, ids, 256, &n_ids, &err),
                   NPULM_OK);
  assert_int_equal(npulm_session_eval(s, ids, n_ids, NULL, &err), NPULM_OK);
  size_t len = 0;
  for (size_t i = 0; i < n_ids; i++) {
    len += npulm_token_to_piece(m, i ? ids[i - 1] : -1, ids[i], out + len, cap - len);
  }
  int32_t prev = ids[n_ids - 1];
  for (int i = 0; i < n; i++) {
    const float *logits = npulm_session_logits(s);
    int32_t next = 0;
    for (int v = 1; v < info.n_vocab; v++) next = logits[v] > logits[next] ? v : next;
    if (npulm_token_is_eog(m, next)) break;
    len += npulm_token_to_piece(m, prev, next, out + len, cap - len);
    assert_true(len < cap);
    prev = next;
    assert_int_equal(npulm_session_eval(s, &next, 1, NULL, &err), NPULM_OK);
  }
  out[len] = '\0';
  npulm_session_free(s);
}

static void test_stories260k_greedy(void **state) {
  (void)state;
  npulm_model *m = test_open_shared("models/stories260K.gguf");
  char text[4096];
  greedy(m, "Once upon a time", 60, text, sizeof(text));
  const char *want = "Once upon a time, there was a little girl named Lily. She loved to play "
                     "outside in the park. One day, she saw a big, red ball.";
  if (strncmp(text, want, strlen(want)) != 0) fail_msg("got: %s", text);
  npulm_model_close(m);
}

static void test_tinystories5m_greedy(void **state) {
  (void)state;
  npulm_model *m = test_open_shared("models/tinystories-5M.gguf");
  char text[4096];
  greedy(m, "Once upon a time", 30, text, sizeof(text));
  const char *want =
      "Once upon a time, there was a little girl named Lily. She loved to play with her toys";
  if (strncmp(text, want, strlen(want)) != 0) fail_msg("got: %s", text);
  npulm_model_close(m);
}

/* One call over n tokens gives the same logits as n calls of one token, and reset forgets. */
static void test_batch_equals_stepwise(void **state) {
  (void)state;
  npulm_model *m = test_open_shared("models/stories260K.gguf");
  enum { N = 12, V = 512 };
  int32_t ids[N] = {1, 400, 31, 7, 290, 511, 3, 258, 100, 42, 9, 13};
  static float all[N * V], one[V];
  npulm_session *s;
  npulm_error err;
  npulm_session_params p = {.n_ctx = 32, .n_threads = 1};
  assert_int_equal(npulm_session_create(m, &p, &s, &err), NPULM_OK);
  assert_int_equal(npulm_session_eval(s, ids, N, all, &err), NPULM_OK);
  assert_int_equal(npulm_session_pos(s), N);
  npulm_session_reset(s);
  assert_int_equal(npulm_session_pos(s), 0);
  for (int i = 0; i < N; i++) {
    assert_int_equal(npulm_session_eval(s, &ids[i], 1, one, &err), NPULM_OK);
    assert_memory_equal(one, all + i * V, sizeof(one));
    assert_memory_equal(npulm_session_logits(s), one, sizeof(one));
  }
  npulm_session_free(s);
  npulm_model_close(m);
}

/* What an observer saw, order aside: per activation name, the number of values and a sum of a
 * hash of each value's bits (commutative, so the order of rows and activations is free). */
struct seen {
  char names[256][48];
  uint64_t count[256], hash[256];
  int n;
};

static void see(void *user, int layer, const char *what, const float *v, int n) {
  struct seen *s = user;
  char name[48];
  snprintf(name, sizeof(name), "%d.%s", layer, what);
  int i = 0;
  while (i < s->n && strcmp(s->names[i], name) != 0) i++;
  if (i == s->n) {
    assert_true(s->n < 256);
    snprintf(s->names[s->n++], sizeof(s->names[0]), "%s", name);
  }
  for (int k = 0; k < n; k++) {
    uint32_t bits;
    memcpy(&bits, &v[k], sizeof(bits));
    s->hash[i] += (uint64_t)bits * 0x9E3779B97F4A7C15ull ^ (bits >> 7);
  }
  s->count[i] += (uint64_t)n;
}

/* npu_ref_block over blocks of positions gives every row the bits npu_ref_forward gives it one
 * position at a time, and shows the observer the same values: the calibration's way through the
 * model (a layer at a time over all rows) is the reference's. Two blocks, so that the second
 * starts past position 0 and attends over the first's cache rows. */
static void test_block_rows_equal_stepwise(void **state) {
  (void)state;
  npulm_model *m = test_open_shared("models/stories260K.gguf");
  const struct npu_config *c = &m->cfg;
  enum { N = 40, FIRST = 17 };
  int32_t ids[N];
  for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 7919 + 13) % c->n_vocab);
  static struct seen a, b;
  memset(&a, 0, sizeof(a));
  memset(&b, 0, sizeof(b));
  float *logits_a = malloc((size_t)N * (size_t)c->n_vocab * sizeof(float));
  float *logits_b = malloc((size_t)N * (size_t)c->n_vocab * sizeof(float));
  float *x = malloc((size_t)N * (size_t)c->dim * sizeof(float));
  assert_true(logits_a && logits_b && x);
  struct npu_ref_state s1, s2;
  npulm_error err;
  assert_int_equal(npu_ref_state_init(&s1, c, N, &err), NPULM_OK);
  assert_int_equal(npu_ref_state_init_rows(&s2, c, N, N - FIRST, &err), NPULM_OK);
  struct npu_ref_observer obs_a = {see, NULL, &a, true}, obs_b = {see, NULL, &b, true};
  for (int i = 0; i < N; i++) {
    npu_ref_forward(m, &s1, ids[i], i, logits_a + (size_t)i * (size_t)c->n_vocab, &obs_a);
  }
  /* the same a layer at a time: embedding, blocks, head */
  for (int i = 0; i < N; i++) {
    memcpy(x + (size_t)i * (size_t)c->dim, m->w.token_embd + (size_t)ids[i] * (size_t)c->dim,
           (size_t)c->dim * sizeof(float));
    see(&b, -1, "embd", x + (size_t)i * (size_t)c->dim, c->dim);
  }
  const int starts[2] = {0, FIRST}, rows[2] = {FIRST, N - FIRST};
  for (int l = 0; l < c->n_layers; l++) {
    for (int k = 0; k < 2; k++) {
      float *xr = x + (size_t)starts[k] * (size_t)c->dim;
      memcpy(s2.x, xr, (size_t)rows[k] * (size_t)c->dim * sizeof(float));
      npu_ref_block(c, &m->w.layers[l], m->w.rope_freqs, &s2, l, starts[k], rows[k], &obs_b);
      memcpy(xr, s2.x, (size_t)rows[k] * (size_t)c->dim * sizeof(float));
    }
  }
  for (int i = 0; i < N; i++) {
    float *xi = x + (size_t)i * (size_t)c->dim, *li = logits_b + (size_t)i * (size_t)c->n_vocab;
    npu_ref_rmsnorm(xi, xi, m->w.output_norm, c->dim, c->rms_eps);
    see(&b, -1, "output_norm", xi, c->dim);
    npu_ref_matvec(li, m->w.output, NULL, xi, c->dim, c->n_vocab);
    see(&b, -1, "logits", li, c->n_vocab);
  }
  assert_memory_equal(logits_a, logits_b, (size_t)N * (size_t)c->n_vocab * sizeof(float));
  assert_int_equal(a.n, b.n);
  for (int i = 0; i < a.n; i++) {
    int j = 0;
    while (j < b.n && strcmp(a.names[i], b.names[j]) != 0) j++;
    if (j == b.n || a.count[i] != b.count[j] || a.hash[i] != b.hash[j]) {
      fail_msg("activation %s: seen otherwise a layer at a time", a.names[i]);
    }
  }
  npu_ref_state_free(&s1);
  npu_ref_state_free(&s2);
  free(logits_a);
  free(logits_b);
  free(x);
  npulm_model_close(m);
}

static void test_session_rejects_bad_input(void **state) {
  (void)state;
  npulm_model *m = test_open_shared("models/stories260K.gguf");
  npulm_session *s;
  npulm_error err;
  npulm_session_params p = {.n_ctx = 8, .n_threads = 1};
  assert_int_equal(npulm_session_create(m, &p, &s, &err), NPULM_OK);
  int32_t ids[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  assert_int_equal(npulm_session_eval(s, ids, 9, NULL, &err), NPULM_ERR_ARG);
  assert_non_null(strstr(err.msg, "context"));
  assert_int_equal(npulm_session_pos(s), 0);
  int32_t bad[2] = {1, 512};
  assert_int_equal(npulm_session_eval(s, bad, 2, NULL, &err), NPULM_ERR_ARG);
  assert_non_null(strstr(err.msg, "512"));
  bad[1] = -1;
  assert_int_equal(npulm_session_eval(s, bad, 2, NULL, &err), NPULM_ERR_ARG);
  assert_int_equal(npulm_session_eval(s, ids, 8, NULL, &err), NPULM_OK);
  assert_int_equal(npulm_session_eval(s, ids, 1, NULL, &err), NPULM_ERR_ARG);
  npulm_session_free(s);
  p.n_ctx = 513;
  assert_int_equal(npulm_session_create(m, &p, &s, &err), NPULM_ERR_ARG);
  assert_null(s);
  npulm_model_close(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matvec_matches_double),
      cmocka_unit_test(test_rmsnorm_and_softmax),
      cmocka_unit_test(test_expf_within_one_ulp),
      cmocka_unit_test(test_attention_matches_double),
      cmocka_unit_test(test_rope_pairs),
      cmocka_unit_test(test_stories260k_config),
      cmocka_unit_test(test_stories260k_greedy),
      cmocka_unit_test(test_tinystories5m_greedy),
      cmocka_unit_test(test_batch_equals_stepwise),
      cmocka_unit_test(test_block_rows_equal_stepwise),
      cmocka_unit_test(test_session_rejects_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
