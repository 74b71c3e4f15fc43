# Alternates `python -m benchmarks ARGS` between this tree and an older one, ROUNDS times, this tree first:
#   mkdir -p /tmp/old && git archive 4b153de datarax benchmarks | tar -x -C /tmp/old
#   ROUNDS=5 bash benchmarks/ab_trees.sh /tmp/old cifar tokens overhead augment_chain --repeats 5
# Each side runs with its own tree first on PYTHONPATH (the venv's editable install comes after).
set -u
old=$(cd "$1" && pwd); shift
new=$(cd "$(dirname "$0")/.." && pwd)
for i in $(seq 1 "${ROUNDS:-2}"); do
  for dir in "$new" "$old"; do
    echo "== $dir round $i $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
    (cd "$dir" && PYTHONPATH="$dir" python -m benchmarks "$@" --no-progress 2>/dev/null)
  done
done
