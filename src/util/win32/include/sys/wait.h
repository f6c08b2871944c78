// Windows only (see ../../posix_shim.h): _pclose / system return the exit code itself.
#pragma once
#define WIFEXITED(st) 1
#define WEXITSTATUS(st) (st)
#define WIFSIGNALED(st) 0
#define WTERMSIG(st) 0
