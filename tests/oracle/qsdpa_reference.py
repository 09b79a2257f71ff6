"""mlx-lm's quantized_scaled_dot_product_attention on random inputs, for
tests/qsdpa_oracle.rs: writes each case's inputs and output to a safetensors
file (names "<case>.<q|kw|ks|kb|vw|vs|vb|mask|out>", metadata "cases").

    python tests/oracle/qsdpa_reference.py OUT.safetensors
"""

import sys

import mlx.core as mx
from mlx_lm.models.base import quantized_scaled_dot_product_attention

mx.set_default_device(mx.cpu)
mx.random.seed(3)
B, H, D, SCALE = 2, 2, 64, 0.125


def bool_mask(L, T):
    """Causal; batch row 1 left-padded by 5 keys and its query 0 fully masked."""
    m = mx.broadcast_to((mx.arange(T)[None, :] <= (T - L + mx.arange(L))[:, None])[None, None], (B, 1, L, T))
    row0 = mx.array([True, False]).reshape(B, 1, 1, 1)
    pad = m & (mx.arange(T) >= 5)[None, None, None, :] & (mx.arange(L) != 0)[None, None, :, None]
    return mx.where(row0, m, pad)


out, cases = {}, []
for bits in (4, 8):
    for g in (32, 64, 128):
        d = max(D, g)
        for rep, L, T, mask_kind in [(3, 1, 300, "none"), (3, 7, 300, "causal"), (4, 7, 300, "bool"),
                                     (1, 7, 5, "causal"), (3, 1, 1, "none"), (2, 3, 77, "additive")]:
            name = f"b{bits}g{g}r{rep}L{L}T{T}{mask_kind}"
            q = mx.random.normal((B, H * rep, L, d))
            kq = mx.quantize(mx.random.normal((B, H, T, d)) * 1.5, g, bits)
            vq = mx.quantize(mx.random.normal((B, H, T, d)), g, bits)
            mask = {"none": None, "causal": "causal"}.get(mask_kind)
            if mask_kind == "bool":
                mask = bool_mask(L, T)
            if mask_kind == "additive":
                mask = mx.random.normal((B, 1, L, T))
            if not isinstance(mask, (str, type(None))):
                out[name + ".mask"] = mask
            # (the function scales its `queries` argument in place: pass a copy)
            o = quantized_scaled_dot_product_attention(mx.array(q), kq, vq, scale=SCALE, mask=mask,
                                                       group_size=g, bits=bits)
            for n, a in zip(("q", "kw", "ks", "kb", "vw", "vs", "vb", "out"), (q, *kq, *vq, o)):
                out[f"{name}.{n}"] = a
            cases.append(name)
mx.save_safetensors(sys.argv[1], out, metadata={"cases": ",".join(cases)})
