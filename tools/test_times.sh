#!/usr/bin/env bash
# Each test binary's seconds in a `cargo test` run, read from its output (cargo's "Running"
# and "Doc-tests" lines and libtest's "finished in" of each binary), slowest first, then their
# sum:
#
#   cargo test --release 2>&1 | tee test.log; tools/test_times.sh test.log
#
# A binary that failed still has its time; one that crashed before its result line has none.
set -euo pipefail
log=${1:?usage: tools/test_times.sh LOG (the output of cargo test, stderr included)}
rows=$(awk '
    /^ *Running / { name = $2; if (name == "unittests") name = $3 }
    /^ *Doc-tests / { name = "doc-tests " $2 }
    /^test result: / && match($0, /finished in [0-9.]+s/) {
        printf "%10.1f s  %s\n", substr($0, RSTART + 12, RLENGTH - 13), name
    }
' "$log" | sort -rn)
printf '%s\n' "$rows"
awk '{ sum += $1 } END { printf "%10.1f s  (sum of %d binaries)\n", sum, NR }' <<<"$rows"
