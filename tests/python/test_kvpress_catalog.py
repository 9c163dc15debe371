"""kvsim.kvpress_catalog (docs/kvpress.md, "Every kvpress press"): every name the pinned kvpress exports is
accounted for — run directly, wrapped, through the pipeline only, or refused with a reason — and a name kvpress
adds fails here until it is listed (the negative control feeds an invented one). The runnable entries build
the class they name at the ratio asked; a refused entry raises kvsim.Error carrying its reason."""
import math

import pytest

kvpress = pytest.importorskip("kvpress", reason="kvpress is not installed (bash scripts/setup.sh installs it)")
import kvsim  # noqa: E402
from kvsim import kvpress_catalog as cat  # noqa: E402


def test_every_export_is_listed():
    assert cat.unlisted() == [], f"kvpress exports names kvsim's catalogue does not account for: {cat.unlisted()}"


def test_an_unlisted_press_is_caught():
    # Negative control: the check is not vacuous — an export the catalogue lacks is named.
    assert cat.unlisted(cat.exported() + ["BrandNewPress"]) == ["BrandNewPress"]


def test_no_stale_entries():
    assert sorted(set(cat.CATALOG) - set(cat.exported())) == []


def test_kinds_and_reasons():
    kinds = {e.kind for e in cat.CATALOG.values()}
    assert kinds <= {"direct", "wrapped", "pipeline", "cannot", "not a press"}
    for name, e in cat.CATALOG.items():
        assert len(e.how) > 10 and "\n" not in e.how, name


@pytest.mark.parametrize("ratio", [0.25, 0.5])
def test_runnable_entries_build_what_they_name(ratio):
    for name in cat.runnable(("direct", "wrapped", "pipeline")):
        press = cat.build(name, ratio)
        assert type(press).__name__ == name
        # The ratio reaches the press: its own, its scorer's, or (ComposedPress) the product of its stages'.
        if name == "ComposedPress":
            kept = math.prod(1 - p.compression_ratio for p in press.presses)
            assert kept == pytest.approx(1 - ratio)
        elif name == "PerLayerCompressionPress":
            assert sum(press.compression_ratios) / len(press.compression_ratios) == pytest.approx(ratio, abs=0.01)
        elif name in ("DecodingPress",):
            assert press.base_press.compression_ratio == ratio
        elif name == "CompressionRatioDecodingPress":
            assert press.target_compression_ratio == ratio
        elif name == "PrefillDecodingPress":
            assert press.prefilling_press.compression_ratio == ratio
        else:
            inner = getattr(press, "press", press)
            assert inner.compression_ratio == ratio, name


def test_refused_entries_raise_their_reason():
    for name, e in cat.CATALOG.items():
        if e.kind in ("cannot", "not a press"):
            with pytest.raises(kvsim.Error, match=name):
                cat.build(name, 0.5)
    with pytest.raises(kvsim.Error, match="not in kvsim.kvpress_catalog"):
        cat.build("BrandNewPress", 0.5)
    with pytest.raises(kvsim.Error, match="outside"):
        cat.build("SnapKVPress", 1.0)


def test_cpu_pipeline_excludes_per_layer_budgets():
    # kvpress decodes per-layer cache sizes with flash attention only: those presses are captured at prefill but
    # left out of the CPU pipeline's list, and every other runnable press stays in it.
    pipe = cat.pipeline_runnable()
    assert set(cat.NO_CPU_PIPELINE) <= set(cat.runnable())
    assert not set(cat.NO_CPU_PIPELINE) & set(pipe)
    assert set(pipe) | set(cat.NO_CPU_PIPELINE) == set(cat.runnable(("direct", "wrapped", "pipeline")))
