"""Open cost of ShardedSource(verify=True) against an epoch, on the remote scenario's slow store (docs/sources.md)."""
import statistics
import tempfile
import time

from benchmarks.scenarios import remote
from datarax import Pipeline
from datarax.host import DecodeImage
from datarax.sources import ShardedSource


def main() -> None:
    remote.register_slow_filesystem()
    paths = remote.write_shards(24_000)["parquet"]
    urls = ["slow://" + p for p in paths]
    mdir = tempfile.mkdtemp()
    ShardedSource(urls=urls, encoded=("image",), fields=("label",), manifest_dir=mdir)  # builds the manifest once
    opens = {True: [], False: []}
    for _ in range(3):
        for verify in (True, False):
            t = time.perf_counter()
            src = ShardedSource(urls=urls, encoded=("image",), fields=("label",), manifest_dir=mdir, verify=verify,
                                shuffle=True, seed=0)
            opens[verify].append(time.perf_counter() - t)
    p = Pipeline(src, [DecodeImage(size=64, resize="fixed", field="image")], batch_size=64)
    t = time.perf_counter()
    n = sum(len(b["label"]) for b in p)
    epoch = time.perf_counter() - t
    o_v, o_n = statistics.median(opens[True]), statistics.median(opens[False])
    print(f"open verify=True {o_v:.3f} s, verify=False {o_n:.3f} s, verify cost {o_v - o_n:.3f} s; "
          f"epoch of {n} records {epoch:.1f} s; cost / epoch {(o_v - o_n) / epoch:.2%}")


if __name__ == "__main__":
    main()
