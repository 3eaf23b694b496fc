// W1 peers cpp_shared_ptr and cpp_shared_ptr_st: std::shared_ptr, the handle
// C++ users share an object with. One op = copy-construct a shared_ptr from
// the one the benchmark holds (a retain) and destroy the copy (a release).
//   cpp_shared_ptr_st  w1a, measured before the process has ever started a
//                      thread: libstdc++ (GCC 12, glibc >= 2.34) then sees
//                      __libc_single_threaded and updates the count without
//                      atomics; this is what a single-threaded program pays
//   cpp_shared_ptr     w1a and w1b, measured after one thread has existed:
//                      the count is updated with lock-prefixed atomics, which
//                      is what any program that ever shares the object pays
// w1b: two threads, n ops each on the same control block; the time from the
// first start to the last end, divided by n. value = the median over reps of
// ns per op, after a warm-up of n/10 ops.
// Build: g++ -O2 -std=c++17 -pthread w1_shared_ptr.cpp -o w1_shared_ptr
// Run:   ./w1_shared_ptr [n=10000000] [reps=5]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

namespace {

struct Payload {
  unsigned char bytes[64];
};

double now_ns() {
  using namespace std::chrono;
  return double(
      duration_cast<nanoseconds>(steady_clock::now().time_since_epoch())
          .count());
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t k = v.size() / 2;
  return v.size() % 2 ? v[k] : (v[k - 1] + v[k]) / 2;
}

// Keeps the copy alive as far as the optimiser can tell.
inline void escape(const void *p) {
  asm volatile("" : : "r"(p) : "memory");
}

__attribute__((noinline)) void clone_drop(const std::shared_ptr<Payload> &held,
                                          long n) {
  for (long i = 0; i < n; i++) {
    std::shared_ptr<Payload> copy(held);
    escape(&copy);
  }
}

double one_thread(const std::shared_ptr<Payload> &held, long n, int reps) {
  std::vector<double> t;
  clone_drop(held, n / 10);
  for (int r = 0; r < reps; r++) {
    double t0 = now_ns();
    clone_drop(held, n);
    t.push_back((now_ns() - t0) / double(n));
  }
  return median_of(t);
}

void report(const char *peer, const char *wl, double v, long n, int reps) {
  std::printf(
      "peer=%s workload=%s size=0 metric=ns_per_op value=%.3f n=%ld reps=%d\n",
      peer, wl, v, n, reps);
  std::fflush(stdout);
}

} // namespace

int main(int argc, char **argv) {
  long n = argc > 1 ? std::atol(argv[1]) : 10000000L;
  int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  if (n < 1) n = 10000000L;
  if (reps < 1) reps = 5;
  auto held = std::make_shared<Payload>();

  report("cpp_shared_ptr_st", "w1a", one_thread(held, n, reps), n, reps);

  std::thread([] {}).join(); // from here on the counts are atomic
  report("cpp_shared_ptr", "w1a", one_thread(held, n, reps), n, reps);

  std::vector<double> t;
  for (int r = 0; r < reps; r++) {
    std::atomic<int> arrived{0};
    double start[2], end[2];
    auto body = [&](int me) {
      arrived.fetch_add(1);
      while (arrived.load() < 2) {
      }
      start[me] = now_ns();
      clone_drop(held, n);
      end[me] = now_ns();
    };
    std::thread a(body, 0), b(body, 1);
    a.join();
    b.join();
    t.push_back((std::max(end[0], end[1]) - std::min(start[0], start[1])) /
                double(n));
  }
  report("cpp_shared_ptr", "w1b", median_of(t), n, reps);
  if (held.use_count() != 1) {
    std::fprintf(stderr, "w1_shared_ptr: use_count %ld, not 1\n",
                 held.use_count());
    return 1;
  }
  return 0;
}
