#!/usr/bin/env python3
"""llama.cpp (llama-cpp-python) and fasa on the same GGUF file, the same token ids, the same thread
count and both with an f16 KV cache, side by side in one run.

The ids: BOS, then the Debian license texts as llama.cpp tokenises them, repeated to length; fasa
reads the same ids from a file (`fasa bench --ids`). Then, in alternating rounds (a busy minute
on a shared machine falls on both engines alike):

  prefill   each engine evaluates the first --prefill ids from an empty cache (llama.cpp in
            batches of 512, fasa as `fasa run` prefills); tok/s, median over --prefill-repeats.
  decode    for each depth D in --depths, llama.cpp evaluates D ids once and times --steps
            greedy single-token steps, restoring the cache to the D ids before each repeat;
            fasa runs its speed task at D (a real prefill of 512 ids tiled to D: decode cost
            does not depend on what the cache holds) with full attention and, when the model has
            a calibration profile, fasa-c (what `fasa run` does by default). Per round, llama.cpp
            runs --repeats timed decodes, then fasa one process with --repeats; medians over
            --rounds rounds.

fasa measures the machine's read bandwidth at its start (`fasa bench --task speed`); the
roofline fraction of each engine is the bytes a decode step must read (weights plus the f16 KV
rows of full attention, as fasa counts them) times tok/s over that bandwidth.

    fasa bench MODEL --task speed --ids IDS --depths D --policy full,fasa-c --threads T \
        --steps N --repeats R --json

Exit status: 0 when both halves ran, 1 when either failed (llama.cpp's numbers are still printed
when fasa fails), 2 for a usage error. Needs llama-cpp-python in the running Python
(scripts/setup-llamacpp.sh installs it into .venv).
"""

import argparse
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
DEFAULT_FASA = os.path.join(ROOT, "bin", "fasa")
LICENSE_GLOB = "/usr/share/common-licenses/*"


def log(msg):
    print(f"bench-compare: {msg}", file=sys.stderr, flush=True)


def parse_depths(text):
    try:
        depths = [int(x) for x in text.split(",") if x.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}")
    if not depths or any(d < 0 for d in depths):
        raise argparse.ArgumentTypeError(f"depths must be integers >= 0: {text!r}")
    return depths


def positive(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}")
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {text!r}")
    return v


def loadavg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def environment():
    prefixes = ("OMP_", "GOMP_", "KMP_", "GGML_", "LLAMA_", "OPENBLAS_", "FASA_")
    keys = sorted(k for k in os.environ if k.startswith(prefixes) or k == "MKL_NUM_THREADS")
    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "cpu": cpu_model(),
        "nproc": os.cpu_count(),
        "loadavg_start": loadavg(),
        "nice": os.nice(0),
        "python": platform.python_version(),
        "fasa_commit": commit,
        "env": {k: os.environ[k] for k in keys},
    }


# ---------------------------------------------------------------------------------------------
# llama.cpp half
# ---------------------------------------------------------------------------------------------

def prompt_tokens(llm, depth):
    """depth token ids: BOS then the Debian license texts, tokenised and repeated to length."""
    bos = llm.token_bos()
    if bos is None or bos < 0:
        bos = 0
    if depth <= 1:
        return [bos][:max(depth, 1)]
    text = []
    for path in sorted(glob.glob(LICENSE_GLOB)):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text.append(f.read())
        except OSError:
            continue
    body = []
    if text:
        body = llm.tokenize("\n\n".join(text).encode("utf-8"), add_bos=False, special=False)
    if not body:
        # No license texts: deterministic ids from the vocabulary (an LCG), avoiding id 0..15,
        # where control tokens usually sit.
        n_vocab, x = llm.n_vocab(), 12345
        for _ in range(depth):
            x = (1103515245 * x + 12345) & 0x7FFFFFFF
            body.append(16 + x % (n_vocab - 16))
    toks = [bos]
    while len(toks) < depth:
        toks.extend(body[: depth - len(toks)])
    return toks


def median(xs):
    return statistics.median(xs) if xs else None


class Llama:
    """llama.cpp through llama-cpp-python: one context, a prompt evaluated once per depth."""

    def __init__(self, model, n_ctx, threads, flash_attn):
        import llama_cpp
        import numpy as np
        self.np = np
        self.info = {
            "llama_cpp_python": llama_cpp.__version__,
            "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
            "kv_type": "f16", "n_batch": 512, "flash_attn": flash_attn, "n_ctx": n_ctx,
        }
        t0 = time.perf_counter()
        # type_k / type_v 1 = GGML_TYPE_F16, as fasa's default cache
        self.llm = llama_cpp.Llama(model_path=model, n_ctx=n_ctx, n_threads=threads,
                                   n_threads_batch=threads, n_batch=512, logits_all=False,
                                   flash_attn=flash_attn, type_k=1, type_v=1, verbose=False)
        self.info["load_s"] = round(time.perf_counter() - t0, 3)
        self.n_vocab = self.llm.n_vocab()
        self.base = 0
        self.first = 0

    def argmax(self):
        # with logits_all=False llama-cpp-python does not copy the logits into llm.scores
        row = self.np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.n_vocab,))
        return int(self.np.argmax(row))

    def prefill(self, ids):
        self.llm.reset()
        t0 = time.perf_counter()
        self.llm.eval(ids)
        secs = time.perf_counter() - t0
        self.base, self.first = self.llm.n_tokens, self.argmax()
        return secs

    def decode(self, n):
        self.llm.n_tokens = self.base  # the next eval drops cache entries past the prompt
        tok = self.first
        t0 = time.perf_counter()
        for _ in range(n):
            self.llm.eval([tok])
            tok = self.argmax()
        return n / (time.perf_counter() - t0)


# ---------------------------------------------------------------------------------------------
# fasa half
# ---------------------------------------------------------------------------------------------

def run_fasa(fasa, model, ids_file, depth, policies, threads, steps, repeats, fill=None, extra=()):
    """One `fasa bench --task speed` process at one depth: its JSON rows, or raises RuntimeError."""
    cmd = [fasa, "bench", model, "--task", "speed", "--ids", ids_file, "--depths", str(depth),
           "--policy", ",".join(policies), "--threads", str(threads), "--steps", str(steps),
           "--repeats", str(repeats), "--json"] + (["--fill", str(fill)] if fill else []) + list(extra)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise RuntimeError(f"could not run fasa: {e}")
    if p.returncode != 0:
        why = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "(no message)"
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {why}")
    try:
        rows = json.loads(p.stdout)
    except json.JSONDecodeError as e:
        raise RuntimeError(f"fasa printed no JSON list on stdout ({e})")
    return {r["policy"]: r for r in rows if isinstance(r, dict) and "decode_tok_s" in r}


def has_profile(model):
    return os.path.isfile(os.path.splitext(model)[0] + ".profile.json")


# ---------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(
        description="llama.cpp beside fasa: prefill and decode tok/s on the same GGUF, ids and threads.")
    ap.add_argument("--model", default=DEFAULT_MODEL, help="GGUF file (default: %(default)s)")
    ap.add_argument("--fasa", default=DEFAULT_FASA, help="fasa binary (default: %(default)s)")
    ap.add_argument("--depths", type=parse_depths, default=[0, 8192],
                    help="cache depths, comma-separated (default: 0,8192)")
    ap.add_argument("--prefill", type=int, default=2048,
                    help="prompt tokens of the prefill comparison (0: none; default 2048)")
    ap.add_argument("--prefill-repeats", type=positive, default=3,
                    help="prefills per engine; the median counts (default 3)")
    ap.add_argument("--threads", "-t", type=positive, default=2, help="threads (default: 2)")
    ap.add_argument("--steps", type=positive, default=64,
                    help="decode steps per repeat, both engines (default: 64)")
    ap.add_argument("--repeats", type=positive, default=3,
                    help="timed decodes per engine per round (default: 3)")
    ap.add_argument("--rounds", type=positive, default=3,
                    help="alternating rounds per depth; medians over all of them (default: 3)")
    ap.add_argument("--warmup", type=int, default=8,
                    help="untimed llama.cpp decode steps after each prompt (default: 8)")
    ap.add_argument("--policy", default=None,
                    help="fasa's policies (default: full, and fasa-c when the model has a profile)")
    ap.add_argument("--flash-attn", action="store_true",
                    help="llama.cpp with flash attention (default off, llama-cpp-python's default)")
    ap.add_argument("--fasa-arg", action="append", default=[], metavar="ARG",
                    help="extra argument for fasa bench (repeatable)")
    ap.add_argument("--json", action="store_true",
                    help="print the result as JSON on stdout (the table goes to stderr)")
    args = ap.parse_args()
    if args.warmup < 0 or args.prefill < 0:
        ap.error("--warmup and --prefill must be >= 0")
    if not os.path.isfile(args.model):
        log(f"no model file {args.model} (scripts/setup.sh installs the default; "
            f"scripts/fetch-model.sh the others)")
        return 1
    if not (os.path.isfile(args.fasa) and os.access(args.fasa, os.X_OK)):
        log(f"{args.fasa} is not an executable file (make bin/fasa)")
        return 1
    policies = args.policy.split(",") if args.policy else \
        ["full"] + (["fasa-c"] if has_profile(args.model) else [])
    if "full" not in policies:
        policies = ["full"] + policies

    env = environment()
    need = max(max(args.depths), args.prefill, 512) + args.steps + args.warmup + 64
    out = {"model": os.path.abspath(args.model), "threads": args.threads, "depths": args.depths,
           "prefill": args.prefill, "steps": args.steps, "repeats": args.repeats,
           "rounds": args.rounds, "policies": policies, "environment": env}
    try:
        llama = Llama(args.model, need, args.threads, args.flash_attn)
    except ImportError as e:
        log(f"llama-cpp-python is not importable here ({e}); run scripts/setup-llamacpp.sh "
            f"and use .venv/bin/python")
        return 1
    out["llama_cpp"] = llama.info
    ids = prompt_tokens(llama.llm, need)
    fd, ids_file = tempfile.mkstemp(prefix="bench-compare-", suffix=".ids")
    with os.fdopen(fd, "w") as f:
        f.write(" ".join(map(str, ids)) + "\n")
    status = 0
    try:
        if args.prefill:
            lt, ft = [], []
            for r in range(args.prefill_repeats):
                secs = llama.prefill(ids[:args.prefill])
                lt.append(args.prefill / secs)
                rows = run_fasa(args.fasa, args.model, ids_file, args.prefill, ["full"], args.threads,
                                1, 1, fill=args.prefill, extra=args.fasa_arg)
                ft.append(rows["full"]["prefill_tok_s"])
                log(f"prefill {args.prefill} tokens, round {r + 1}: llama.cpp {lt[-1]:.1f} tok/s, "
                    f"fasa {ft[-1]:.1f} tok/s")
            out["prefill_rows"] = {"llama_cpp_tok_s": lt, "fasa_tok_s": ft,
                                   "llama_cpp_median": median(lt), "fasa_median": median(ft),
                                   "fasa_over_llama_cpp": round(median(ft) / median(lt), 3)}
        table = []
        for depth in args.depths:
            t0 = time.perf_counter()
            llama.prefill(ids[:max(depth, 1)])
            log(f"llama.cpp: {max(depth, 1)} prompt tokens in {time.perf_counter() - t0:.1f} s")
            if args.warmup:
                llama.decode(args.warmup)
            l_rates, f_rates, f_rows = [], {p: [] for p in policies}, []
            for r in range(args.rounds):
                l_rates += [llama.decode(args.steps) for _ in range(args.repeats)]
                rows = run_fasa(args.fasa, args.model, ids_file, depth, policies, args.threads,
                                args.steps, args.repeats, extra=args.fasa_arg)
                f_rows.append(rows)
                for p in policies:
                    f_rates[p].append(rows[p]["decode_tok_s"])
                log(f"depth {depth}, round {r + 1}: llama.cpp {median(l_rates[-args.repeats:]):.2f} "
                    + " ".join(f"{p} {f_rates[p][-1]:.2f}" for p in policies) + " tok/s")
            full = f_rows[-1]["full"]
            bw = median([rows["full"]["bandwidth_gb_s"] for rows in f_rows])
            row = {"depth": depth, "llama_cpp_tok_s": round(median(l_rates), 2),
                   "llama_cpp_all": [round(x, 2) for x in l_rates], "bandwidth_gb_s": round(bw, 2),
                   "bytes_per_token": full["bytes_per_token"], "fasa": {}}
            row["llama_cpp_roofline"] = round(full["bytes_per_token"] * row["llama_cpp_tok_s"] / (bw * 1e9), 3)
            for p in policies:
                tps = median(f_rates[p])
                last = f_rows[-1][p]
                row["fasa"][p] = {"tok_s": round(tps, 2), "all": [round(x, 2) for x in f_rates[p]],
                                  "over_llama_cpp": round(tps / row["llama_cpp_tok_s"], 3),
                                  "bytes_per_token": last["bytes_per_token"],
                                  "roofline": round(last["bytes_per_token"] * tps / (bw * 1e9), 3)}
            if "fasa-c" in row["fasa"]:
                row["fasa"]["fasa-c"]["over_full"] = round(row["fasa"]["fasa-c"]["tok_s"] /
                                                          row["fasa"]["full"]["tok_s"], 3)
            table.append(row)
        out["table"] = table
    except RuntimeError as e:
        log(f"fasa FAILED: {e}")
        out["error"] = str(e)
        status = 1
        table = out.get("table", [])
    finally:
        os.unlink(ids_file)
    env["loadavg_end"] = loadavg()

    plural = "s" if args.threads != 1 else ""
    lines = [f"{os.path.basename(args.model)}, {args.threads} thread{plural}, f16 KV, the same ids "
             f"(load average {env['loadavg_start']} -> {env['loadavg_end']})"]
    pr = out.get("prefill_rows")
    if pr:
        lines.append(f"prefill {args.prefill} tokens: llama.cpp {pr['llama_cpp_median']:.1f} tok/s, "
                     f"fasa {pr['fasa_median']:.1f} tok/s: {pr['fasa_over_llama_cpp']:.3f}x "
                     f"(medians of {args.prefill_repeats})")
    head = f"{'depth':>7}  {'llama.cpp':>15}"
    for p in policies:
        head += f"  {'fasa ' + p:>15}  {'/llama.cpp':>10}"
    if "fasa-c" in policies:
        head += f"  {'fasa-c/full':>11}"
    lines += [f"decode tok/s (roofline fraction; bandwidth measured by fasa in the same run), "
              f"medians of {args.rounds} rounds x {args.repeats} x {args.steps} steps", head]
    for t in table:
        line = f"{t['depth']:>7}  {t['llama_cpp_tok_s']:>8.2f} ({t['llama_cpp_roofline']:.2f})"
        for p in policies:
            f = t["fasa"][p]
            line += f"  {f['tok_s']:>8.2f} ({f['roofline']:.2f})  {f['over_llama_cpp']:>9.3f}x"
        if "fasa-c" in policies:
            line += f"  {t['fasa']['fasa-c']['over_full']:>10.3f}x"
        lines.append(line)
    if table:
        lines.append(f"bandwidth: {', '.join(str(t['bandwidth_gb_s']) for t in table)} GB/s "
                     f"(2-thread read sweep, per depth)")
    if "error" in out:
        lines.append(f"fasa: {out['error']}")
    text = "\n".join(lines)
    if args.json:
        print(text, file=sys.stderr)
        json.dump(out, sys.stdout, indent=2)
        print()
    else:
        print(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
