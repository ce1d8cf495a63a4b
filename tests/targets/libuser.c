/* Uses libtrig.so, linked or through dlopen.
 *   libuser calls N GAP_MS      lib_trigger(i) N times
 *   libuser wait                maps the library but never calls it
 *   libuser dlopen PATH N GAP   dlopen(PATH) after the go signal, then lib_trigger(i)
 *   libuser common              common_name() from the executable and the library
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

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  const char *mode = argv[1];
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
  } else if (!strcmp(mode, "common")) {
    common_name(1);
    for (;;) pause();
  }
  printf("done\n");
  fflush(stdout);
  return 0;
}
