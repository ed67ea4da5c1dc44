# gcc -O2 compiling one large generated C file (functions with switches, loops, structs and
# string tables: enough for the compiler's own data structures to grow to hundreds of MiB).
# SCALE: units of 40 functions. Peak RSS is that of cc1, the largest process of the tree.
source "$(dirname "$0")/common.sh"
case "$verb" in
  check) need gcc gcc ;;
  setup) awk -v n=$((40 * scale)) 'BEGIN {
      print "#include <string.h>\nstruct rec { int a; long b; double c; const char *s; };"
      for (i = 0; i < n; i++) {
        printf "static const char *names_%d[] = {\"a%d\", \"bb%d\", \"ccc%d\", \"dddd%d\"};\n", i, i, i, i, i
        printf "long f_%d(struct rec *r, int k, long acc) {\n  for (int j = 0; j < k; j++) {\n", i
        printf "    switch ((j + %d) %% 6) {\n", i
        for (c = 0; c < 6; c++) printf "    case %d: acc += r[j].a * %d + (long)strlen(names_%d[%d]); r[j].c += acc * 0.%d; break;\n", c, c + i, i, c % 4, c + 1
        printf "    }\n    if (acc > %d) acc ^= r[j].b;\n  }\n  return acc%s;\n}\n", 1000 + i, i ? sprintf(" + f_%d(r, k - 1, acc)", i - 1) : ""
      }
    }' > "$dir/big.c" ;;
  run) gcc -O2 -c "$dir/big.c" -o "$dir/big.o" ;;
esac
