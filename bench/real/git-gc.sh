# git gc --aggressive then git fsck on a repository made at setup (git fast-import of a
# generated history: files edited commit after commit, so packing finds deltas).
# SCALE: units of 300 commits. Peak RSS is that of the largest git process (pack-objects).
source "$(dirname "$0")/common.sh"
case "$verb" in
  check) need git git ;;
  setup) git init -q "$dir/repo"
         awk -v n=$((300 * scale)) 'BEGIN {
           for (c = 1; c <= n; c++) {
             printf "commit refs/heads/main\ncommitter bench <bench@example.invalid> %d +0000\n", 1000000000 + c
             msg = "commit " c; printf "data %d\n%s\n", length(msg), msg
             for (f = 0; f < 4; f++) {
               body = ""
               for (l = 0; l < 40; l++) body = body sprintf("file %d line %d value %d\n", (c * 4 + f) % 50, l, (l == c % 40) ? c : l * 31)
               printf "M 644 inline dir%d/file%d.txt\ndata %d\n%s\n", f % 5, (c * 4 + f) % 50, length(body), body
             }
           }
         }' | (cd "$dir/repo" && git fast-import --quiet) ;;
  run) cd "$dir/repo" && git gc --aggressive --quiet && git fsck --no-progress >&2 ;;
esac
