#!/bin/sh
# The layers of src/, bottom to top (docs/development.md, "Layout"): a file uses only its own layer and those
# below. Seven checks, TAP lines, each naming every file and line at fault:
# 1. every source file of src/ lies in a layer folder, and every #include "..." between folders
#    points to its own layer or one below. The public headers (include/npulm.h, npulm_bench.h)
#    may be included from any layer: they declare the types every layer shares (status, error,
#    parameters) and include nothing of src/, so they cannot close a loop;
# 2. no two modules (folders, such as kernels/npu and kernels/cpu) include each other;
# 3. tools/ (the CLI) includes only the public headers (include/: npulm.h, npulm_bench.h) and its
#    own;
# 4. the compiled objects agree: no object of the library calls a function or reads a variable
#    that a higher layer's object defines (an include check cannot see a declaration that sits in
#    a low header while its definition lives above). Objects are looked for next to $NPULM_BIN
#    (BUILD/npulm -> BUILD/src/**/*.o); skipped if absent;
# 5. the compiled program is the contract between the compiler and what runs or reads it
#    (src/program/): backends/, runtime/, analysis/ and export/ include nothing of compiler/ and
#    call nothing its objects define (only the pipeline, which compiles, does);
# 6. no two objects of the library, nor of the CLI, call each other, directly or round a loop (a
#    loop of calls is a circle of files, whichever layer they are in);
# 7. no source file of src/, include/ or tools/ is over 1,200 lines, none of src/compiler/ over
#    800 (a file that long holds more than one job).
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${NPULM_BIN:-build/npulm}
case "$bin" in /*) ;; *) bin="$PWD/$bin" ;; esac
objdir=$(dirname "$bin")/src
COMPILER_FREE="backends runtime analysis export"
LAYERS="base io model ref kernels ir program compiler backends runtime pipeline analysis export"
n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); echo "not ok $n - $1"; }
skip() { n=$((n + 1)); echo "ok $n - $1 # SKIP $2"; }
report() { # $1: description, $2: the faults, one a line
  if [ -z "$2" ]; then ok "$1"; else
    notok "$1"; echo "$2" | sed 's/^/#   /'; fi
}

cd "$root" || exit 1

# "FILE LINE TARGET" for every quoted include of every source file of src/ (paths from src/)
includes=$(find src -name '*.[ch]' -o -name '*.inc' | sort | while read -r f; do
  grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" |
    sed 's/^\([0-9]*\):[^"]*"\([^"]*\)".*/\1 \2/' | sed "s|^|${f#src/} |"
done)

# 1. layer folders and downward includes
faults=$(echo "$includes" | awk -v layers="$LAYERS" '
  BEGIN { n = split(layers, l, " "); for (i = 1; i <= n; i++) rank[l[i]] = i }
  function layer(path) { sub(/\/.*/, "", path); return path }
  NF == 3 {
    f = $1; t = $3; lf = layer($1)
    if (!(lf in rank)) { if (!(f in told)) print "src/" f ": not in a layer folder (" layers ")"; told[f] = 1; next }
    if (t == "npulm.h" || index(t, "/") == 0) next
    lt = layer(t)
    if (!(lt in rank)) print "src/" f ":" $2 ": includes \"" t "\", which is in no layer"
    else if (rank[lt] > rank[lf])
      print "src/" f ":" $2 ": includes \"" t "\": layer " lt " is above " lf
  }'
  grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' include/*.h | grep -v '"npulm.h"' |
    sed 's/^\([^:]*\):\([0-9]*\):.*/\1:\2: a public header includes one of src\/'"'"'s headers/')
report "every include in src/ points to its own layer or one below" "$faults"

# 2. modules that include each other
faults=$(echo "$includes" | awk '
  function module(path) { sub(/\/[^\/]*$/, "", path); return path }
  NF == 3 && index($3, "/") {
    a = module($1); b = module($3)
    if (a != b && !((a, b) in at)) at[a, b] = "src/" $1 ":" $2
  }
  END {
    for (k in at) {
      split(k, p, SUBSEP)
      if (p[1] < p[2] && ((p[2], p[1]) in at))
        print p[1] " and " p[2] " include each other: " at[k] ", " at[p[2], p[1]]
    }
  }' | sort)
report "no two modules include each other" "$faults"

# 3. the CLI uses only the public API
faults=$(for f in tools/*.c tools/*.h; do
  grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" |
    sed 's/^\([0-9]*\):[^"]*"\([^"]*\)".*/\1 \2/' | while read -r line target; do
    [ -e "include/$target" ] || [ -e "tools/$target" ] ||
      echo "$f:$line: includes \"$target\": the CLI uses only the public headers of include/"
  done
done)
report "tools/ includes only the public headers and its own" "$faults"

# 5. (includes) the layers that read programs include nothing of the compiler
faults=$(echo "$includes" | awk -v free="$COMPILER_FREE" '
  BEGIN { n = split(free, l, " "); for (i = 1; i <= n; i++) no[l[i]] = 1 }
  NF == 3 { lf = $1; sub(/\/.*/, "", lf)
    if ((lf in no) && $3 ~ /^compiler\//) print "src/" $1 ":" $2 ": includes \"" $3 "\": " lf " reads programs (program/), not the compiler" }')
report "$COMPILER_FREE include nothing of compiler/" "$faults"

# 7. file sizes
faults=$(find src include tools -name '*.[ch]' -o -name '*.inc' | sort | xargs wc -l | awk '
  $2 != "total" && ($1 > 1200 || ($2 ~ /^src\/compiler\// && $1 > 800)) {
    print $2 ": " $1 " lines (at most " ($2 ~ /^src\/compiler\// ? 800 : 1200) ")" }')
report "no source file over 1,200 lines, none of src/compiler/ over 800" "$faults"

# 4. symbols: each object's undefined symbols against the layer of the object defining them
objs=$(find "$objdir" -name '*.o' 2>/dev/null | sort)
if [ -z "$objs" ] || ! command -v nm >/dev/null 2>&1; then
  for what in "no object calls into a higher layer" "no object of $COMPILER_FREE calls the compiler" \
    "no two objects call each other, directly or round a loop"; do
    skip "$what" "no objects in $objdir or no nm"
  done
  exit 0
fi
# "U FILE SYMBOL" for each symbol an object uses, "D FILE SYMBOL" for each it defines
symbols=$(for o in $objs; do
  rel=${o#"$objdir"/}
  [ -e "src/${rel%.o}.c" ] || continue # left over from a source since moved or removed
  nm "$o" | awk -v f="$rel" '$1 == "U" { print "U", f, $2; next }
                             NF == 3 && $2 ~ /^[TDBRC]$/ { print "D", f, $3 }'
done)
# "USER DEFINER" for each use of a symbol another object of the library defines
calls=$(echo "$symbols" | awk '$1 == "D" { def[$3] = $2; next }
  { use[++u] = $2 " " $3 }
  END { for (i = 1; i <= u; i++) { split(use[i], w, " ")
          if ((w[2] in def) && def[w[2]] != w[1]) print w[1], def[w[2]], w[2] } }' |
  sed 's/\.o / /g; s/\.o$//' | sort -u)
faults=$(echo "$symbols" | awk -v layers="$LAYERS" '
  BEGIN { n = split(layers, l, " "); for (i = 1; i <= n; i++) rank[l[i]] = i }
  function layer(path) { sub(/\/.*/, "", path); return path }
  $1 == "D" { def[$3] = $2; next }
  { use[++u] = $2 " " $3 }
  END {
    for (i = 1; i <= u; i++) {
      split(use[i], w, " ")
      if (!(w[2] in def)) continue
      lu = layer(w[1]); ld = layer(def[w[2]])
      if ((lu in rank) && (ld in rank) && rank[ld] > rank[lu])
        print "src/" w[1] " uses " w[2] " of src/" def[w[2]] ": layer " ld " is above " lu
    }
  }' | sed 's/\.o /.c /; s/\.o:/.c:/; s/\.o$/.c/' | sort)
report "no object calls into a higher layer" "$faults"

# 5. (objects) nor call what the compiler's objects define
faults=$(echo "$calls" | awk -v free="$COMPILER_FREE" '
  BEGIN { n = split(free, l, " "); for (i = 1; i <= n; i++) no[l[i]] = 1 }
  { lu = $1; sub(/\/.*/, "", lu)
    if ((lu in no) && $2 ~ /^compiler\//) print "src/" $1 ".c uses " $3 " of src/" $2 ".c" }')
report "no object of $COMPILER_FREE calls the compiler" "$faults"

# 6. loops of calls between objects, the library's and the CLI's (tools/): tsort names the files
# of each loop it finds
loops() { # loops PREFIX: the loops of the "USER DEFINER" pairs on stdin, files named PREFIX/NAME.c
  sort -u | tsort 2>&1 >/dev/null |
    awk -v at="$1" '/input contains a loop/ { if (loop != "") print loop; loop = "a loop of calls:"; next }
         /^tsort: / { loop = loop " " at "/" $2 ".c" } END { if (loop != "") print loop }'
}
tool_calls=$(for o in "$(dirname "$bin")"/tools/*.o; do
  name=$(basename "$o" .o)
  [ -e "tools/$name.c" ] || continue
  nm "$o" | awk -v f="$name" '$1 == "U" { print "U", f, $2; next }
                              NF == 3 && $2 ~ /^[TDBRC]$/ { print "D", f, $3 }'
done | awk '$1 == "D" { def[$3] = $2; next } { use[++u] = $2 " " $3 }
  END { for (i = 1; i <= u; i++) { split(use[i], w, " ")
          if ((w[2] in def) && def[w[2]] != w[1]) print w[1], def[w[2]] } }')
faults=$(echo "$calls" | awk 'NF == 3 { print $1, $2 }' | loops src
  [ -z "$tool_calls" ] || echo "$tool_calls" | loops tools)
report "no two objects call each other, directly or round a loop" "$faults"
