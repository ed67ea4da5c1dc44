# python3 building and dropping object graphs: dicts of small objects, strings, lists and
# tuples (bench/real/python_objects.py). SCALE: units of 20,000 records per round (3 rounds).
source "$(dirname "$0")/common.sh"
case "$verb" in
  check) [[ -n "$python" ]] || { echo "python3 not found (Debian package python3)"; exit 1; } ;;
  setup) ;;
  run) "$python" "$here/python_objects.py" "$scale" ;;
esac
