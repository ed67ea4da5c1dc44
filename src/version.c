/* version: qm_version(), the version of the library a program runs with, so that a program (or
 * the install test) can tell at run time which qmalloc it got; the header's QMALLOC_VERSION_*
 * macros say which one it was compiled against. The number is written once, in CMakeLists.txt's
 * project(VERSION), and reaches this file through the generated qmalloc_version.h. Nothing else
 * lives here. Callers: applications. */
#include "config.h"
#include "qmalloc.h"

QM_EXPORT const char *qm_version(void) { return QM_VERSION; }
