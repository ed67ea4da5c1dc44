// The C++ counterpart of consumer.c (same builds, same checks): operator new[] and the standard
// containers must allocate from qmalloc (qm_malloc_usable_size stops the program on a block from
// any other allocator), and qm_version() must equal the header's QM_VERSION. Prints one line
// "consumer++: qmalloc VERSION, new int[1000] usable N" and exits 0, or exits 1.
#include <qmalloc.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

int main() {
  if (std::strcmp(qm_version(), QM_VERSION) != 0) {
    std::printf("consumer++: qm_version() %s but QM_VERSION %s\n", qm_version(), QM_VERSION);
    return 1;
  }
  int *array = new int[1000];
  std::vector<std::string> words(100, std::string(100, 'x'));
  size_t usable = qm_malloc_usable_size(array);
  size_t vector_usable = qm_malloc_usable_size(words.data());
  delete[] array;
  if (usable < 1000 * sizeof(int) || vector_usable < 100 * sizeof(std::string)) {
    std::printf("consumer++: usable sizes %zu and %zu are too small\n", usable, vector_usable);
    return 1;
  }
  std::printf("consumer++: qmalloc %s, new int[1000] usable %zu\n", qm_version(), usable);
  return 0;
}
