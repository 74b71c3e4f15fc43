set -u
. benchmarks/tpu/setup.sh
date -u
echo "== vision"; timeout 170 python3 -m recipes.vision --seeds 1 --workdir /tmp/vision > $OUT/vision.log 2>&1; echo "rc $?"
grep -v Warn $OUT/vision.log | tail -25 | cut -c1-400
for d in /tmp/vision/*/; do n=$(basename $d); cp $d/goodput.json $OUT/goodput-$n.json 2>/dev/null; done
python3 - <<'PY'
import json, glob
for f in sorted(glob.glob("/tmp/vision/*/goodput.json")):
    r = json.load(open(f)); s = r.get("steady", {})
    print(f, "steady goodput_pct", s.get("goodput_pct"), "step_time_s", s.get("step_time_s"), "span", s.get("span_s"))
PY
date -u
echo "== train_step"; timeout 140 python3 -m benchmarks train_step --repeats 2 --json --no-progress > $OUT/train_step.jsonl 2>$OUT/train_step.err; echo "rc $?"
cut -c1-500 $OUT/train_step.jsonl; tail -3 $OUT/train_step.err
