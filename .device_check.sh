#!/usr/bin/env bash
# Device check for the trainers kit (run on the GPU machine from the repo root).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
q() { grep -v -E "^(W|I|E)[0-9]{4}|absl|^WARNING" ; }
python3 -c "import jax, flax, optax, orbax.checkpoint as o, numpy; print('versions', jax.__version__, flax.__version__, optax.__version__, o.__version__, numpy.__version__, jax.devices())" 2>&1 | q
A="--batch-size 256 --num-records 8192 --log-every 100 --no-progress"
echo "== GPU demo, device-resident"
timeout 150 python3 -m trainers.demo --workdir /tmp/g1 --steps 300 --checkpoint-every 100 $A 2>&1 | q | tail -6
cp /tmp/g1/goodput.json $OUT/gpu_fast.json; cp /tmp/g1/goodput.png $OUT/gpu_fast.png; cp /tmp/g1/result.json $OUT/gpu_fast_result.json
echo "== GPU demo, SIGKILL after checkpoint 100 then rerun (same --steps)"
(timeout 150 python3 -m trainers.demo --workdir /tmp/g3 --steps 300 --checkpoint-every 100 $A > /tmp/g3.log 2>&1 &)
for i in $(seq 1 1200); do [ -d /tmp/g3/checkpoints/100 ] && break; sleep 0.1; done
sleep 0.3; pkill -9 -f "workdir /tmp/g3" ; sleep 1; ls /tmp/g3/checkpoints
timeout 150 python3 -m trainers.demo --workdir /tmp/g3 --steps 300 --checkpoint-every 100 $A 2>&1 | q | tail -2
python3 -c "
import json; a=json.load(open('/tmp/g1/result.json')); b=json.load(open('/tmp/g3/result.json'))
print('GPU resume: resumed_from', b['resumed_from'], 'sha equal', a['params_sha256']==b['params_sha256'], 'eval', a['eval_metrics'], b['eval_metrics'])"
echo "== GPU demo, slow host input (10 ms per batch)"
timeout 150 python3 -m trainers.demo --workdir /tmp/g2 --steps 200 --checkpoint-every 100 --input-delay-ms 10 $A 2>&1 | q | tail -3
cp /tmp/g2/goodput.json $OUT/gpu_slow.json; cp /tmp/g2/goodput.png $OUT/gpu_slow.png
echo "== CPU goodput + trainer tests on an idle 16-core host"
JAX_PLATFORMS=cpu timeout 240 python3 -m pytest tests/trainers/test_goodput.py tests/trainers/test_trainer.py -q -p no:cacheprovider --durations=6 2>&1 | q | tail -15
