#!/usr/bin/env python3
"""Decode speed of llama.cpp (llama-cpp-python) and fasa on the same GGUF file, side by side.

For each cache depth D in --depths, llama.cpp evaluates a D-token prompt once (depth 0: a single
BOS token), then times --steps single-token decode steps (greedy) --repeats times, restoring the
cache to the prompt before each repeat; decode tok/s is the median over the repeats. Then fasa
runs its own speed task on the same model, threads and depths:

    fasa bench MODEL --task speed --depths D1,D2 --policy full --threads T \
        --steps N --repeats R --json

and the table gives llama.cpp tok/s, fasa tok/s and fasa/llama.cpp per depth. Both run with
their own defaults (OpenMP and environment untouched); the environment (OMP_*, GGML_*, ...
variables, nice value, load average) is recorded in --json. Both engines use OpenMP with spinning
barriers, so on a machine busy with other work the numbers swing widely; compare
OMP_WAIT_POLICY=passive runs, set in the environment for both alike, when the load is high.

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


def run_llamacpp(model, depths, threads, steps, repeats, warmup, flash_attn):
    try:
        import llama_cpp
        import numpy as np
    except ImportError as e:
        log(f"llama-cpp-python is not importable here ({e}); run scripts/setup-llamacpp.sh "
            f"and use .venv/bin/python")
        return None, {"error": f"import failed: {e}"}

    info = {
        "llama_cpp_python": llama_cpp.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
    }
    rows = []
    n_ctx = max(depths) + steps + warmup + 64
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=model, n_ctx=n_ctx, n_threads=threads,
                          n_threads_batch=threads, n_batch=512, logits_all=False,
                          flash_attn=flash_attn, verbose=False)
    info["load_s"] = round(time.perf_counter() - t0, 3)
    info["n_ctx"] = n_ctx
    info["flash_attn"] = flash_attn

    n_vocab = llm.n_vocab()

    def step_token():
        # greedy: argmax of the logits of the last evaluated position, read from the context
        # (with logits_all=False llama-cpp-python does not copy them into llm.scores)
        row = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))
        return int(np.argmax(row))

    for depth in depths:
        toks = prompt_tokens(llm, depth)
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(toks)
        prefill_s = time.perf_counter() - t0
        base = llm.n_tokens
        first = step_token()

        def decode(n):
            llm.n_tokens = base  # the next eval drops cache entries past the prompt
            tok = first
            t = time.perf_counter()
            for _ in range(n):
                llm.eval([tok])
                tok = step_token()
            return time.perf_counter() - t

        if warmup:
            decode(warmup)
        times = [decode(steps) for _ in range(repeats)]
        rates = [steps / t for t in times]
        row = {
            "engine": "llama.cpp",
            "depth": depth,
            "prompt_tokens": len(toks),
            "prefill_s": round(prefill_s, 4),
            "prefill_tok_s": round(len(toks) / prefill_s, 2) if prefill_s > 0 else None,
            "steps": steps,
            "repeats": repeats,
            "decode_tok_s": round(statistics.median(rates), 2),
            "decode_tok_s_all": [round(r, 2) for r in rates],
            "loadavg": loadavg(),
        }
        rows.append(row)
        log(f"llama.cpp depth {depth}: {row['decode_tok_s']} tok/s decode "
            f"(median of {repeats} x {steps} steps; prefill {len(toks)} tokens in "
            f"{prefill_s:.2f} s; load {row['loadavg']})")
    del llm
    return rows, info


# ---------------------------------------------------------------------------------------------
# fasa half
# ---------------------------------------------------------------------------------------------

def run_fasa(fasa, model, depths, threads, steps, repeats, extra):
    cmd = [fasa, "bench", model, "--task", "speed", "--depths", ",".join(map(str, depths)),
           "--policy", "full", "--threads", str(threads), "--steps", str(steps),
           "--repeats", str(repeats), "--json"] + extra
    info = {"command": cmd}
    if not (os.path.isfile(fasa) and os.access(fasa, os.X_OK)):
        info["error"] = f"{fasa} is not an executable file (make bin/fasa)"
        return None, info
    log("running: " + " ".join(cmd))
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        info["error"] = f"could not run fasa: {e}"
        return None, info
    info["wall_s"] = round(time.perf_counter() - t0, 2)
    info["exit_status"] = p.returncode
    if p.stderr.strip():
        info["stderr_tail"] = p.stderr.strip().splitlines()[-5:]
    if p.returncode != 0:
        why = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "(no message)"
        info["error"] = f"fasa bench --task speed exited {p.returncode}: {why}"
        return None, info
    try:
        data = json.loads(p.stdout)
    except json.JSONDecodeError as e:
        info["error"] = f"fasa printed no JSON list on stdout ({e})"
        return None, info
    if isinstance(data, dict):
        data = data.get("rows") or data.get("results") or [data]
    rows = [r for r in data if isinstance(r, dict) and r.get("task", "speed") == "speed"
            and r.get("policy", "full") == "full" and "decode_tok_s" in r]
    if not rows:
        info["error"] = "fasa's JSON has no speed rows with policy full and decode_tok_s"
        return None, info
    return rows, info


def fasa_row_for(rows, depth):
    """The fasa row whose cache depth is this depth (exact, else within one token: whether a
    single BOS counts as depth 0 or 1 is a convention)."""
    def ctx(r):
        for k in ("context", "depth"):
            if isinstance(r.get(k), (int, float)):
                return r[k]
        return None
    exact = [r for r in rows if ctx(r) == depth]
    if exact:
        return exact[0]
    near = [r for r in rows if ctx(r) is not None and abs(ctx(r) - depth) <= 1]
    return near[0] if near else None


# ---------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(
        description="llama.cpp beside fasa: decode tok/s on the same GGUF, threads and depths.")
    ap.add_argument("--model", default=DEFAULT_MODEL, help="GGUF file (default: %(default)s)")
    ap.add_argument("--fasa", default=DEFAULT_FASA, help="fasa binary (default: %(default)s)")
    ap.add_argument("--depths", type=parse_depths, default=[0, 4096],
                    help="cache depths, comma-separated (default: 0,4096)")
    ap.add_argument("--threads", "-t", type=positive, default=2, help="threads (default: 2)")
    ap.add_argument("--steps", type=positive, default=64,
                    help="decode steps per repeat, both engines (default: 64)")
    ap.add_argument("--repeats", type=positive, default=5,
                    help="timed repeats per depth, both engines; the median counts (default: 5)")
    ap.add_argument("--warmup", type=int, default=8,
                    help="untimed decode steps before the repeats (default: 8)")
    ap.add_argument("--flash-attn", action="store_true",
                    help="llama.cpp with flash attention (default off, llama-cpp-python's default)")
    ap.add_argument("--fasa-arg", action="append", default=[], metavar="ARG",
                    help="extra argument for fasa bench (repeatable)")
    ap.add_argument("--skip-fasa", action="store_true", help="only measure llama.cpp")
    ap.add_argument("--json", action="store_true",
                    help="print the result as JSON on stdout (the table goes to stderr)")
    args = ap.parse_args()
    if args.warmup < 0:
        ap.error("--warmup must be >= 0")
    if not os.path.isfile(args.model):
        log(f"no model file {args.model} (scripts/setup.sh installs the default)")
        return 1

    env = environment()
    out = {"model": os.path.abspath(args.model), "threads": args.threads, "depths": args.depths,
           "steps": args.steps, "repeats": args.repeats, "environment": env}
    status = 0

    llama_rows, llama_info = run_llamacpp(args.model, args.depths, args.threads, args.steps,
                                          args.repeats, args.warmup, args.flash_attn)
    out["llama_cpp"] = dict(llama_info, rows=llama_rows)
    if llama_rows is None:
        status = 1

    fasa_rows = None
    if args.skip_fasa:
        out["fasa"] = {"skipped": True}
    else:
        fasa_rows, fasa_info = run_fasa(args.fasa, args.model, args.depths, args.threads,
                                        args.steps, args.repeats, args.fasa_arg)
        out["fasa"] = dict(fasa_info, rows=fasa_rows)
        if fasa_rows is None:
            status = 1
            log("fasa half FAILED: " + fasa_info["error"])
            log("llama.cpp's numbers below stand alone; no ratios")
    env["loadavg_end"] = loadavg()

    table = []
    for depth in args.depths:
        lr = next((r for r in (llama_rows or []) if r["depth"] == depth), None)
        fr = fasa_row_for(fasa_rows, depth) if fasa_rows else None
        l_tps = lr["decode_tok_s"] if lr else None
        f_tps = float(fr["decode_tok_s"]) if fr and fr.get("decode_tok_s") is not None else None
        ratio = round(f_tps / l_tps, 3) if (l_tps and f_tps is not None) else None
        table.append({"depth": depth, "llama_cpp_tok_s": l_tps, "fasa_tok_s": f_tps,
                      "fasa_over_llama_cpp": ratio})
    out["table"] = table

    def fmt(v, spec):
        width = int(spec.split(".")[0])
        return format(v, spec) if v is not None else "-".rjust(width)

    plural = "s" if args.threads != 1 else ""
    lines = [f"decode tok/s, {args.threads} thread{plural}, model {os.path.basename(args.model)} "
             f"(load average {env['loadavg_start']} -> {env['loadavg_end']})",
             f"{'depth':>7}  {'llama.cpp':>10}  {'fasa':>10}  {'fasa/llama.cpp':>14}"]
    for t in table:
        lines.append(f"{t['depth']:>7}  {fmt(t['llama_cpp_tok_s'], '10.2f')}  "
                     f"{fmt(t['fasa_tok_s'], '10.2f')}  {fmt(t['fasa_over_llama_cpp'], '14.3f')}")
    for r in llama_rows or []:
        lo, hi = min(r["decode_tok_s_all"]), max(r["decode_tok_s_all"])
        if lo > 0 and hi / lo > 1.5:
            lines.append(f"note: llama.cpp's repeats at depth {r['depth']} ranged "
                         f"{lo:.2f}-{hi:.2f} tok/s: the machine is busy (see the docstring on "
                         f"OpenMP waits)")
    if llama_rows is None:
        lines.append(f"llama.cpp: {out['llama_cpp']['error']}")
    if not args.skip_fasa and fasa_rows is None:
        lines.append(f"fasa: {out['fasa']['error']}")
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
