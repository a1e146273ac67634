/*
 * The run's random seed, shared by every test program (test_schedule too,
 * which does not link libmla and so not the rest of testutil).
 */
#ifndef MLA_TEST_SEED_H
#define MLA_TEST_SEED_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* MLA_TEST_SEED from the environment when set (decimal or 0x hex), else
 * fresh from /dev/urandom (time and pid as a fallback). The first call
 * prints it with the line to reproduce the run; later calls return the same
 * value. */
uint64_t tu_seed(void);
/* Print the seed again (call on failure so it sits next to the error). */
void tu_print_seed(void);

#ifdef __cplusplus
}
#endif

#endif
