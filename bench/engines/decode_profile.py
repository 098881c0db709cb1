"""Decode-step time of Qwen2.5-shaped decoders against batch width and context, on one GPU.

Random bf16 weights, fused QKV and gate/up projections, grouped-query attention over a
filled KV cache, the LM head and an argmax: one decode step captured in a CUDA graph and
replayed, as a serving engine with CUDA graphs runs it. Prints one JSON line a point
(and appends it to ``PROFILE_OUT``); ``KV_CAP_GB`` (40) skips points whose KV cache is
larger, ``REPS`` (20) sets the replays a point. The H100 profiles shipped with blendserve
(``bench/engines/fit_step_costs.py`` fits them) were measured with it; on a GPU at hand::

    python -m bench.engines.decode_profile qwen2.5-7b,qwen2.5-0.5b 1,8,32,128,512,1024 512,2048,8192
"""

import json
import os
import sys
import time

import torch
import torch.nn.functional as F

SHAPES = {
    "qwen2.5-0.5b": dict(layers=24, d=896, heads=14, kv=2, inter=4864, vocab=151936),
    "qwen2.5-1.5b": dict(layers=28, d=1536, heads=12, kv=2, inter=8960, vocab=151936),
    "qwen2.5-7b": dict(layers=28, d=3584, heads=28, kv=4, inter=18944, vocab=152064),
    "qwen2.5-14b": dict(layers=48, d=5120, heads=40, kv=8, inter=13824, vocab=152064),
    "qwen2.5-32b": dict(layers=64, d=5120, heads=40, kv=8, inter=27648, vocab=152064),
    "tiny": dict(layers=2, d=64, heads=4, kv=2, inter=128, vocab=1000),
}
HD = 128


def weights(s, dev, dt):
    hd = HD if s["d"] >= 512 else s["d"] // s["heads"]
    g = lambda *shape: torch.randn(*shape, device=dev, dtype=dt) * 0.02  # noqa: E731
    layers = [
        dict(
            qkv=g(s["d"], (s["heads"] + 2 * s["kv"]) * hd),
            o=g(s["heads"] * hd, s["d"]),
            gu=g(s["d"], 2 * s["inter"]),
            down=g(s["inter"], s["d"]),
        )
        for _ in range(s["layers"])
    ]
    return layers, g(s["d"], s["vocab"]), hd


def rms(x):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)


def step(x, layers, lm, kcache, vcache, s, hd):
    b = x.shape[0]
    group = s["heads"] // s["kv"]
    for w, kc, vc in zip(layers, kcache, vcache, strict=True):
        qkv = rms(x) @ w["qkv"]
        q = qkv[:, : s["heads"] * hd].view(b, s["kv"], group, hd)
        a = F.scaled_dot_product_attention(q, kc, vc)  # (b, kv, group, hd): GQA as query rows
        x = x + a.reshape(b, s["heads"] * hd) @ w["o"]
        gate, up = (rms(x) @ w["gu"]).chunk(2, dim=-1)
        x = x + (F.silu(gate) * up) @ w["down"]
    return (rms(x) @ lm).argmax(-1)


def _times(x, layers, lm, kc, vc, s, hd, dev, reps):
    """Milliseconds of ``reps`` decode steps: CUDA-graph replays on a GPU, plain calls else."""
    if dev != "cuda":
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            step(x, layers, lm, kc, vc, s, hd)
            times.append((time.perf_counter() - t) * 1e3)
        return times
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step(x, layers, lm, kc, vc, s, hd)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(x, layers, lm, kc, vc, s, hd)
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(reps):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    del graph
    return times


def _model(name, batches, ctxs, dev, dt, kv_cap, reps, out):
    """Every (batch, ctx) point of one shape whose KV cache fits ``kv_cap`` bytes."""
    s = SHAPES[name]
    t0 = time.time()
    layers, lm, hd = weights(s, dev, dt)
    params = sum(t.numel() for w in layers for t in w.values()) + lm.numel()
    width = 2 if dt == torch.bfloat16 else 4
    for ctx in ctxs:
        for b in batches:
            kv_bytes = 2 * s["layers"] * b * s["kv"] * ctx * hd * width
            if kv_bytes > kv_cap:
                continue
            shape = (b, s["kv"], ctx, hd)
            kc = [torch.randn(*shape, device=dev, dtype=dt) for _ in range(s["layers"])]
            vc = [torch.randn(*shape, device=dev, dtype=dt) for _ in range(s["layers"])]
            x = torch.randn(b, s["d"], device=dev, dtype=dt)
            times = sorted(_times(x, layers, lm, kc, vc, s, hd, dev, reps))
            median = times[len(times) // 2]
            row = dict(
                model=name, params=params, batch=b, ctx=ctx, kv_gb=round(kv_bytes / 2**30, 2),
                ms_median=round(median, 4), ms_min=round(times[0], 4),
                tokens_per_s=round(b / (median / 1e3)),
            )  # fmt: skip
            print(json.dumps(row), flush=True)
            out.write(json.dumps(row) + "\n")
            out.flush()
            del kc, vc, x
            if dev == "cuda":
                torch.cuda.empty_cache()
    print(json.dumps(dict(model=name, seconds=round(time.time() - t0, 1))), flush=True)


def main():
    """``decode_profile.py SHAPES BATCHES CONTEXTS``, each a comma-separated list."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    names = sys.argv[1].split(",")
    batches = [int(b) for b in sys.argv[2].split(",")]
    ctxs = [int(c) for c in sys.argv[3].split(",")]
    kv_cap = float(os.environ.get("KV_CAP_GB", "40")) * 2**30
    reps = int(os.environ.get("REPS", "20"))
    if dev == "cuda":
        device = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__)
        print(json.dumps(device), flush=True)
    with open(os.environ.get("PROFILE_OUT", os.devnull), "a") as out:
        for name in names:
            _model(name, batches, ctxs, dev, dt, kv_cap, reps, out)
            if dev == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
