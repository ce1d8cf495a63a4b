/* A pre-fork server for mt-agent's fork-following tests: a master that
 * forks its workers without exec, then replaces them, as nginx, PostgreSQL
 * or gunicorn do.
 *
 * It prints "ready <pid>" and waits for a line on stdin (the go signal).
 * Then, GENERATIONS times: it forks WORKERS workers; each calls
 * handle_request(its pid) at once (within a few ms of the fork), burns
 * ~200 ms of CPU in worker_loop() and exits; the master burns CPU in
 * master_loop() meanwhile, prints "worker <pid>" for each, and reaps them.
 *
 *   prefork WORKERS GENERATIONS
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

volatile uint64_t sink;

__attribute__((noipa, used)) void handle_request(long id) { sink += (uint64_t)id; }

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

__attribute__((noipa)) static void worker_loop(long ms) {
  uint64_t end = now_ns() + (uint64_t)ms * 1000000ull;
  while (now_ns() < end) sink++;
}

__attribute__((noipa)) static void master_loop(long ms) {
  uint64_t end = now_ns() + (uint64_t)ms * 1000000ull;
  while (now_ns() < end) sink += 2;
}

int main(int argc, char **argv) {
  long workers = argc > 1 ? strtol(argv[1], NULL, 0) : 3;
  long generations = argc > 2 ? strtol(argv[2], NULL, 0) : 2;
  printf("ready %d\n", getpid());
  fflush(stdout);
  char line[64];
  if (!fgets(line, sizeof line, stdin)) return 3;
  master_loop(200);
  for (long g = 0; g < generations; g++) {
    for (long w = 0; w < workers; w++) {
      pid_t p = fork();
      if (p == 0) {
        handle_request((long)getpid());
        worker_loop(200);
        _exit(0);
      }
      printf("worker %d\n", (int)p);
      fflush(stdout);
    }
    master_loop(300);
    for (long w = 0; w < workers; w++) wait(NULL);
    master_loop(300);
  }
  printf("done\n");
  fflush(stdout);
  return 0;
}
