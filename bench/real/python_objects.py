"""Workload of bench/real/python-objects.sh: what object-heavy Python code does to its
allocator. Each round builds an index of records (a dict of small class instances holding
strings, tuples and lists), sorts and groups it, serializes part of it, then drops it all.
Prints a checksum so that the work cannot be skipped; argument: the scale (20,000 records per
unit)."""
import json
import sys


class Record:
    __slots__ = ("key", "name", "tags", "score", "parent")

    def __init__(self, key, name, tags, score, parent):
        self.key, self.name, self.tags, self.score, self.parent = key, name, tags, score, parent


def round_of(n, seed):
    index = {}
    prev = None
    for i in range(n):
        k = (i * 2654435761 + seed) % (1 << 32)
        rec = Record(k, f"item-{k:x}-{i}", [f"t{k % 7}", f"t{k % 11}"], (k % 1000) / 7.0, prev)
        index[rec.name] = rec
        if i % 3 == 0:
            prev = rec
    groups = {}
    for rec in index.values():
        groups.setdefault(rec.tags[0], []).append((rec.score, rec.key))
    total = 0
    for tag, items in groups.items():
        items.sort()
        total += len(tag) + int(items[len(items) // 2][0])
    dump = json.dumps([{"k": r.key, "n": r.name, "t": r.tags} for r in list(index.values())[: n // 10]])
    total += len(json.loads(dump))
    words = " ".join(r.name for r in list(index.values())[: n // 5]).split("-")
    total += len(set(words))
    return total


def main():
    scale = int(sys.argv[1])
    checksum = 0
    for r in range(3):
        checksum += round_of(20_000 * scale, r)
    print("checksum", checksum)


main()
