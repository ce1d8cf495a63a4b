/* A traced program for the unwinding and build-id tests.
 *
 * Built twice with different function names (-DPREFIX=old_build and
 * -DPREFIX=new_build: a "deploy" replaces one with the other), and once
 * without frame pointers (-O2 -fomit-frame-pointer).
 *
 * It prints "ready <pid>", waits for a line on stdin (the go signal), then
 * runs ROUNDS rounds (argument 1, default 3): each round burns CPU for
 * SPIN_MS (argument 2, default 300) of wall time four calls deep in its own
 * code,
 * PREFIX_level3 <- PREFIX_level2 <- PREFIX_level1 <- PREFIX_run <- main, then
 * calls trigger(round). Then it exits 0.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#ifndef PREFIX
#define PREFIX old_build
#endif
#define CAT2(a, b) a##_##b
#define CAT(a, b) CAT2(a, b)
#define F(name) CAT(PREFIX, name)

volatile uint64_t sink;

/* The trigger: the same name in every build. */
__attribute__((noipa, used)) void trigger(long i) { sink += (uint64_t)i; }

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* The time-stamp counter: read inline, so a spin that watches it stays in
 * its own code (a clock_gettime call would put samples in the vDSO). */
static inline uint64_t tsc(void) {
  uint32_t lo, hi;
  __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
  return ((uint64_t)hi << 32) | lo;
}

/* Spins for `ticks` of the time-stamp counter in this function's own code:
 * samples land here, not in libc. Wall time, not a count of iterations
 * calibrated once: a count measured on a busy CPU ran short later, and a
 * second call then fell inside the first hit's cooldown (seen in CI). */
__attribute__((noipa)) void F(level3)(uint64_t ticks) {
  uint64_t end = tsc() + ticks;
  while (tsc() < end) __asm__ volatile("" ::: "memory");
  sink++;
}

/* noipa: no inlining and no clones; the work after each call keeps it a
 * real call, not a tail jump. */
__attribute__((noipa)) void F(level2)(uint64_t n) {
  F(level3)(n);
  sink += 2;
}

__attribute__((noipa)) void F(level1)(uint64_t n) {
  F(level2)(n);
  sink += 3;
}

__attribute__((noipa)) void F(run)(long rounds, uint64_t spins) {
  for (long i = 0; i < rounds; i++) {
    F(level1)(spins);
    trigger(i);
  }
  sink += 4;
}

int main(int argc, char **argv) {
  long rounds = argc > 1 ? atol(argv[1]) : 3;
  long spin_ms = argc > 2 ? atol(argv[2]) : 300;
  /* Time-stamp counter ticks per ms, measured against the monotonic clock
   * over a 20 ms sleep: both are wall time, so a busy CPU does not skew it. */
  uint64_t t0 = now_ns(), c0 = tsc();
  struct timespec nap = {0, 20000000};
  nanosleep(&nap, NULL);
  uint64_t dt = now_ns() - t0, dc = tsc() - c0;
  uint64_t per_ms = dc * 1000000ull / (dt ? dt : 1);
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  char line[64];
  if (!fgets(line, sizeof line, stdin)) return 1;
  F(run)(rounds, per_ms * (uint64_t)spin_ms);
  return 0;
}
