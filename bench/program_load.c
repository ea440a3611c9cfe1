/* What checking a program file's checksums costs at load: the median time of opening the program
 * (npulm_model_open: parse, checksums, configuration, tokenizer, weights, program, verification)
 * beside the median time of the checksum pass alone, the page cache warm (a first open warms it;
 * its time is printed too: the cold figure, after `echo 1 > /proc/sys/vm/drop_caches`).
 * Usage: program_load FILE.npu [runs (default 5)] */
#include <stdio.h>
#include <stdlib.h>

#include "base/common.h"
#include "compiler/compiler.h"
#include "io/gguf.h"
#include "npulm.h"
#include "program/program_io.h"

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *t, int n) {
  qsort(t, (size_t)n, sizeof(*t), cmp_double);
  return t[n / 2];
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: program_load FILE.npu [runs]\n");
    return 2;
  }
  const int runs = argc > 2 ? atoi(argv[2]) : 5;
  if (runs < 1 || runs > 100) {
    fprintf(stderr, "program_load: runs must be 1..100\n");
    return 2;
  }
  double open_s[100], sums_s[100], first_s = 0;
  npulm_error err;
  uint64_t bytes = 0;
  for (int r = -1; r < runs; r++) { /* run -1 warms the page cache */
    double t0 = npu_now();
    npulm_model *m = NULL;
    if (npulm_model_open(argv[1], &m, &err) != NPULM_OK) {
      fprintf(stderr, "program_load: %s\n", err.msg);
      return 1;
    }
    double t1 = npu_now();
    npulm_model_close(m);
    struct npu_gguf *g = NULL;
    int64_t n_damaged = 0;
    if (npu_gguf_open(argv[1], &g, &err) != NPULM_OK) return 1;
    double t2 = npu_now();
    if (npu_program_file_damage(g, NULL, NULL, &n_damaged, &err) != NPULM_OK || n_damaged != 0) {
      fprintf(stderr, "program_load: damaged\n");
      return 1;
    }
    double t3 = npu_now();
    bytes = g->size;
    npu_gguf_close(g);
    if (r < 0) first_s = t1 - t0;
    if (r >= 0) {
      open_s[r] = t1 - t0;
      sums_s[r] = t3 - t2;
    }
  }
  const double open_med = median(open_s, runs), sums_med = median(sums_s, runs);
  printf("%s: %.2f GB; first open %.3f s; open %.3f s (median of %d), of which checksums ~%.3f s "
         "(%.1f GB/s, %.0f%%)\n",
         argv[1], (double)bytes / 1e9, first_s, open_med, runs, sums_med,
         (double)bytes / sums_med / 1e9, 100.0 * sums_med / open_med);
  return 0;
}
