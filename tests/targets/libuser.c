/* Uses libtrig.so, linked or through dlopen.
 *   libuser calls N GAP_MS      lib_trigger(i) N times
 *   libuser wait                maps the library but never calls it
 *   libuser dlopen PATH N GAP   dlopen(PATH) after the go signal, then lib_trigger(i)
 *   libuser common              common_name() from the executable and the library
 *   libuser cycle PATH C N GAP  after the go signal, C times: dlopen(PATH), lib_trigger(i)
 *                               N times GAP_MS apart, dlclose; prints "unmapped" when
 *                               the library is gone from /proc/self/maps
 *   libuser late PATH DELAY N   dlopen(PATH) DELAY_MS after start, before the go signal;
 *                               after it, lib_trigger(i) N times, 100 ms apart
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Built twice: `libuser` links libtrig.so; `dlopener` (-DDLOPEN_ONLY) does
 * not, so the library appears only when dlopen maps it. */
void lib_trigger(long i);
volatile long user_sink;

__attribute__((noinline, visibility("default"))) void common_name(long i) { user_sink += i; }

static void sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

/* Whether /proc/self/maps has a mapping of a file whose path ends in `name`. */
static int mapped(const char *name) {
  FILE *f = fopen("/proc/self/maps", "r");
  char line[4096];
  int found = 0;
  size_t n = strlen(name);
  while (f && fgets(line, sizeof line, f)) {
    size_t l = strlen(line);
    while (l && line[l - 1] == '\n') line[--l] = 0;
    if (l >= n && !strcmp(line + l - n, name)) found = 1;
  }
  if (f) fclose(f);
  return found;
}

/* dlopen(path) and lib_trigger(i) n times, gap_ms apart; 0 on success. */
static int open_and_call(const char *path, long n, long gap_ms, void **handle) {
  *handle = dlopen(path, RTLD_NOW);
  if (!*handle) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 4;
  }
  void (*fn)(long) = (void (*)(long))dlsym(*handle, "lib_trigger");
  for (long i = 0; i < n; i++) {
    fn(i);
    sleep_ms(gap_ms);
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  const char *mode = argv[1];
  if (!strcmp(mode, "late")) {
    /* The library appears while the process is young; nobody says go. */
    printf("ready %d\n", getpid());
    fflush(stdout);
    sleep_ms(strtol(argv[3], NULL, 0));
    void *h;
    int rc = open_and_call(argv[2], 0, 0, &h);
    if (rc) return rc;
    char go[64];
    if (!fgets(go, sizeof go, stdin)) return 3;
    void (*fn)(long) = (void (*)(long))dlsym(h, "lib_trigger");
    for (long i = 0; i < strtol(argv[4], NULL, 0); i++) {
      fn(i);
      sleep_ms(100);
    }
    printf("done\n");
    fflush(stdout);
    return 0;
  }
  printf("ready %d\n", getpid());
  fflush(stdout);
  char line[64];
  if (!fgets(line, sizeof line, stdin)) return 3;
  if (!strcmp(mode, "calls")) {
#ifndef DLOPEN_ONLY
    long n = strtol(argv[2], NULL, 0), gap = strtol(argv[3], NULL, 0);
    for (long i = 0; i < n; i++) {
      lib_trigger(i);
      sleep_ms(gap);
    }
#endif
  } else if (!strcmp(mode, "wait")) {
    for (;;) pause();
  } else if (!strcmp(mode, "dlopen")) {
    long n = strtol(argv[3], NULL, 0), gap = strtol(argv[4], NULL, 0);
    sleep_ms(300);
    void *h = dlopen(argv[2], RTLD_NOW);
    if (!h) {
      fprintf(stderr, "dlopen: %s\n", dlerror());
      return 4;
    }
    void (*fn)(long) = (void (*)(long))dlsym(h, "lib_trigger");
    printf("loaded\n");
    fflush(stdout);
    sleep_ms(1500);
    for (long i = 0; i < n; i++) {
      fn(i);
      sleep_ms(gap);
    }
  } else if (!strcmp(mode, "cycle")) {
    long cycles = strtol(argv[3], NULL, 0), n = strtol(argv[4], NULL, 0);
    long gap = strtol(argv[5], NULL, 0);
    const char *base = strrchr(argv[2], '/') ? strrchr(argv[2], '/') + 1 : argv[2];
    for (long c = 0; c < cycles; c++) {
      void *h;
      int rc = open_and_call(argv[2], n, gap, &h);
      if (rc) return rc;
      dlclose(h);
      if (!mapped(base)) printf("unmapped\n");
      fflush(stdout);
    }
  } else if (!strcmp(mode, "common")) {
    common_name(1);
    for (;;) pause();
  }
  printf("done\n");
  fflush(stdout);
  return 0;
}
