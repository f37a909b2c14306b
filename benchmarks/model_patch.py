"""A transformers Llama model (small config, random weights) patched with a specgen package,
beside the same model in eager PyTorch and with Liger-Kernel's patch: a training step
(forward + backward of the LM loss) and a decode step (one new token with a KV cache).

    python benchmarks/model_patch.py --package specgen_kernels --out model_patch.json

Prints a table (median milliseconds per step, and each variant against eager) and writes
JSON. Variants: eager; specgen (`<package>.patch(model)`: every module a spec's `replaces:`
names); liger-rmsnorm (Liger's patch limited to RMSNorm, the same modules specgen swaps);
liger (Liger's default Llama patch: RMSNorm, SwiGLU, RoPE, fused linear cross-entropy).
Before timing, each patched variant's logits are compared with eager's (bf16 tolerance).
Needs a CUDA GPU, transformers, and liger-kernel for the Liger rows (skipped without it).
"""
from __future__ import annotations

import argparse
import copy
import importlib
import json
import platform
import statistics
import sys
import time

import torch


def make_model(args, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, max_position_embeddings=4096,
                         attn_implementation="sdpa")
    return LlamaForCausalLM(config).to(device="cuda", dtype=dtype)


def timed(fn, warmup: int, iters: int) -> list[float]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def train_step(model, ids):
    def step():
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
    return step


def decode_step(model, prompt):
    """One new token after `prompt`, reusing the prompt's KV cache (rebuilt outside the timing
    would need a copy per call; the cache is cropped back to the prompt instead)."""
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=True)
    cache = out.past_key_values
    length = prompt.shape[1]
    token = prompt[:, -1:]

    def step():
        with torch.no_grad():
            model(input_ids=token, past_key_values=cache, use_cache=True,
                  cache_position=torch.tensor([length], device=token.device))
        cache.crop(-1)  # drop the token just added: every call decodes at the same position
    return step


def variants(args, base):
    """(name, build) pairs, in the order they must run: each build() returns (model, note), or
    (None, why) where the variant cannot be made here. Built one at a time, just before it is
    timed: Liger's patch also replaces module-level functions of transformers (rope, the
    causal-LM forward), which would change every model timed after it, so Liger runs last."""
    def eager():
        return base, "transformers as is"

    def specgen():
        package = importlib.import_module(args.package)
        model = copy.deepcopy(base)
        names = package.patch(model)
        layers = ", ".join(sorted(set(package.layers.patched(model).values())))
        return model, f"{args.package}.patch: {len(names)} modules ({layers})"

    def liger(**options):
        def build():
            from liger_kernel.transformers import apply_liger_kernel_to_llama

            model = copy.deepcopy(base)
            apply_liger_kernel_to_llama(model=model, **options)
            return model, "apply_liger_kernel_to_llama(" + (", ".join(f"{k}={v}" for k, v in options.items())
                                                            or "defaults") + ")"
        return build

    return [("eager", eager), ("specgen", specgen),
            ("liger-rmsnorm", liger(rope=False, swiglu=False, cross_entropy=False,
                                    fused_linear_cross_entropy=False, rms_norm=True)),
            ("liger", liger())]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package", default="specgen_kernels")
    parser.add_argument("--out", default="model_patch.json")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=5632)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--decode-batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("model_patch: needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    base = make_model(args, dtype)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")
    prompt = torch.randint(0, args.vocab, (args.decode_batch, args.prompt), device="cuda")
    with torch.no_grad():
        reference = base(input_ids=ids[:1, :128]).logits.float()

    rows = []
    for name, build in variants(args, base):
        try:
            model, note = build()
        except Exception as error:  # noqa: BLE001 - a row that says why
            model, note = None, f"{type(error).__name__}: {error}"
        row = {"variant": name, "note": note}
        if model is None:
            rows.append(row)
            continue
        if name != "eager":
            with torch.no_grad():
                logits = model(input_ids=ids[:1, :128]).logits.float()
            row["max_logit_diff"] = (logits - reference).abs().max().item()
        model.train()
        row["train_ms"] = statistics.median(timed(train_step(model, ids), args.warmup, args.iters))
        model.eval()
        row["decode_ms"] = statistics.median(timed(decode_step(model, prompt), args.warmup, args.iters * 5))
        model.zero_grad(set_to_none=True)
        rows.append(row)
    eager = rows[0]
    for row in rows:
        for key in ("train_ms", "decode_ms"):
            if key in row:
                row[key.replace("_ms", "_vs_eager")] = eager[key] / row[key]

    print(f"Llama {args.layers} layers, hidden {args.hidden}, {args.dtype}; train [{args.batch} x {args.seq}], "
          f"decode batch {args.decode_batch} after {args.prompt} tokens ({torch.cuda.get_device_name()})")
    print(f"{'variant':15} {'train ms':>9} {'x eager':>8} {'decode ms':>10} {'x eager':>8} {'logit diff':>10}  note")
    for row in rows:
        if "train_ms" not in row:
            print(f"{row['variant']:15} {'-':>9} {'-':>8} {'-':>10} {'-':>8} {'-':>10}  {row['note']}")
            continue
        diff = row.get("max_logit_diff")
        print(f"{row['variant']:15} {row['train_ms']:9.3f} {row['train_vs_eager']:7.2f}x {row['decode_ms']:10.3f} "
              f"{row['decode_vs_eager']:7.2f}x {'-' if diff is None else f'{diff:.3g}':>10}  {row['note']}")
    result = {"args": vars(args), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "python": platform.python_version(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "rows": rows}
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
