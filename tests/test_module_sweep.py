"""The module_db sweep (stitchml/tools/module_sweep.py): a CI slice of PyTorch's module
database in both modes, every sample against eager under strict mode with the fallback
off.  The full sweep is docs/MODULES.md:
`python -m stitchml.tools.module_sweep --out docs/MODULES.md`."""
import pytest

from stitchml.tools import module_sweep

# one module per family the sweep covers: a Transformer layer, attention, normalisation
# with parameters, embedding, a loss, a parametrised activation, a bilinear contraction, a
# pool and a padding (the first full sweep found fractional pooling running eagerly:
# random, so the sweep skips it; tests/test_fractional_pool.py)
SLICE = ["nn.TransformerEncoderLayer", "nn.MultiheadAttention", "nn.GroupNorm", "nn.Embedding",
         "nn.CrossEntropyLoss", "nn.PReLU", "nn.Bilinear", "nn.LPPool2d", "nn.ReflectionPad2d"]


@pytest.mark.parametrize("name", SLICE)
def test_module_samples_pass_in_both_modes(name):
    rows = module_sweep.sweep([name], samples=1)
    assert {r["mode"] for r in rows} == set(module_sweep.MODES)
    bad = [r for r in rows if r["status"] != "pass"]
    assert not bad, bad
    assert all(r["graphs"] >= 1 for r in rows), rows


def test_a_random_module_is_skipped_with_its_reason_and_the_table_counts_it():
    rows = module_sweep.sweep(["nn.FractionalMaxPool2d"], samples=1)
    assert {r["status"] for r in rows} == {"skip"} and all(r["why"] == "random numbers" for r in rows)
    text = module_sweep.render(rows, 1.0, ["--modules", "nn.FractionalMaxPool2d"])
    assert "| train | 0 | 0 | 0 | 0 | 0 | 0 | 1 |" in text and "random numbers" in text


def test_unknown_module_names_are_refused():
    with pytest.raises(SystemExit):
        module_sweep.main(["--modules", "nn.NoSuchModule"])
