# sqlite3 running one large transaction: insert rows made by a recursive query, index them,
# aggregate, update a third and delete a fifth, in a file database (its page cache is heap
# memory). SCALE: units of 50,000 rows.
source "$(dirname "$0")/common.sh"
case "$verb" in
  check) need sqlite3 sqlite3 ;;
  setup) ;;
  run) sqlite3 "$dir/bench.db" >&2 <<SQL
PRAGMA cache_size = -200000;
BEGIN;
CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, grp INTEGER, payload BLOB);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT $((50000 * scale)))
  INSERT INTO t SELECT x, 'name-' || hex(randomblob(8)), x % 1000, randomblob(50 + x % 200) FROM c;
CREATE INDEX t_name ON t(name);
CREATE INDEX t_grp ON t(grp, id);
SELECT grp, count(*), sum(length(payload)) FROM t GROUP BY grp ORDER BY 3 DESC LIMIT 3;
UPDATE t SET name = name || '-x' WHERE id % 3 = 0;
DELETE FROM t WHERE id % 5 = 0;
SELECT count(*) FROM t;
COMMIT;
SQL
  ;;
esac
