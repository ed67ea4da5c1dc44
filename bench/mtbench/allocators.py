"""Which allocators a run uses and how each is loaded: 'system' (no preload), 'qmalloc' (this
repository's build/libqmalloc.so, skipped with a note until it is built), the peers Debian
packages (found through ldconfig's cache, then the usual library folders), and any
name=/path/lib.so given by the user. Runs of the repository's qmalloc (and only those: not a
user's .so, even another qmalloc build) also get QMALLOC_STATS=2, so qmalloc prints its own
statistics at exit for the report (qmstats.py). Every preloaded library is proven loadable before a run
starts, by preloading it into a trivial program and finding it in that program's memory map:
LD_PRELOAD of a bad path only prints a warning and runs the program on the system allocator,
which would silently mislabel every figure."""

from dataclasses import dataclass, field
import glob
import hashlib
import os
import re
import subprocess

from . import qmstats

# name -> library file names, most preferred first
PEERS = {
    "jemalloc": ["libjemalloc.so.2", "libjemalloc.so"],
    "tcmalloc": ["libtcmalloc_minimal.so.4", "libtcmalloc.so.4", "libtcmalloc_minimal.so", "libtcmalloc.so"],
    "mimalloc": ["libmimalloc.so.2", "libmimalloc.so"],
}
LIBRARY_DIRS = ["/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"]
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


class AllocatorError(Exception):
    """A user-facing, one-line problem with an allocator (missing file, not preloadable, unknown name)."""


@dataclass
class Allocator:
    name: str
    path: str = None      # None: the system allocator, no preload
    version: str = ""
    origin: str = ""      # "system", "this repository", "installed", "command line"
    extra_env: dict = field(default_factory=dict)   # set in the child's environment besides LD_PRELOAD

    def env(self, base=None, extra_env=None):
        """The child's environment: base (os.environ), this allocator's preload, and extra_env
        (this allocator's own variables unless a run narrows them, runner.Job.extra_env)."""
        env = dict(os.environ if base is None else base)
        env.pop("LD_PRELOAD", None)
        if self.path:
            env["LD_PRELOAD"] = self.path
        env.update(self.extra_env if extra_env is None else extra_env)
        return env

    def to_json(self):
        return {"name": self.name, "path": self.path, "realpath": os.path.realpath(self.path) if self.path else None,
                "version": self.version, "origin": self.origin, "env": dict(self.extra_env)}


def glibc_version():
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") or "unknown"
    except (ValueError, OSError):
        return "unknown"


def _ldconfig_paths():
    """soname -> path from the dynamic linker's cache (empty if ldconfig is unavailable)."""
    paths = {}
    for ldconfig in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        try:
            out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        for line in out.splitlines():
            m = re.match(r"\s*(\S+) \((.*)\) => (\S+)", line)
            if m and (os.uname().machine != "x86_64" or "x86-64" in m.group(2)):
                paths.setdefault(m.group(1), m.group(3))
        if paths:
            break
    return paths


def find_peer(name, ldcache=None):
    """Path of an installed peer allocator, or None."""
    ldcache = _ldconfig_paths() if ldcache is None else ldcache
    for soname in PEERS[name]:
        for d in LIBRARY_DIRS:
            p = os.path.join(d, soname)
            if os.path.exists(p):
                return p
        if soname in ldcache and os.path.exists(ldcache[soname]):
            return ldcache[soname]
    return None


def package_version(path):
    """'package version' of the Debian package that owns the file, else a short content hash."""
    real = os.path.realpath(path)
    for candidate in (path, real):
        try:
            owner = subprocess.run(["dpkg-query", "-S", candidate], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            break
        if owner.returncode == 0 and ":" in owner.stdout:
            pkg = owner.stdout.split(": ", 1)[0].split(",")[0].strip()
            ver = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True, timeout=20)
            if ver.returncode == 0:
                return f"{pkg} {ver.stdout.strip()}"
    try:
        with open(real, "rb") as f:
            return "sha256:" + hashlib.sha256(f.read()).hexdigest()[:12]
    except OSError:
        return "unknown"


def git_version(repo_root):
    try:
        out = subprocess.run(["git", "-C", repo_root, "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=20)
        return ("git " + out.stdout.strip()) if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def qmalloc_path(repo_root, build_dir=None):
    return os.path.join(build_dir or os.path.join(repo_root, "build"), "libqmalloc.so")


_ENV_ITEM = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def parse_spec(spec):
    """'name=/path/lib.so[,VAR=value...]' -> (name, path, {VAR: value}); the variables go into the
    child's environment (the same library with an option set, side by side with its default).
    A malformed spec is an AllocatorError."""
    name, sep, rest = spec.partition("=")
    parts = rest.split(",")
    path, env = parts[0], {}
    for item in parts[1:]:
        m = _ENV_ITEM.match(item)
        if not m or m.group(1) == "LD_PRELOAD":
            raise AllocatorError(f"--alloc: '{item}' in '{spec}' is not VAR=value (LD_PRELOAD excepted)")
        env[m.group(1)] = m.group(2)
    if not sep or not name or not path:
        raise AllocatorError(f"--alloc expects name=/path/lib.so[,VAR=value...], got '{spec}'")
    if not _NAME.match(name):
        raise AllocatorError(f"--alloc: allocator name '{name}' may use only letters, digits and _.+-")
    return name, path, env


def check_loadable(alloc):
    """Raises AllocatorError unless the library exists and really gets preloaded into a program."""
    if not alloc.path:
        return
    if not os.path.exists(alloc.path):
        raise AllocatorError(f"allocator '{alloc.name}': {alloc.path}: no such file")
    if not os.path.isfile(os.path.realpath(alloc.path)):
        raise AllocatorError(f"allocator '{alloc.name}': {alloc.path}: not a regular file")
    try:
        probe = subprocess.run(["cat", "/proc/self/maps"], env=alloc.env(), capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        raise AllocatorError(f"allocator '{alloc.name}': {alloc.path}: a trivial program hung with it preloaded")
    real = os.path.realpath(alloc.path)
    mapped = any(line.split()[-1] == real for line in probe.stdout.splitlines() if len(line.split()) >= 6)
    if probe.returncode != 0 or not mapped:
        why = probe.stderr.strip().splitlines()[0] if probe.stderr.strip() else (
            f"exit status {probe.returncode}" if probe.returncode else "it was not mapped")
        raise AllocatorError(f"allocator '{alloc.name}': {alloc.path} cannot be preloaded: {why}")


def resolve(names, extra_specs, repo_root, build_dir=None):
    """The allocators to run, in order, plus notes on any that were skipped.

    names: list of requested names, or None for every one found; extra_specs: ['name=/path', ...].
    Raises AllocatorError for anything the user asked for that cannot be used (qmalloc excepted:
    it is skipped with a note until the library has been built)."""
    notes = []
    ldcache = _ldconfig_paths()
    known = ["system", "qmalloc"] + list(PEERS)
    extra = [parse_spec(s) for s in extra_specs]
    extra_names = [n for n, _, _ in extra]
    extra_path = {n: p for n, p, _ in extra}
    extra_env = {n: e for n, _, e in extra}
    if len(set(extra_names)) != len(extra_names):
        raise AllocatorError("--alloc: the same name is given twice")
    if names is None:
        wanted = known + extra_names
        explicit = False
    else:
        wanted = list(dict.fromkeys(names))
        explicit = True
        for n in extra_names:
            if n not in wanted:
                wanted.append(n)
    for n in extra_names:
        if n in known:
            raise AllocatorError(f"--alloc: '{n}' is a built-in allocator name; pick another name for {extra_path[n]}")
    result = []
    for name in wanted:
        if name == "system":
            result.append(Allocator("system", None, glibc_version(), "system"))
        elif name == "qmalloc":
            path = qmalloc_path(repo_root, build_dir)
            if os.path.exists(path):
                result.append(Allocator("qmalloc", path, git_version(repo_root), "this repository",
                                        dict(qmstats.STATS_ENV)))
            else:
                notes.append(f"qmalloc skipped: {path} does not exist (build it with `make`)")
        elif name in PEERS:
            path = find_peer(name, ldcache)
            if path:
                result.append(Allocator(name, path, package_version(path), "installed"))
            elif explicit:
                raise AllocatorError(f"allocator '{name}' is not installed (looked for {', '.join(PEERS[name])}; "
                                     "tools/deps.sh bench installs it)")
            else:
                notes.append(f"{name} skipped: not installed")
        elif name in extra_names:
            result.append(Allocator(name, os.path.abspath(extra_path[name]), "", "command line", extra_env[name]))
        else:
            raise AllocatorError(f"unknown allocator '{name}' (known: {', '.join(known)}; "
                                 "add others with --alloc name=/path/lib.so)")
    for alloc in result:
        check_loadable(alloc)
        if alloc.origin == "command line":
            alloc.version = package_version(alloc.path)
    if not result:
        raise AllocatorError("no allocator to run")
    return result, notes
