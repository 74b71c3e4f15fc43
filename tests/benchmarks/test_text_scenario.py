"""The `text` scenario: its numpy packer does the packing datarax does, and a tiny run reports a row."""

from __future__ import annotations

import numpy as np

from benchmarks.registry import BenchOptions
from benchmarks.scenarios import text
from datarax import Pipeline
from datarax.sources import PackedTextSource, TextSource


def test_the_baselines_packer_packs_like_packed_text_source():
    docs = text.make_documents(300)
    tokenizer = text.train_tokenizer(vocab_size=300)
    ids = [e.ids for e in tokenizer.encode_batch(docs, add_special_tokens=False)]
    expected = text.pack_numpy(ids, 64, text.EOS)
    source = PackedTextSource(source=TextSource(documents=docs), tokenizer=tokenizer, seq_len=64, eos_id=text.EOS,
                              shuffle=False)
    batches = list(Pipeline(source, [], batch_size=16))
    for name, value in expected.items():
        np.testing.assert_array_equal(np.concatenate([np.asarray(b[name]) for b in batches]), value, err_msg=name)


def test_a_tiny_run_reports_datarax_against_datasets():
    (result,) = text.run(BenchOptions(repeats=1, scale=0.02))
    assert result["scenario"] == "text" and result["records"] == int(0.02 * text.COPIES * 2608)
    assert result["datarax_el_s"] > 0 and result["floor_el_s"] > 0 and result["ratio"] > 0
