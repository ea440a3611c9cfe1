/* The NPU cost model and the host roofline: the profile list, predictions that grow with the MACs
 * and shrink with the peak rate, decode bound by bandwidth (the bytes a token must read), prefill
 * by MACs, decode traffic that adds up, each matmul at its own precision's rate (w4a16 reads fewer
 * bytes than w8a8 and computes at the 16-bit rate), a roofline measurement with positive ceilings
 * (all of them, or the memory ones alone), and repetitions placed against the ceilings around
 * them. */
#include <math.h>
#include <string.h>

#include "npulm.h"
#include "npulm_bench.h"
#include "test_util.h"

/* Host rates for predictions: fixed figures, so the tests do not depend on the machine. */
static npulm_roofline fake_host(void) {
  npulm_roofline h;
  memset(&h, 0, sizeof(h));
  h.n_threads = 1;
  h.int8_macs = 50e9;
  h.w4a8_macs = 40e9;
  h.w8a16_macs = 25e9;
  h.w4a16_macs = 20e9;
  h.w4a16_block_macs = 15e9;
  h.f32_macs = 20e9;
  h.read_bytes = h.copy_bytes = h.mem_bytes = 10e9;
  h.cache_bytes = 32u << 20;
  return h;
}

static npulm_model *open_compiled(const char *quant) {
  const char *path = test_shared_path("models/stories260K.gguf");
  if (access(path, R_OK) != 0) return NULL;
  npulm_model *m;
  npulm_error err;
  assert_int_equal(npulm_model_open(path, &m, &err), NPULM_OK);
  npulm_compile_params cp = npulm_compile_default_params();
  cp.quant = quant;
  cp.calib_tokens = 64;
  assert_int_equal(npulm_model_compile(m, &cp, &err), NPULM_OK);
  return m;
}

static void test_profiles(void **state) {
  (void)state;
  int n = 0;
  const npulm_npu_profile *p = npulm_npu_profiles(&n);
  assert_true(n >= 3);
  const char *want[] = {"hexagon-v75", "m4-ane", "mtl-npu"};
  for (int w = 0; w < 3; w++) {
    bool found = false;
    for (int i = 0; i < n; i++) found |= strcmp(p[i].name, want[w]) == 0;
    assert_true(found);
  }
  for (int i = 0; i < n; i++) {
    assert_non_null(p[i].part);
    assert_non_null(p[i].estimates);
    assert_true(p[i].int8_tops > 1 && p[i].int8_tops < 1000);
    assert_true(p[i].fp16_tflops > 0 && p[i].fp16_tflops <= p[i].int8_tops);
    /* every precision has a rate, none above int8 x int8 */
    assert_true(p[i].w8a16_tops > 0 && p[i].w8a16_tops <= p[i].int8_tops);
    assert_true(p[i].w4a8_tops > 0 && p[i].w4a8_tops <= p[i].int8_tops);
    assert_true(p[i].w4a16_tops > 0 && p[i].w4a16_tops <= p[i].int8_tops);
    /* the peak of a mode or a precision name is its matmuls' rate */
    assert_true(npulm_npu_profile_peak(&p[i], "w8a8-smooth") == p[i].int8_tops * 0.5e12);
    assert_true(npulm_npu_profile_peak(&p[i], "w8a16") == p[i].w8a16_tops * 0.5e12);
    assert_true(npulm_npu_profile_peak(&p[i], "w4a16-block-naive") == p[i].w4a16_tops * 0.5e12);
    assert_true(npulm_npu_profile_peak(&p[i], "w4a8-shadow") == p[i].w4a8_tops * 0.5e12);
    assert_true(npulm_npu_profile_peak(&p[i], "f32") == p[i].fp16_tflops * 0.5e12);
    assert_true(npulm_npu_profile_peak(&p[i], "w2a2") == 0.0);
    assert_true(p[i].dram_gbs > 10 && p[i].dram_gbs < 1000);
    assert_true(p[i].sram_mib > 0);
    assert_true(p[i].dispatch_us >= 0);
  }
}

/* The host's peak by precision: each GEMM kernel's own rate, blocks apart. */
static void test_host_peak(void **state) {
  (void)state;
  const npulm_roofline h = fake_host();
  assert_true(npulm_roofline_peak(&h, "w8a8-naive") == h.int8_macs);
  assert_true(npulm_roofline_peak(&h, "w8a16-smooth") == h.w8a16_macs);
  assert_true(npulm_roofline_peak(&h, "w4a16") == h.w4a16_macs);
  assert_true(npulm_roofline_peak(&h, "w4a16-block") == h.w4a16_block_macs);
  assert_true(npulm_roofline_peak(&h, "w4a8-naive") == h.w4a8_macs);
  assert_true(npulm_roofline_peak(&h, "f32") == h.f32_macs);
  assert_true(npulm_roofline_peak(&h, "int8") == 0.0);
}

static void test_no_program(void **state) {
  (void)state;
  const char *path = test_shared_path("models/stories260K.gguf");
  TEST_REQUIRE_FILE(path);
  npulm_model *m;
  npulm_error err;
  assert_int_equal(npulm_model_open(path, &m, &err), NPULM_OK);
  npulm_roofline h = fake_host();
  npulm_prediction pr;
  assert_int_equal(npulm_predict(m, NULL, &h, 16, 0, &pr, &err), NPULM_ERR_ARG);
  assert_non_null(strstr(err.msg, "no program"));
  npulm_decode_traffic t;
  assert_int_equal(npulm_decode_traffic_at(m, 0, &t, &err), NPULM_ERR_ARG);
  assert_int_equal(npulm_program_max_rows(m), 0);
  npulm_model_close(m);
}

static void test_monotonic_in_macs(void **state) {
  (void)state;
  npulm_model *m = open_compiled("w8a8-naive");
  if (m == NULL) skip();
  npulm_roofline h = fake_host();
  npulm_error err;
  int n_prof;
  const npulm_npu_profile *prof = npulm_npu_profiles(&n_prof);
  for (int p = -1; p < n_prof; p++) {
    const npulm_npu_profile *pp = p < 0 ? NULL : &prof[p];
    double last_s = 0;
    uint64_t last_macs = 0;
    for (int n = 8; n <= 256; n *= 2) {
      npulm_prediction pr;
      assert_int_equal(npulm_predict(m, pp, &h, n, 0, &pr, &err), NPULM_OK);
      assert_true(pr.macs > last_macs);
      assert_true(pr.seconds >= last_s);
      assert_true(pr.seconds > 0 && isfinite(pr.seconds));
      assert_true(fabs(pr.seconds - (pr.npu_s + pr.cpu_s + pr.dispatch_s + pr.transfer_s)) <
                  1e-12 + 1e-9 * pr.seconds);
      last_s = pr.seconds;
      last_macs = pr.macs;
    }
  }
  /* a slower NPU never makes a run faster; a much faster one never slower */
  npulm_npu_profile slow = prof[0], fast = prof[0];
  slow.int8_tops /= 100;
  fast.int8_tops *= 100;
  npulm_prediction a, b, c;
  assert_int_equal(npulm_predict(m, &prof[0], &h, 128, 0, &a, &err), NPULM_OK);
  assert_int_equal(npulm_predict(m, &slow, &h, 128, 0, &b, &err), NPULM_OK);
  assert_int_equal(npulm_predict(m, &fast, &h, 128, 0, &c, &err), NPULM_OK);
  assert_true(b.npu_s > a.npu_s && b.seconds > a.seconds);
  assert_true(c.npu_s <= a.npu_s && c.seconds <= a.seconds);
  /* the step plan is the session's: 128 tokens = one chunk of 128; 129 add a decode step */
  assert_int_equal(a.n_steps, 1);
  assert_int_equal(npulm_predict(m, &prof[0], &h, 129, 0, &a, &err), NPULM_OK);
  assert_int_equal(a.n_steps, 2);
  assert_int_equal(npulm_program_max_rows(m), 128);
  /* bad arguments */
  assert_int_equal(npulm_predict(m, NULL, &h, 0, 0, &a, &err), NPULM_ERR_ARG);
  assert_int_equal(npulm_predict(m, NULL, &h, 100000, 0, &a, &err), NPULM_ERR_ARG);
  assert_non_null(strstr(err.msg, "largest context"));
  npulm_roofline zero;
  memset(&zero, 0, sizeof(zero));
  assert_int_equal(npulm_predict(m, NULL, &zero, 16, 0, &a, &err), NPULM_ERR_ARG);
  npulm_model_close(m);
}

/* On the host's own ceilings (no dispatch), a decode step of a w8a8 program is bound by the bytes
 * it reads: doubling the bandwidth nearly halves it, doubling the MAC rate barely moves it. Prefill
 * of a whole chunk the other way round for its NPU part. */
static void test_decode_bandwidth_bound(void **state) {
  (void)state;
  npulm_model *m = open_compiled("w8a8-naive");
  if (m == NULL) skip();
  npulm_error err;
  npulm_roofline h = fake_host(), h_bw = h, h_mac = h;
  h.cache_bytes = h_bw.cache_bytes = h_mac.cache_bytes = 0; /* every byte from DRAM */
  h_bw.mem_bytes *= 2;
  h_mac.int8_macs *= 2;
  h_mac.f32_macs *= 2;
  npulm_prediction base, bw, mac;
  assert_int_equal(npulm_predict(m, NULL, &h, 0, 32, &base, &err), NPULM_OK);
  assert_int_equal(npulm_predict(m, NULL, &h_bw, 0, 32, &bw, &err), NPULM_OK);
  assert_int_equal(npulm_predict(m, NULL, &h_mac, 0, 32, &mac, &err), NPULM_OK);
  assert_int_equal(base.n_steps, 32);
  assert_true(base.dispatch_s == 0 && base.transfer_s == 0);
  print_message("tg32: %.3f ms; 2x bandwidth %.3f ms; 2x MACs %.3f ms; %.2f MAC/byte\n",
                base.seconds * 1e3, bw.seconds * 1e3, mac.seconds * 1e3,
                (double)base.macs / (double)base.bytes);
  assert_true(bw.seconds < 0.6 * base.seconds);
  assert_true(mac.seconds > 0.9 * base.seconds);
  assert_true((double)base.macs / (double)base.bytes < 2.0); /* int8 decode: ~1 MAC per byte */

  /* the traffic of a decode step: weights once, KV growing with the position */
  npulm_decode_traffic t0, t100;
  assert_int_equal(npulm_decode_traffic_at(m, 0, &t0, &err), NPULM_OK);
  assert_int_equal(npulm_decode_traffic_at(m, 100, &t100, &err), NPULM_OK);
  assert_string_equal(t0.quant, "w8a8-naive");
  /* every weight is the NPU's: the norms run there too */
  assert_true(t0.weight_bytes_npu > 0 && t0.weight_bytes_cpu == 0);
  assert_int_equal(t0.bytes, t0.weight_bytes_npu + t0.weight_bytes_cpu + t0.kv_bytes);
  assert_int_equal(t0.weight_bytes_npu, t100.weight_bytes_npu);
  npulm_model_info info;
  npulm_model_get_info(m, &info);
  const uint64_t kv_row = 2ull * (uint64_t)info.n_layers * (uint64_t)info.n_kv_heads *
                          (uint64_t)info.head_dim * sizeof(float);
  /* reads positions 0..pos of K and V, writes the new row of each */
  assert_int_equal(t0.kv_bytes, 2 * kv_row);
  assert_int_equal(t100.kv_bytes, 102 * kv_row);
  /* int8 weights of the matmuls: about one byte per parameter of theirs */
  assert_true(t0.weight_bytes_npu < info.n_params * 2);
  assert_true(t0.model_bytes > t0.weight_bytes_npu / 2);
  assert_int_equal(npulm_decode_traffic_at(m, 100000, &t0, &err), NPULM_ERR_ARG);

  /* prefill of a full chunk, activations in cache: far more MACs per byte than decode */
  npulm_roofline h_cache = fake_host();
  npulm_prediction pp;
  assert_int_equal(npulm_predict(m, NULL, &h_cache, 128, 0, &pp, &err), NPULM_OK);
  print_message("pp128: %.2f MAC/byte\n", (double)pp.macs / (double)pp.bytes);
  assert_true((double)pp.macs / (double)pp.bytes > 10.0 * (double)base.macs / (double)base.bytes);
  npulm_model_close(m);
}

/* The same model compiled w4a16 and w8a8: w4a16's int4 weights make a decode step read fewer
 * bytes, and its int16 inputs make prefill's matmuls run at the 16-bit rate, half the int8 one on
 * Hexagon V75 (an estimate), so prefill there takes longer where it is bound by MACs. A w8a8
 * program does not see the other precisions' rates. */
static void test_precisions(void **state) {
  (void)state;
  npulm_model *m8 = open_compiled("w8a8-naive");
  if (m8 == NULL) skip();
  npulm_model *m4 = open_compiled("w4a16-naive");
  npulm_error err;
  npulm_decode_traffic t8, t4;
  assert_int_equal(npulm_decode_traffic_at(m8, 0, &t8, &err), NPULM_OK);
  assert_int_equal(npulm_decode_traffic_at(m4, 0, &t4, &err), NPULM_OK);
  assert_string_equal(t4.quant, "w4a16-naive");
  print_message("decode weight bytes: w8a8 %llu, w4a16 %llu\n",
                (unsigned long long)t8.weight_bytes_npu, (unsigned long long)t4.weight_bytes_npu);
  assert_true(t4.weight_bytes_npu < 0.8 * (double)t8.weight_bytes_npu);
  assert_true(t4.model_bytes < t8.model_bytes);

  const npulm_roofline h = fake_host();
  int n_prof;
  const npulm_npu_profile *prof = npulm_npu_profiles(&n_prof);
  const npulm_npu_profile *hex = NULL;
  for (int i = 0; i < n_prof; i++) {
    if (strcmp(prof[i].name, "hexagon-v75") == 0) hex = &prof[i];
  }
  assert_non_null(hex);
  assert_true(hex->w8a16_tops == 0.5 * hex->int8_tops && hex->w4a16_tops == hex->w8a16_tops);
  /* decode on the profile: fewer DRAM bytes */
  npulm_prediction g8, g4;
  assert_int_equal(npulm_predict(m8, hex, &h, 0, 16, &g8, &err), NPULM_OK);
  assert_int_equal(npulm_predict(m4, hex, &h, 0, 16, &g4, &err), NPULM_OK);
  assert_true(g4.bytes < g8.bytes);
  /* prefill with memory out of the way (a bandwidth no byte waits for): bound by the MAC rates */
  npulm_npu_profile fast_mem = *hex;
  fast_mem.dram_gbs *= 1e6;
  fast_mem.sram_mib *= 1e6;
  npulm_prediction p8, p4;
  assert_int_equal(npulm_predict(m8, &fast_mem, &h, 128, 0, &p8, &err), NPULM_OK);
  assert_int_equal(npulm_predict(m4, &fast_mem, &h, 128, 0, &p4, &err), NPULM_OK);
  print_message("pp128 NPU time on %s: w8a8 %.3f us, w4a16 %.3f us\n", hex->name, p8.npu_s * 1e6,
                p4.npu_s * 1e6);
  assert_true(p4.npu_s > 1.5 * p8.npu_s);
  /* w8a8 reads only the int8 rate: the int4 / int16 rates do not move it */
  npulm_npu_profile other = fast_mem;
  other.w8a16_tops /= 100;
  other.w4a8_tops /= 100;
  other.w4a16_tops /= 100;
  npulm_prediction q8, q4;
  assert_int_equal(npulm_predict(m8, &other, &h, 128, 0, &q8, &err), NPULM_OK);
  assert_true(q8.npu_s == p8.npu_s);
  assert_int_equal(npulm_predict(m4, &other, &h, 128, 0, &q4, &err), NPULM_OK);
  assert_true(q4.npu_s > 10 * p4.npu_s);
  /* a profile or a host without a rate the program needs is refused */
  other.w4a16_tops = 0;
  assert_int_equal(npulm_predict(m4, &other, &h, 128, 0, &q4, &err), NPULM_ERR_ARG);
  npulm_roofline h0 = h;
  h0.w4a16_macs = 0;
  assert_int_equal(npulm_predict(m4, NULL, &h0, 128, 0, &q4, &err), NPULM_ERR_ARG);
  assert_non_null(strstr(err.msg, "int4 weights x int16"));
  assert_int_equal(npulm_predict(m8, NULL, &h0, 128, 0, &q8, &err), NPULM_OK);
  /* on the host, w4a16's matmuls at its kernel's rate: slower than int8's in the fake rates */
  npulm_roofline h_cache = h;
  assert_int_equal(npulm_predict(m8, NULL, &h_cache, 128, 0, &p8, &err), NPULM_OK);
  assert_int_equal(npulm_predict(m4, NULL, &h_cache, 128, 0, &p4, &err), NPULM_OK);
  assert_true(p4.npu_s > p8.npu_s);
  npulm_model_close(m8);
  npulm_model_close(m4);
}

/* An FP32 program reads four bytes per weight: four times the w8a8 one. */
static void test_f32_program_reads_more(void **state) {
  (void)state;
  npulm_model *m8 = open_compiled("w8a8-naive");
  if (m8 == NULL) skip();
  npulm_model *m32 = open_compiled("f32");
  npulm_error err;
  npulm_decode_traffic t8, t32;
  assert_int_equal(npulm_decode_traffic_at(m8, 0, &t8, &err), NPULM_OK);
  assert_int_equal(npulm_decode_traffic_at(m32, 0, &t32, &err), NPULM_OK);
  assert_string_equal(t32.quant, "f32");
  assert_true(t32.weight_bytes_npu > 3 * t8.weight_bytes_npu);
  npulm_model_close(m8);
  npulm_model_close(m32);
}

static void test_roofline_measure(void **state) {
  (void)state;
  npulm_roofline r;
  npulm_error err;
  assert_int_equal(npulm_roofline_measure(1, &r, &err), NPULM_OK);
  print_message(
      "1 thread: int8 %.2f GMAC/s (%s), f32 %.2f GMAC/s, read %.2f GB/s, copy %.2f GB/s\n",
      r.int8_macs * 1e-9, r.kernel, r.f32_macs * 1e-9, r.read_bytes * 1e-9, r.copy_bytes * 1e-9);
  assert_int_equal(r.n_threads, 1);
  assert_true(r.int8_macs > 1e8 && r.f32_macs > 1e7);
  assert_true(r.read_bytes > 1e8 && r.copy_bytes > 1e8);
  assert_true(r.mem_bytes == fmax(r.read_bytes, r.copy_bytes));
  assert_true(r.buffer_bytes >= 256ull << 20);
  assert_non_null(strstr(r.kernel, "qs8_gemm__"));
  print_message("1 thread: w4a8 %.2f (%s), w8a16 %.2f (%s), w4a16 %.2f / blocks %.2f (%s) GMAC/s\n",
                r.w4a8_macs * 1e-9, r.kernel_w4a8, r.w8a16_macs * 1e-9, r.kernel_w8a16,
                r.w4a16_macs * 1e-9, r.w4a16_block_macs * 1e-9, r.kernel_w4a16);
  assert_true(r.w4a8_macs > 1e7 && r.w8a16_macs > 1e7 && r.w4a16_macs > 1e7 &&
              r.w4a16_block_macs > 1e7);
  assert_non_null(strstr(r.kernel_w4a8, "qs8_qc4w_gemm__"));
  assert_non_null(strstr(r.kernel_w8a16, "qs16_gemm_qs16__"));
  assert_non_null(strstr(r.kernel_w4a16, "qs16_qc4w_gemm_qs16__"));
  assert_int_equal(npulm_roofline_measure(-1, &r, &err), NPULM_ERR_ARG);
  /* the memory ceiling alone */
  assert_int_equal(npulm_roofline_measure_memory(1, &r, &err), NPULM_OK);
  assert_int_equal(r.n_threads, 1);
  assert_true(r.int8_macs == 0.0 && r.f32_macs == 0.0 && r.w4a8_macs == 0.0 &&
              r.w8a16_macs == 0.0 && r.w4a16_macs == 0.0 && r.w4a16_block_macs == 0.0);
  assert_true(r.read_bytes > 1e8 && r.copy_bytes > 1e8);
  assert_true(r.mem_bytes == fmax(r.read_bytes, r.copy_bytes));
  assert_int_equal(npulm_roofline_measure_memory(-1, &r, &err), NPULM_ERR_ARG);
}

/* Repetitions placed against the bandwidths measured around them: one whose two disagree by more
 * than NPULM_PAIR_SPREAD has no known ceiling unless both give the compute peak. */
static void test_roofline_pair(void **state) {
  (void)state;
  npulm_paired p;
  npulm_error err;
  /* bytes/s against the bandwidth alone: rep 1 between 20 and 40 GB/s is left out */
  const double rate[3] = {12e9, 20e9, 30e9};
  const double mem[4] = {20e9, 20e9, 40e9, 38e9};
  assert_int_equal(npulm_roofline_pair(rate, mem, 3, INFINITY, 1.0, &p, &err), NPULM_OK);
  assert_int_equal(p.n_known, 2);
  assert_true(fabs(p.pct - 67.5) < 1e-9);     /* median of 60 and 75 */
  assert_true(fabs(p.pct_all - 60.0) < 1e-9); /* median of 60, 50 and 75 */
  /* 10 % apart exactly still counts; a little more does not */
  const double edge[3] = {9e9, 10e9, 10.01e9};
  const double r2[2] = {5e9, 5e9};
  assert_int_equal(npulm_roofline_pair(r2, edge, 2, INFINITY, 1.0, &p, &err), NPULM_OK);
  assert_int_equal(p.n_known, 2);
  assert_int_equal(
      npulm_roofline_pair(r2, (const double[]){9e9, 10.01e9, 9e9}, 2, INFINITY, 1.0, &p, &err),
      NPULM_OK);
  assert_int_equal(p.n_known, 0);
  assert_true(isnan(p.pct));
  assert_true(fabs(p.pct_all - 100.0 * 5e9 / 10.01e9) < 1e-9);
  /* MAC/s at 100 MAC/byte: both bandwidths put the ceiling at the 1e12 peak, so it is known */
  const double macs[1] = {5e11};
  assert_int_equal(
      npulm_roofline_pair(macs, (const double[]){20e9, 40e9}, 1, 1e12, 100.0, &p, &err), NPULM_OK);
  assert_int_equal(p.n_known, 1);
  assert_true(fabs(p.pct - 50.0) < 1e-9);
  /* at 30 MAC/byte the lower bandwidth (20 GB/s: 6e11 MAC/s) is below the peak: unknown */
  assert_int_equal(npulm_roofline_pair(macs, (const double[]){20e9, 40e9}, 1, 1e12, 30.0, &p, &err),
                   NPULM_OK);
  assert_int_equal(p.n_known, 0);
  /* an even count: the mean of the middle two */
  const double four[4] = {10e9, 20e9, 30e9, 40e9}, flat[5] = {50e9, 50e9, 50e9, 50e9, 50e9};
  assert_int_equal(npulm_roofline_pair(four, flat, 4, INFINITY, 1.0, &p, &err), NPULM_OK);
  assert_int_equal(p.n_known, 4);
  assert_true(fabs(p.pct - 50.0) < 1e-9 && fabs(p.pct_all - 50.0) < 1e-9);
  /* what cannot be placed */
  assert_int_equal(npulm_roofline_pair(macs, mem, 0, 1e12, 1.0, &p, &err), NPULM_ERR_ARG);
  assert_int_equal(npulm_roofline_pair(NULL, mem, 1, 1e12, 1.0, &p, &err), NPULM_ERR_ARG);
  assert_int_equal(npulm_roofline_pair(macs, NULL, 1, 1e12, 1.0, &p, &err), NPULM_ERR_ARG);
  assert_int_equal(npulm_roofline_pair(macs, mem, 1, 1e12, 1.0, NULL, &err), NPULM_ERR_ARG);
  assert_int_equal(npulm_roofline_pair(macs, (const double[]){NAN, 30e9}, 1, 1e12, 1.0, &p, &err),
                   NPULM_ERR_ARG);
  assert_int_equal(npulm_roofline_pair(macs, (const double[]){0.0, 30e9}, 1, 1e12, 1.0, &p, &err),
                   NPULM_ERR_ARG);
  assert_int_equal(npulm_roofline_pair((const double[]){NAN}, mem, 1, 1e12, 1.0, &p, &err),
                   NPULM_ERR_ARG);
  assert_int_equal(npulm_roofline_pair(macs, mem, 1, 1e12, 0.0, &p, &err), NPULM_ERR_ARG);
  assert_int_equal(npulm_roofline_pair(macs, mem, 1, NAN, 1.0, &p, &err), NPULM_ERR_ARG);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_profiles),
      cmocka_unit_test(test_host_peak),
      cmocka_unit_test(test_no_program),
      cmocka_unit_test(test_monotonic_in_macs),
      cmocka_unit_test(test_decode_bandwidth_bound),
      cmocka_unit_test(test_precisions),
      cmocka_unit_test(test_f32_program_reads_more),
      cmocka_unit_test(test_roofline_measure),
      cmocka_unit_test(test_roofline_pair),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
