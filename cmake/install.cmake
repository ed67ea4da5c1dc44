# Install rules: what `make install` / `cmake --install <build>` put under the prefix, and the
# uninstall target (cmake/uninstall.cmake). Paths follow GNUInstallDirs, relative to the prefix
# given at install time (`--prefix`, default CMAKE_INSTALL_PREFIX, /usr/local), under $DESTDIR:
#   lib/libqmalloc.so.MAJOR.MINOR.PATCH (soname libqmalloc.so.MAJOR) + the two symlinks,
#   lib/libqmalloc.a, include/qmalloc.h + qmalloc_version.h, lib/pkgconfig/qmalloc.pc,
#   lib/cmake/qmalloc/ (find_package: qmalloc::qmalloc, qmalloc::qmalloc-static),
#   share/man/man3/qmalloc.3 (generated from docs/ by tools/gen_manpage.py), bin/qmalloc,
#   bin/qmalloc-profile.
#   The hardened build (docs/hardening.md): lib/libqmalloc-hardened.so.* and its links, and
#   lib/pkgconfig/qmalloc-hardened.pc (qmalloc::qmalloc-hardened in the CMake package).
# Every installed file is relocatable: the .pc, the CMake package and the launcher locate the
# rest relative to themselves, so `--prefix` at install time may differ from the configured one.
# It builds nothing of the library; it only describes targets defined in CMakeLists.txt.
# Included at the end of CMakeLists.txt; checked end to end by tests/install.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(QM_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/qmalloc)

# qm_install_library(TARGET): installs one library target of CMakeLists.txt into the CMake package
# as qmalloc::<TARGET with '-' for '_'>. A shared library also gets the version and soname and
# its own pkg-config file, named after its output name (libqmalloc-x.so: qmalloc-x.pc); a static
# one carries its thread-library dependency for static consumers.
function(qm_install_library target)
  string(REPLACE "_" "-" export_name ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${export_name})
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "SHARED_LIBRARY")
    set_target_properties(${target} PROPERTIES VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR})
    get_target_property(QM_PC_LIBNAME ${target} OUTPUT_NAME)
    if(NOT QM_PC_LIBNAME)
      set(QM_PC_LIBNAME ${target})
    endif()
    # ${pcfiledir} is where pkg-config found the file: the prefix is relative to it.
    file(RELATIVE_PATH QM_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
    string(REGEX REPLACE "/$" "" QM_PC_TO_PREFIX "${QM_PC_TO_PREFIX}")
    configure_file(${PROJECT_SOURCE_DIR}/cmake/qmalloc.pc.in ${PROJECT_BINARY_DIR}/pkgconfig/${QM_PC_LIBNAME}.pc @ONLY)
    install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/${QM_PC_LIBNAME}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
  else()
    target_link_libraries(${target} INTERFACE Threads::Threads)
  endif()
  install(TARGETS ${target} EXPORT qmallocTargets
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endfunction()

# ---- the libraries: one line each -------------------------------------------------------------
qm_install_library(qmalloc)
qm_install_library(qmalloc_static)
qm_install_library(qmalloc_hardened)

# ---- header, CMake package ----------------------------------------------------------------------
install(FILES ${PROJECT_SOURCE_DIR}/include/qmalloc.h ${PROJECT_BINARY_DIR}/include/qmalloc_version.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT qmallocTargets NAMESPACE qmalloc:: DESTINATION ${QM_INSTALL_CMAKEDIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/qmallocConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/qmallocConfig.cmake INSTALL_DESTINATION ${QM_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/qmallocConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cmake/qmallocConfig.cmake ${PROJECT_BINARY_DIR}/cmake/qmallocConfigVersion.cmake
  DESTINATION ${QM_INSTALL_CMAKEDIR})

# ---- man page qmalloc(3): generated at build time from docs/, never written by hand --------------
find_package(Python3 REQUIRED COMPONENTS Interpreter)
set(QM_MANPAGE ${PROJECT_BINARY_DIR}/man/qmalloc.3)
add_custom_command(OUTPUT ${QM_MANPAGE}
  COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/gen_manpage.py --version ${PROJECT_VERSION}
          --source ${PROJECT_SOURCE_DIR} --output ${QM_MANPAGE}
  DEPENDS ${PROJECT_SOURCE_DIR}/tools/gen_manpage.py ${PROJECT_SOURCE_DIR}/include/qmalloc.h
          ${PROJECT_SOURCE_DIR}/docs/options.md ${PROJECT_SOURCE_DIR}/docs/stats.md ${PROJECT_SOURCE_DIR}/docs/errors.md
  COMMENT "Generating qmalloc.3 from docs/")
add_custom_target(qmalloc_manpage ALL DEPENDS ${QM_MANPAGE})
install(FILES ${QM_MANPAGE} DESTINATION ${CMAKE_INSTALL_MANDIR}/man3)

# ---- the launcher: tools/qmalloc, told where the library is relative to bin/ --------------------
file(RELATIVE_PATH QM_BIN_TO_LIB /prefix/${CMAKE_INSTALL_BINDIR} /prefix/${CMAKE_INSTALL_LIBDIR})
file(READ ${PROJECT_SOURCE_DIR}/tools/qmalloc QM_LAUNCHER)
string(REPLACE "@QM_INSTALLED_LIB@" "${QM_BIN_TO_LIB}/libqmalloc.so.${PROJECT_VERSION_MAJOR}" QM_LAUNCHER "${QM_LAUNCHER}")
# Written only when it changes (configure_file COPYONLY): a re-configure while the tests run must
# not truncate a launcher another test is copying.
file(WRITE ${PROJECT_BINARY_DIR}/launcher/qmalloc.new "${QM_LAUNCHER}")
configure_file(${PROJECT_BINARY_DIR}/launcher/qmalloc.new ${PROJECT_BINARY_DIR}/launcher/qmalloc COPYONLY)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tools/qmalloc)
install(PROGRAMS ${PROJECT_BINARY_DIR}/launcher/qmalloc DESTINATION ${CMAKE_INSTALL_BINDIR})
# The launcher's --profile runs this, from beside it.
install(PROGRAMS ${PROJECT_SOURCE_DIR}/tools/qmalloc-profile DESTINATION ${CMAKE_INSTALL_BINDIR})

# ---- the loader's cache: a library in /usr/local/lib is found at run time only once ldconfig has
# seen it. Run it for a real install (no DESTDIR: a staged tree is the packager's business), as
# Debian's packages do in their postinst; where it cannot run (not root), say so.
install(CODE [[
  if("$ENV{DESTDIR}" STREQUAL "")
    execute_process(COMMAND ldconfig RESULT_VARIABLE qm_rc OUTPUT_QUIET ERROR_QUIET)
    if(NOT qm_rc EQUAL 0)
      message(STATUS "ldconfig did not run (${qm_rc}): outside the loader's default paths, link with -Wl,-rpath")
    endif()
  endif()
]])

# ---- uninstall: removes what the rules above install for the same prefix -------------------------
add_custom_target(uninstall
  COMMAND ${CMAKE_COMMAND} -DQM_BUILD=${PROJECT_BINARY_DIR} -DQM_PREFIX=${CMAKE_INSTALL_PREFIX}
          -P ${PROJECT_SOURCE_DIR}/cmake/uninstall.cmake)

# ---- the test: tests/install/test_X.sh is CTest's install-X -------------------------------------
file(GLOB QM_INSTALL_TESTS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/install/test_*.sh)
foreach(src ${QM_INSTALL_TESTS})
  get_filename_component(name ${src} NAME_WE)
  string(REPLACE "test_" "" short ${name})
  add_test(NAME install-${short} COMMAND bash ${src})
  set_tests_properties(install-${short} PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77 ENVIRONMENT
    "QM_SOURCE_DIR=${PROJECT_SOURCE_DIR};QM_BUILD_DIR=${PROJECT_BINARY_DIR};QM_VERSION=${PROJECT_VERSION}")
endforeach()
