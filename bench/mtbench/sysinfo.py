"""What machine a result set came from, stored with the raw data so results stay interpretable:
CPU model, core counts, memory, kernel, glibc, python, and the repository's commit."""

import os
import platform
import subprocess

from .allocators import glibc_version
from .benchmarks import cpu_count


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_kb():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _git_commit(repo_root):
    try:
        out = subprocess.run(["git", "-C", repo_root, "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip() if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def collect(repo_root):
    return {
        "cpu_model": _cpu_model(),
        "cpus_online": os.cpu_count(),
        "cpus_usable": cpu_count(),
        "mem_total_kb": _mem_total_kb(),
        "kernel": platform.release(),
        "os": platform.platform(),
        "glibc": glibc_version(),
        "python": platform.python_version(),
        "repo_commit": _git_commit(repo_root),
    }
