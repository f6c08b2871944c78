// Windows only (see ../../posix_shim.h): read-only file mappings for util/mmap.cpp.
#pragma once
#include <stddef.h>
#include <sys/types.h>
#ifdef __cplusplus
extern "C" {
#endif
#define PROT_READ 1
#define MAP_SHARED 1
#define MAP_PRIVATE 2
#define MAP_FAILED ((void*)-1)
#define MADV_WILLNEED 3
#define MADV_DONTNEED 4
void* mmap(void* addr, size_t len, int prot, int flags, int fd, long long off);  // PROT_READ, whole file from 0
int munmap(void* addr, size_t len);
int madvise(void* addr, size_t len, int advice);  // WILLNEED: PrefetchVirtualMemory; DONTNEED: nothing
#ifdef __cplusplus
}
#endif
