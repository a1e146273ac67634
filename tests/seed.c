/* The run's seed; see seed.h. */
#define _POSIX_C_SOURCE 200809L
#include "seed.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int g_seed_set;
static uint64_t g_seed;

uint64_t tu_seed(void) {
    if (!g_seed_set) {
        const char *env = getenv("MLA_TEST_SEED");
        if (env && *env) {
            g_seed = strtoull(env, NULL, 0);
        } else {
            FILE *f = fopen("/dev/urandom", "rb");
            if (!f || fread(&g_seed, sizeof g_seed, 1, f) != 1)
                g_seed = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
            if (f) fclose(f);
            g_seed &= 0xffffffffffffull; /* short enough to type */
        }
        g_seed_set = 1;
        tu_print_seed();
    }
    return g_seed;
}

void tu_print_seed(void) {
    printf("[ seed     ] %llu  (reproduce with MLA_TEST_SEED=%llu)\n", (unsigned long long)g_seed,
           (unsigned long long)g_seed);
    fflush(stdout);
}
