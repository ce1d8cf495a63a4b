/* A traced program for mt-agent's end-to-end tests.
 *
 * It prints "ready <pid>", waits for a line on stdin (the go signal, given
 * after the agent prints `armed`), burns CPU so the first snapshot has
 * samples, runs one scenario, and exits 0.
 *
 *   target calls N GAP_MS        trigger(i) for i in 0..N, GAP_MS apart
 *   target loop N SPIN_US        N calls of trigger(i), spinning SPIN_US between
 *   target threads T GAP_MS      T threads; thread k calls trigger(k) at k*GAP_MS
 *   target tids T N GAP_MS       T threads print their tids, wait for a second go line,
 *                                then each calls trigger(k) N times, GAP_MS apart
 *   target storm SECONDS [FN]    FN(i) (default trigger) as fast as possible for SECONDS
 *   target slow N                f_slow(i) for i in 0..N; i in {10,20,30} sleep SLOW_MS (50 ms)
 *   target slowrec N             the same through a recursive f_rec
 *   target slowthreads T N       slow on T threads at once
 *   target slowwait N            slow N, then waits until killed
 *   target slowmix N             f_mix(i) for i in 0..N: 60 ms if i % 10 == 9, else 20 ms
 *   target long N MS             f_long(i) for i in 0..N back to back: even i burn MS ms of CPU,
 *                                odd i sleep MS ms
 *   target after                 f_after burns 30 ms of CPU after entry
 *   target fork                  a forked child calls trigger 5 times; the parent does not
 *   target exec PATH...          execs PATH after the go signal
 *   target churn N               creates and joins N short threads, calling trigger now and then
 *   target wait                  waits until killed
 *   target stamp N GAP_MS [FN]   FN(CLOCK_MONOTONIC ns) N times, GAP_MS apart; prints each stamp
 *   target bench FN N REPS       REPS times: FN (push|nop5|step|trigger) N times; prints ns per call
 *   target early MS              trigger(0) at once after exec, then "ready", then trigger(1)
 *                                MS ms later, and exits (no go line)
 *   target busy N GAP_MS         two threads burn CPU; every GAP_MS the main one prints "halfway"
 *                                at half the gap, then calls trigger(i); N = 0: burn GAP_MS, no call
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* How long a "slow" call sleeps: far above any preemption on a loaded
 * 2-core machine, so only the intended calls pass --slower-than 25ms. */
#define SLOW_MS 50

volatile uint64_t sink;

/* The trigger: an exported, out-of-line function (static in the
 * STATIC_TRIGGER build, so only separate debug info names it). */
#ifdef STATIC_TRIGGER
static
#endif
__attribute__((noipa, used)) void trigger(long i) { sink += (uint64_t)i; }

/* Trigger functions whose first instruction is fixed, for cost hints and the
 * bench: push (emulated), a 5-byte nop (optimized), and a RIP-relative load
 * (single-stepped). */
__asm__(".globl trigger_push\n.type trigger_push,@function\ntrigger_push:\n"
        "  push %rbp\n  pop %rbp\n  ret\n.size trigger_push, .-trigger_push\n"
        ".globl trigger_nop5\n.type trigger_nop5,@function\ntrigger_nop5:\n"
        "  .byte 0x0f,0x1f,0x44,0x00,0x00\n  ret\n.size trigger_nop5, .-trigger_nop5\n"
        ".globl trigger_step\n.type trigger_step,@function\ntrigger_step:\n"
        "  mov sink(%rip), %rax\n  ret\n.size trigger_step, .-trigger_step\n");
/* A compiler-style clone with no original body: `fclone` names only
 * `fclone.constprop.0`, which must not be picked silently. */
__asm__(".globl fclone.constprop.0\n.type fclone.constprop.0,@function\nfclone.constprop.0:\n"
        "  push %rbp\n  pop %rbp\n  ret\n.size fclone.constprop.0, .-fclone.constprop.0\n");
/* A function whose first instruction is int3, which the kernel refuses to
 * probe (never called), and one that starts with a lock-prefixed add. */
__asm__(".globl trigger_int3\n.type trigger_int3,@function\ntrigger_int3:\n"
        "  int3\n  ret\n.size trigger_int3, .-trigger_int3\n"
        ".globl trigger_lock\n.type trigger_lock,@function\ntrigger_lock:\n"
        "  lock addq $1, sink(%rip)\n  ret\n.size trigger_lock, .-trigger_lock\n");
/* A function with one `ret` and one tail jump (to trigger), as optimized
 * code such as nginx's has: --slower-than's `ret` probes cannot time the
 * jump's calls (never called). */
__asm__(".globl f_tailjump\n.type f_tailjump,@function\nf_tailjump:\n"
        "  test $1, %dil\n  jnz 1f\n  ret\n1:\n  jmp trigger\n"
        ".size f_tailjump, .-f_tailjump\n");
void trigger_push(long);
void trigger_nop5(long);
void trigger_step(long);

/* A data symbol, for refusal tests. */
__attribute__((used)) long trigger_data[4] = {1, 2, 3, 4};

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void burn_ns(uint64_t ns) {
  uint64_t end = now_ns() + ns;
  while (now_ns() < end) sink++;
}

static void burn_ms(long ms) { burn_ns((uint64_t)ms * 1000000ull); }

static void sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

/* noipa: no inlining and no IPA clones (f.constprop.0), so each test
 * function is one symbol with real calls. */
__attribute__((noipa)) long f_slow(long i) {
  if (i == 10 || i == 20 || i == 30) sleep_ms(SLOW_MS);
  sink += (uint64_t)i;
  return i * 2;
}

/* Every call is slow-ish and in flight most of the time: 20 ms, or 60 ms
 * for every tenth (i % 10 == 9). */
__attribute__((noipa)) long f_mix(long i) {
  sleep_ms(i % 10 == 9 ? 60 : 20);
  sink += (uint64_t)i;
  return i * 2;
}

/* Back-to-back slow calls, CPU-bound (even i) or sleeping (odd i). */
static long g_long_ms;
__attribute__((noipa)) long f_long(long i) {
  if (i % 2 == 0)
    burn_ms(g_long_ms);
  else
    sleep_ms(g_long_ms);
  sink += (uint64_t)i;
  return i * 2;
}

/* Recursive: the outermost call recurses 3 levels (fast calls that return
 * first), then, for i in {10,20,30}, sleeps. Only that outermost frame is
 * slow, so its entry slot must survive the nested calls. */
__attribute__((noipa)) long f_rec(long i, int depth) {
  long r = 0;
  if (depth > 0) r = f_rec(i, depth - 1);
  if (depth == 3 && (i == 10 || i == 20 || i == 30)) sleep_ms(SLOW_MS);
  sink += (uint64_t)i;
  return r + i;
}

/* Spin iterations per ms, measured at startup, so f_after can burn CPU
 * in its own code: samples inside libc's clock_gettime have no frame
 * pointers to unwind through, so they would not show f_after. */
static uint64_t spins_per_ms;

__attribute__((noipa)) static void spin(uint64_t n) {
  for (uint64_t k = 0; k < n; k++) __asm__ volatile("" ::: "memory");
}

static void calibrate(void) {
  uint64_t t0 = now_ns();
  spin(10000000);
  uint64_t dt = now_ns() - t0;
  spins_per_ms = 10000000ull * 1000000ull / (dt ? dt : 1);
}

__attribute__((noipa)) void f_after(long i) {
  sink += (uint64_t)i;
  /* 30 ms of CPU in f_after's own frame (spin inlined by hand). */
  for (uint64_t k = 0; k < 30 * spins_per_ms; k++) __asm__ volatile("" ::: "memory");
}

static long g_gap, g_n;
static void *thread_call(void *arg) {
  long k = (long)arg;
  sleep_ms(k * g_gap);
  burn_ms(20);
  trigger(k);
  return NULL;
}

static pthread_barrier_t g_tids_go;
static void *thread_tids(void *arg) {
  long k = (long)arg;
  printf("tid %ld %ld\n", k, (long)syscall(SYS_gettid));
  fflush(stdout);
  /* The test starts an agent with --tid, then sends a second go. */
  pthread_barrier_wait(&g_tids_go);
  for (long i = 0; i < g_n; i++) {
    trigger(k);
    sleep_ms(g_gap);
  }
  return NULL;
}

static void *thread_slow(void *arg) {
  (void)arg;
  for (long i = 0; i < g_n; i++) f_slow(i);
  return NULL;
}

static void *thread_short(void *arg) {
  sink += (uint64_t)(long)arg;
  return NULL;
}

/* The trigger functions by short name: push, nop5, step, or trigger. */
static void (*pick(const char *name))(long) {
  if (!strcmp(name, "push")) return trigger_push;
  if (!strcmp(name, "nop5")) return trigger_nop5;
  if (!strcmp(name, "step")) return trigger_step;
  return trigger;
}

/* Deep-ish stacks for the busy mode: a chain of out-of-line frames. */
__attribute__((noipa)) static void busy_leaf(int depth, uint64_t end) {
  if (depth > 0) {
    busy_leaf(depth - 1, end);
    return;
  }
  while (now_ns() < end) sink++;
}
__attribute__((noipa)) static void busy_main(long ms) {
  uint64_t end = now_ns() + (uint64_t)ms * 1000000ull;
  while (now_ns() < end) busy_leaf(16, now_ns() + 1000000ull);
}
__attribute__((noipa)) static void *busy_worker(void *arg) {
  (void)arg;
  for (;;) busy_leaf(16, now_ns() + 1000000ull);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: target MODE ...\n");
    return 2;
  }
  const char *mode = argv[1];
  long a = argc > 2 ? strtol(argv[2], NULL, 0) : 0;
  long b = argc > 3 ? strtol(argv[3], NULL, 0) : 0;
  long c = argc > 4 ? strtol(argv[4], NULL, 0) : 0;

  if (!strcmp(mode, "early")) {
    /* A short-lived process (a CLI tool, a cron job) calls at once. */
    trigger(0);
    printf("ready %d\n", getpid());
    fflush(stdout);
    sleep_ms(a);
    trigger(1);
    return 0;
  }

  printf("ready %d\n", getpid());
  fflush(stdout);
  char line[64];
  if (!fgets(line, sizeof line, stdin)) return 3;
  burn_ms(200);

  if (!strcmp(mode, "calls")) {
    for (long i = 0; i < a; i++) {
      trigger(i);
      burn_ms(b);
    }
  } else if (!strcmp(mode, "loop")) {
    for (long i = 0; i < a; i++) {
      trigger(i);
      burn_ns((uint64_t)b * 1000ull);
    }
  } else if (!strcmp(mode, "threads")) {
    pthread_t t[64];
    g_gap = b;
    for (long k = 0; k < a && k < 64; k++) pthread_create(&t[k], NULL, thread_call, (void *)k);
    for (long k = 0; k < a && k < 64; k++) pthread_join(t[k], NULL);
  } else if (!strcmp(mode, "tids")) {
    pthread_t t[64];
    g_n = b;
    g_gap = c;
    long nt = a < 64 ? a : 64;
    pthread_barrier_init(&g_tids_go, NULL, (unsigned)nt + 1);
    for (long k = 0; k < nt; k++) pthread_create(&t[k], NULL, thread_tids, (void *)k);
    if (!fgets(line, sizeof line, stdin)) return 3;
    pthread_barrier_wait(&g_tids_go);
    for (long k = 0; k < a && k < 64; k++) pthread_join(t[k], NULL);
  } else if (!strcmp(mode, "storm")) {
    void (*fn)(long) = argc > 3 ? pick(argv[3]) : trigger;
    uint64_t t0 = now_ns(), end = t0 + (uint64_t)a * 1000000000ull, n = 0;
    while (1) {
      for (int k = 0; k < 1000; k++) fn((long)n++);
      if (now_ns() >= end) break;
    }
    printf("calls %llu in %.3f s\n", (unsigned long long)n, (double)(now_ns() - t0) / 1e9);
    fflush(stdout); /* the bench reads it while the agent still runs */
  } else if (!strcmp(mode, "long")) {
    g_long_ms = b;
    for (long i = 0; i < a; i++) f_long(i);
  } else if (!strcmp(mode, "slowmix")) {
    for (long i = 0; i < a; i++) f_mix(i);
  } else if (!strcmp(mode, "slow")) {
    for (long i = 0; i < a; i++) f_slow(i);
  } else if (!strcmp(mode, "slowrec")) {
    for (long i = 0; i < a; i++) f_rec(i, 3);
  } else if (!strcmp(mode, "slowwait")) {
    for (long i = 0; i < a; i++) f_slow(i);
    for (;;) pause();
  } else if (!strcmp(mode, "slowthreads")) {
    pthread_t t[64];
    g_n = b;
    for (long k = 0; k < a && k < 64; k++) pthread_create(&t[k], NULL, thread_slow, NULL);
    for (long k = 0; k < a && k < 64; k++) pthread_join(t[k], NULL);
  } else if (!strcmp(mode, "after")) {
    calibrate();
    f_after(1);
    burn_ms(100);
  } else if (!strcmp(mode, "fork")) {
    pid_t child = fork();
    if (child == 0) {
      for (long i = 0; i < 5; i++) {
        trigger(i);
        sleep_ms(150);
      }
      _exit(0);
    }
    int st;
    waitpid(child, &st, 0);
    burn_ms(300);
  } else if (!strcmp(mode, "exec")) {
    trigger(0);
    burn_ms(300);
    execv(argv[2], argv + 2);
    perror("execv");
    return 4;
  } else if (!strcmp(mode, "churn")) {
    for (long i = 0; i < a; i++) {
      pthread_t t;
      pthread_create(&t, NULL, thread_short, (void *)i);
      pthread_join(t, NULL);
      if (i % 100 == 0) trigger(i);
    }
    burn_ms(300);
  } else if (!strcmp(mode, "wait")) {
    for (;;) pause();
  } else if (!strcmp(mode, "stamp")) {
    void (*fn)(long) = argc > 4 ? pick(argv[4]) : trigger;
    for (long i = 0; i < a; i++) {
      burn_ms(b / 2);
      uint64_t t = now_ns();
      fn((long)t);
      printf("stamp %llu\n", (unsigned long long)t);
      fflush(stdout);
      sleep_ms(b - b / 2);
    }
  } else if (!strcmp(mode, "pairs")) {
    /* pairs N BURN_MS GAP_MS [fn]: N pairs of calls; the first of each
     * after BURN_MS of CPU (a large snapshot with DWARF stacks), the second
     * GAP_MS of CPU after it, printed as "first T" and "stamp T". */
    void (*fn)(long) = argc > 5 ? pick(argv[5]) : trigger;
    for (long i = 0; i < a; i++) {
      burn_ms(b);
      uint64_t t = now_ns();
      fn((long)t);
      printf("first %llu\n", (unsigned long long)t);
      fflush(stdout);
      burn_ms(c);
      t = now_ns();
      fn((long)t);
      printf("stamp %llu\n", (unsigned long long)t);
      fflush(stdout);
      sleep_ms(100);
    }
  } else if (!strcmp(mode, "busy")) {
    pthread_t t;
    pthread_create(&t, NULL, busy_worker, NULL);
    for (long i = 0; i < a || (a == 0 && i == 0); i++) {
      busy_main(b / 2);
      printf("halfway %ld\n", i);
      fflush(stdout);
      busy_main(b - b / 2);
      if (a > 0) {
        printf("hit %ld %llu\n", i, (unsigned long long)now_ns());
        fflush(stdout);
        trigger(i);
      }
    }
  } else if (!strcmp(mode, "bench")) {
    void (*fn)(long) = pick(argv[2]);
    long n = b, reps = c > 0 ? c : 1;
    /* One warm-up call, outside the timed loops: an agent's first accepted
     * hit (and perf's file switch) happens here, not while timing. */
    fn(-1);
    sleep_ms(300);
    for (long r = 0; r < reps; r++) {
      uint64_t t0 = now_ns();
      for (long i = 0; i < n; i++) fn(i);
      uint64_t t1 = now_ns();
      printf("ns_per_call %.3f\n", (double)(t1 - t0) / (double)n);
      fflush(stdout);
    }
  } else {
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
  }
  burn_ms(200);
  printf("done\n");
  fflush(stdout);
  return 0;
}
