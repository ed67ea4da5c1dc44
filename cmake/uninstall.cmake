# `make uninstall` / `cmake --build <build> --target uninstall`: removes from $DESTDIR<prefix> every
# file that installing <build> there would write, and then the directories only qmalloc uses
# (lib/cmake/qmalloc) once empty. The list comes from a trial install into a scratch directory, not
# from install_manifest.txt, so it is right for any prefix, whatever was installed last. Shared
# directories (bin, lib, include, share/man/man3) stay, even when empty.
# usage: cmake -DQM_BUILD=<build dir> -DQM_PREFIX=<prefix> -P cmake/uninstall.cmake  (DESTDIR from the environment)
if(NOT QM_BUILD OR NOT QM_PREFIX)
  message(FATAL_ERROR "uninstall.cmake: usage: cmake -DQM_BUILD=<build dir> -DQM_PREFIX=<prefix> -P uninstall.cmake")
endif()
if(NOT IS_ABSOLUTE "${QM_PREFIX}")
  message(FATAL_ERROR "uninstall: the prefix must be an absolute path, not '${QM_PREFIX}'")
endif()
if(NOT EXISTS "${QM_BUILD}/cmake_install.cmake")
  message(FATAL_ERROR "uninstall: ${QM_BUILD} is not a configured build directory (run make first)")
endif()

set(stage "${QM_BUILD}/uninstall-stage")
file(REMOVE_RECURSE "${stage}")
execute_process(COMMAND ${CMAKE_COMMAND} -E env DESTDIR=${stage} ${CMAKE_COMMAND} --install ${QM_BUILD} --prefix ${QM_PREFIX}
  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "uninstall: could not list the installed files (trial install failed): ${err}")
endif()

set(destdir "$ENV{DESTDIR}")
file(GLOB_RECURSE files LIST_DIRECTORIES false RELATIVE "${stage}" "${stage}/*")
set(removed 0)
foreach(f ${files})
  set(path "${destdir}/${f}")
  if(EXISTS "${path}" OR IS_SYMLINK "${path}")
    message(STATUS "Removing: ${path}")
    file(REMOVE "${path}")
    math(EXPR removed "${removed} + 1")
  endif()
endforeach()

# Directories named after qmalloc are ours: remove them once empty, deepest first.
file(GLOB_RECURSE dirs LIST_DIRECTORIES true RELATIVE "${stage}" "${stage}/*")
list(SORT dirs ORDER DESCENDING)
foreach(d ${dirs})
  get_filename_component(leaf "${d}" NAME)
  if(IS_DIRECTORY "${stage}/${d}" AND leaf MATCHES "qmalloc" AND IS_DIRECTORY "${destdir}/${d}")
    file(GLOB left "${destdir}/${d}/*")
    if(NOT left)
      message(STATUS "Removing: ${destdir}/${d}/")
      file(REMOVE_RECURSE "${destdir}/${d}")
    endif()
  endif()
endforeach()
file(REMOVE_RECURSE "${stage}")
if(destdir STREQUAL "")
  execute_process(COMMAND ldconfig OUTPUT_QUIET ERROR_QUIET) # forget the removed library (best effort)
endif()
message(STATUS "uninstall: removed ${removed} files from ${destdir}${QM_PREFIX}")
