"""A transformers Llama model (small config, random weights) patched with a specgen package,
beside the same model in eager PyTorch and with Liger-Kernel's patch: a training step
(forward + backward of the LM loss) and a decode step (one new token with a KV cache).

    python benchmarks/model_patch.py --package specgen_kernels --out model_patch.json

Prints a table (median milliseconds per step, and each variant against eager) and writes
JSON. Variants: eager; specgen (`<package>.patch(model)`: every module a spec's `replaces:`
names); liger-rmsnorm (Liger's patch limited to RMSNorm, the same modules specgen swaps);
liger (Liger's default Llama patch: RMSNorm, SwiGLU, RoPE, fused linear cross-entropy).
Before timing, each patched variant's logits are compared with eager's (bf16 tolerance). eager,
specgen and liger-rmsnorm are timed interleaved (--rounds rounds taking them in turn: the
decode step is host-bound and the machine drifts); liger after them, alone.
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


def interleaved(steps: dict, rounds: int, warmup: int, iters: int, timer=None) -> dict:
    """Each step's median time over `rounds` rounds that take the steps in turn (a, b, c, a, b,
    c, ...), so a drift of the machine (a host-bound decode step moved 1.66x between two runs of
    the same variant, session 15) falls on every variant alike. Returns name -> the per-round
    medians; a variant's time is the median of those."""
    timer = timer or timed
    medians: dict = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            medians[name].append(statistics.median(timer(step, warmup, iters)))
    return medians


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


def profile_decode(step, name: str, path: str) -> None:
    """Where a decode step's time goes: 10 steps under torch.profiler, the top host ops by self
    CPU time and the top device kernels, appended to `path` under the variant's name."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            step()
        torch.cuda.synchronize()
    averages = prof.key_averages()
    with open(path, "a") as handle:
        handle.write(f"==== {name}: 10 decode steps, host ops by self CPU time\n")
        handle.write(averages.table(sort_by="self_cpu_time_total", row_limit=30) + "\n")
        handle.write(f"==== {name}: device kernels by device time\n")
        handle.write(averages.table(sort_by="self_device_time_total", row_limit=15) + "\n")


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


def time_group(group: dict, ids, prompt, args) -> None:
    """Train and decode steps of the group's models, interleaved (`interleaved`), into their rows."""
    if not group:
        return
    for model, _ in group.values():
        model.train()
    train = interleaved({name: train_step(model, ids) for name, (model, _) in group.items()},
                        args.rounds, args.warmup, args.iters)
    for model, _ in group.values():
        model.zero_grad(set_to_none=True)
        model.eval()
    decode = interleaved({name: decode_step(model, prompt) for name, (model, _) in group.items()},
                         args.rounds, args.warmup, args.iters * 5)
    for name, (model, row) in group.items():
        row["train_ms"], row["decode_ms"] = statistics.median(train[name]), statistics.median(decode[name])
        row["train_rounds_ms"], row["decode_rounds_ms"] = train[name], decode[name]
        row["timed_with"] = sorted(group)
        if args.profile_decode:
            profile_decode(decode_step(model, prompt), name, args.profile_decode)


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
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of timing that take the variants in turn (eager, specgen, Liger's RMSNorm)")
    parser.add_argument("--profile-decode", metavar="FILE",
                        help="also profile 10 decode steps of each variant (torch.profiler): the host ops by "
                             "self CPU time and the device kernels, appended to FILE")
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

    rows, group = [], {}
    for name, build in variants(args, base):
        if name == "liger":  # its patch rewrites transformers' module functions: after the others
            time_group(group, ids, prompt, args)
            group = {}
        try:
            model, note = build()
        except Exception as error:  # noqa: BLE001 - a row that says why
            model, note = None, f"{type(error).__name__}: {error}"
        row = {"variant": name, "note": note}
        rows.append(row)
        if model is None:
            continue
        if name != "eager":
            with torch.no_grad():
                logits = model(input_ids=ids[:1, :128]).logits.float()
            row["max_logit_diff"] = (logits - reference).abs().max().item()
        group[name] = (model, row)
    time_group(group, ids, prompt, args)
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
