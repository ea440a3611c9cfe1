/* Error reporting and clock helpers shared by all modules. */
#include "base/common.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

npulm_status npu_fail(npulm_error *err, npulm_status status, const char *fmt, ...) {
  if (err != NULL) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
    /* one line, whatever a hostile file's names hold */
    for (char *c = err->msg; *c != '\0'; c++) {
      if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    }
  }
  return status;
}

const char *npulm_status_name(npulm_status status) {
  switch (status) {
  case NPULM_OK: return "ok";
  case NPULM_ERR_IO: return "I/O error";
  case NPULM_ERR_FORMAT: return "format error";
  case NPULM_ERR_UNSUPPORTED: return "unsupported";
  case NPULM_ERR_ARG: return "bad argument";
  case NPULM_ERR_NOMEM: return "out of memory";
  }
  return "unknown status";
}

double npu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
