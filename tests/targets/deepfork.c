/* A pre-fork server with PostgreSQL's stack shape, for the test of cut
 * DWARF stacks completed by their frames' places on the stack
 * (tests/tests/unwind.rs). Built -O2 -fomit-frame-pointer.
 *
 * The master's main loop, serve(), holds a large frame: a 6 KiB buffer, as
 * PostgreSQL's ServerLoop and PostgresMain hold fd sets and sigjmp_bufs.
 * So no copy of 1 or 2 KiB taken in the code below it reaches main.
 *
 * It prints "ready <pid>" and, without waiting, spins in master_work()
 * below serve() until a line arrives on stdin (the go signal): the agent's
 * stack-copy measurement records it spinning there. Then it forks WORKERS
 * workers, one after the other, each from the same place in serve(), so
 * each starts with the master's stack at the same addresses. A worker runs
 * child_main() -> handle() -> query_a() / query_b() for SPIN_MS of wall
 * time, calls trigger(its pid) and exits.
 *
 *   deepfork WORKERS SPIN_MS
 */
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

volatile uint64_t sink;

__attribute__((noipa, used)) void trigger(long id) { sink += (uint64_t)id; }

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* Spins in its own code (no libc call inside the loop) for `ns`. */
__attribute__((noipa)) void query_a(uint64_t ns) {
  uint64_t end = now_ns() + ns;
  while (now_ns() < end)
    for (int i = 0; i < 2000; i++) __asm__ volatile("" ::: "memory");
  sink++;
}

__attribute__((noipa)) void query_b(uint64_t ns) {
  uint64_t end = now_ns() + ns;
  while (now_ns() < end)
    for (int i = 0; i < 2000; i++) __asm__ volatile("" ::: "memory");
  sink += 2;
}

__attribute__((noipa)) void handle(long ms) {
  uint64_t end = now_ns() + (uint64_t)ms * 1000000ull;
  while (now_ns() < end) {
    query_a(2000000);
    query_b(3000000);
  }
  sink += 3;
}

__attribute__((noipa)) void child_main(long ms) {
  handle(ms);
  trigger((long)getpid());
  sink += 4;
}

__attribute__((noipa)) void master_work(uint64_t ns) {
  uint64_t end = now_ns() + ns;
  while (now_ns() < end)
    for (int i = 0; i < 2000; i++) __asm__ volatile("" ::: "memory");
  sink += 5;
}

static int go_line(void) {
  struct pollfd p = {.fd = 0, .events = POLLIN};
  return poll(&p, 1, 0) > 0;
}

/* The big frame: its buffer is written and read, so it stays. */
__attribute__((noipa)) int serve(long workers, long ms) {
  volatile char state[6144];
  memset((char *)state, 1, sizeof state);
  while (!go_line()) master_work(5000000);
  for (long w = 0; w < workers; w++) {
    pid_t p = fork();
    if (p == 0) {
      child_main(ms);
      _exit(0);
    }
    printf("worker %d\n", (int)p);
    fflush(stdout);
    waitpid(p, NULL, 0);
  }
  return state[100] + state[6000];
}

int main(int argc, char **argv) {
  long workers = argc > 1 ? strtol(argv[1], NULL, 0) : 3;
  long ms = argc > 2 ? strtol(argv[2], NULL, 0) : 400;
  printf("ready %d\n", getpid());
  fflush(stdout);
  int r = serve(workers, ms);
  return r == 2 ? 0 : 1;
}
