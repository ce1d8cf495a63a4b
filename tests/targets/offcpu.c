/* The off-CPU breakdown's test and bench target.
 *
 * It prints "ready <pid>", waits for a line on stdin (the go signal, given
 * after the agent prints `armed`), runs one scenario, prints "done" and
 * exits 0. CPU time is thread CPU time (CLOCK_THREAD_CPUTIME_ID), so a
 * "20 ms compute" is 20 ms on a CPU however loaded the machine is.
 *
 *   offcpu blocked N     N times, 300 ms apart: slow_call(), which runs
 *                        compute_part() (20 ms of CPU) then wait_part(),
 *                        which sleeps on a futex until a second thread wakes
 *                        it 100 ms later
 *   offcpu runnable N    three CPU-bound threads pinned to one CPU; one of
 *                        them calls slow_call_cpu() (60 ms of CPU, so about
 *                        180 ms of wall time) N times, 300 ms apart
 *   offcpu pingpong S    two threads pinned to one CPU pass one byte back
 *                        and forth through two pipes for S seconds; prints
 *                        "round_trips N", "switches N" and
 *                        "ns_per_switch X"; pp_trigger() is called once
 *                        every 65536 round trips (a function to probe that
 *                        costs nothing measurable)
 *   offcpu condwait N    N times, 300 ms apart: slow_call_cond(), which
 *                        runs cond_wait_part(), which waits 100 ms in libc's
 *                        pthread_cond_timedwait (nobody signals: it times
 *                        out). Debian's libc has no frame pointers, so a
 *                        frame-pointer walk from inside it loses the caller
 *   offcpu overlap N     N times, 400 ms apart: one thread calls
 *                        overlap_call(1) and spins 300 ms of wall time (no
 *                        system call), while a second thread, 50 ms in,
 *                        calls overlap_call(0), which sleeps 100 ms: its
 *                        return, in the middle of the spin, makes perf
 *                        switch files before the spin's call returns
 *   offcpu lossy N       four threads block and wake every ~50 µs; the main
 *                        thread N times sleeps 1200 ms, calls lossy_call(),
 *                        sleeps 30 ms, calls it again
 *   offcpu wait          waits until killed (a target that never switches)
 *
 * The functions the tests name are noipa: one symbol each, never inlined or
 * cloned. The futex wait is an inline `syscall` instruction inside
 * wait_part, so the user address at the switch is in wait_part itself and a
 * frame-pointer walk does not skip it (a leaf like libc's syscall() keeps
 * its caller's frame pointer, so the walk would go straight to slow_call).
 */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define COMPUTE_MS 20
#define WAIT_MS 100
#define CPU_CALL_MS 60
#define GAP_MS 300

volatile uint64_t sink;

static uint64_t clock_ns(clockid_t id) {
  struct timespec t;
  clock_gettime(id, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static uint64_t now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }
static uint64_t cpu_ns(void) { return clock_ns(CLOCK_THREAD_CPUTIME_ID); }

static void sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&t, &t) != 0) {
  }
}

/* Spins until this thread has used `ms` more of CPU time. The spin is in
 * the caller's frame (always_inline), so CPU samples land in it; the clock
 * is read every ~20000 iterations (a system call: thread CPU clocks have no
 * vDSO path). */
static inline __attribute__((always_inline)) void burn_cpu_ms(long ms) {
  uint64_t end = cpu_ns() + (uint64_t)ms * 1000000ull;
  do {
    for (int k = 0; k < 20000; k++) __asm__ volatile("" ::: "memory");
  } while (cpu_ns() < end);
}

/* futex(2) by the syscall instruction, in the caller's frame. */
static inline __attribute__((always_inline)) long futex_inline(int *addr, int op, int val) {
  register long r10 __asm__("r10") = 0; /* no timeout */
  long ret;
  __asm__ volatile("syscall"
                   : "=a"(ret)
                   : "0"((long)SYS_futex), "D"(addr), "S"((long)op), "d"((long)val), "r"(r10)
                   : "rcx", "r11", "memory");
  return ret;
}

static long futex_call(int *addr, int op, int val) {
  return syscall(SYS_futex, addr, op, val, NULL, NULL, 0);
}

/* --- blocked ------------------------------------------------------------ */

/* g_request: 1 when wait_part asks the waker for a wake-up; g_woken: 1 once
 * the waker has woken wait_part. */
static int g_request, g_woken;

static void *waker(void *arg) {
  (void)arg;
  for (;;) {
    while (!__atomic_load_n(&g_request, __ATOMIC_ACQUIRE))
      futex_call(&g_request, FUTEX_WAIT_PRIVATE, 0);
    __atomic_store_n(&g_request, 0, __ATOMIC_RELEASE);
    sleep_ms(WAIT_MS);
    __atomic_store_n(&g_woken, 1, __ATOMIC_RELEASE);
    futex_call(&g_woken, FUTEX_WAKE_PRIVATE, 1);
  }
  return NULL;
}

__attribute__((noipa)) void compute_part(void) { burn_cpu_ms(COMPUTE_MS); }

__attribute__((noipa)) void wait_part(void) {
  __atomic_store_n(&g_woken, 0, __ATOMIC_RELEASE);
  __atomic_store_n(&g_request, 1, __ATOMIC_RELEASE);
  futex_call(&g_request, FUTEX_WAKE_PRIVATE, 1);
  while (!__atomic_load_n(&g_woken, __ATOMIC_ACQUIRE))
    futex_inline(&g_woken, FUTEX_WAIT_PRIVATE, 0);
}

__attribute__((noipa)) void slow_call(long i) {
  compute_part();
  wait_part();
  sink += (uint64_t)i;
}

/* --- condwait ----------------------------------------------------------- */

static pthread_mutex_t g_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;

__attribute__((noipa)) void cond_wait_part(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  t.tv_nsec += WAIT_MS * 1000000L;
  if (t.tv_nsec >= 1000000000L) {
    t.tv_sec++;
    t.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&g_mutex);
  while (pthread_cond_timedwait(&g_cond, &g_mutex, &t) == 0) {
  }
  pthread_mutex_unlock(&g_mutex);
}

__attribute__((noipa)) void slow_call_cond(long i) {
  cond_wait_part();
  sink += (uint64_t)i;
}

static void run_condwait(long n) {
  for (long i = 0; i < n; i++) {
    slow_call_cond(i);
    sleep_ms(GAP_MS);
  }
}

static void run_blocked(long n) {
  pthread_t t;
  pthread_create(&t, NULL, waker, NULL);
  for (long i = 0; i < n; i++) {
    slow_call(i);
    sleep_ms(GAP_MS);
  }
}

/* --- runnable ----------------------------------------------------------- */

static int g_stop;
static long g_calls;
static cpu_set_t g_one_cpu;

/* The lowest CPU this process may run on: all pinned threads share it. */
static void pick_one_cpu(void) {
  cpu_set_t all;
  CPU_ZERO(&all);
  sched_getaffinity(0, sizeof all, &all);
  CPU_ZERO(&g_one_cpu);
  for (int c = 0; c < CPU_SETSIZE; c++) {
    if (CPU_ISSET(c, &all)) {
      CPU_SET(c, &g_one_cpu);
      return;
    }
  }
}

static void pin_self(void) {
  if (sched_setaffinity(0, sizeof g_one_cpu, &g_one_cpu) != 0) {
    perror("sched_setaffinity");
    exit(4);
  }
}

__attribute__((noipa)) void slow_call_cpu(long i) {
  burn_cpu_ms(CPU_CALL_MS);
  sink += (uint64_t)i;
}

static void *spinner(void *arg) {
  (void)arg;
  pin_self();
  while (!__atomic_load_n(&g_stop, __ATOMIC_RELAXED)) sink++;
  return NULL;
}

static void *caller(void *arg) {
  (void)arg;
  pin_self();
  for (long i = 0; i < g_calls; i++) {
    slow_call_cpu(i);
    /* Compete between calls too (no sleep): the call starts in the middle
     * of the contention, as in a busy server. */
    uint64_t end = now_ns() + (uint64_t)GAP_MS * 1000000ull;
    while (now_ns() < end) sink++;
  }
  return NULL;
}

static void run_runnable(long n) {
  pthread_t s[2], c;
  pick_one_cpu();
  g_calls = n;
  for (int k = 0; k < 2; k++) pthread_create(&s[k], NULL, spinner, NULL);
  pthread_create(&c, NULL, caller, NULL);
  pthread_join(c, NULL);
  __atomic_store_n(&g_stop, 1, __ATOMIC_RELAXED);
  for (int k = 0; k < 2; k++) pthread_join(s[k], NULL);
}

/* --- pingpong ----------------------------------------------------------- */

static int g_ab[2], g_ba[2];

__attribute__((noipa)) void pp_trigger(long i) { sink += (uint64_t)i; }

static void *ponger(void *arg) {
  (void)arg;
  pin_self();
  char b;
  while (read(g_ab[0], &b, 1) == 1) {
    if (b == 'q') break;
    if (write(g_ba[1], &b, 1) != 1) break;
  }
  return NULL;
}

static void run_pingpong(long seconds) {
  pthread_t t;
  pick_one_cpu();
  if (pipe(g_ab) != 0 || pipe(g_ba) != 0) {
    perror("pipe");
    exit(4);
  }
  pthread_create(&t, NULL, ponger, NULL);
  pin_self();
  char b = 'p';
  uint64_t t0 = now_ns(), end = t0 + (uint64_t)seconds * 1000000000ull, n = 0, t1;
  for (;;) {
    for (int k = 0; k < 1024; k++, n++) {
      if ((n & 65535) == 0) pp_trigger((long)n);
      if (write(g_ab[1], &b, 1) != 1 || read(g_ba[0], &b, 1) != 1) {
        perror("pingpong");
        exit(4);
      }
    }
    t1 = now_ns();
    if (t1 >= end) break;
  }
  b = 'q';
  if (write(g_ab[1], &b, 1) != 1) exit(4);
  pthread_join(t, NULL);
  /* Both threads on one CPU: each hand-off of the byte is one switch. */
  printf("round_trips %llu\nswitches %llu\nns_per_switch %.1f\n", (unsigned long long)n,
         (unsigned long long)(2 * n), (double)(t1 - t0) / (double)(2 * n));
  fflush(stdout);
}

/* --- overlap ------------------------------------------------------------ */

#define SPIN_MS 300
#define OVERLAP_SLEEP_MS 100

__attribute__((noipa)) void overlap_call(long spin) {
  if (spin) {
    uint64_t end = now_ns() + (uint64_t)SPIN_MS * 1000000ull;
    while (now_ns() < end) sink++;
  } else {
    sleep_ms(OVERLAP_SLEEP_MS);
  }
}

static void *overlap_sleeper(void *arg) {
  (void)arg;
  sleep_ms(50);
  overlap_call(0);
  return NULL;
}

static void run_overlap(long n) {
  for (long i = 0; i < n; i++) {
    pthread_t t;
    pthread_create(&t, NULL, overlap_sleeper, NULL);
    overlap_call(1);
    pthread_join(t, NULL);
    sleep_ms(GAP_MS + 100);
  }
}

/* --- lossy -------------------------------------------------------------- */

__attribute__((noipa)) void lossy_call(long i) { sink += (uint64_t)i; }

static void *churner(void *arg) {
  (void)arg;
  struct timespec t = {0, 50000};
  while (!__atomic_load_n(&g_stop, __ATOMIC_RELAXED)) {
    for (int k = 0; k < 2000; k++) __asm__ volatile("" ::: "memory");
    nanosleep(&t, NULL);
  }
  return NULL;
}

static void run_lossy(long n) {
  pthread_t c[4];
  for (int k = 0; k < 4; k++) pthread_create(&c[k], NULL, churner, NULL);
  for (long i = 0; i < n; i++) {
    sleep_ms(1200);
    lossy_call(2 * i);
    sleep_ms(30);
    lossy_call(2 * i + 1);
  }
  __atomic_store_n(&g_stop, 1, __ATOMIC_RELAXED);
  for (int k = 0; k < 4; k++) pthread_join(c[k], NULL);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: offcpu blocked N | runnable N | condwait N | pingpong SECONDS | overlap N | lossy N | wait\n");
    return 2;
  }
  const char *mode = argv[1];
  long a = argc > 2 ? strtol(argv[2], NULL, 0) : 0;
  printf("ready %d\n", getpid());
  fflush(stdout);
  char line[64];
  if (!fgets(line, sizeof line, stdin)) return 3;
  if (!strcmp(mode, "blocked")) {
    run_blocked(a);
  } else if (!strcmp(mode, "runnable")) {
    run_runnable(a);
  } else if (!strcmp(mode, "pingpong")) {
    run_pingpong(a);
  } else if (!strcmp(mode, "condwait")) {
    run_condwait(a);
  } else if (!strcmp(mode, "overlap")) {
    run_overlap(a);
  } else if (!strcmp(mode, "lossy")) {
    run_lossy(a);
  } else if (!strcmp(mode, "wait")) {
    for (;;) pause();
  } else {
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
  }
  printf("done\n");
  fflush(stdout);
  return 0;
}
