// prof_deep.cc - a C++ program for the heap profiler under LD_PRELOAD (tests/preload/test_prof.sh):
// four threads at once, each 100 calls deep (deeper than the 64 frames a sample keeps), keep what
// keep_deep allocates there with operator new (std::vector's buffers): 64 blocks of 64 KiB per
// thread, 16 MiB in all, never freed, so the leak profile at exit must put them all in keep_deep.
// Meanwhile each thread allocates and frees as much again one call deep (churn), which must not
// appear in the leak profile. Built with -O1 -g and no frame pointers, as Debian's binaries are.
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

constexpr int kThreads = 4, kBlocks = 64, kDepth = 100;
constexpr size_t kBlockBytes = 64 << 10;

std::vector<std::vector<char> *> kept[kThreads];

__attribute__((noinline)) void keep_deep(int t) {
  for (int i = 0; i < kBlocks; i++) kept[t].push_back(new std::vector<char>(kBlockBytes, char(i)));
}

// The volatile access after the call keeps each frame (no tail call), so the stack is kDepth deep.
__attribute__((noinline)) void descend(int depth, int t) {
  static volatile int sink;
  if (depth == 0) keep_deep(t);
  else descend(depth - 1, t);
  sink = sink + 1;
}

__attribute__((noinline)) void churn(int t) {
  for (int i = 0; i < kBlocks; i++) {
    std::vector<char> v(kBlockBytes, char(t));
    if (v[kBlockBytes - 1] != char(t)) std::abort();
  }
}

}  // namespace

int main() {
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; t++)
    threads.emplace_back([t] {
      churn(t);
      descend(kDepth, t);
    });
  for (auto &th : threads) th.join();
  size_t blocks = 0;
  for (auto &k : kept) blocks += k.size();
  std::printf("kept %zu blocks of %zu bytes\n", blocks, kBlockBytes);
  return blocks == size_t(kThreads) * kBlocks ? 0 : 1;
}
