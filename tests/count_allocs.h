// Counts the operator new calls of the test binary whose one .cpp includes this header (the
// no-allocation tests: read g_allocs before and after the loop under test). Replacing the global
// operator new/delete pair is done once per program, so a binary includes it in one file only.
#pragma once
#include <atomic>
#include <cstdlib>
#include <new>

// GCC cannot see that these replacements pair malloc with free on purpose.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
static std::atomic<long> g_allocs{0};
void* operator new(size_t n) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
