# Compiler flags of each x86 kernel family for the shell builds (tests/c/run.sh, tools/fuzz/run.sh),
# sourced by both. Each family's flags extend the previous one's, as in src/kernels/meson.build.
x86_haswell=(-mavx2 -mfma -mf16c)
x86_skylake=("${x86_haswell[@]}" -mavx512f -mavx512cd -mavx512bw -mavx512dq -mavx512vl)
x86_icelake=("${x86_skylake[@]}" -mavx512vnni -mavx512vbmi -mavx512vbmi2 -mavx512bitalg -mavx512vpopcntdq)
x86_sapphireamx=("${x86_icelake[@]}" -mamx-tile -mamx-int8)
