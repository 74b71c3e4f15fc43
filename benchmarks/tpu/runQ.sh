# Run Q (prepared, not yet run): does the shared chunk queue (ea1890b: workers take chunks of every
# batch in flight from one queue; the batch after next starts as soon as the batch read next is in
# flight) beat one block of rows per worker (1762110) on the 13-core host? Run H measured an
# earlier queue (three segments, 3-row chunks) at 5,810 records/s against run G's 6,316 for blocks,
# in two separate runs; this one alternates the two versions on the same machine. The old tree is
# carried in scratch/old (`git archive 1762110 datarax benchmarks | tar -x -C scratch/old`):
#   run(command="bash benchmarks/tpu/runQ.sh", carry=[".whl-tpu", "scratch/old"])
# Then decode_pieces.py with and without the TPU runtime in the process, then (JPEG_S) `jpeg`.
set -u
. benchmarks/tpu/setup.sh
date -u
[ -d scratch/old/datarax ] || echo "scratch/old is missing (build it and carry it): the old sides fail"
for i in 1 2; do
  for side in old new; do
    dir=.; [ $side = old ] && dir=scratch/old
    echo "== $side $i"
    (cd $dir && timeout ${SIDE_S:-100} python3 benchmarks/tpu/decode_workers.py --workers 13 --repeats 2 2>/dev/null)
  done
done
echo "== pieces"
JAX_PLATFORMS=cpu timeout 60 python3 benchmarks/tpu/decode_pieces.py 2>/dev/null
timeout 60 python3 benchmarks/tpu/decode_pieces.py 2>/dev/null
date -u
if [ -n "${JPEG_S:-}" ]; then
  echo "== jpeg"; timeout $JPEG_S python3 -m benchmarks jpeg --repeats 2 > $OUT/jpeg.txt 2>$OUT/jpeg.err; echo "rc $?"
  cut -c1-300 $OUT/jpeg.txt
fi
