"""mtbench: runs the seed papers' allocator benchmarks under any LD_PRELOAD-able allocator and
reports tables and plots. The C programs live in bench/programs (built into build/bench); this
package only plans runs, executes them, stores raw data and renders reports from stored data.
Importing it must not import matplotlib: the program checks use the system python."""

__version__ = "1.0"
