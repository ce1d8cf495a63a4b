/* Calls glibc's memcpy, an IFUNC, through the PLT on 1 MiB buffers.
 *
 *   ifunc bound N GAP_MS     one memcpy (which binds the GOT entry), then
 *                            "ready <pid>"; after the go line, N memcpy
 *                            calls GAP_MS apart
 *   ifunc unbound            "ready <pid>" before any memcpy, then waits
 *
 * Built with -fno-builtin and a volatile size, so that the compiler calls
 * memcpy instead of inlining it, and with lazy binding (-z lazy), so that
 * the GOT entry stays unbound until the first call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char src[1 << 20], dst[1 << 20];
volatile size_t size = sizeof src;

static void sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  int bound = !strcmp(argv[1], "bound");
  if (bound) memcpy(dst, src, size);
  printf("ready %d\n", getpid());
  fflush(stdout);
  char line[64];
  if (!fgets(line, sizeof line, stdin)) return 3;
  if (!bound) {
    for (;;) pause();
  }
  long n = argc > 2 ? strtol(argv[2], NULL, 0) : 10;
  long gap = argc > 3 ? strtol(argv[3], NULL, 0) : 20;
  for (long i = 0; i < n; i++) {
    src[0] = (char)i;
    memcpy(dst, src, size);
    sleep_ms(gap);
  }
  printf("done %d\n", dst[0]);
  fflush(stdout);
  return 0;
}
