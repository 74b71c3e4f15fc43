#!/usr/bin/env bash
# One run on a TPU machine, from the repository root: set-up (setup.sh), then each step in turn.
usage() {
  cat <<'EOF'
usage: bash benchmarks/tpu/run.sh STEP [+ STEP ...]

Steps, run in order; each under `timeout $STEP_S` (default 540 s), its output in $OUT/NN-NAME.log:
  tests [all|operators|rest]  the TPU test command of docs/tpu.md in one process, with a persistent
                              compilation cache in /tmp (cold it needs about 11 minutes: on a fresh
                              machine run `tests operators + tests rest`, then `tests` reads the cache)
  pytest ARGS...              JAX_PLATFORMS=tpu,cpu python -m pytest -p no:xdist ARGS
  bench ARGS...               python -m benchmarks ARGS; rows appended to $OUT/results/<machine>.jsonl
  probe NAME [ARGS...]        python benchmarks/tpu/NAME.py ARGS, rows appended as for bench; NAME is
                              probe, userfn_probe, dispatch_k, decode_probe, decode_workers,
                              decode_profile, decode_threads, decode_ceiling, rrc_probe
                              or layout_probe
  recipe NAME [ARGS...]       python -m recipes.NAME ARGS, e.g. recipe vision --seeds 1 --workdir /tmp/vision

Environment:
  OUT        where logs and results go (default ./tpu-out; the lent machine sets it)
  STEP_S     each step's time limit in seconds (default 540)
  EXTRA_PIP  packages to install beside setup.sh's, e.g. tensorflow-cpu for the tf.data rows
  COMMIT     the commit the machine's copy was made from, for the results rows where it has no .git
  DRY=1      print each step's command and run nothing (no set-up)

Example: COMMIT=$(git rev-parse HEAD) bash benchmarks/tpu/run.sh tests rest + bench cifar --scale 0.25 --repeats 2
EOF
}

set -u
if [ $# -eq 0 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
  usage
  exit 0
fi
OUT=${OUT:-$PWD/tpu-out}
mkdir -p "$OUT/results"
PY=python3
if [ -z "${DRY:-}" ]; then
  # shellcheck disable=SC1091
  . benchmarks/tpu/setup.sh
fi
RESULTS=(env "DATARAX_BENCH_RESULTS=$OUT/results" "DATARAX_BENCH_COMMIT=${COMMIT:-}")
# Tests never add rows (tests/conftest.py turns recording off when nothing names a folder).
TESTS=(env -u DATARAX_BENCH_RESULTS JAX_PLATFORMS=tpu,cpu DATARAX_TEST_JAX_CACHE=/tmp/datarax-tpu-test-cache)
PYTEST=("$PY" -m pytest -p no:xdist -p no:cacheprovider -q -rfE --tb=short --durations=40)
REST=(tests/core tests/pipeline tests/control/test_device_copies.py tests/train/loop/test_fused.py)
PROBES=" probe userfn_probe dispatch_k decode_probe decode_workers decode_profile decode_threads decode_ceiling rrc_probe layout_probe "

# Sets `cmd` (the step's command line) and `name` (its log's name) from one step's words.
plan() {
  local what=$1
  shift
  case $what in
    tests)
      name="tests-${1:-all}"
      case ${1:-all} in
        all) cmd=("${TESTS[@]}" "${PYTEST[@]}" tests/operators "${REST[@]}") ;;
        operators) cmd=("${TESTS[@]}" "${PYTEST[@]}" tests/operators) ;;
        rest) cmd=("${TESTS[@]}" "${PYTEST[@]}" "${REST[@]}") ;;
        *) echo "run.sh: tests takes all, operators or rest, got '$1'" >&2; return 1 ;;
      esac ;;
    pytest) name=pytest; cmd=("${TESTS[@]}" "${PYTEST[@]}" "$@") ;;
    bench) name="bench-${1:-all}"; cmd=("${RESULTS[@]}" "$PY" -m benchmarks --no-progress "$@") ;;
    probe)
      if [ $# -eq 0 ] || [[ $PROBES != *" $1 "* ]]; then
        echo "run.sh: probe takes one of$PROBES(benchmarks/tpu/NAME.py), got '${1:-}'" >&2
        return 1
      fi
      name="probe-$1"; cmd=("${RESULTS[@]}" "$PY" "benchmarks/tpu/$1.py" "${@:2}") ;;
    recipe) name="recipe-${1:-}"; cmd=("$PY" -m "recipes.${1:?run.sh: recipe takes a NAME}" "${@:2}") ;;
    *) echo "run.sh: unknown step '$what'; choose tests, pytest, bench, probe or recipe (--help)" >&2; return 1 ;;
  esac
}

# Check every step before running any: a typo must not cost the machine's time.
steps=()
current=()
for word in "$@" +; do
  if [ "$word" = + ]; then
    [ ${#current[@]} -gt 0 ] && steps+=("${current[*]@Q}")
    current=()
  else
    current+=("$word")
  fi
done
for step in "${steps[@]}"; do
  eval "plan $step" || exit 2
done

n=0
status=0
for step in "${steps[@]}"; do
  n=$((n + 1))
  eval "plan $step"
  log=$(printf "%s/%02d-%s.log" "$OUT" "$n" "$name")
  echo "== $(date -u +%H:%M:%S) step $n: ${cmd[*]}"
  [ -n "${DRY:-}" ] && continue
  start=$(date +%s)
  timeout "${STEP_S:-540}" "${cmd[@]}" > "$log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=$rc
  echo "   rc $rc in $(( $(date +%s) - start )) s; the log's end ($log):"
  grep -v -i -E "hugepage|warnings.warn" "$log" | tail -n 15 | cut -c1-300
done
if [ -z "${DRY:-}" ]; then
  echo "== results: $(cat "$OUT"/results/*.jsonl 2>/dev/null | wc -l) rows in $OUT/results/;" \
    "append them to benchmarks/results/ in the checkout to keep them"
fi
exit $status
