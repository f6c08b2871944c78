# Cross build for 64-bit ARM Linux with Debian's cross compiler (g++-aarch64-linux-gnu).
# Tests run under qemu-user: CMAKE_CROSSCOMPILING_EMULATOR makes ctest (and gtest discovery) start
# each test binary as `qemu-aarch64 -L /usr/aarch64-linux-gnu BINARY`; the CPU model is chosen with
# the environment variable QEMU_CPU (scripts/cross-test.sh). Libraries Debian has no cross package
# for come from scripts/cross-deps.sh (KIMI_CROSS_PREFIX).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(KIMI_SYSROOT /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH ${KIMI_SYSROOT} ${KIMI_CROSS_PREFIX})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;${KIMI_SYSROOT})
