/* real.c - the `real` family's launcher: runs one real program (python3, perl, gcc, git, redis,
 * sqlite3) on a workload that bench/real/PROGRAM.sh generates, under whatever allocator
 * LD_PRELOAD names, and reports its wall time and the peak RSS of its process tree.
 *
 * Each bench/real/PROGRAM.sh answers three verbs: `check` (exit 0 when its tools are installed,
 * otherwise one line saying what is missing), `setup DIR SCALE` (generates the inputs in DIR;
 * not timed, and run without LD_PRELOAD so that no allocator's setup work is counted) and
 * `run DIR SCALE` (the measured work, with LD_PRELOAD as given). A program whose tools are
 * missing prints a RESULT line with skipped=REASON and no figures, so a run of the whole family
 * goes on (tools/deps.sh bench installs them on Debian).
 *
 * Peak RSS of the tree: the measured command runs under a meter process forked from this one
 * after setup, so the meter's RUSAGE_CHILDREN covers the measured tree alone. Linux reports there
 * the largest ru_maxrss of any process of the tree (each process's own peak, not the sum of
 * processes alive together): for gcc that is cc1, for git the biggest of its helpers. A process
 * started by exec keeps the peak of the image it replaced, which here is at most the meter's own
 * (a few MiB), far below any program measured. */
#define _GNU_SOURCE
#include "bench_common.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROG "real"

#ifndef REAL_DIR
#error "REAL_DIR (the folder of the programs' scripts) must be defined by the build"
#endif

static const char *opt_program = NULL;
static uint64_t opt_scale = 1;

typedef struct {
  struct rusage ru; /* of the measured tree */
  int status;       /* wait status of the script */
} meter_report_t;

/* Runs the script with a verb; with `without_preload`, in a child whose environment lacks LD_PRELOAD. */
static pid_t spawn(const char *script, const char *verb, const char *dir, bool without_preload, int out_fd) {
  char scale[32];
  snprintf(scale, sizeof scale, "%llu", (unsigned long long)opt_scale);
  pid_t pid = fork();
  if (pid < 0) bench_die(PROG, "fork failed: %s", strerror(errno));
  if (pid == 0) {
    if (without_preload) unsetenv("LD_PRELOAD");
    if (out_fd >= 0) dup2(out_fd, STDOUT_FILENO); /* the script's chatter stays off our stdout */
    execl("/bin/bash", "bash", script, verb, dir, scale, (char *)NULL);
    fprintf(stderr, "%s: cannot run /bin/bash: %s\n", PROG, strerror(errno));
    _exit(127);
  }
  return pid;
}

static int wait_for(pid_t pid) {
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) bench_die(PROG, "waitpid failed: %s", strerror(errno));
  return status;
}

static void remove_tree(const char *dir) {
  pid_t pid = fork();
  if (pid == 0) {
    unsetenv("LD_PRELOAD");
    execl("/bin/rm", "rm", "-rf", dir, (char *)NULL);
    _exit(127);
  }
  if (pid > 0) wait_for(pid);
}

static void list_programs(char *out, size_t size) {
  out[0] = 0;
  DIR *d = opendir(REAL_DIR);
  if (!d) return;
  for (struct dirent *e; (e = readdir(d));) {
    size_t n = strlen(e->d_name);
    if (n > 3 && !strcmp(e->d_name + n - 3, ".sh") && strcmp(e->d_name, "common.sh") && strlen(out) + n < size - 2)
      snprintf(out + strlen(out), size - strlen(out), "%s%.*s", out[0] ? ", " : "", (int)(n - 3), e->d_name);
  }
  closedir(d);
}

int main(int argc, char **argv) {
  const opt_t opts[] = {
    {"scale", OPT_U64, &opt_scale, 1, 1000000, "size of the workload (each script says what one unit is)"},
    {"program", OPT_STR, &opt_program, 0, 0, "which program: a script bench/real/NAME.sh"},
    {NULL, 0, NULL, 0, 0, NULL},
  };
  bench_parse(PROG, "Real programs (python3, perl, gcc, git, redis, sqlite3) on generated workloads: time and peak RSS.",
              opts, argc, argv);
  char script[4096], names[1024];
  list_programs(names, sizeof names);
  if (!opt_program) bench_usage_error(PROG, "--program is required (one of: %s)", names);
  snprintf(script, sizeof script, "%s/%s.sh", REAL_DIR, opt_program);
  if (!strcmp(opt_program, "common") || access(script, R_OK) != 0) bench_usage_error(PROG, "unknown program '%s' (one of: %s)", opt_program, names);

  /* check: its one line of output is the reason when the tools are missing. */
  int pipe_fd[2];
  if (pipe(pipe_fd)) bench_die(PROG, "pipe failed");
  pid_t pid = spawn(script, "check", "-", true, pipe_fd[1]);
  close(pipe_fd[1]);
  char reason[512] = "";
  ssize_t got = read(pipe_fd[0], reason, sizeof reason - 1);
  close(pipe_fd[0]);
  reason[got > 0 ? got : 0] = 0;
  reason[strcspn(reason, "\n")] = 0;
  int status = wait_for(pid);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "%s: %s skipped: %s\n", PROG, opt_program, reason[0] ? reason : "its check failed");
    result_begin(PROG);
    result_str("program", opt_program);
    result_u64("scale", opt_scale);
    result_str("skipped", reason[0] ? reason : "check_failed");
    result_end();
    return 0;
  }

  const char *tmp = getenv("TMPDIR");
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/mtbench-real-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) bench_die(PROG, "cannot create a work folder in %s: %s", tmp && *tmp ? tmp : "/tmp", strerror(errno));

  status = wait_for(spawn(script, "setup", dir, true, STDERR_FILENO));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    remove_tree(dir);
    bench_die(PROG, "%s setup failed (exit status %d)", opt_program, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }

  /* The measured run, under the meter (see the top of the file). */
  if (pipe(pipe_fd)) bench_die(PROG, "pipe failed");
  double start = now_s();
  pid_t meter = fork();
  if (meter < 0) bench_die(PROG, "fork failed: %s", strerror(errno));
  if (meter == 0) {
    close(pipe_fd[0]);
    meter_report_t rep;
    rep.status = wait_for(spawn(script, "run", dir, false, STDERR_FILENO));
    getrusage(RUSAGE_CHILDREN, &rep.ru);
    _exit(write(pipe_fd[1], &rep, sizeof rep) == (ssize_t)sizeof rep ? 0 : 1);
  }
  close(pipe_fd[1]);
  meter_report_t rep;
  got = read(pipe_fd[0], &rep, sizeof rep);
  close(pipe_fd[0]);
  int meter_status = wait_for(meter);
  double elapsed = now_s() - start;
  remove_tree(dir);
  if (got != (ssize_t)sizeof rep || !WIFEXITED(meter_status) || WEXITSTATUS(meter_status) != 0)
    bench_die(PROG, "%s: the meter process failed", opt_program);
  if (WIFSIGNALED(rep.status))
    bench_die(PROG, "%s run killed by signal %d", opt_program, WTERMSIG(rep.status));
  if (WEXITSTATUS(rep.status) != 0)
    bench_die(PROG, "%s run failed (exit status %d)", opt_program, WEXITSTATUS(rep.status));

  result_begin(PROG);
  result_str("program", opt_program);
  result_u64("scale", opt_scale);
  result_f("elapsed_s", elapsed);
  result_f("run_user_s", rep.ru.ru_utime.tv_sec + rep.ru.ru_utime.tv_usec / 1e6);
  result_f("run_sys_s", rep.ru.ru_stime.tv_sec + rep.ru.ru_stime.tv_usec / 1e6);
  result_u64("run_minflt", (uint64_t)rep.ru.ru_minflt);
  result_u64("tree_peak_rss_kb", (uint64_t)rep.ru.ru_maxrss);
  result_end();
  return 0;
}
