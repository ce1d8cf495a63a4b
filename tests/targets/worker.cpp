// C++ target: `ns::Worker::handle(int)` is the trigger; `ns::Worker::risky(int)`
// throws through itself to a caller that catches (exception tests).
//   worker calls N GAP_MS     handle(i) for i in 0..N
//   worker throw N            risky(i) for i in 0..N; even i throw, caught by main
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <unistd.h>

volatile long sink;

namespace ns {
struct Worker {
  __attribute__((noipa)) void handle(int x);
  __attribute__((noipa)) long risky(int x);
};

void Worker::handle(int x) { sink += x; }

long Worker::risky(int x) {
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (x % 2 == 0) throw std::runtime_error("boom " + std::to_string(x));
  sink += x;
  return x;
}
}  // namespace ns

// Two overloads of one name (refusal tests: `work` is ambiguous).
__attribute__((noipa, used)) void work(int x) { sink += x; }
__attribute__((noipa, used)) void work(double x) { sink += (long)x; }

static void burn_ms(long ms) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) sink++;
}

int main(int argc, char **argv) {
  if (argc < 3) return 2;
  std::string mode = argv[1];
  long n = std::strtol(argv[2], nullptr, 0);
  long gap = argc > 3 ? std::strtol(argv[3], nullptr, 0) : 0;
  std::printf("ready %d\n", getpid());
  std::fflush(stdout);
  std::string line;
  if (!std::getline(std::cin, line)) return 3;
  burn_ms(200);
  ns::Worker w;
  if (mode == "calls") {
    for (int i = 0; i < n; i++) {
      w.handle(i);
      burn_ms(gap);
    }
  } else if (mode == "throw") {
    int caught = 0;
    for (int i = 0; i < n; i++) {
      try {
        w.risky(i);
      } catch (const std::exception &e) {
        caught++;
      }
    }
    std::printf("caught %d\n", caught);
  }
  burn_ms(200);
  std::printf("done\n");
  std::fflush(stdout);
  return 0;
}
