#!/usr/bin/env python3
"""Check fasa's logits and greedy tokens against the independent reference (ref_logits.py).

  .venv/bin/python scripts/verify_logits.py --fasa bin/fasa [--model models/...gguf]

For each fixed prompt (ChatML chat, prose, code, a list, a long instruction, numbers and
punctuation; each >= 200 tokens, tokenised with Hugging Face `tokenizers`):
  - logits at every prompt position:  fasa run MODEL --ids F --dump-logits OUT.f32 -n 0 --mode full --kv-type f32
  - 64 greedy tokens:                 fasa run MODEL --ids F -n 64 --temp 0 --print-ids --mode full --kv-type f32
and the same from transformers (float32, dequantised weights). Reference outputs are cached in
build/ref/ keyed by a hash of (model sha256, ids, reference version).

Pass: per prompt max|dlogit| <= 1e-3 * max|logit| and greedy tokens identical; top-1 agreement
>= 99.9% over all positions of all prompts. The last line counts these checks ("N passed, N
failed": one per prompt plus the pooled top-1). Exit 0 pass, 1 fail, 77 with "skipped: <reason>" when the reference
(or the model) is not available.

--kv-type f16 checks the f16 KV cache (fasa run's default) the same way; rounding keys and
values to f16 moves logits by about 1e-3 of the max, so its checks are reported, not required
(make verify runs the f32 check).
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
REF_VERSION = "ref-v1"  # bump when ref_logits.py changes what it computes
REL_TOL = 1e-3
KV_TYPE = "f32"   # --kv-type
EXACT = []        # --exact: ["--exact"]
TOP1_MIN = 0.999
MIN_TOKENS = 200


def skip(reason):
    print(f"skipped: {reason}")
    sys.exit(77)


try:
    sys.path.insert(0, HERE)
    import numpy as np
    import ref_logits  # sets thread env before torch is imported
    import gguf  # noqa: F401
    import tokenizers  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
except Exception as e:  # ImportError, or a broken torch/numpy pairing
    skip(f"reference not importable ({type(e).__name__}: {e}); run scripts/setup.sh --reference")


# --------------------------------------------------------------------------------------------
# prompts (fixed; changing one changes its ids and so its cache key)
# --------------------------------------------------------------------------------------------
def _prompts():
    chat = [
        {"role": "system", "content": "You are a patient assistant who explains things to "
                                      "curious people in plain words, with short examples."},
        {"role": "user", "content": "My grandmother keeps a vegetable garden and she asked me "
                                    "why her tomatoes split open after a heavy rain. What is "
                                    "going on, and can she do anything about it?"},
        {"role": "assistant", "content": "Tomatoes split when the fruit takes up water faster "
                                         "than its skin can stretch. After a dry spell the skin "
                                         "becomes less elastic, so a sudden soaking makes the "
                                         "inside swell and the skin cracks, usually in rings "
                                         "around the stem or in lines down the side. Steady "
                                         "watering helps most: a deep soak every few days "
                                         "instead of a little every day, and a layer of mulch "
                                         "to keep the soil evenly moist. Picking the fruit "
                                         "just as it starts to colour, before a forecast "
                                         "downpour, also saves many of them."},
        {"role": "user", "content": "Thanks! She also wants to know whether the split ones are "
                                    "still safe to eat, and which varieties crack less. Could "
                                    "you answer both in a few sentences?"},
    ]
    prose = (
        "The lighthouse at the end of the breakwater had not been kept by a person for "
        "almost forty years, yet every evening its lamp still turned on at dusk, as if "
        "someone climbed the spiral stairs to light it. The children of the harbour town "
        "told each other that the old keeper had never really left. Their parents knew "
        "the truth was duller: a timer, a bank of batteries, and a small panel of solar "
        "cells bolted to the railing of the gallery. Still, nobody in town quite believed "
        "the dull version either. On winter nights, when the wind came in from the north "
        "and the spray reached the top of the wall, the beam seemed to linger a little "
        "longer over the fishing boats that were late coming home. Marta, who ran the "
        "bakery on the corner of the square, said her father had been one of those late "
        "boats in the great storm of 1962, and that he swore the light had stopped "
        "turning altogether and simply pointed at him, steady and bright, until he was "
        "safely inside the harbour mouth. She told the story every year, on the first "
        "cold morning of November, while the bread was still too hot to cut, and every "
        "year the customers who had heard it twenty times listened as if it were new."
    )
    code = '''#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A tiny growable array of integers, with binary search over a sorted copy. */
typedef struct {
    int *data;
    size_t len, cap;
} intvec;

static int intvec_push(intvec *v, int x)
{
    if (v->len == v->cap) {
        size_t ncap = v->cap ? v->cap * 2 : 16;
        int *p = realloc(v->data, ncap * sizeof *p);
        if (!p)
            return -1;
        v->data = p;
        v->cap = ncap;
    }
    v->data[v->len++] = x;
    return 0;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static long find(const int *a, size_t n, int key)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (a[mid] < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (lo < n && a[lo] == key) ? (long)lo : -1;
}

int main(void)
{
    intvec v = {0};
    for (int i = 0; i < 100; i++)
        if (intvec_push(&v, (i * 37) % 101) != 0)
            return 1;
    qsort(v.data, v.len, sizeof *v.data, cmp_int);
    printf("%ld\\n", find(v.data, v.len, 42));
    free(v.data);
    return 0;
}
'''
    lst = (
        "Packing list for a four-day hiking trip in the mountains (late September):\n\n"
        "1. Backpack, 45 litres, with a rain cover\n"
        "2. Tent (2-person, 1.8 kg), footprint and 8 pegs\n"
        "3. Sleeping bag rated to -5 °C and an inflatable mat\n"
        "4. Stove, one 230 g gas canister, lighter and a spare box of matches\n"
        "5. Pot (900 ml), spoon, mug, and a small sponge\n"
        "6. Food: 4 breakfasts, 4 lunches, 3 dinners, plus 600 g of snacks\n"
        "7. Water: two 1-litre bottles and a filter\n"
        "8. Clothes: base layer, fleece, down jacket, waterproof jacket and trousers\n"
        "9. Hat, gloves, 3 pairs of socks, sunglasses\n"
        "10. Map (1:25,000), compass, phone with offline maps, power bank (10,000 mAh)\n"
        "11. First-aid kit: plasters, blister pads, ibuprofen, tape, tweezers\n"
        "12. Headlamp with spare batteries\n"
        "13. Sun cream (SPF 50) and lip balm\n"
        "14. Trowel, toilet paper, and a bag to carry rubbish out\n"
        "15. Knife, repair tape, and 5 m of cord\n\n"
        "Total weight without food and water: about 9.5 kg. Check the forecast on the "
        "evening before leaving, and tell someone the route and the expected return time."
    )
    instruction = [
        {"role": "user", "content": (
            "I need you to write a short report for the members of our community choir. "
            "Please follow these instructions carefully. First, open with a single sentence "
            "that thanks everyone for coming to the spring concert, which took place on "
            "Saturday in the old town hall and raised money for the local food bank. Second, "
            "give the results: we sold 212 tickets at 8 euros each, received 315 euros in "
            "donations at the door, and spent 140 euros on hiring the hall and 62 euros on "
            "printing programmes; state the net amount given to the food bank. Third, mention "
            "that rehearsals restart on the first Tuesday of next month at 7:30 in the "
            "evening, and that new members who can read a little music are especially "
            "welcome in the tenor and bass sections. Fourth, ask people to reply by Friday if "
            "they can help carry chairs for the summer open-air concert. Keep the tone warm "
            "but not gushing, use plain language, do not use bullet points, and keep the "
            "whole report under 200 words. Finally, sign it from the choir committee.")},
    ]
    mixed = (
        "Q3 results, unaudited (all figures in thousands of EUR unless noted):\n"
        "Revenue: 12,480 (Q2: 11,905; +4.8%). Gross margin: 41.2% (Q2: 40.7%).\n"
        "Operating costs: 3,917 -> 4,066 (+3.8%), driven by hiring (+14 FTE) and rent.\n"
        "EBITDA: 1,228; net income: 604; EPS: 0.37 EUR (diluted 0.36).\n"
        "Cash at 30 Sept: 8,311 vs 7,950 at 30 June; no debt drawn on the 5,000 facility.\n"
        "Guidance for FY: revenue 48.5-49.5 M, margin >= 40%.\n\n"
        "Notes: (a) Figures rounded; totals may not add up. (b) The Zürich office opened on "
        "2 August; the café project in Malmö was paused. (c) \"Customers\" means active "
        "accounts with >1 order in 90 days - 18,204 at quarter end (+6.1% q/q).\n"
        "Contact: investors@example.com, +44 20 7946 0958, ext. 214; https://example.com/ir?"
        "q=3&y=2024#results. Emoji check: ok ✓, warn ⚠, rain ☔. Math: e^(iπ) + 1 = 0; "
        "√2 ≈ 1.41421356; 3/7 ≈ 0.428571; 2^10 = 1024; 0xFF = 255; 1e-6 s = 1 µs."
    )
    return [
        ("chat", "chat", chat),
        ("prose", "text", prose),
        ("code", "text", code),
        ("list", "text", lst),
        ("instruction", "chat", instruction),
        ("mixed", "text", mixed),
    ]


def build_prompts(g):
    tok = ref_logits.build_tokenizer(g)
    out = []
    for name, kind, body in _prompts():
        text = ref_logits.chatml(g, body) if kind == "chat" else body
        ids = tok.encode(text, add_special_tokens=False).ids
        if len(ids) < MIN_TOKENS:
            raise SystemExit(f"verify: prompt {name} has only {len(ids)} tokens (< {MIN_TOKENS})")
        out.append((name, ids))
    return out, tok


# --------------------------------------------------------------------------------------------
# reference, with a cache
# --------------------------------------------------------------------------------------------
def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


class RefCache:
    def __init__(self, model, model_sha, cache_dir, n_greedy, use_cache=True):
        self.model, self.model_sha, self.dir = model, model_sha, cache_dir
        self.n_greedy, self.use_cache = n_greedy, use_cache
        self.ref = None
        self.computed = 0
        os.makedirs(cache_dir, exist_ok=True)

    def _key(self, ids):
        h = hashlib.sha256()
        h.update(f"{REF_VERSION}\n{self.model_sha}\n{self.n_greedy}\n".encode())
        h.update(" ".join(map(str, ids)).encode())
        return h.hexdigest()[:32]

    def get(self, ids):
        """(logits float32 (n, vocab), greedy ids list)."""
        key = self._key(ids)
        lp = os.path.join(self.dir, key + ".logits.f32")
        mp = os.path.join(self.dir, key + ".json")
        if self.use_cache and os.path.exists(lp) and os.path.exists(mp):
            with open(mp) as f:
                meta = json.load(f)
            if meta.get("n_pos") == len(ids):
                lg = np.fromfile(lp, dtype="<f4")
                if lg.size == meta["n_pos"] * meta["n_vocab"]:
                    return lg.reshape(meta["n_pos"], meta["n_vocab"]), meta["greedy"]
        if self.ref is None:
            t = time.time()
            self.ref = ref_logits.Reference(self.model)
            print(f"verify: reference model loaded in {time.time() - t:.1f}s", file=sys.stderr)
        lg = self.ref.logits(ids)
        greedy = self.ref.greedy(ids, self.n_greedy)
        self.computed += 1
        tmp = lp + ".tmp"
        lg.astype("<f4").tofile(tmp)
        os.replace(tmp, lp)
        meta = {"version": REF_VERSION, "model_sha256": self.model_sha, "n_pos": len(ids),
                "n_vocab": int(lg.shape[1]), "greedy": greedy,
                "torch": torch.__version__, "transformers": transformers.__version__}
        with open(mp + ".tmp", "w") as f:
            json.dump(meta, f)
        os.replace(mp + ".tmp", mp)
        return lg, greedy


# --------------------------------------------------------------------------------------------
# fasa
# --------------------------------------------------------------------------------------------
class FasaError(Exception):
    pass


def run_fasa(cmd, timeout):
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise FasaError(f"timed out after {timeout}s: {' '.join(cmd)}")
    except OSError as e:
        raise FasaError(f"cannot run {cmd[0]}: {e}")
    if p.returncode != 0:
        err = p.stderr.decode(errors="replace").strip().splitlines()[-5:]
        raise FasaError(f"exit {p.returncode}: {' '.join(cmd)}\n    " + "\n    ".join(err))
    return p.stdout.decode(errors="replace")


def fasa_logits(fasa, model, ids_file, out, n_pos, n_vocab, timeout):
    run_fasa([fasa, "run", model, "--ids", ids_file, "--dump-logits", out, "-n", "0",
              "--mode", "full", "--kv-type", KV_TYPE] + EXACT, timeout)
    a = np.fromfile(out, dtype="<f4")
    if a.size != n_pos * n_vocab:
        raise FasaError(f"--dump-logits wrote {a.size} floats, want {n_pos} x {n_vocab}")
    return a.reshape(n_pos, n_vocab)


def fasa_greedy(fasa, model, ids_file, n, timeout):
    out = run_fasa([fasa, "run", model, "--ids", ids_file, "-n", str(n), "--temp", "0",
                    "--print-ids", "--mode", "full", "--kv-type", KV_TYPE] + EXACT, timeout)
    try:
        return [int(x) for x in out.split()]
    except ValueError:
        raise FasaError(f"--print-ids printed non-integers: {out[:200]!r}")


# --------------------------------------------------------------------------------------------
def greedy_match(ref, got, stop_ids):
    """(equal, note). fasa may stop at end-of-turn: a prefix of the reference that ends at a
    stop token, or that stops just before one, counts as equal."""
    if got == ref:
        return True, ""
    k = len(got)
    if 0 < k < len(ref) and got == ref[:k]:
        if got[-1] in stop_ids:
            return True, f"stopped at eos after {k}"
        if ref[k] in stop_ids:
            return True, f"stopped before eos at {k}"
    return False, ""


def compare(name, ref_lg, ref_greedy, got_lg, got_greedy, stop_ids=()):
    d = np.abs(got_lg.astype(np.float64) - ref_lg.astype(np.float64))
    max_d = float(d.max())
    worst = np.unravel_index(int(d.argmax()), d.shape)
    max_l = float(np.abs(ref_lg).max())
    ra, ga = ref_lg.argmax(1), got_lg.argmax(1)
    agree = int((ra == ga).sum())
    # disagreements where the reference's own top-2 gap is below the logit tolerance
    tol = REL_TOL * max_l
    near = 0
    for i in np.nonzero(ra != ga)[0]:
        if ref_lg[i, ra[i]] - ref_lg[i, ga[i]] <= tol:
            near += 1
    r = {"name": name, "n": int(ref_lg.shape[0]), "max_d": max_d, "max_l": max_l,
         "ratio": max_d / max_l if max_l > 0 else float("inf"),
         "worst_pos": int(worst[0]), "worst_tok": int(worst[1]),
         "top1": agree, "top1_near_ties": near, "greedy_first_diff": None}
    r["greedy_equal"], r["greedy_note"] = greedy_match(ref_greedy, got_greedy, stop_ids)
    if not r["greedy_equal"]:
        k = next((i for i, (a, b) in enumerate(zip(got_greedy, ref_greedy)) if a != b),
                 min(len(got_greedy), len(ref_greedy)))
        r["greedy_first_diff"] = k
    r["pass_logits"] = r["ratio"] <= REL_TOL
    return r


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fasa", required=True, help="path to the fasa binary")
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--cache-dir", default=os.path.join(ROOT, "build", "ref"))
    ap.add_argument("--no-cache", action="store_true", help="recompute the reference")
    ap.add_argument("--greedy", type=int, default=64, metavar="N")
    ap.add_argument("--only", action="append", metavar="NAME", help="run only these prompts")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per fasa run")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON")
    ap.add_argument("--list", action="store_true", help="print the prompts' names, sizes, text")
    ap.add_argument("--keep", metavar="DIR", help="keep fasa's outputs and the ids files here")
    ap.add_argument("--kv-type", choices=("f32", "f16"), default="f32", help="fasa's KV cache type (default f32)")
    ap.add_argument("--exact", action="store_true",
                    help="fasa run --exact: weight products in f32 over dequantised rows, the reference's "
                         "arithmetic (the fast kernels round activations: 16-bit per 32 values for Q4_0..Q8_0, "
                         "8-bit per 256 for the K types, as llama.cpp does)")
    a = ap.parse_args(argv)
    global KV_TYPE, EXACT
    KV_TYPE = a.kv_type
    EXACT = ["--exact"] if a.exact else []

    if not os.path.exists(a.model):
        skip(f"model {a.model} not found; run scripts/setup.sh")
    t0 = time.time()
    g = ref_logits.GGUFModel(a.model)
    prompts, tok = build_prompts(g)
    if a.only:
        unknown = set(a.only) - {n for n, _ in prompts}
        if unknown:
            ap.error(f"unknown prompt(s): {', '.join(sorted(unknown))}")
        prompts = [(n, ids) for n, ids in prompts if n in a.only]
    if a.list:
        for n, ids in prompts:
            print(f"== {n} ({len(ids)} tokens)\n{tok.decode(ids, skip_special_tokens=False)}")
        return 0
    fasa = a.fasa if os.sep in a.fasa else (os.path.join(".", a.fasa)
                                            if os.path.exists(a.fasa) else a.fasa)
    if os.sep in fasa and not os.access(fasa, os.X_OK):
        print(f"verify: FAIL: fasa binary {fasa} not found or not executable")
        return 1

    types = g.meta("tokenizer.ggml.token_type") or []
    stop_ids = {i for i, t in enumerate(types) if t == 3}  # control tokens (eos, im_end, ...)
    eos = g.meta("tokenizer.ggml.eos_token_id")
    if eos is not None:
        stop_ids.add(int(eos))
    model_sha = file_sha256(a.model)
    cache = RefCache(a.model, model_sha, a.cache_dir, a.greedy, use_cache=not a.no_cache)
    work = a.keep or tempfile.mkdtemp(prefix="fasa-verify-")
    os.makedirs(work, exist_ok=True)
    n_vocab = None
    results = []
    hdr = (f"{'prompt':<12} {'n':>5} {'max|dlogit|':>12} {'max|logit|':>10} {'ratio':>9} "
           f"{'top1':>13} {'greedy64':>9}  result")
    print(f"verify: model {os.path.basename(a.model)} sha256 {model_sha[:16]}..., fasa {fasa}")
    print(hdr)
    for name, ids in prompts:
        ref_lg, ref_greedy = cache.get(ids)
        n_vocab = ref_lg.shape[1]
        ids_file = os.path.join(work, f"{name}.ids")
        with open(ids_file, "w") as f:
            f.write(" ".join(map(str, ids)) + "\n")
        try:
            t = time.time()
            got_lg = fasa_logits(fasa, a.model, ids_file, os.path.join(work, f"{name}.f32"),
                                 len(ids), n_vocab, a.timeout)
            t_logits = time.time() - t
            t = time.time()
            got_greedy = fasa_greedy(fasa, a.model, ids_file, a.greedy, a.timeout)
            t_greedy = time.time() - t
        except FasaError as e:
            print(f"{name:<12} {len(ids):>5}  fasa failed: {e}")
            results.append({"name": name, "n": len(ids), "error": str(e)})
            continue
        r = compare(name, ref_lg, ref_greedy, got_lg, got_greedy, stop_ids)
        r["fasa_seconds"] = {"logits": round(t_logits, 2), "greedy": round(t_greedy, 2)}
        r["ref_greedy"], r["fasa_greedy"] = ref_greedy, got_greedy
        ok = r["pass_logits"] and r["greedy_equal"]  # top-1 is judged over all prompts
        r["pass"] = ok
        results.append(r)
        top1 = f"{r['top1']}/{r['n']}"
        gr = ("yes" if not r["greedy_note"] else f"yes:{len(got_greedy)}") \
            if r["greedy_equal"] else f"no@{r['greedy_first_diff']}"
        print(f"{name:<12} {r['n']:>5} {r['max_d']:>12.3e} {r['max_l']:>10.3f} "
              f"{r['ratio']:>9.2e} {top1:>13} {gr:>9}  {'ok' if ok else 'FAIL'}")
        if r["greedy_note"]:
            print(f"    greedy: fasa {r['greedy_note']} tokens; equal to the reference so far")
        if not r["pass_logits"]:
            print(f"    worst |dlogit| at position {r['worst_pos']}, token {r['worst_tok']}")
        if r["top1"] < r["n"]:
            print(f"    {r['n'] - r['top1']} top-1 disagreement(s), {r['top1_near_ties']} "
                  f"where the reference's top-2 gap <= {REL_TOL:g} * max|logit|")
        if not r["greedy_equal"]:
            k = r["greedy_first_diff"]
            print(f"    greedy diverges at step {k}: ref {ref_greedy[k:k + 8]} "
                  f"fasa {got_greedy[k:k + 8]}")
            print(f"    ref : {tok.decode(ref_greedy, skip_special_tokens=False)!r}")
            print(f"    fasa: {tok.decode(got_greedy, skip_special_tokens=False)!r}")

    good = [r for r in results if "error" not in r]
    tot_n = sum(r["n"] for r in good)
    tot_top1 = sum(r["top1"] for r in good)
    logits_ok = bool(good) and len(good) == len(results) and all(r["pass_logits"] for r in good)
    top1_ok = tot_n > 0 and tot_top1 >= TOP1_MIN * tot_n
    greedy_ok = bool(good) and all(r["greedy_equal"] for r in good)
    ok = logits_ok and top1_ok and greedy_ok
    if tot_n:
        print(f"overall: top-1 agreement {tot_top1}/{tot_n} = {100.0 * tot_top1 / tot_n:.3f}% "
              f"(need >= {100 * TOP1_MIN:.1f}%); logits within {REL_TOL:g} * max|logit|: "
              f"{'yes' if logits_ok else 'no'}; greedy-{a.greedy} equal: "
              f"{'yes' if greedy_ok else 'no'}")
    print(f"verify: {'PASS' if ok else 'FAIL'} ({time.time() - t0:.0f}s; "
          f"reference computed for {cache.computed} prompt(s), cached for "
          f"{len(prompts) - cache.computed})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"pass": ok, "model_sha256": model_sha, "results": results}, f, indent=1)
    # checks: one per prompt (logits + greedy) and the pooled top-1 agreement
    n_pass = sum(1 for r in results if r.get("pass")) + (1 if top1_ok else 0)
    print(f"{n_pass} passed, {len(results) + 1 - n_pass} failed")
    if not a.keep:
        for fn in os.listdir(work):
            os.unlink(os.path.join(work, fn))
        os.rmdir(work)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
