set -u
EXTRA_PIP=tensorflow-cpu . benchmarks/tpu/setup.sh
python3 -c "import tensorflow as tf; print('tf', tf.__version__)" 2>&1 | tail -1
python3 -c "import librosa, numpy as np; print('librosa stft ok', librosa.stft(np.zeros(2048, np.float32)).shape)" 2>&1 | tail -2
date -u; nproc
echo "== bench"; timeout 430 python3 -m benchmarks cifar train_step augment_chain overhead --repeats 3 --json --no-progress > $OUT/bench.jsonl 2> $OUT/bench.err; echo "rc $?"
cat $OUT/bench.jsonl | cut -c1-600; tail -5 $OUT/bench.err
echo "== k sweep"; timeout 70 python3 benchmarks/tpu/dispatch_k.py 2>&1 | grep -v Warn | tee $OUT/k.jsonl
date -u
