#!/bin/sh
# The documentation against the program it describes. TAP lines, each failure naming the page,
# the line and what is wrong:
# - README.md starts with its two commands (the build and run, then make test) and stays a
#   user's first screen: under 200 lines;
# - each command page (docs/CMD.md, titled "# `npulm CMD` ...") lists under "## Options" exactly
#   the options `npulm CMD --help` prints, and every option its text names in backticks is one of
#   CMD's (or --help), of a command named on the same line (`npulm OTHER`, or `OTHER` in
#   backticks, alone or first), or on a line naming another tool (llama-*, a converter), that
#   tool's;
# - every command of `npulm --help` has its page;
# - every relative link of README.md and docs/*.md reaches a file, and a #fragment a heading of
#   it (GitHub's anchors: lower case, punctuation dropped, spaces to hyphens).
. "$(dirname "$0")/tap.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1

report() { # report NAME FAULTS: ok when FAULTS is empty, else each fault a '#' line
  n=$((n + 1))
  if [ -z "$2" ]; then echo "ok $n - $1"; else
    echo "not ok $n - $1"; echo "$2" | sed 's/^/#   /'; fi
}

# The options of a help text on stdin: on each line that starts with blanks and a dash, the
# option names before the description (which starts after two blanks), one a line, sorted.
options_of() {
  awk '/^[[:space:]]+-/ {
         sub(/^[[:space:]]+/, ""); names = $0; sub(/   *.*/, "", names)
         while (match(names, /(^|[ ,|\[])--?[A-Za-z0-9][A-Za-z0-9-]*/)) {
           o = substr(names, RSTART, RLENGTH); sub(/^[ ,|\[]/, "", o); print o
           names = substr(names, RSTART + RLENGTH)
         } }' | sort -u
}

# The lines of a page's "## Options" code block.
options_block() {
  awk '/^## / { in_opts = ($0 == "## Options") } in_opts && /^```/ { inside = !inside; next }
       in_opts && inside' "$1"
}

commands=$("$bin" --help | awk '/^commands:/ { on = 1; next } on && /^[[:space:]]+[a-z]/ { print $1 }
                                 on && /^$/ { exit }')

faults=$(head -6 README.md | awk 'NR == 1 && !/^# / { print "README.md:1: not a title" }
  /^```sh$/ { code = 1; next } code && /^```$/ { code = 0; done = 1 }
  code { line[++k] = $0 }
  END { if (k != 2 || line[1] !~ /make/ || line[2] != "make test")
          print "README.md: the first code block is not the two commands (build and run; make test)" }')
lines=$(wc -l <README.md)
[ "$lines" -lt 200 ] || faults="$faults${faults:+
}README.md: $lines lines (under 200)"
report "README.md starts with its two commands and is under 200 lines" "$faults"

missing=""
for c in $commands; do
  [ "$c" = version ] && continue # a word, no options: `npulm --version` in docs/library.md
  [ -f "docs/$c.md" ] || missing="$missing${missing:+
}docs/$c.md: no page for npulm $c"
done
report "every command of npulm --help has its page" "$missing"

for page in docs/*.md; do
  cmd=$(sed -n '1s/^# `npulm \([a-z]*\)`.*/\1/p' "$page")
  [ -n "$cmd" ] || continue
  "$bin" "$cmd" --help 2>&1 | options_of >"$tmp/help"
  options_block "$page" | options_of >"$tmp/doc"
  faults=$(comm -13 "$tmp/doc" "$tmp/help" | sed "s|^|$page: --help has |; s|$|, the page's Options do not|"
    comm -23 "$tmp/doc" "$tmp/help" | sed "s|^|$page: the page's Options have |; s|$|, --help does not|")
  [ -s "$tmp/help" ] || faults="npulm $cmd --help lists no options"
  report "$page: its Options are npulm $cmd --help's" "$faults"

  # options in the prose (outside code blocks), in backticks
  faults=$(awk '/^```/ { code = !code; next } !code { print FNR "\t" $0 }' "$page" |
    while IFS='	' read -r ln text; do
      opts=$(printf '%s\n' "$text" | grep -o '`[^`]*`' | grep -o -- '--[a-z][a-z0-9_-]*' | sort -u)
      [ -n "$opts" ] || continue
      # a line that names another tool (llama.cpp's, a vendor's converter) may quote its options
      printf '%s\n' "$text" | grep -q 'llama-[a-z]\|converter' && continue
      others=$(printf '%s\n' "$text" | grep -o 'npulm [a-z]*\|`[a-z]*[` ]' | sed 's/npulm //; s/[` ]//g' | sort -u)
      for o in $opts; do
        [ "$o" = --help ] && continue # every command's
        grep -qx -- "$o" "$tmp/help" && continue
        found=""
        for x in $others; do
          printf '%s\n' "$commands" | grep -qx "$x" || continue
          "$bin" "$x" --help 2>&1 | options_of | grep -qx -- "$o" && found=$x && break
        done
        [ -n "$found" ] || echo "$page:$ln: $o is not an option of npulm $cmd${others:+ (nor of a command the line names)}"
      done
    done)
  report "$page: every option its text names is npulm $cmd's" "$faults"
done

# links: [text](target) with a relative target
slug() { # a heading as GitHub anchors it
  tr 'A-Z' 'a-z' | sed 's/^#* *//; s/[^a-z0-9 _-]//g; s/ /-/g'
}
faults=$(for page in README.md docs/*.md; do
  dir=$(dirname "$page")
  grep -n -o '\](\([^)]*\))' "$page" | sed 's/^\([0-9]*\):](\(.*\))$/\1 \2/' |
    while read -r ln target; do
      case $target in http*|mailto:*) continue ;; esac
      file=${target%%#*}
      frag=""
      case $target in *'#'*) frag=${target#*#} ;; esac
      if [ -z "$file" ]; then path=$page; else path=$dir/$file; fi
      if [ ! -e "$path" ]; then echo "$page:$ln: $target: no such file"; continue; fi
      [ -n "$frag" ] || continue
      case $path in *.md) ;; *) continue ;; esac
      grep '^#' "$path" | slug | grep -qx -- "$frag" || echo "$page:$ln: $target: no such heading"
    done
done)
report "every relative link of README.md and docs/ reaches a file and a heading" "$faults"
echo "1..$n"
