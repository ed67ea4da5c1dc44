# The version, declared once in CMakeLists.txt's project(VERSION), made visible to C: configures
# cmake/qmalloc_version.h.in into <build>/include/qmalloc_version.h (QMALLOC_VERSION_MAJOR/MINOR/
# PATCH, QM_VERSION), which include/qmalloc.h includes and install.cmake installs next to it.
# The same PROJECT_VERSION gives the soname and qmalloc.pc (cmake/install.cmake).
# Included by CMakeLists.txt right after project(), before any target, so that every target of
# this directory finds the generated header (include_directories, not a per-target list).
configure_file(${CMAKE_CURRENT_LIST_DIR}/qmalloc_version.h.in ${CMAKE_BINARY_DIR}/include/qmalloc_version.h @ONLY)
include_directories(${CMAKE_BINARY_DIR}/include)
