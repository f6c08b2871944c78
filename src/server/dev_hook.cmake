# Development only: `cmake -DCMAKE_PROJECT_INCLUDE=src/server/dev_hook.cmake` includes server.cmake
# at the end of the top directory without editing CMakeLists.txt.
cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL include ${CMAKE_SOURCE_DIR}/src/server/server.cmake)
