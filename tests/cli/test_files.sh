#!/bin/sh
# Files npulm writes and reads: a program file is written whole or not at all (a killed or failing
# compile leaves the old file as it was and no temporary), never onto the model it reads (nor any
# file of an export), and every byte of it is checksummed (`npulm verify` names the damaged part; loading refuses it).
# Prints TAP lines.
. "$(dirname "$0")/tap.sh"
require_model files

# only the expected files in a folder: no temporary left behind
only_files() { # only_files DIR NAME...
  dir=$1; shift
  [ "$(ls -A "$dir" | sort | tr '\n' ' ')" = "$(printf '%s\n' "$@" | sort | tr '\n' ' ')" ]
}

out=$tmp/out.d
mkdir "$out"
old=$tmp/old.npu
"$bin" compile -m "$model" -o "$old" --ctx 64 2>/dev/null
cp "$old" "$out/m.npu"

# compile onto its own input: refused before anything is written, the input untouched
cp "$model" "$out/m.gguf"
fails "compile: -o the input GGUF itself" "model's own file" "$bin" compile -m "$out/m.gguf" -o "$out/m.gguf"
check "compile: the input GGUF is untouched" cmp -s "$model" "$out/m.gguf"
fails "compile: -o the input program itself" "model's own file" "$bin" compile -m "$out/m.npu" -o "$out/m.npu"
check "compile: the input program is untouched" cmp -s "$old" "$out/m.npu"
ln -s m.npu "$out/link.npu"
fails "compile: -o a link to the input" "model's own file" "$bin" compile -m "$out/m.npu" -o "$out/link.npu"
# export onto its input: the model, the encodings or the external data file beside -o; each
# refused before anything is written, the input untouched
fails "export: -o the input program itself" "model's own file" "$bin" export -m "$out/m.npu" -o "$out/m.npu"
check "export: the input program is untouched" cmp -s "$old" "$out/m.npu"
fails "export: -o the input GGUF itself" "model's own file" "$bin" export -m "$out/m.gguf" -o "$out/m.gguf"
check "export: the input GGUF is untouched" cmp -s "$model" "$out/m.gguf"
ln -s m.npu "$out/x.encodings.json"
fails "export: encodings onto the input (a link to it)" "'.*x.encodings.json' is the model's own file" \
  "$bin" export -m "$out/m.npu" -o "$out/x.onnx"
ln "$out/m.npu" "$out/y.onnx.data"
fails "export: the data file onto the input (a hard link)" "'.*y.onnx.data' is the model's own file" \
  "$bin" export -m "$out/m.npu" -o "$out/y.onnx" --external-data
check "export: the input program is still untouched" cmp -s "$old" "$out/m.npu"
rm "$out/link.npu" "$out/m.gguf" "$out/x.encodings.json" "$out/y.onnx.data"

# an output that cannot be a file: said at once, before the model is compiled
quick() { # quick SECONDS COMMAND...: the command fails within SECONDS
  limit=$1; shift
  start=$(date +%s)
  "$@" 2>/dev/null && return 1
  [ $(($(date +%s) - start)) -le "$limit" ]
}
fails "compile: -o a directory" "'$tmp': it names a directory" "$bin" compile -m "$model" -o "$tmp"
fails "compile: -o ''" "no output path given" "$bin" compile -m "$model" -o ''
fails "export: -o a directory" "it names a directory" "$bin" export -m "$model" -o "$tmp/"
check "compile: -o a directory is refused before the compile (stories27M, 2 s)" \
  quick 2 "$bin" compile -m "$shared/models/stories27M.gguf" -o "$tmp"

# killed in the middle of writing: the file size limit stops the process with SIGXFSZ once the
# output passes ~0.5 MB (of 1.7 MB), as a kill at that moment would
killed() { (ulimit -c 0; ulimit -f 1000; exec "$bin" compile -m "$model" -o "$out/m.npu") 2>/dev/null; }
killed_midway() { killed; [ $? -ge 128 ]; }
check "compile: killed midway (SIGXFSZ)" killed_midway
check "compile: killed midway leaves the old file as it was" cmp -s "$old" "$out/m.npu"
check "compile: killed midway leaves no temporary file" only_files "$out" m.npu
killed_new() { (ulimit -c 0; ulimit -f 1000; exec "$bin" compile -m "$model" -o "$out/new.npu") 2>/dev/null; [ $? -ge 128 ]; }
check "compile: killed midway writing a new file" killed_new
check "compile: ... leaves no file at all" only_files "$out" m.npu

# a write that fails (the limit's signal ignored: write() says EFBIG, as a full disk says ENOSPC)
full() { (trap '' XFSZ; ulimit -f 1000; exec "$bin" compile -m "$model" -o "$out/m.npu"); }
fails "compile: a failing write is one error naming the file" "cannot write '.*m.npu'" full
check "compile: a failing write leaves the old file as it was" cmp -s "$old" "$out/m.npu"
check "compile: a failing write leaves no temporary file" only_files "$out" m.npu

# a complete compile replaces the file
replaced() { "$bin" compile -m "$model" -o "$out/m.npu" 2>/dev/null && ! cmp -s "$old" "$out/m.npu" &&
  only_files "$out" m.npu && "$bin" run -m "$out/m.npu" -p "Once" -n 4 --temp 0 >/dev/null 2>&1; }
check "compile: a finished compile replaces the file" replaced

# a kill between naming the complete temporary and renaming it leaves NAME.tmp.PID.N: the next
# write of NAME removes those of processes that are gone, not a live one's nor another target's
stale() {
  dead=$(sh -c 'echo $$')
  kept="m.npu.tmp.$$.0 other.npu.tmp.$dead.0 m.npu.tmp.$dead.x m.npu.tmp.+$dead.0 m.npu.tmp.0$dead.0"
  for f in m.npu.tmp.$dead.0 m.npu.tmp.$dead.7 $kept; do cp "$old" "$out/$f"; done
  # shellcheck disable=SC2086 # the names are words
  "$bin" compile -m "$model" -o "$out/m.npu" 2>/dev/null && only_files "$out" m.npu $kept &&
    (cd "$out" && rm $kept)
}
check "compile: removes the temporaries dead writers left beside the target" stale

# checksums: every damaged part is named, and a damaged file does not load
sound() { "$bin" verify "$old" | grep -q "sound: .* XXH3-64 checksums"; }
check "verify: a sound program" sound
flip() { # flip SRC DST OFFSET: copy SRC to DST with byte OFFSET inverted
  cp "$1" "$2"
  byte=$(od -An -tu1 -j "$3" -N1 "$1" | tr -d ' ')
  printf "\\$(printf '%03o' $((255 - byte)))" | dd of="$2" bs=1 seek="$3" conv=notrunc 2>/dev/null
}
size=$(wc -c <"$old")
flip "$old" "$tmp/last.npu" $((size - 1))
fails "verify: the last byte flipped" "damaged: 1 of" "$bin" verify "$tmp/last.npu"
verify_names() { "$bin" verify "$tmp/last.npu" | grep -q "^damaged: tensor '.*', bytes [0-9]*-$size: its checksum"; }
check "verify: names the damaged tensor and its bytes" verify_names
fails "run: the last byte flipped" "damaged: the checksum of tensor" "$bin" run -m "$tmp/last.npu" -p x
flip "$old" "$tmp/head.npu" 200
fails "run: a header byte flipped" "damaged: the checksum of the header" "$bin" run -m "$tmp/head.npu" -p x
flip "$tmp/last.npu" "$tmp/two.npu" $((size / 2))
two_named() { "$bin" verify "$tmp/two.npu" >"$tmp/two.out"; [ $? -eq 1 ] && [ "$(grep -c '^damaged: ' "$tmp/two.out")" -eq 2 ]; }
check "verify: lists every damaged part" two_named
cp "$old" "$tmp/long.npu"
printf 'x' >>"$tmp/long.npu"
fails "run: a byte appended" "bytes appended" "$bin" run -m "$tmp/long.npu" -p x
fails "verify: a GGUF model is not a program" "not a program file" "$bin" verify "$model"
fails "verify: missing file" "cannot open" "$bin" verify "$tmp/nope.npu"
echo "1..$n"
