#!/usr/bin/env python3
"""kvsim's GGML dequantization against llama.cpp's own Python package `gguf` (gguf.quants).

  gguf_dequant_test.py random            seeded random blocks of every type kvsim reads
  gguf_dequant_test.py file MODEL.gguf   every tensor of a real GGUF file

Equality is bitwise (float32 bit patterns); kvsim's dequantizers round each product and sum as numpy
does (no fused multiply-add). Negative controls (random mode): the same comparison applied to blocks
with the nibble order swapped, or with the min / dmin field negated, must fail — so a dequantizer with
either bug would be caught.
Exit 0 passed, 1 failed, 77 SKIPPED (numpy/gguf or the file absent).
"""
import os
import sys

SKIP = 77
from checks import check, failures  # noqa: E402  (tests/real_model/checks.py, beside this script)


def bits_equal(a, b):
    import numpy as np
    a = np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
    b = np.ascontiguousarray(b, dtype=np.float32).reshape(-1)
    if a.shape != b.shape:
        return False, a.size
    diff = a.view(np.uint32) != b.view(np.uint32)
    return not diff.any(), int(diff.sum())


# type: (half-precision fields to overwrite with finite values: byte offsets, min field offset or None)
LAYOUT = {
    "F16": None, "BF16": None, "F32": None,
    "Q4_0": ([0], None), "Q4_1": ([0, 2], 2), "Q5_0": ([0], None), "Q5_1": ([0, 2], 2),
    "Q8_0": ([0], None), "Q4_K": ([0, 2], 2), "Q5_K": ([0, 2], 2), "Q6_K": ([208], None),
}


def random_blocks(np, gguf, name, n_blocks, rng):
    qt = getattr(gguf.GGMLQuantizationType, name)
    block, size = gguf.GGML_QUANT_SIZES[qt]
    if name == "F32":
        return qt, rng.standard_normal(n_blocks * block).astype(np.float32).tobytes(), n_blocks * block
    if name in ("F16", "BF16"):  # every 16-bit pattern: zeros, subnormals, infinities, NaNs
        return qt, np.arange(65536, dtype=np.uint16).tobytes(), 65536
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in LAYOUT[name][0]:  # finite scales of either sign and varied magnitude
        h = (rng.standard_normal(n_blocks) * 10.0 ** rng.integers(-4, 2, n_blocks)).astype(np.float16)
        raw[:, off:off + 2] = h.view(np.uint8).reshape(n_blocks, 2)
    return qt, raw.tobytes(), n_blocks * block


def run_random():
    import numpy as np
    import gguf
    from kvsim.model import dequantize

    rng = np.random.default_rng(20261125)
    for name in LAYOUT:
        qt, data, n = random_blocks(np, gguf, name, 4096 if name != "F32" else 65536, rng)
        ref = gguf.quants.dequantize(np.frombuffer(data, dtype=np.uint8), qt).reshape(-1)
        ours = dequantize(int(qt), data, n)
        same, nd = bits_equal(ours, ref)
        check(same, f"{name}: {n} values from random blocks bitwise equal to gguf.quants ({nd} differ)")
    # Negative controls on Q4_1 and Q4_K: a swapped nibble order and a negated min.
    for name in ("Q4_1", "Q4_K"):
        qt, data, n = random_blocks(np, gguf, name, 512, rng)
        ref = gguf.quants.dequantize(np.frombuffer(data, dtype=np.uint8), qt).reshape(-1)
        block, size = gguf.GGML_QUANT_SIZES[qt]
        raw = np.frombuffer(data, dtype=np.uint8).reshape(-1, size).copy()
        qs_from = 4 if name == "Q4_1" else 16
        swapped = raw.copy()
        swapped[:, qs_from:] = (raw[:, qs_from:] >> 4) | (raw[:, qs_from:] << 4)
        same, nd = bits_equal(dequantize(int(qt), swapped.tobytes(), n), ref)
        check(not same, f"negative control {name}: a swapped nibble order is caught ({nd} of {n} values differ)")
        neg = raw.copy()
        m_off = LAYOUT[name][1]
        neg[:, m_off + 1] ^= 0x80  # flip the sign bit of the half-precision min / dmin
        same, nd = bits_equal(dequantize(int(qt), neg.tobytes(), n), ref)
        check(not same, f"negative control {name}: a wrong min sign is caught ({nd} of {n} values differ)")


def run_file(path):
    import numpy as np
    import gguf
    from kvsim.model import gguf_tensor

    reader = gguf.GGUFReader(path)
    types = {}
    bad = []
    total = 0
    for t in reader.tensors:
        ref = gguf.quants.dequantize(t.data, t.tensor_type)
        ours = gguf_tensor(path, t.name)
        same, nd = bits_equal(ours, ref)
        if not same or tuple(ours.shape) != tuple(ref.shape):
            bad.append(f"{t.name} ({t.tensor_type.name}: {nd} values differ, shapes {ours.shape} vs {ref.shape})")
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
        total += ours.size
    check(not bad, f"{len(reader.tensors)} tensors ({total} values; "
          + ", ".join(f"{k} x{v}" for k, v in sorted(types.items())) + ") bitwise equal to gguf.quants"
          + ("" if not bad else ": " + "; ".join(bad[:3])))


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("random", "file") or (sys.argv[1] == "file") != (len(sys.argv) == 3):
        print(__doc__)
        return 2
    try:
        import numpy  # noqa: F401
        import gguf  # noqa: F401
    except ImportError as e:
        print(f"SKIPPED: {e} (bash scripts/setup.sh installs .venv)")
        return SKIP
    if sys.argv[1] == "random":
        run_random()
    else:
        if not os.path.exists(sys.argv[2]):
            print(f"SKIPPED: {sys.argv[2]} absent (bash scripts/setup.sh fetches it)")
            return SKIP
        run_file(sys.argv[2])
    print(f"{len(failures)} failure(s)" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
