/* The report test's target: is the moment the moment?
 *
 * It prints "ready <pid>", waits for a line on stdin (the go signal), then:
 * a worker thread runs background_work() all the time, while the main
 * thread, N times over, spins in fast_work() for 20 ms, sleeps 100 ms, and
 * calls handle(i). handle() is quick, except every call with an odd i:
 * then it first spends 60 ms of CPU in slow_part(), then sleeps 10 ms in
 * blocked_part(). So with `--slower-than 30ms` each hit's call is about
 * 60 ms of slow_part on CPU and 10 ms blocked in blocked_part (the
 * report's off-CPU graph), and the whole process is mostly
 * background_work.
 *
 *   moment N       N calls of handle (N/2 of them slow), then exit 0
 *   deep SECONDS   for the bench: two threads busy 48 calls deep (big
 *                  samples), and handle(0) every 700 ms, for SECONDS
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

volatile uint64_t sink;
static volatile int stop;

static uint64_t cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Spins for MS ms of this thread's CPU time (so preemption does not shorten
 * it), in the function that uses it: the clock is read only every 200000
 * iterations, so nearly every sample is in the caller's own loop. */
#define SPIN_CPU_MS(ms)                                                   \
    do {                                                                  \
        uint64_t end_ = cpu_ns() + (uint64_t)(ms) * 1000000u;             \
        do {                                                              \
            for (int k_ = 0; k_ < 200000; k_++) sink += (uint64_t)k_;     \
        } while (cpu_ns() < end_);                                        \
    } while (0)

__attribute__((noinline)) void background_work(void) {
    while (!stop) {
        for (int k = 0; k < 100000; k++) sink += (uint64_t)k;
    }
}

__attribute__((noinline)) void slow_part(void) { SPIN_CPU_MS(60); }

__attribute__((noinline)) void fast_work(void) { SPIN_CPU_MS(20); }

/* Off CPU for 10 ms, blocked in nanosleep (not a tail call, so that the
 * frame stays on the stack). */
__attribute__((noinline)) void blocked_part(void) {
    struct timespec nap = {0, 10 * 1000000L};
    nanosleep(&nap, NULL);
    sink += 1;
}

__attribute__((noinline, used)) void handle(long i) {
    if (i % 2 == 1) {
        slow_part();
        blocked_part();
    }
    sink += (uint64_t)i;
}

/* Recurses DEPTH calls deep, then spins a little: deep call chains. */
__attribute__((noinline)) void deep(int depth) {
    if (depth > 0) {
        deep(depth - 1);
        sink += 1; /* not a tail call */
        return;
    }
    for (int k = 0; k < 20000; k++) sink += (uint64_t)k;
}

static void *deep_worker(void *arg) {
    (void)arg;
    while (!stop) deep(48);
    return NULL;
}

static int deep_mode(long seconds) {
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, deep_worker, NULL);
    for (long ms = 0; ms < seconds * 1000; ms += 700) {
        struct timespec nap = {0, 700 * 1000000L};
        nanosleep(&nap, NULL);
        handle(0);
    }
    stop = 1;
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    return 0;
}

static void *worker(void *arg) {
    (void)arg;
    background_work();
    return NULL;
}

int main(int argc, char **argv) {
    long n = argc > 2 ? atol(argv[2]) : 8;
    printf("ready %d\n", getpid());
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) return 1;
    if (argc > 2 && argv[1][0] == 'd') return deep_mode(n);
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    for (long i = 0; i < n; i++) {
        fast_work();
        struct timespec nap = {0, 100 * 1000000L};
        nanosleep(&nap, NULL);
        handle(i);
    }
    stop = 1;
    pthread_join(t, NULL);
    return 0;
}
