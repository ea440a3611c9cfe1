/* npulm_roofline_measure: this host's two roofline ceilings. The compute ceiling is the int8 MAC
 * rate of the NPU's own GEMM microkernel (the variant npu_ukernels_select picks for this CPU) on
 * cache-resident shapes, the best of several, and for each other precision (w4a8, w8a16, w4a16
 * per channel and in blocks) the rate of its GEMM kernel on one cache-resident shape; the memory
 * ceiling is the rate of a streaming read and of a streaming copy through a buffer several times
 * the last-level cache, in pages like the packed weights' (npu_pages_alloc_huge: streaming from
 * huge pages is faster, and the ceiling must not be measured slower than the engine can read).
 * Every phase runs on all threads at once: the threads are created once and persist for the whole
 * measurement, meeting at a barrier before each timed window, so a window's rate is total work /
 * the longest thread's time, and a phase reports its best window. */
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "base/pages.h"
#include "kernels/cpu/kernels.h"
#include "kernels/npu/npu_ukernels.h"
#include "npulm_bench.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_AVX2_READ 1
#endif

#define MIB (1024ull * 1024ull)
#define WINDOWS 3           /* each phase runs this many timed windows; the best one counts */
#define PHASE_S 0.05        /* seconds of each window of a compute phase */
#define STREAM_PHASE_S 0.09 /* seconds of each window of a memory phase */
#define ALIGN 64

/* Cache-resident int8 GEMM shapes {m, n, k}: x, packed weights and y of each fit in a 1 MiB L2
 * (m a multiple of the AVX2 kernel's 3-row tile, n of its 16 channels). */
static const size_t gemm_shapes[][3] = {{48, 256, 1024}, {96, 128, 768}, {24, 512, 512}};
#define N_GEMM (sizeof(gemm_shapes) / sizeof(gemm_shapes[0]))
/* The one shape of the other precisions' GEMMs {m, n, k}: smaller, since some have only a scalar
 * kernel (a call must stay well inside a window); k a multiple of the int4 blocks. */
static const size_t prec_shape[3] = {24, 128, 512};
/* The float matmul shape {rows, n, k} (x 96 KiB, w 512 KiB). */
static const int32_t f32_shape[3] = {48, 256, 512};

/* Phases: the int8 shapes, then the other precisions' kernels (w4a16 twice: per channel and in
 * blocks), the float matmul, then memory. */
enum { PH_W4A8 = N_GEMM, PH_W8A16, PH_W4A16, PH_W4A16_BLOCK, PH_F32, PH_READ, PH_COPY, PH_COUNT };

/* A barrier that the main thread can abort (when creating a thread fails, the ones already
 * waiting must be let go). */
struct barrier {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int n, waiting;
  unsigned generation;
  bool aborted;
};

/* Wait until 'n' threads are here; false if the barrier was aborted. */
static bool barrier_wait(struct barrier *b) {
  pthread_mutex_lock(&b->mu);
  unsigned gen = b->generation;
  if (!b->aborted && ++b->waiting == b->n) {
    b->waiting = 0;
    b->generation++;
    pthread_cond_broadcast(&b->cv);
  } else {
    while (!b->aborted && gen == b->generation) pthread_cond_wait(&b->cv, &b->mu);
  }
  bool ok = !b->aborted;
  pthread_mutex_unlock(&b->mu);
  return ok;
}

static void barrier_abort(struct barrier *b) {
  pthread_mutex_lock(&b->mu);
  b->aborted = true;
  pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->mu);
}

/* What every thread shares: the kernels, the read-only operands, the streamed buffer. */
struct shared {
  struct barrier barrier;
  struct npu_ukernels uk;
  struct npu_cpu_ukernels cpu_uk;
  int n_threads;
  const int8_t *x;             /* (max m * k) int8 GEMM input */
  const int16_t *x16;          /* (prec_shape m * k) int16 GEMM input */
  const void *packed[N_GEMM];  /* packed weights of each shape */
  const void *packed8;         /* prec_shape's int8 weights (qs16_gemm_qs16) */
  const void *packed4[2];      /* prec_shape's int4 weights: per channel, in 32-k blocks */
  const int32_t *mult, *shift; /* (max n) requantization */
  const float *fx, *fw;        /* float matmul operands */
  uint8_t *stream;             /* (n_threads * slice) bytes */
  int first_phase;             /* phases before it are not measured */
  size_t slice;                /* bytes of 'stream' each thread owns (a multiple of 64) */
};

struct worker {
  struct shared *sh;
  int id;
  int8_t *y;                         /* (max m * n) int8, or int16 for the int16 GEMMs */
  float *fy;                         /* (rows * n) */
  uint64_t units[PH_COUNT][WINDOWS]; /* calls or passes completed */
  double elapsed[PH_COUNT][WINDOWS];
  uint64_t sink; /* keeps the read loop's result alive */
};

/* Sum of 'n' bytes at 'p' (64-byte aligned, n a multiple of 64), touching every cache line. */
static uint64_t read_generic(const uint8_t *p, size_t n) {
  const uint64_t *q = (const uint64_t *)(const void *)p;
  uint64_t a = 0, b = 0, c = 0, d = 0;
  for (size_t i = 0; i < n / 8; i += 8) {
    a += q[i] ^ q[i + 1];
    b += q[i + 2] ^ q[i + 3];
    c += q[i + 4] ^ q[i + 5];
    d += q[i + 6] ^ q[i + 7];
  }
  return a + b + c + d;
}

#ifdef HAVE_AVX2_READ
__attribute__((target("avx2"))) static uint64_t read_avx2(const uint8_t *p, size_t n) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  for (size_t i = 0; i < n; i += 128) {
    a = _mm256_add_epi64(a, _mm256_load_si256((const __m256i *)(const void *)(p + i)));
    b = _mm256_add_epi64(b, _mm256_load_si256((const __m256i *)(const void *)(p + i + 32)));
    c = _mm256_add_epi64(c, _mm256_load_si256((const __m256i *)(const void *)(p + i + 64)));
    d = _mm256_add_epi64(d, _mm256_load_si256((const __m256i *)(const void *)(p + i + 96)));
  }
  a = _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d));
  uint64_t lanes[4];
  _mm256_storeu_si256((__m256i *)(void *)lanes, a);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
#endif

static uint64_t read_stream(const uint8_t *p, size_t n) {
#ifdef HAVE_AVX2_READ
  if (__builtin_cpu_supports("avx2") && n % 128 == 0) return read_avx2(p, n);
#endif
  return read_generic(p, n);
}

/* One unit of phase 'ph' on worker 'w'. */
static void run_unit(struct worker *w, int ph) {
  const struct shared *sh = w->sh;
  if (ph < (int)N_GEMM) {
    const size_t m = gemm_shapes[ph][0], n = gemm_shapes[ph][1], k = gemm_shapes[ph][2];
    const struct npu_qs8_gemm_params p = {sh->mult, sh->shift, -3, 2};
    sh->uk.qs8_gemm(m, 0, n, k, sh->x, k, sh->packed[ph], w->y, n, &p);
  } else if (ph == PH_W4A8) {
    const size_t m = prec_shape[0], n = prec_shape[1], k = prec_shape[2];
    const struct npu_qs8_gemm_params p = {sh->mult, sh->shift, -3, 2};
    sh->uk.qs8_qc4w_gemm(m, 0, n, k, sh->x, k, sh->packed4[0], w->y, n, &p);
  } else if (ph <= PH_W4A16_BLOCK) {
    const size_t m = prec_shape[0], n = prec_shape[1], k = prec_shape[2];
    const struct npu_qs16_gemm_params p = {sh->mult, sh->shift, 8, 0,
                                           ph == PH_W4A16_BLOCK ? NPU_QC4W_BLOCK : 0};
    int16_t *y = (int16_t *)(void *)w->y;
    if (ph == PH_W8A16) sh->uk.qs16_gemm_qs16(m, 0, n, k, sh->x16, k, sh->packed8, y, n, &p);
    else {
      sh->uk.qs16_qc4w_gemm_qs16(m, 0, n, k, sh->x16, k, sh->packed4[ph == PH_W4A16_BLOCK], y, n,
                                 &p);
    }
  } else if (ph == PH_F32) {
    sh->cpu_uk.f32_matmul(w->fy, sh->fx, sh->fw, NULL, f32_shape[0], f32_shape[2], f32_shape[1]);
  } else if (ph == PH_READ) {
    w->sink += read_stream(sh->stream + (size_t)w->id * sh->slice, sh->slice);
  } else {
    uint8_t *mine = sh->stream + (size_t)w->id * sh->slice;
    memcpy(mine + sh->slice / 2, mine, sh->slice / 2);
  }
}

static void *worker_main(void *arg) {
  struct worker *w = arg;
  for (int ph = w->sh->first_phase; ph < PH_COUNT; ph++) {
    for (int win = 0; win < WINDOWS; win++) {
      if (!barrier_wait(&w->sh->barrier)) return NULL;
      const double limit = ph >= PH_READ ? STREAM_PHASE_S : PHASE_S;
      const double t0 = npu_now();
      double t = t0;
      uint64_t units = 0;
      do {
        run_unit(w, ph);
        units++;
        t = npu_now();
      } while (t - t0 < limit);
      w->units[ph][win] = units;
      w->elapsed[ph][win] = t - t0;
    }
  }
  return NULL;
}

/* Work of one unit of phase 'ph': MACs, or bytes moved (a copy counts its reads and writes). */
static double unit_work(const struct shared *sh, int ph) {
  if (ph < (int)N_GEMM) {
    return (double)gemm_shapes[ph][0] * (double)gemm_shapes[ph][1] * (double)gemm_shapes[ph][2];
  }
  if (ph < PH_F32) return (double)prec_shape[0] * (double)prec_shape[1] * (double)prec_shape[2];
  if (ph == PH_F32) return (double)f32_shape[0] * (double)f32_shape[1] * (double)f32_shape[2];
  return (double)sh->slice; /* read: slice bytes; copy: slice/2 read + slice/2 written */
}

static uint64_t xorshift(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545F4914F6CDD1DULL;
}

/* Size of the highest cache level cpu0 has, from sysfs ("32768K"), or 0. */
static uint64_t sysfs_llc_bytes(void) {
  uint64_t best = 0;
  int best_level = 0;
  for (int i = 0; i < 16; i++) {
    char path[96], buf[64];
    int level = 0;
    snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
    FILE *f = fopen(path, "r");
    if (f == NULL) break;
    if (fscanf(f, "%d", &level) != 1) level = 0;
    fclose(f);
    snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
    f = fopen(path, "r");
    if (f == NULL) continue;
    unsigned long long v = 0;
    char unit = 0;
    if (fgets(buf, sizeof(buf), f) != NULL && sscanf(buf, "%llu%c", &v, &unit) >= 1) {
      if (unit == 'K') v <<= 10;
      else if (unit == 'M') v <<= 20;
      if (level > best_level) best_level = level, best = v;
    }
    fclose(f);
  }
  return best;
}

/* The last-level cache size: sysfs's, else what sysconf reports (which some virtual machines
 * overstate), else 0. */
static uint64_t llc_bytes(void) {
  uint64_t v = sysfs_llc_bytes();
  if (v > 0) return v;
  long s = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
  s = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (s <= 0) s = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
  return s > 0 ? (uint64_t)s : 0;
}

static void *alloc64(size_t bytes) {
  return aligned_alloc(ALIGN, (bytes + ALIGN - 1) / ALIGN * ALIGN);
}

/* npulm_roofline_measure from phase 'first_phase' on: all of them, or the memory ones. */
static npulm_status measure(int n_threads, int first_phase, npulm_roofline *out, npulm_error *err) {
  memset(out, 0, sizeof(*out));
  if (n_threads < 0 || n_threads > 1024) {
    return npu_fail(err, NPULM_ERR_ARG, "thread count %d is outside 0..1024", n_threads);
  }
  if (n_threads == 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    n_threads = n > 0 ? (int)n : 1;
  }
  const double t_start = npu_now();
  npulm_status st = NPULM_OK;
  struct shared sh;
  memset(&sh, 0, sizeof(sh));
  sh.n_threads = n_threads;
  sh.first_phase = first_phase;
  npu_ukernels_select(npu_isa_detect(), &sh.uk);
  npu_cpu_ukernels_select(npu_isa_detect(), &sh.cpu_uk);
  snprintf(out->kernel, sizeof(out->kernel), "qs8_gemm__%s",
           npu_ukernels_variant(&sh.uk, "qs8_gemm"));
  snprintf(out->kernel_w4a8, sizeof(out->kernel_w4a8), "qs8_qc4w_gemm__%s",
           npu_ukernels_variant(&sh.uk, "qs8_qc4w_gemm"));
  snprintf(out->kernel_w8a16, sizeof(out->kernel_w8a16), "qs16_gemm_qs16__%s",
           npu_ukernels_variant(&sh.uk, "qs16_gemm_qs16"));
  snprintf(out->kernel_w4a16, sizeof(out->kernel_w4a16), "qs16_qc4w_gemm_qs16__%s",
           npu_ukernels_variant(&sh.uk, "qs16_qc4w_gemm_qs16"));

  /* the streamed buffer: 4x the last-level cache, at least 256 MiB, at most 1 GiB */
  const uint64_t cache = llc_bytes();
  uint64_t total = cache * 4 > 256 * MIB ? cache * 4 : 256 * MIB;
  if (total > 1024 * MIB) total = 1024 * MIB;
  sh.slice = (size_t)(total / (uint64_t)n_threads) / 256 * 256;
  if (sh.slice < 256) sh.slice = 256;

  size_t max_x = 0, max_y = 0, max_n = 0;
  for (size_t s = 0; s < N_GEMM; s++) {
    const size_t m = gemm_shapes[s][0], n = gemm_shapes[s][1], k = gemm_shapes[s][2];
    if (m * k > max_x) max_x = m * k;
    if (m * n > max_y) max_y = m * n;
    if (n > max_n) max_n = n;
  }
  const size_t pm = prec_shape[0], pn = prec_shape[1], pk = prec_shape[2];
  if (pm * pk > max_x) max_x = pm * pk;
  if (2 * pm * pn > max_y) max_y = 2 * pm * pn; /* int16 outputs */
  if (pn > max_n) max_n = pn;
  int8_t *x = alloc64(max_x), *w = NULL;
  int16_t *x16 = alloc64(pm * pk * sizeof(int16_t));
  int8_t *w8 = malloc(pn * pk), *w4 = malloc(pn * pk);
  uint8_t *bscale = malloc(pn * (pk / NPU_QC4W_BLOCK));
  void *packed8 = alloc64(npu_qs8_gemm_packed_size(pn, pk));
  void *packed4[2] = {alloc64(npu_qc4w_gemm_packed_size(pn, pk, 0)),
                      alloc64(npu_qc4w_gemm_packed_size(pn, pk, NPU_QC4W_BLOCK))};
  int32_t *mult = malloc(max_n * sizeof(int32_t)), *shift = malloc(max_n * sizeof(int32_t));
  void *packed[N_GEMM] = {NULL};
  const size_t fx_n = (size_t)f32_shape[0] * (size_t)f32_shape[2];
  const size_t fw_n = (size_t)f32_shape[1] * (size_t)f32_shape[2];
  float *fx = alloc64(fx_n * sizeof(float)), *fw = alloc64(fw_n * sizeof(float));
  uint8_t *stream = npu_pages_alloc_huge(sh.slice * (size_t)n_threads);
  struct worker *workers = calloc((size_t)n_threads, sizeof(*workers));
  pthread_t *threads = calloc((size_t)n_threads, sizeof(*threads));
  int n_started = 0;
  bool barrier_made = false;
  if (x == NULL || mult == NULL || shift == NULL || fx == NULL || fw == NULL || stream == NULL ||
      workers == NULL || threads == NULL || x16 == NULL || w8 == NULL || w4 == NULL ||
      bscale == NULL || packed8 == NULL || packed4[0] == NULL || packed4[1] == NULL) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory allocating %llu MiB to measure bandwidth",
                  (unsigned long long)(sh.slice * (size_t)n_threads / MIB));
    goto done;
  }

  /* operands: random int8 weights in [-127, 127], packed once per shape */
  uint64_t rng = 0x9e3779b97f4a7c15ULL;
  for (size_t i = 0; i < max_x; i++) x[i] = (int8_t)xorshift(&rng);
  for (size_t j = 0; j < max_n; j++) {
    mult[j] = (1 << 30) + (int32_t)(xorshift(&rng) % (1u << 29));
    shift[j] = -12;
  }
  for (size_t s = 0; s < N_GEMM; s++) {
    const size_t n = gemm_shapes[s][1], k = gemm_shapes[s][2];
    w = malloc(n * k);
    packed[s] = alloc64(npu_qs8_gemm_packed_size(n, k));
    if (w == NULL || packed[s] == NULL) {
      st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
      goto done;
    }
    for (size_t i = 0; i < n * k; i++) w[i] = (int8_t)((int)(xorshift(&rng) % 255) - 127);
    bool packed_ok = npu_qs8_gemm_pack(n, k, w, NULL, packed[s]);
    free(w);
    w = NULL;
    if (!packed_ok) {
      st = npu_fail(err, NPULM_ERR_ARG, "cannot pack the benchmark weights");
      goto done;
    }
    sh.packed[s] = packed[s];
  }
  /* the other precisions: int16 inputs of any sign, int8 weights in [-127, 127], int4 weights in
   * [-8, 7] with block scales in [0, 15] */
  for (size_t i = 0; i < pm * pk; i++) x16[i] = (int16_t)xorshift(&rng);
  for (size_t i = 0; i < pn * pk; i++) {
    w8[i] = (int8_t)((int)(xorshift(&rng) % 255) - 127);
    w4[i] = (int8_t)((int)(xorshift(&rng) % 16) - 8);
  }
  for (size_t i = 0; i < pn * (pk / NPU_QC4W_BLOCK); i++)
    bscale[i] = (uint8_t)(xorshift(&rng) % 16);
  if (!npu_qs8_gemm_pack(pn, pk, w8, NULL, packed8) ||
      !npu_qc4w_gemm_pack(pn, pk, w4, NULL, 0, NULL, packed4[0]) ||
      !npu_qc4w_gemm_pack(pn, pk, w4, NULL, NPU_QC4W_BLOCK, bscale, packed4[1])) {
    st = npu_fail(err, NPULM_ERR_ARG, "cannot pack the benchmark weights");
    goto done;
  }
  sh.x16 = x16;
  sh.packed8 = packed8;
  sh.packed4[0] = packed4[0];
  sh.packed4[1] = packed4[1];
  for (size_t i = 0; i < fx_n; i++) fx[i] = (float)((int)(xorshift(&rng) % 2001) - 1000) * 1e-3f;
  for (size_t i = 0; i < fw_n; i++) fw[i] = (float)((int)(xorshift(&rng) % 2001) - 1000) * 1e-3f;
  /* commit every page of the streamed buffer before timing */
  memset(stream, 1, sh.slice * (size_t)n_threads);
  sh.x = x;
  sh.mult = mult;
  sh.shift = shift;
  sh.fx = fx;
  sh.fw = fw;
  sh.stream = stream;

  for (int i = 0; i < n_threads; i++) {
    workers[i].sh = &sh;
    workers[i].id = i;
    workers[i].y = alloc64(max_y);
    workers[i].fy = alloc64((size_t)f32_shape[0] * (size_t)f32_shape[1] * sizeof(float));
    if (workers[i].y == NULL || workers[i].fy == NULL) {
      st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
      goto done;
    }
  }
  if (pthread_mutex_init(&sh.barrier.mu, NULL) != 0) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "cannot create a mutex");
    goto done;
  }
  if (pthread_cond_init(&sh.barrier.cv, NULL) != 0) {
    pthread_mutex_destroy(&sh.barrier.mu);
    st = npu_fail(err, NPULM_ERR_NOMEM, "cannot create a condition variable");
    goto done;
  }
  barrier_made = true;
  sh.barrier.n = n_threads;

  /* worker 0 is this thread */
  for (int i = 1; i < n_threads; i++) {
    if (pthread_create(&threads[i], NULL, worker_main, &workers[i]) != 0) {
      barrier_abort(&sh.barrier);
      st = npu_fail(err, NPULM_ERR_NOMEM, "cannot start measuring thread %d of %d", i + 1,
                    n_threads);
      goto done;
    }
    n_started++;
  }
  worker_main(&workers[0]);

done:
  for (int i = 1; i <= n_started; i++) pthread_join(threads[i], NULL);
  if (st == NPULM_OK) {
    /* a window's rate: all threads' work / the longest thread's time; a phase's: its best
     * window (the ceiling, least disturbed by other load on the machine) */
    double rate[PH_COUNT] = {0};
    for (int ph = first_phase; ph < PH_COUNT; ph++) {
      for (int win = 0; win < WINDOWS; win++) {
        double work = 0.0, longest = 0.0;
        for (int i = 0; i < n_threads; i++) {
          work += (double)workers[i].units[ph][win] * unit_work(&sh, ph);
          if (workers[i].elapsed[ph][win] > longest) longest = workers[i].elapsed[ph][win];
        }
        if (longest > 0.0 && work / longest > rate[ph]) rate[ph] = work / longest;
      }
    }
    out->n_threads = n_threads;
    for (size_t s = 0; s < N_GEMM; s++) {
      if (rate[s] > out->int8_macs) out->int8_macs = rate[s];
    }
    out->w4a8_macs = rate[PH_W4A8];
    out->w8a16_macs = rate[PH_W8A16];
    out->w4a16_macs = rate[PH_W4A16];
    out->w4a16_block_macs = rate[PH_W4A16_BLOCK];
    out->f32_macs = rate[PH_F32];
    out->read_bytes = rate[PH_READ];
    out->copy_bytes = rate[PH_COPY];
    out->mem_bytes = out->read_bytes > out->copy_bytes ? out->read_bytes : out->copy_bytes;
    out->buffer_bytes = (uint64_t)sh.slice * (uint64_t)n_threads;
    out->cache_bytes = cache;
    out->seconds = npu_now() - t_start;
  }
  if (barrier_made) {
    pthread_cond_destroy(&sh.barrier.cv);
    pthread_mutex_destroy(&sh.barrier.mu);
  }
  if (workers != NULL) {
    for (int i = 0; i < n_threads; i++) {
      free(workers[i].y);
      free(workers[i].fy);
    }
  }
  free(workers);
  free(threads);
  free(w);
  for (size_t s = 0; s < N_GEMM; s++) free(packed[s]);
  free(x);
  free(x16);
  free(w8);
  free(w4);
  free(bscale);
  free(packed8);
  free(packed4[0]);
  free(packed4[1]);
  free(mult);
  free(shift);
  free(fx);
  free(fw);
  npu_pages_free(stream, sh.slice * (size_t)n_threads);
  return st;
}

/* The storage ceiling: a file of STORAGE_BYTES written in $TMPDIR (else /tmp), synced, dropped
 * from the page cache, read back with pread a MiB at a time (as the neuron cache reads the program
 * file after dropping it). Bytes per second, or 0 where it cannot be measured. */
enum { STORAGE_MIB = 256 };
static double measure_storage(uint64_t *file_bytes) {
  const char *dir = getenv("TMPDIR");
  char path[4096];
  snprintf(path, sizeof(path), "%s/npulm-storage-XXXXXX", dir != NULL && *dir ? dir : "/tmp");
  *file_bytes = (uint64_t)STORAGE_MIB * MIB;
  const int fd = mkstemp(path);
  if (fd < 0) return 0.0;
  unlink(path); /* gone when closed, however this ends */
  uint8_t *buf = malloc(MIB);
  bool ok = buf != NULL;
  uint64_t x = 0x9E3779B97F4A7C15ull; /* incompressible bytes */
  for (int i = 0; ok && i < STORAGE_MIB; i++) {
    for (size_t k = 0; k < MIB; k += 8) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      memcpy(buf + k, &x, 8);
    }
    ok = write(fd, buf, MIB) == (ssize_t)MIB;
  }
  ok = ok && fsync(fd) == 0 && posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
  const double t0 = npu_now();
  for (int i = 0; ok && i < STORAGE_MIB; i++) {
    ok = pread(fd, buf, MIB, (off_t)i * (off_t)MIB) == (ssize_t)MIB;
  }
  const double t = npu_now() - t0;
  free(buf);
  close(fd);
  return ok && t > 0 ? (double)*file_bytes / t : 0.0;
}

npulm_status npulm_roofline_measure(int n_threads, npulm_roofline *out, npulm_error *err) {
  npulm_status st = measure(n_threads, 0, out, err);
  if (st == NPULM_OK) out->storage_bytes = measure_storage(&out->storage_file_bytes);
  return st;
}

npulm_status npulm_roofline_measure_memory(int n_threads, npulm_roofline *out, npulm_error *err) {
  return measure(n_threads, PH_READ, out, err);
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of v[0 .. n-1], n >= 1 (sorted in place). */
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(*v), cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

npulm_status npulm_roofline_pair(const double *rate, const double *mem, int n, double peak,
                                 double intensity, npulm_paired *out, npulm_error *err) {
  if (rate == NULL || mem == NULL || out == NULL || n < 1) {
    return npu_fail(err, NPULM_ERR_ARG, "npulm_roofline_pair: a NULL array, or %d repetitions", n);
  }
  /* NaN would pass fmin/fmax unseen and break the sort */
  bool valid = peak > 0 && intensity > 0 && isfinite(intensity);
  for (int i = 0; i <= n; i++) valid = valid && isfinite(mem[i]) && mem[i] > 0;
  for (int i = 0; i < n; i++) valid = valid && isfinite(rate[i]) && rate[i] >= 0;
  if (!valid) {
    return npu_fail(err, NPULM_ERR_ARG,
                    "npulm_roofline_pair: a rate, bandwidth, peak or intensity that is not a "
                    "positive number");
  }
  double *all = malloc(2 * (size_t)n * sizeof(double));
  if (all == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory placing repetitions");
  double *known = all + n;
  int n_known = 0;
  for (int i = 0; i < n; i++) {
    const double lo = fmin(peak, intensity * fmin(mem[i], mem[i + 1]));
    const double hi = fmin(peak, intensity * fmax(mem[i], mem[i + 1]));
    all[i] = 100.0 * rate[i] / hi;
    if (lo >= (1.0 - NPULM_PAIR_SPREAD) * hi) known[n_known++] = all[i];
  }
  out->n_known = n_known;
  out->pct = n_known > 0 ? median(known, n_known) : NAN;
  out->pct_all = median(all, n);
  free(all);
  return NPULM_OK;
}
