"""Allocation-heavy Python workload for tests/preload/test_programs.sh (run with PYTHONMALLOC=malloc
so every object goes through malloc): dicts, lists, strings and bytes, a few hundred MB allocated
and dropped over the rounds, some of it from threads. Each result is compared with a closed-form
value computed without the data structures; prints "churn: OK" and whether libqmalloc is mapped
into this process (from /proc/self/maps); exits 1 on a wrong result."""
import sys
import threading

ROUNDS = 12
N = 100_000


def one_round(r):
    d = {f"key-{i}-{r}": [i] * (i % 20) for i in range(N)}
    total = sum(len(v) for v in d.values())
    s = "".join(str(i) for i in range(2 * N))
    parts = s.split("9")
    b = bytearray(s.encode()) * 3
    return total, len(s), len(parts) - 1, len(b)


def expected():
    per_dict = (N // 20) * sum(range(20))
    digits = sum(len(str(i)) for i in range(2 * N))  # plain integers, no big containers
    nines = sum(str(i).count("9") for i in range(2 * N))
    return per_dict, digits, nines, 3 * digits


def threaded(results, k):
    chunks = [bytes([k]) * (i % 4096) for i in range(20_000)]
    words = {str(i): str(i) * 3 for i in range(20_000)}
    results[k] = sum(map(len, chunks)) + sum(len(v) for v in words.values())


def main():
    want = expected()
    for r in range(ROUNDS):
        got = one_round(r)
        if got != want:
            print(f"churn: round {r}: got {got}, expected {want}")
            return 1
    results = [0] * 4
    threads = [threading.Thread(target=threaded, args=(results, k)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    want_t = sum(i % 4096 for i in range(20_000)) + sum(3 * len(str(i)) for i in range(20_000))
    if results != [want_t] * 4:
        print(f"churn: threads got {results}, expected {want_t} each")
        return 1
    with open("/proc/self/maps") as f:
        mapped = any("libqmalloc" in line for line in f)
    print("churn: OK")
    print("maps: libqmalloc " + ("mapped" if mapped else "NOT mapped"))
    return 0


sys.exit(main())
