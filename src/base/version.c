/* The library's version and the commit it was built from. Only this file sees the commit (the
 * Makefile's -DNPULM_COMMIT), so that a new commit rebuilds one object. */
#include "npulm.h"

/* a build without the Makefile's define (by hand, the fuzz harnesses) */
#ifndef NPULM_COMMIT
#define NPULM_COMMIT "unknown"
#endif

const char *npulm_version(void) { return NPULM_VERSION " (" NPULM_COMMIT ")"; }
