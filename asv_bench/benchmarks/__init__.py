"""airspeed velocity benchmarks of numkong (see asv_bench/asv.conf.json)."""
