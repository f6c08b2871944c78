# The ISA compile flags of the run-time dispatched kernel files, in one place for the main build and
# the fuzz build. They must match the feature sets of src/backend/cpu/dispatch.cpp: files named
# *_avx512.cpp / *_avx2.cpp are only entered after that run-time CPU check. Off x86 nothing is set
# (those files guard their bodies with #if defined(__x86_64__)).
function(kimi_set_isa_flags)
  if(NOT CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|amd64")
    return()
  endif()
  foreach(src ${ARGN})
    if(src MATCHES "_avx512\\.cpp$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS
        "-mavx512f;-mavx512bw;-mavx512dq;-mavx512vl;-mavx512vnni;-mavx512bf16;-mfma;-mf16c;-mavx2;-mbmi2")
    elseif(src MATCHES "_avx2\\.cpp$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma;-mf16c;-mbmi2")
    endif()
  endforeach()
endfunction()
