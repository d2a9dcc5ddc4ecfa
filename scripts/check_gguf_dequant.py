#!/usr/bin/env python3
"""Cross-check formats/gguf.c's dequantisers against the `gguf` Python package.

Builds tests/tools/gguf_dump.c with the library's flags, then compares our dequantised values
with gguf.quants.dequantize
  1. for every type we read, on random blocks (random bytes, random finite f16 scales) and on
     blocks from our reference quantisers (gguf_dump --fixture), and
  2. for every tensor of every real GGUF file given (--model, repeatable; by default every
     models/*.gguf), on --rows rows per tensor spread over the tensor (0: every row).
Prints the max |diff| per type and per tensor, and exits 1 on any difference.

Tolerance: none (0). Both sides compute in float32 with the same operations in the same order
(step = d * scale, then step * q, then - dmin * min or + m), each rounded once: gguf.c turns off
the compiler's fusing of multiply-adds, numpy never fuses. So the values must be equal to the bit;
NaN and infinities count as equal only to themselves. Exit 0: all equal; 1: a difference or a
tensor we could not read; 77: the gguf package cannot be imported.

    .venv/bin/python scripts/check_gguf_dequant.py [--model FILE]... [--rows N] [--quiet]
"""
import argparse, glob, os, subprocess, sys, tempfile

try:
    import numpy as np
    from gguf import GGUFReader, GGML_QUANT_SIZES
    from gguf.quants import dequantize, quantize
except ImportError as e:   # the Criterion test skips on 77
    print(f"check_gguf_dequant: cannot import the gguf package: {e}", file=sys.stderr)
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build(tmp):
    exe = os.path.join(tmp, "gguf_dump")
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-std=gnu11", "-O2", "-march=native", "-Wall", "-Wextra", "-Werror",
                    "-Wno-unused-parameter", "-I" + os.path.join(ROOT, "formats"),
                    os.path.join(ROOT, "formats/base.c"), os.path.join(ROOT, "formats/gguf.c"),
                    os.path.join(ROOT, "tests/tools/gguf_dump.c"), "-lm", "-o", exe], check=True)
    return exe


def max_diff(got, ref):
    """Max |got - ref| with equal values (NaN to NaN, inf to inf) counting as 0; a NaN on one
    side only counts as inf."""
    same = (got == ref) | (np.isnan(got) & np.isnan(ref))
    if same.all():
        return 0.0
    d = np.abs(got[~same].astype(np.float64) - ref[~same].astype(np.float64))
    d[~np.isfinite(d)] = np.inf
    return float(d.max())


def pick(rows, n):
    n = rows if n <= 0 or n > rows else n
    return [i * rows // n for i in range(n)]


def reference(t, idx):
    """gguf-py's dequantisation of rows idx of tensor t, as (len(idx), ne0) float32."""
    block, size = GGML_QUANT_SIZES[t.tensor_type]
    ne0 = int(t.shape[0])
    raw = np.asarray(t.data).view(np.uint8).reshape(-1)
    rows = raw.reshape(-1, ne0 // block * size)[idx]
    return np.asarray(dequantize(rows, t.tensor_type), dtype=np.float32).reshape(len(idx), ne0)


def compare_file(exe, path, nrows, quiet):
    """Per tensor max |diff| over the chosen rows; returns ({type: worst}, [failures])."""
    reader = GGUFReader(path)
    out = subprocess.run([exe, "--rows", str(nrows), path], capture_output=True)
    if out.returncode != 0:
        msg = out.stderr.decode(errors="replace").strip()
        print(f"  ours failed: {msg}")
        return {}, [f"{path}: {msg}"]
    ours = np.frombuffer(out.stdout, dtype="<f4")
    pos, per_type, bad = 0, {}, []
    # gguf_dump walks tensors in info order, as GGUFReader lists them
    for t in reader.tensors:
        ne0 = int(t.shape[0])
        idx = pick(int(t.n_elements) // ne0, nrows)
        ref = reference(t, idx).reshape(-1)
        got = ours[pos:pos + ref.size]
        pos += ref.size
        if got.size != ref.size:
            bad.append(f"{path}: {t.name}: ours gave {got.size} values, expected {ref.size}")
            continue
        d = max_diff(got, ref)
        name = t.tensor_type.name
        per_type[name] = max(per_type.get(name, 0.0), d)
        if d != 0.0:
            bad.append(f"{path}: {t.name} ({name}): max |diff| {d:.3g}")
        if not quiet or d != 0.0:
            shape = "x".join(str(int(s)) for s in t.shape)
            print(f"  {t.name:40s} {name:6s} {shape:>14s} {len(idx):6d} rows  max |diff| {d:.3g}"
                  f"  (max |value| {float(np.nanmax(np.abs(ref))) if ref.size else 0:.3g})")
    if pos != ours.size:
        bad.append(f"{path}: ours gave {ours.size} values, gguf-py {pos}")
    return per_type, bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", help="a GGUF file (repeatable; default models/*.gguf)")
    ap.add_argument("--rows", type=int, default=16, help="rows per real tensor, spread out (0: all)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--quiet", action="store_true", help="per-tensor lines only for differences")
    args = ap.parse_args()
    models = args.model if args.model else sorted(glob.glob(os.path.join(ROOT, "models", "*.gguf")))
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(tmp)
        fixture = os.path.join(tmp, "fixture.gguf")
        subprocess.run([exe, "--fixture", fixture, str(args.seed)], check=True)
        reader = GGUFReader(fixture)
        ours = {}
        for t in reader.tensors:
            out = subprocess.run([exe, fixture, t.name], check=True, capture_output=True).stdout
            ours[t.name] = np.frombuffer(out, dtype="<f4")
        print("random blocks and reference-quantised blocks, ours vs gguf-py:")
        types = [t.name.split(".", 1)[1] for t in reader.tensors if t.name.startswith("rand.")]
        src = next(t for t in reader.tensors if t.name == "src")
        x = np.asarray(src.data, dtype=np.float32).reshape(-1, int(src.shape[0]))
        for ty in types:
            line = f"  {ty:6s}"
            for kind in ("rand", "quant"):
                t = next(t for t in reader.tensors if t.name == f"{kind}.{ty}")
                ref = reference(t, list(range(int(t.n_elements) // int(t.shape[0])))).reshape(-1)
                d = max_diff(ours[t.name], ref)
                if d != 0.0:
                    failures.append(f"{kind}.{ty}: max |diff| {d:.3g}")
                line += f"  {kind} max |diff| {d:.3g}"
            # information only: how far each reference quantiser lands from the data
            q = next(t for t in reader.tensors if t.name == f"quant.{ty}")
            mine = float(np.max(np.abs(ours[q.name].reshape(x.shape) - x)))
            try:
                theirs = f"{float(np.max(np.abs(dequantize(quantize(x, q.tensor_type), q.tensor_type) - x))):.3g}"
            except NotImplementedError:
                theirs = "n/a"
            print(f"{line}   quantisation error: ours {mine:.3g}, gguf-py {theirs}")

        for path in models:
            print(f"{path} ({'every row' if args.rows <= 0 else f'up to {args.rows} rows'} per tensor):")
            per_type, bad = compare_file(exe, path, args.rows, args.quiet)
            failures += bad
            print("  by type: " + ", ".join(f"{k} {v:.3g}" for k, v in sorted(per_type.items())))
        if not models:
            print("no real GGUF file given or found in models/")
    if failures:
        print(f"{len(failures)} mismatches:")
        for f in failures[:20]:
            print(f"  {f}")
        return 1
    print("all equal (max |diff| 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
