/*
 * Corpus replay driver: runs LLVMFuzzerTestOneInput of fuzz_api.c on every
 * file named on the command line (directories: every regular file in them,
 * in name order). Lets any compiler, with or without sanitizers, replay the
 * committed corpus and the regression inputs as an ordinary test:
 *
 *   fuzz_replay tests/fuzz/corpus tests/fuzz/regressions
 *
 * Exit 0 when every input ran (a finding aborts inside the harness).
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    uint8_t *buf;
    long n;
    if (!f) {
        fprintf(stderr, "fuzz_replay: cannot open %s\n", path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = (uint8_t *)malloc(n > 0 ? (size_t)n : 1);
    if (!buf || (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n)) {
        fprintf(stderr, "fuzz_replay: cannot read %s\n", path);
        fclose(f);
        free(buf);
        return -1;
    }
    fclose(f);
    /* An exactly sized copy, so that a harness overread is visible too. */
    {
        uint8_t *exact = (uint8_t *)malloc(n > 0 ? (size_t)n : 1);
        if (!exact) return -1;
        if (n > 0) memcpy(exact, buf, (size_t)n);
        LLVMFuzzerTestOneInput(exact, (size_t)n);
        free(exact);
    }
    free(buf);
    return 0;
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int run_path(const char *path, int *count) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "fuzz_replay: %s does not exist\n", path);
        return -1;
    }
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        struct dirent *e;
        char **names = NULL;
        size_t n = 0, cap = 0, i;
        int rc = 0;
        if (!d) return -1;
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.') continue;
            if (n == cap) {
                cap = cap ? cap * 2 : 64;
                names = (char **)realloc(names, cap * sizeof *names);
                if (!names) return -1;
            }
            names[n] = (char *)malloc(strlen(path) + strlen(e->d_name) + 2);
            if (!names[n]) return -1;
            sprintf(names[n], "%s/%s", path, e->d_name);
            ++n;
        }
        closedir(d);
        if (n) qsort(names, n, sizeof *names, cmp_names);
        for (i = 0; i < n; ++i) {
            struct stat fs;
            if (rc == 0 && stat(names[i], &fs) == 0 && S_ISREG(fs.st_mode)) {
                if (run_file(names[i]) != 0) rc = -1;
                else ++*count;
            }
            free(names[i]);
        }
        free(names);
        return rc;
    }
    if (run_file(path) != 0) return -1;
    ++*count;
    return 0;
}

int main(int argc, char **argv) {
    int i, count = 0;
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE_OR_DIR...\n", argv[0]);
        return 2;
    }
    for (i = 1; i < argc; ++i)
        if (run_path(argv[i], &count) != 0) return 1;
    printf("fuzz_replay: %d inputs ran without a finding\n", count);
    return count > 0 ? 0 : 1;
}
