// Per-thread state with a destructor (scratch vectors, PCRE2 match data): kimi::per_thread<T, Tag>() is
// the calling thread's T, made on first use and destroyed when that thread ends.
//
// Not a plain `thread_local T`: MinGW-w64's GCC keeps thread_local objects in emulated TLS, whose storage
// is freed at thread exit before the objects' destructors run — a use after free (a vector's destructor
// frees a clobbered pointer; kimi.exe serve crashed on shutdown in the pre-tokenizer's match state). On
// Windows the object lives on the heap behind a pthread key whose destructor deletes it; elsewhere it is a
// function-local thread_local. Tag tells apart two per-thread objects of one type (any type, complete or
// not). A thread_local of a trivially destructible type (a pointer, a number) needs none of this.
#pragma once

#if defined(_WIN32)
#include <pthread.h>

#include <cstdlib>
#endif

namespace kimi {

template <class T, class Tag>
T& per_thread() {
#if defined(_WIN32)
  static const pthread_key_t key = [] {
    pthread_key_t k{};
    if (pthread_key_create(&k, [](void* p) { delete static_cast<T*>(p); }) != 0) std::abort();
    return k;
  }();
  auto* v = static_cast<T*>(pthread_getspecific(key));
  if (!v) {
    v = new T();
    pthread_setspecific(key, v);
  }
  return *v;
#else
  thread_local T v;
  return v;
#endif
}

}  // namespace kimi
