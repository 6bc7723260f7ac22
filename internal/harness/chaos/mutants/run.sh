#!/usr/bin/env bash
# Mutation test of the chaos harness: each *.patch here is a deliberate bug
# (its first line says which). For each, the tree as committed plus the
# patch is built in a scratch copy and the harness runs the given seeds
# (default 1 2 3; MUTANT_SEEDS="1 2 3 4 5 6 7 8 9 10" for the 9-of-10 rule) on
# the single-server variant (MUTANT_VARIANT=cluster for the other). A
# mutant named goredis-* runs the harness on go-redis (the goredis test
# package of internal/harness), where its code path is.
# A mutant is caught by a seed when the test binary exits non-zero: a
# violation, a failure, a panic, or goroutines left over (goleak).
#
#   internal/harness/chaos/mutants/run.sh              # every mutant
#   internal/harness/chaos/mutants/run.sh do-swallow   # some, by name
#
# Needs redis-server on PATH, as the harness does. Prints one line per
# mutant: caught by how many seeds, and exits non-zero if one escaped every
# seed.
set -euo pipefail
top=$(git rev-parse --show-toplevel)
here="$top/internal/harness/chaos/mutants"
seeds=${MUTANT_SEEDS:-"1 2 3"}
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for p in "$here"/*.patch; do names+=("$(basename "$p" .patch)"); done
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
escaped=0
for name in "${names[@]}"; do
  tree="$scratch/$name"
  mkdir -p "$tree"
  (cd "$top" && git ls-files -z | tar --null -T - -cf -) | tar -xf - -C "$tree"
  if ! patch -s -d "$tree" -p1 < "$here/$name.patch"; then
    echo "$name: patch does not apply"; escaped=1; continue
  fi
  pkg=chaos
  case $name in goredis-*) pkg=goredis ;; esac
  (cd "$tree/internal/harness" && go test -c -o "$scratch/$name.test" ./$pkg) || { echo "$name: does not build"; escaped=1; continue; }
  caught=0 total=0 how=""
  for s in $seeds; do
    total=$((total + 1))
    # Caught is decided on the exit status, not on the output: goleak
    # (redistest.Main) reports leaked goroutines after the tests printed
    # PASS, and then exits non-zero.
    status=0
    out=$(cd "$tree/internal/harness/$pkg" && SLUICE_REQUIRE_REDIS=1 SLUICE_CHAOS_SEED=$s "$scratch/$name.test" -test.run "TestChaos/${MUTANT_VARIANT:-single}$" -test.count=1 2>&1) || status=$?
    if [ "$status" -ne 0 ]; then
      caught=$((caught + 1))
      [ -n "$how" ] || how=$(grep -m1 -E '^\s+at [0-9.]+s: ' <<<"$out" | sed 's/^ *//' | cut -c1-160 || true)
      [ -n "$how" ] || how=$(grep -m1 -E 'panic|FAIL|goleak' <<<"$out" | cut -c1-160 || true)
      [ -n "$how" ] || how="exit status $status"
    fi
  done
  echo "$name: caught by $caught of $total seeds${how:+ (first: $how)}"
  [ "$caught" -gt 0 ] || escaped=1
  rm -rf "$tree" "$scratch/$name.test"
done
exit $escaped
