# family_flags NAME: print the compiler flags of kernel family NAME, one per line, from
# src/kernels/family_flags.txt, read as src/kernels/meson.build reads it (blank and '#' lines skipped;
# a word naming another family stands for that family's flags). Sourced by tests/c/run.sh,
# tests/c/run_arm.sh and tools/fuzz/run.sh.
declare -A family_flags_of
family_flags_file="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../src/kernels" && pwd)/family_flags.txt"
while read -r family_name family_words; do
    [[ -z "$family_name" || "$family_name" == \#* ]] || family_flags_of[$family_name]="$family_words"
done <"$family_flags_file"
family_flags() {
    local word
    [[ -v "family_flags_of[$1]" ]] || { echo "no family $1 in $family_flags_file" >&2; return 1; }
    for word in ${family_flags_of[$1]}; do
        if [[ -v "family_flags_of[$word]" ]]; then family_flags "$word"; else printf '%s\n' "$word"; fi
    done
}
