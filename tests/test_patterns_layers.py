"""Kernels per layer (issue 15.4): the summariser plans each block of small BERT,
GPT-2 and LLaMA-style models alone and reports kernels, bytes and predicted time,
with the pattern rewrites it applied."""
import pytest

from stitchml import config
from stitchml.tools.layers import default_layers, reference_blocks, summarise_layers


@pytest.fixture(scope="module")
def blocks():
    pytest.importorskip("transformers")
    return reference_blocks(batch=1, seq=8, hidden=32, heads=2, layers=1, vocab=64)


@pytest.mark.parametrize("name,layer_type", [("BERT", "BertLayer"), ("GPT-2", "GPT2Block"),
                                             ("LLaMA", "LlamaDecoderLayer")])
def test_layer_summary(blocks, name, layer_type):
    model, inputs = blocks[name]
    assert len(default_layers(model)) == 1
    with config.override(device="H100"):
        summary = summarise_layers(model, *inputs, title=name)
    (row,) = summary.rows
    assert row.type == layer_type and summary.device == "H100"
    kinds = [g.kind for g in row.graphs]
    assert kinds == ["forward", "backward"], kinds
    assert all(g.kernels > 0 and g.library_calls > 0 for g in row.graphs)
    assert 0 < row.modelled_bytes < row.unfused_bytes and row.predicted_us > 0
    # eager attention in every block is kept fused by the attention rewrite
    assert any("attention" in p and "rewritten" in p for p in row.patterns), row.patterns
    text = summary.to_text()
    assert layer_type in text and "kernels by graph: forward" in text


def test_attention_knob_off_changes_the_plan(blocks):
    model, inputs = blocks["LLaMA"]
    with config.override(device="H100"):
        on = summarise_layers(model, *inputs).rows[0]
        with config.override(attention_sdpa=False):
            off = summarise_layers(model, *inputs).rows[0]
    assert not [p for p in off.patterns if p.startswith("attention")], off.patterns
    assert any(p.startswith("attention") for p in on.patterns), on.patterns
    # without the rewrite the score tensor goes through memory: more modelled bytes
    assert off.modelled_bytes > on.modelled_bytes
