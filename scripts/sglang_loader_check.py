#!/usr/bin/env python3
"""Load a `fasa inspect P.json --export sglang-ds` file the way SGLang's Double Sparsity does and
check it against the profile.

SGLang (model_runner.init_double_sparsity_channel_config) does, per layer i:
    torch.tensor(channel_config["model.layers.<i>.self_attn.<type>_proj"])[:, :ds_heavy_channel_num]
and its backend then gathers both k (tokens, kv_heads, d) and q (tokens, q_heads, d) along the
last dim with that one table. This script repeats those steps (torch when it is importable, plain
Python otherwise), checks every row is a permutation of 0..d_head-1 whose first 2F channels are
the Hugging Face dims of the profile's top-F chunks, and reports whether the gathers would work
for the model's head counts.

usage: scripts/sglang_loader_check.py CHANNELS.json PROFILE.json [--type qk|q|k] [--channels C]
"""
import argparse
import json
import sys


def chunk_dims(definition, d_head, c):
    return (c, c + d_head // 2) if definition == "plane" else (2 * c, 2 * c + 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("channels")
    ap.add_argument("profile")
    ap.add_argument("--type", default="qk", choices=["qk", "q", "k"])
    ap.add_argument("--channels", dest="heavy", type=int, default=0, help="ds_heavy_channel_num (default 2 * the profile's fcs)")
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        torch = None

    with open(a.channels) as f:
        config = json.load(f)
    with open(a.profile) as f:
        prof = json.load(f)
    m = prof["model"]
    n_layer, n_head, n_kv, d = m["n_layer"], m["n_head"], m["n_kv_head"], m["d_head"]
    definition = prof["chunks"]["definition"]
    C = a.heavy or 2 * prof["calibration"]["fcs"]
    ranks = prof["group_rank"] if a.type == "k" else prof["rank"]
    rows_want = n_kv if a.type == "k" else n_head
    bad = 0
    for i in range(n_layer):
        key = "model.layers." + str(i) + ".self_attn." + a.type + "_proj"
        if key not in config:
            print(f"layer {i}: missing key {key}")
            bad += 1
            continue
        table = config[key]
        if torch is not None:
            t = torch.tensor(table)  # fails on ragged tables, as in SGLang
            if t.dtype != torch.int64 or tuple(t.shape) != (rows_want, d):
                print(f"{key}: dtype {t.dtype} shape {tuple(t.shape)}, want int64 ({rows_want}, {d})")
                bad += 1
                continue
            sliced = t[:, :C].contiguous().tolist()
        else:
            sliced = [row[:C] for row in table]
        for r, row in enumerate(table):
            if sorted(row) != list(range(d)):
                print(f"{key} row {r}: not a permutation of 0..{d - 1}")
                bad += 1
                continue
            top = ranks[i][r][: C // 2]
            want = [x for c in top for x in chunk_dims(definition, d, c)]
            if sliced[r] != want:
                print(f"{key} row {r}: first {C} channels {sliced[r]} != top-{C // 2} chunk dims {want}")
                bad += 1
    print(f"{n_layer} layers checked, type {a.type}, {rows_want} rows x {d} channels, C = {C}: "
          f"{'ok' if bad == 0 else str(bad) + ' problems'}")

    # The backend's gathers: k_label = gather(k, 2, table.expand(T, -1, -1)) on k (T, n_kv, d) and
    # q_label likewise on q (T, n_head, d). torch.gather needs index.size(1) <= input.size(1), and
    # the kernels expect one label row per head of the input.
    if torch is not None:
        t = torch.tensor(config["model.layers.0.self_attn." + a.type + "_proj"])[:, :C]
        for name, heads in (("k", n_kv), ("q", n_head)):
            x = torch.randn(5, heads, d)
            try:
                out = torch.gather(x, 2, t.unsqueeze(0).expand(5, -1, -1))
                note = "" if out.shape[1] == heads else f" (labels for {out.shape[1]} of {heads} heads only)"
                print(f"gather on {name} (T, {heads}, {d}): {tuple(out.shape)}{note}")
            except RuntimeError as e:
                print(f"gather on {name} (T, {heads}, {d}): fails: {str(e).splitlines()[0]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
