# family_flags NAME: print the compiler flags of kernel family NAME, one per line, from
# src/kernels/family_flags.txt, read as src/kernels/meson.build reads it (a word naming an earlier
# family stands for that family's flags). Sourced by tests/c/run.sh, tests/c/run_arm.sh and
# tools/fuzz/run.sh.
family_flags_file="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../src/kernels" && pwd)/family_flags.txt"
family_flags() {
    local line word
    line="$(grep -E "^$1( |$)" "$family_flags_file")" || { echo "no family $1 in $family_flags_file" >&2; return 1; }
    for word in ${line#"$1"}; do
        if grep -qE "^$word( |$)" "$family_flags_file"; then family_flags "$word"; else printf '%s\n' "$word"; fi
    done
}
