# The ISA compile flags of the run-time dispatched kernel files, in one place for the main build and
# the fuzz build. They must match the feature sets of src/backend/cpu/dispatch.cpp: files named
# *_avx512.cpp / *_amx.cpp / *_avx2.cpp are only entered after that run-time CPU check. Off x86 nothing is set
# (those files guard their bodies with #if defined(__x86_64__)).
# On aarch64: *_neon.cpp get the baseline (ARMv8-A AdvSIMD needs no flag), *_neon_dot.cpp
# ARMv8.2-A + dotprod, *_neon_i8mm.cpp ARMv8.6-A + dotprod + i8mm + bf16 (the neon, neon_dot and
# neon_i8mm levels of dispatch.h); those files guard their bodies with #if defined(__aarch64__).
function(kimi_set_isa_flags)
  if(CMAKE_SYSTEM_PROCESSOR MATCHES "aarch64|arm64|ARM64")
    foreach(src ${ARGN})
      if(src MATCHES "_neon_dot\\.cpp$")
        set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "-march=armv8.2-a+dotprod")
      elseif(src MATCHES "_neon_i8mm\\.cpp$")
        set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "-march=armv8.6-a+dotprod+i8mm+bf16")
      endif()
    endforeach()
    return()
  endif()
  if(NOT CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|amd64")
    return()
  endif()
  foreach(src ${ARGN})
    if(src MATCHES "_avx512\\.cpp$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS
        "-mavx512f;-mavx512bw;-mavx512dq;-mavx512vl;-mavx512vnni;-mavx512bf16;-mfma;-mf16c;-mavx2;-mbmi2")
    elseif(src MATCHES "_amx\\.cpp$")  # AMX tiles on top of the AVX-512 level (entered after amx::usable())
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS
        "-mavx512f;-mavx512bw;-mavx512dq;-mavx512vl;-mavx512vnni;-mavx512bf16;-mfma;-mf16c;-mavx2;-mbmi2;-mamx-tile;-mamx-bf16;-mamx-int8")
    elseif(src MATCHES "_avx2\\.cpp$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma;-mf16c;-mbmi2")
    endif()
  endforeach()
endfunction()
