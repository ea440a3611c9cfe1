/* npulm bench --plot: the roofline of this host and of the NPU profiles, with the measured points,
 * as an SVG (bench.h). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "bench.h"

enum { SVG_W = 980, SVG_H = 620, PX0 = 90, PX1 = 690, PY0 = 60, PY1 = 540 };

struct axes {
  double lx0, lx1, ly0, ly1; /* log10 of the ranges */
};

static double sx(const struct axes *a, double x) {
  return PX0 + (log10(x) - a->lx0) / (a->lx1 - a->lx0) * (PX1 - PX0);
}

static double sy(const struct axes *a, double y) {
  return PY1 - (log10(y) - a->ly0) / (a->ly1 - a->ly0) * (PY1 - PY0);
}

/* 'v' (a power of ten) with an SI prefix: "100 M", "1 G", "10 T"; "0.1", "1", "1 k" for x. */
static void si_label(double v, char *buf, size_t cap) {
  static const char *const prefix[] = {"", " k", " M", " G", " T", " P", " E"};
  if (v < 1.0) {
    snprintf(buf, cap, "%g", v);
    return;
  }
  int e = (int)floor(log10(v) + 1e-9) / 3;
  if (e > 6) e = 6;
  snprintf(buf, cap, "%g%s", v / pow(10.0, 3 * e), prefix[e]);
}

static void svg_escape(FILE *f, const char *s) {
  for (; *s; s++) {
    switch (*s) {
    case '&': fputs("&amp;", f); break;
    case '<': fputs("&lt;", f); break;
    case '>': fputs("&gt;", f); break;
    case '"': fputs("&quot;", f); break;
    default: fputc(*s, f);
    }
  }
}

/* A roofline ceiling: y = min(peak, bw * x) across the plot, clipped to it. */
static void svg_ceiling(FILE *f, const struct axes *a, double peak, double bw, const char *color,
                        const char *dash, double width) {
  const double x0 = pow(10, a->lx0), x1 = pow(10, a->lx1), ridge = peak / bw;
  fprintf(f,
          "<polyline clip-path=\"url(#plot)\" fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\"%s "
          "points=\"",
          color, width, dash);
  fprintf(f, "%.1f,%.1f ", sx(a, x0), sy(a, fmin(peak, bw * x0)));
  if (ridge > x0 && ridge < x1) fprintf(f, "%.1f,%.1f ", sx(a, ridge), sy(a, peak));
  fprintf(f, "%.1f,%.1f\"/>\n", sx(a, x1), sy(a, fmin(peak, bw * x1)));
}

bool bench_write_svg(const char *path, const struct model_desc *d, const struct result *rs, int n,
                     const npulm_roofline *hosts, int n_hosts) {
  int n_prof;
  const npulm_npu_profile *prof = npulm_npu_profiles(&n_prof);
  if (n_prof > MAX_PROFILES) n_prof = MAX_PROFILES;
  /* ranges: every point, ridge and ceiling, padded to whole decades */
  double xmin = 1e300, xmax = 0, ymin = 1e300, ymax = 0;
  for (int i = 0; i < n; i++) {
    struct placement pl;
    bench_place(d, &rs[i], &pl);
    if (pl.ai > 0 && pl.macs_s > 0) {
      xmin = fmin(xmin, pl.ai), xmax = fmax(xmax, pl.ai);
      ymin = fmin(ymin, pl.macs_s), ymax = fmax(ymax, pl.macs_s);
    }
  }
  for (int h = 0; h < n_hosts; h++) {
    const double peak = bench_peak_macs(d, &hosts[h]);
    xmin = fmin(xmin, peak / hosts[h].mem_bytes), xmax = fmax(xmax, peak / hosts[h].mem_bytes);
    ymax = fmax(ymax, peak);
  }
  for (int p = 0; p < n_prof; p++) {
    const double peak = npulm_npu_profile_peak(&prof[p], d->precision);
    const double ridge = peak / (prof[p].dram_gbs * 1e9);
    xmin = fmin(xmin, ridge), xmax = fmax(xmax, ridge);
    ymax = fmax(ymax, peak);
  }
  if (!(xmax > 0)) xmin = 0.1, xmax = 100;
  struct axes a = {floor(log10(xmin / 3)), ceil(log10(xmax * 3)), 0, ceil(log10(ymax * 1.5))};
  for (int h = 0; h < n_hosts; h++) ymin = fmin(ymin, hosts[h].mem_bytes * pow(10, a.lx0));
  a.ly0 = floor(log10(ymin / 2));
  if (a.ly1 - a.ly0 > 9) a.ly0 = a.ly1 - 9;

  FILE *f = fopen(path, "w");
  if (f == NULL) return false;
  fprintf(f,
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 "
          "%d %d\" font-family=\"DejaVu Sans, Arial, sans-serif\" font-size=\"13\">\n",
          SVG_W, SVG_H, SVG_W, SVG_H);
  fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
  fprintf(f,
          "<defs><clipPath id=\"plot\"><rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\"/>"
          "</clipPath></defs>\n",
          PX0, PY0, PX1 - PX0, PY1 - PY0);
  fprintf(f, "<text x=\"%d\" y=\"32\" font-size=\"17\" font-weight=\"bold\">Roofline: ", PX0);
  svg_escape(f, d->type);
  fprintf(f, "</text>\n");
  /* grid and tick labels, one per decade */
  for (int e = (int)a.lx0; e <= (int)a.lx1; e++) {
    char lab[32];
    const double x = sx(&a, pow(10, e));
    si_label(pow(10, e), lab, sizeof(lab));
    fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/>\n", x, PY0, x,
            PY1);
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", x, PY1 + 20, lab);
  }
  for (int e = (int)a.ly0; e <= (int)a.ly1; e++) {
    char lab[32];
    const double y = sy(&a, pow(10, e));
    si_label(pow(10, e), lab, sizeof(lab));
    fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", PX0, y, PX1,
            y);
    fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", PX0 - 8, y + 4, lab);
  }
  fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#333\"/>\n",
          PX0, PY0, PX1 - PX0, PY1 - PY0);
  fprintf(f,
          "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"14\">arithmetic "
          "intensity (MAC per DRAM byte)</text>\n",
          (PX0 + PX1) / 2, PY1 + 48);
  fprintf(f,
          "<text transform=\"translate(24 %d) rotate(-90)\" text-anchor=\"middle\" "
          "font-size=\"14\">performance (%s MAC/s)</text>\n",
          (PY0 + PY1) / 2, d->precision);
  /* ceilings: NPU profiles dashed, this host solid */
  static const char *const colors[] = {"#2ca02c", "#9467bd", "#8c564b", "#e377c2",
                                       "#7f7f7f", "#bcbd22", "#17becf", "#aec7e8"};
  int ly = PY0 + 8;
  const int lx = PX1 + 20;
  for (int p = 0; p < n_prof; p++) {
    const double peak = npulm_npu_profile_peak(&prof[p], d->precision);
    svg_ceiling(f, &a, peak, prof[p].dram_gbs * 1e9, colors[p], " stroke-dasharray=\"7 4\"", 1.6);
    fprintf(f,
            "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"1.6\" "
            "stroke-dasharray=\"7 4\"/>\n",
            lx, ly, lx + 28, ly, colors[p]);
    fprintf(f, "<text x=\"%d\" y=\"%d\">%s</text>\n", lx + 36, ly + 4, prof[p].name);
    fprintf(
        f, "<text x=\"%d\" y=\"%d\" font-size=\"11\" fill=\"#555\">%.1f TMAC/s, %.0f GB/s</text>\n",
        lx + 36, ly + 19, peak * 1e-12, prof[p].dram_gbs);
    ly += 40;
  }
  for (int h = 0; h < n_hosts; h++) {
    const double peak = bench_peak_macs(d, &hosts[h]);
    svg_ceiling(f, &a, peak, hosts[h].mem_bytes, "#111", "", 2.4);
    fprintf(
        f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#111\" stroke-width=\"2.4\"/>\n",
        lx, ly, lx + 28, ly);
    fprintf(f, "<text x=\"%d\" y=\"%d\">this host, %d thread%s</text>\n", lx + 36, ly + 4,
            hosts[h].n_threads, hosts[h].n_threads == 1 ? "" : "s");
    fprintf(
        f, "<text x=\"%d\" y=\"%d\" font-size=\"11\" fill=\"#555\">%.1f GMAC/s, %.1f GB/s</text>\n",
        lx + 36, ly + 19, peak * 1e-9, hosts[h].mem_bytes * 1e-9);
    ly += 40;
  }
  /* measured points */
  fprintf(f,
          "<circle cx=\"%d\" cy=\"%d\" r=\"5\" fill=\"#1f77b4\"/><text x=\"%d\" y=\"%d\">prefill "
          "(pp N)</text>\n",
          lx + 14, ly, lx + 36, ly + 4);
  ly += 24;
  fprintf(f,
          "<circle cx=\"%d\" cy=\"%d\" r=\"5\" fill=\"#d62728\"/><text x=\"%d\" y=\"%d\">decode "
          "(tg N)</text>\n",
          lx + 14, ly, lx + 36, ly + 4);
  ly += 30;
  fprintf(f,
          "<text x=\"%d\" y=\"%d\" font-size=\"11\" fill=\"#555\">points: measured on this "
          "host,</text>\n",
          lx, ly);
  fprintf(f,
          "<text x=\"%d\" y=\"%d\" font-size=\"11\" fill=\"#555\">label: test and %% of its "
          "ceiling</text>\n",
          lx, ly + 15);
  /* the points, then their labels where they overlap no other label (font 12: ~7 px a char) */
  struct box {
    double x0, y0, x1, y1;
  } boxes[4 * MAX_LIST * MAX_LIST];
  int n_boxes = 0;
  for (int i = 0; i < n; i++) {
    struct placement pl;
    bench_place(d, &rs[i], &pl);
    if (!(pl.ai > 0 && pl.macs_s > 0)) continue;
    const double x = sx(&a, pl.ai), y = sy(&a, pl.macs_s);
    fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"%s\" stroke=\"white\"/>\n", x, y,
            rs[i].n_gen > 0 ? "#d62728" : "#1f77b4");
  }
  for (int i = 0; i < n; i++) {
    struct placement pl;
    bench_place(d, &rs[i], &pl);
    if (!(pl.ai > 0 && pl.macs_s > 0)) continue;
    char name[48], label[96];
    bench_test_name(&rs[i], name, sizeof(name));
    if (n_hosts > 1)
      snprintf(label, sizeof(label), "%s, %d t (%.1f%%)", name, rs[i].n_threads, pl.pct);
    else snprintf(label, sizeof(label), "%s (%.1f%%)", name, pl.pct);
    const double x = sx(&a, pl.ai), y = sy(&a, pl.macs_s), w = 7.0 * (double)strlen(label), h = 14;
    /* candidate baselines: right above, right below, left above, left below, then further out */
    static const double offs[][2] = {{8, -8},  {8, 18}, {-8, -8},  {-8, 18},
                                     {8, -24}, {8, 34}, {-8, -24}, {-8, 34}};
    struct box b = {0, 0, 0, 0};
    bool left = false;
    for (size_t c = 0; c < sizeof(offs) / sizeof(offs[0]); c++) {
      left = offs[c][0] < 0;
      b.x0 = left ? x + offs[c][0] - w : x + offs[c][0];
      b.x1 = b.x0 + w;
      b.y1 = y + offs[c][1] + 3;
      b.y0 = b.y1 - h;
      bool clear = b.x0 >= PX0 && b.x1 <= PX1 + 60 && b.y0 >= PY0;
      for (int j = 0; j < n_boxes && clear; j++) {
        clear =
            b.x1 < boxes[j].x0 || b.x0 > boxes[j].x1 || b.y1 < boxes[j].y0 || b.y0 > boxes[j].y1;
      }
      if (clear) break;
    }
    if (n_boxes < (int)(sizeof(boxes) / sizeof(boxes[0]))) boxes[n_boxes++] = b;
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\">%s</text>\n", b.x0, b.y1 - 3, label);
  }
  fprintf(f, "</svg>\n");
  bool ok = !ferror(f);
  return fclose(f) == 0 && ok;
}
