// Windows only (see ../../posix_shim.h): getrusage(RUSAGE_SELF) from GetProcessTimes and the peak
// working set.
#pragma once
#include <sys/time.h>
#ifdef __cplusplus
extern "C" {
#endif
#define RUSAGE_SELF 0
struct rusage {
  struct timeval ru_utime, ru_stime;
  long ru_maxrss;  // KiB, as on Linux
};
int getrusage(int who, struct rusage* ru);
#ifdef __cplusplus
}
#endif
