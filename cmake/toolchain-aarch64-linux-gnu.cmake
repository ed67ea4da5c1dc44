# Cross-compiling qmalloc for 64-bit Arm Linux with Debian's cross compiler
# (gcc-aarch64-linux-gnu, g++-aarch64-linux-gnu, libc6-dev-arm64-cross).
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64-linux-gnu.cmake
# Tests of such a build run under qemu-user: CTest puts CMAKE_CROSSCOMPILING_EMULATOR in front of
# every test whose command is one of our executables (tests/cross/run.sh drives it end to end).
# It only selects the compilers and the target's libraries; the build flags are CMakeLists.txt's.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(QM_CROSS_TRIPLE aarch64-linux-gnu)
set(CMAKE_C_COMPILER ${QM_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${QM_CROSS_TRIPLE}-g++)

# Debian's multiarch-less cross layout: headers and libraries of the target under one root.
set(QM_CROSS_SYSROOT /usr/${QM_CROSS_TRIPLE} CACHE PATH "Root of the aarch64 libraries (qemu's -L)")
set(CMAKE_FIND_ROOT_PATH ${QM_CROSS_SYSROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)   # build tools (python3, nm) are the host's
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# qemu-aarch64 finds the target's dynamic loader and libc under -L (its other settings, e.g.
# QEMU_PAGESIZE, come from the environment of the test run).
# -cpu: without SVE, which qemu emulates element by element (glibc's string functions use it).
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -cpu max,sve=off -L ${QM_CROSS_SYSROOT})
