#!/usr/bin/env python3
"""Check that `fasa convert MODEL --to hf` writes a model Hugging Face transformers loads and runs
with fasa's logits.

  .venv/bin/python scripts/check_hf_export.py [--fasa bin/fasa] [--model models/...gguf]
                                              [--dtype f32] [--out DIR] [--tokens 300]

1. fasa convert MODEL --to hf -o DIR --dtype DTYPE   (DIR: a fresh directory under build/ unless
   --out is given; removed at the end unless --keep)
2. transformers AutoModelForCausalLM.from_pretrained(DIR) (float32, eager attention) and
   AutoTokenizer.from_pretrained(DIR): nothing but the exported files.
3. Prompt ids: a fixed text tokenised by the exported tokenizer, which must give the same ids as
   a tokenizer.json built independently from the GGUF vocabulary by scripts/tokenizer_check.py.
4. Logits at every prompt position from transformers on DIR, from `fasa run MODEL --mode full`
   (the original file) and from `fasa run DIR --mode full` (the export), plus 32 greedy tokens.

Pass: max|dlogit| <= 1e-3 * max|logit| for fasa(MODEL) and fasa(DIR) against transformers(DIR),
greedy tokens equal (with --dtype f16/bf16 only fasa(DIR) is checked: the export is rounded). Prints the figures; exit 0 pass, 1 fail, 77 ("skipped: ...") when the
reference packages are missing.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
REL_TOL = 1e-3

_THREADS = int(os.environ.get("FASA_REF_THREADS", "1") or 1)
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(_THREADS))
os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))

try:
    import numpy as np
    import tokenizers
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    sys.path.insert(0, HERE)
    import tokenizer_check
except Exception as e:  # ImportError, or a broken torch/numpy pairing
    print(f"skipped: reference not importable ({type(e).__name__}: {e}); run scripts/setup.sh --reference")
    sys.exit(77)

TEXT = (
    "The lighthouse at the end of the breakwater had not been kept by a person for almost forty "
    "years, yet every evening its lamp still turned on at dusk. In 1987 the harbour board paid "
    "$12,450.75 for a clockwork timer; it has run ever since, losing about 3 seconds a month.\n\n"
    "def checksum(data: bytes) -> int:\n    total = 0\n    for i, b in enumerate(data):\n"
    "        total = (total * 31 + b) & 0xFFFFFFFF\n    return total\n\n"
    "Shopping list: 2 loaves of rye bread, 500 g of butter, 12 eggs (free-range!), a jar of "
    "honey, and 3 tins of tomatoes. Don't forget: the shop closes at 17:30 on Saturdays. "
    "Questions? E-mail me at keeper@example.org or call +44 20 7946 0958. "
    "Ünïcödé wörds, naïve café crème brûlée, 東京 and Ελληνικά appear too, with emoji 🌊🚢. "
    "When the storm of 1953 came, the keeper's daughter climbed the 117 steps with a lantern, "
    "because the electric supply had failed, and kept the light turning by hand all night."
)


def rel(a, ref):
    return float(np.abs(a - ref).max() / np.abs(ref).max())


def fasa_run(fasa, model, ids_path, out_path, greedy):
    subprocess.run([fasa, "run", model, "--ids", ids_path, "-n", "0", "--mode", "full",
                    "--dump-logits", out_path], check=True, capture_output=True)
    r = subprocess.run([fasa, "run", model, "--ids", ids_path, "-n", str(greedy), "--mode", "full",
                        "--print-ids", "--ignore-eos"], check=True, capture_output=True, text=True)
    return [int(x) for x in r.stdout.split()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fasa", default=os.path.join(ROOT, "bin", "fasa"))
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--dtype", default="f32", choices=["f32", "f16", "bf16"])
    ap.add_argument("--out", help="export directory (must not exist); default: under build/")
    ap.add_argument("--keep", action="store_true", help="keep the export")
    ap.add_argument("--tokens", type=int, default=300, help="prompt tokens (default 300)")
    ap.add_argument("--greedy", type=int, default=32)
    a = ap.parse_args()
    if not os.path.exists(a.model):
        print(f"skipped: no model at {a.model}")
        return 77
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(_THREADS)
    os.makedirs(os.path.join(ROOT, "build"), exist_ok=True)
    work = tempfile.mkdtemp(prefix="check-hf-export-", dir=os.path.join(ROOT, "build"))
    out = a.out or os.path.join(work, "export")
    failures = []
    try:
        subprocess.run([a.fasa, "convert", a.model, "--to", "hf", "-o", out, "--dtype", a.dtype], check=True)
        print(f"export: {out}: " + ", ".join(sorted(os.listdir(out))))

        # tokenizer: the exported one vs one built independently from the GGUF vocabulary
        tok = AutoTokenizer.from_pretrained(out)
        ids = tok(TEXT * 3, add_special_tokens=False)["input_ids"]
        if a.model.endswith(".gguf"):
            v = tokenizer_check.gguf_vocab(a.model)
            ref_tok = tokenizers.Tokenizer.from_str(json.dumps(tokenizer_check.tokenizer_json(v, v["pre"] or "gpt2")))
            ref_ids = ref_tok.encode(TEXT * 3, add_special_tokens=False).ids
            same = ids == ref_ids
            print(f"tokenizer: {len(ids)} ids, {'identical to' if same else 'DIFFERENT from'} tokenizer_check.py's build")
            if not same:
                failures.append("tokenizer ids")
        ids = ids[:a.tokens]
        ids_path = os.path.join(work, "ids.txt")
        with open(ids_path, "w") as f:
            f.write(" ".join(map(str, ids)))

        model = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32, attn_implementation="eager").eval()
        with torch.no_grad():
            ref = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float().numpy()
            x, past, ref_greedy = torch.tensor([ids]), None, []
            for _ in range(a.greedy):
                r = model(input_ids=x, past_key_values=past, use_cache=True)
                past = r.past_key_values
                nxt = int(torch.argmax(r.logits[0, -1]).item())
                ref_greedy.append(nxt)
                x = torch.tensor([[nxt]])
        print(f"transformers {transformers.__version__}: {type(model).__name__}, {len(ids)} prompt tokens")

        for name, path in (("fasa on the original", a.model), ("fasa on the export", out)):
            lg_path = os.path.join(work, "logits.f32")
            g = fasa_run(a.fasa, path, ids_path, lg_path, a.greedy)
            lg = np.fromfile(lg_path, dtype=np.float32).reshape(ref.shape)
            d = rel(lg, ref)
            top1 = float((lg.argmax(1) == ref.argmax(1)).mean())
            ok = d <= REL_TOL and g == ref_greedy
            # A rounded export (f16/bf16) is not the original model: that row is for information.
            strict = path == out or a.dtype == "f32"
            print(f"{name:22s} vs transformers(export): max rel logit diff {d:.3e}, top-1 agreement "
                  f"{top1 * 100:.2f}%, greedy {a.greedy} {'equal' if g == ref_greedy else 'DIFFERENT'}"
                  f"  {('ok' if ok else 'FAIL') if strict else '(' + a.dtype + ' rounding; not checked)'}")
            if strict and not ok:
                failures.append(name)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
            if a.out:
                pass  # the user's directory stays
    print("pass" if not failures else "FAIL: " + ", ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
