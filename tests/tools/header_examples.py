#!/usr/bin/env python3
"""Compiles the usage example at the top of every public header (make check-headers).

The example is the first run of comment lines indented by three spaces after " *" in the
header's opening comment. It is compiled as the body of a function, after every public header
and a set of file-scope variables with the names the examples use (m, s, err, ids, ...), so a
renamed function, a wrong argument count or a stale type fails the build. A line of "..."
stands for the caller's own handling and compiles as "return 1".

    tests/tools/header_examples.py CC CFLAGS... -- HEADER...
"""
import re, subprocess, sys, tempfile, os

PRELUDE = r"""
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
%(includes)s
static model *m; static run_state *s; static char err[FASA_ERRLEN];
static int32_t *ids, next, tok, *idx; static int n, n_ids, n_prompt, n_ctx, n_prefill, n_layer, n_kv_head, d_head;
static int layer, head, kv_head, l, k, t, d, n_vocab; static int64_t rows, cols;
static float *logits, *scores, *x, *y, *q, *K, *V, *out, *norm, *row, eps; static const void *data;
static profile prof, a, b; static uint64_t *scratch; static sampler sp; static const char *text;
static gguf_tensor *tensor; static ruler_count_fn count_tokens; static void *ctx; static const char *output;
"""

def example(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    body, started = [], False
    for ln in lines:
        if ln.startswith(" */") or ln.startswith("*/"):
            break
        if re.match(r"^ \*   \S", ln) or (started and ln.startswith(" *    ")):
            started = True
            body.append(ln[5:])
        elif started:
            break
    return body

def main():
    argv = sys.argv[1:]
    sep = argv.index("--")
    cc, headers = argv[:sep], argv[sep + 1:]
    includes = "\n".join('#include "%s"' % os.path.basename(h) for h in headers)
    failed = 0
    for h in headers:
        body = example(h)
        if not body:
            print("check-headers: %s: no usage example in its opening comment" % h, file=sys.stderr)
            failed += 1
            continue
        code = "\n".join(re.sub(r"\.\.\.;?", "return 1;", b) for b in body)
        src = PRELUDE % {"includes": includes} + "\nint example(void);\nint example(void)\n{\n" + code + "\n    return 0;\n}\n"
        with tempfile.NamedTemporaryFile("w", suffix=".c", delete=False) as f:
            f.write(src)
            name = f.name
        r = subprocess.run(cc + ["-fsyntax-only", "-Wno-unused", "-Wno-unused-result", name],
                           capture_output=True, text=True)
        os.unlink(name)
        if r.returncode != 0:
            failed += 1
            print("check-headers: %s: its example does not compile:\n%s" % (h, r.stderr.replace(name, h + "(example)")),
                  file=sys.stderr)
    print("check-headers: %d of %d header examples compile" % (len(headers) - failed, len(headers)))
    return 1 if failed else 0

sys.exit(main())
