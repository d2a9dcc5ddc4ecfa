#!/usr/bin/env python3
"""Cross-check formats/gguf.c's dequantisers against the `gguf` Python package.

Builds tests/tools/gguf_dump.c with the library's flags, then compares our dequantised values
with gguf.quants.dequantize
  1. for every type we read, on random blocks (random bytes, random finite f16 scales) and on
     blocks from our reference quantisers (gguf_dump --fixture), and
  2. for every tensor of every real GGUF file given (--model, repeatable; by default every
     models/*.gguf), on --rows rows per tensor spread over the tensor (0: every row), our values
     streamed tensor by tensor from `gguf_dump --rows`.
Prints the max |diff| per type and per tensor, and exits 1 on any difference.

Tolerance: none (0). Every product in these dequantisers is exact in f32: an f16 scale has 11
significant bits, a sub-block scale at most 7 (Q6_K's int8) and a code at most 7 (IQ4's 127),
and no type multiplies more than 23 bits together. So the order of the multiplies and whether a
compiler fuses one with the add after it (FMA) cannot matter; the only rounding is the final
add or subtract of Q4_1/Q5_1 (+ m) and Q2_K/Q4_K/Q5_K (- dmin * min), the same single rounding
on both sides. The values must be equal to the bit. NaN and infinities count as equal only to
themselves. Exit 0: all equal; 1: a difference or a tensor we could not read; 77: the gguf
package cannot be imported.

    .venv/bin/python scripts/check_gguf_dequant.py [--model FILE]... [--rows N] [--quiet]
"""
import argparse, glob, os, struct, subprocess, sys, tempfile
from collections import namedtuple

try:
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
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


Tensor = namedtuple("Tensor", "name type shape data")   # shape: ne[0] first; data: the raw bytes


def tensors_of(path):
    """Every tensor of a GGUF file, from its header walked here: independent of gguf.c, and
    much faster than GGUFReader, which builds an array for every metadata string (14-21 s for
    a 150k-token vocabulary)."""
    buf = np.memmap(path, dtype=np.uint8, mode="r")
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0] if len(v) == 1 else v

    def string():
        nonlocal pos
        n = take("Q")
        pos += n
        return bytes(buf[pos - n:pos]).decode(errors="replace")

    def skip(vt):
        nonlocal pos
        if vt in SIZES:
            pos += SIZES[vt]
        elif vt == 8:
            string()
        elif vt == 9:
            et, n = take("IQ")
            if et in SIZES:
                pos += n * SIZES[et]
            else:
                for _ in range(n):
                    skip(et)
        else:
            raise ValueError(f"{path}: metadata value type {vt}")

    SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    magic, version, n_tensors, n_kv = take("4sIQQ")
    assert magic == b"GGUF" and version in (2, 3), f"{path}: not a GGUF v2/v3 file"
    align = 32
    for _ in range(n_kv):
        key, vt = string(), take("I")
        if key == "general.alignment" and vt == 4:
            align = take("I")
        else:
            skip(vt)
    infos = []
    for _ in range(n_tensors):
        name = string()
        shape = [take("Q") for _ in range(take("I"))]
        ty, off = take("IQ")
        infos.append((name, GGMLQuantizationType(ty), shape, off))
    start = (pos + align - 1) // align * align
    out = []
    for name, ty, shape, off in infos:
        block, size = GGML_QUANT_SIZES[ty]
        nbytes = int(np.prod(shape)) // block * size
        out.append(Tensor(name, ty, shape, buf[start + off:start + off + nbytes]))
    return out


def reference(t, idx):
    """gguf-py's dequantisation of rows idx of tensor t, as (len(idx), ne0) float32."""
    block, size = GGML_QUANT_SIZES[t.type]
    ne0 = t.shape[0]
    rows = np.asarray(t.data).reshape(-1, ne0 // block * size)[idx]
    return np.asarray(dequantize(rows, t.type), dtype=np.float32).reshape(len(idx), ne0)


def compare_file(exe, path, nrows, quiet):
    """Per tensor max |diff| over the chosen rows; returns ({type: worst}, [failures]). Our values
    are streamed one tensor at a time, so a multi-GB file is compared in bounded memory."""
    tensors = tensors_of(path)
    proc = subprocess.Popen([exe, "--rows", str(nrows), path], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    per_type, bad = {}, []
    for t in tensors:   # gguf_dump walks them in info order too
        ne0 = t.shape[0]
        idx = pick(int(np.prod(t.shape)) // ne0, nrows)
        ref = reference(t, idx).reshape(-1)
        raw = proc.stdout.read(4 * ref.size)
        got = np.frombuffer(raw, dtype="<f4")
        if got.size != ref.size:
            bad.append(f"{path}: {t.name}: ours gave {got.size} values, expected {ref.size}")
            break
        d = max_diff(got, ref)
        name = t.type.name
        per_type[name] = max(per_type.get(name, 0.0), d)
        if d != 0.0:
            bad.append(f"{path}: {t.name} ({name}): max |diff| {d:.3g}")
        if not quiet or d != 0.0:
            shape = "x".join(str(s) for s in t.shape)
            print(f"  {t.name:40s} {name:6s} {shape:>14s} {len(idx):6d} rows  max |diff| {d:.3g}"
                  f"  (max |value| {float(np.nanmax(np.abs(ref))) if ref.size else 0:.3g})")
    extra = len(proc.stdout.read())
    err = proc.stderr.read().decode(errors="replace").strip()
    if proc.wait() != 0:
        print(f"  ours failed: {err}")
        bad.append(f"{path}: {err}")
    elif extra:
        bad.append(f"{path}: ours gave {extra // 4} values more than gguf-py")
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
        tensors = {t.name: t for t in tensors_of(fixture)}
        print("random blocks and reference-quantised blocks, ours vs gguf-py:")
        src = tensors["src"]
        x = np.asarray(src.data).view("<f4").reshape(-1, src.shape[0])
        for ty in [n.split(".", 1)[1] for n in tensors if n.startswith("rand.")]:
            line = f"  {ty:6s}"
            for kind in ("rand", "quant"):
                t = tensors[f"{kind}.{ty}"]
                out = subprocess.run([exe, fixture, t.name], check=True, capture_output=True).stdout
                ours = np.frombuffer(out, dtype="<f4")
                ref = reference(t, list(range(int(np.prod(t.shape)) // t.shape[0]))).reshape(-1)
                d = max_diff(ours, ref)
                if d != 0.0:
                    failures.append(f"{kind}.{ty}: max |diff| {d:.3g}")
                line += f"  {kind} max |diff| {d:.3g}"
            # information only: how far each reference quantiser lands from the data
            mine = float(np.max(np.abs(ours.reshape(x.shape) - x)))
            try:
                theirs = f"{float(np.max(np.abs(dequantize(quantize(x, t.type), t.type) - x))):.3g}"
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
