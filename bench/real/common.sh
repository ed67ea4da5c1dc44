# Shared by the real family's scripts (sourced, not run): argument checks and the one-line
# "missing" message of `check`. See bench/programs/real.c for the verbs.
set -euo pipefail
verb=${1:-}; dir=${2:-}; scale=${3:-1}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
case "$verb" in check|setup|run) ;; *) echo "usage: $0 check|setup|run DIR SCALE" >&2; exit 2 ;; esac
[[ "$scale" =~ ^[1-9][0-9]*$ ]] || { echo "$0: SCALE must be a positive integer, got '$scale'" >&2; exit 2; }
# need CMD PACKAGE: in `check`, fails with the reason when CMD is missing.
need() { command -v "$1" >/dev/null 2>&1 || { echo "$1 not found (Debian package $2; tools/deps.sh bench installs it)"; exit 1; }; }
# Debian's python3 when there is one (what the issue measured), else the first on PATH.
python=$(command -v /usr/bin/python3 || command -v python3 || true)
