#!/usr/bin/env python3
"""Compare fasa's tokenizer (lib/tokenizer.c) with Hugging Face `tokenizers`, line by line.

    PY=.venv/bin/python   # any python with `tokenizers` and `gguf` installed
    $PY scripts/tokenizer_check.py --gguf MODEL.gguf [--json OUT.json] [--tool bin] [--lines N]

1. Builds a Hugging Face tokenizer.json from the GGUF vocabulary, merges and token types, with
   SmolLM2's pre-tokenizer (Digits(individual_digits) + ByteLevel), and saves it to --json.
   Three more variants over the same vocabulary exercise the other families fasa knows: plain
   GPT-2 ByteLevel, Llama-3's Split regex (with ignore_merges, as Llama-3 ships it) and Qwen2's.
2. Generates --lines (default 12000) varied lines from a fixed seed: prose, code, numbers,
   whitespace runs, many scripts, emoji and ZWJ sequences, contractions, punctuation, embedded
   special tokens, long words, and lines holding invalid UTF-8.
3. Tokenizes every line with `tokenizers` and with tests/tools/tokenize.c (built here unless
   --tool is given), for parse_special on and off, through the GGUF loader and every JSON.
   `tokenizers` takes str, so a line's bytes reach it decoded with errors="replace"; the C side
   gets the raw bytes and must make the same U+FFFD substitution itself.
4. Prints the counts and the first mismatches; exits 1 if any line differs.

parse_special off is compared with `tokenizers`' encode_special_tokens = True. No post-processor
runs on either side (add_special_tokens=False): BOS is the caller's business in fasa.
"""
import argparse
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PAT_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
PAT_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PAT_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")


# ---- 1. tokenizer.json from the GGUF ----------------------------------------------------

def gguf_vocab(path):
    import gguf
    r = gguf.GGUFReader(path)

    def field(key):
        return r.fields.get(key)

    def strings(key):
        f = field(key)
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data] if f else []

    def scalar(key):
        f = field(key)
        if not f:
            return None
        v = f.parts[f.data[0]]
        return bytes(v).decode("utf-8") if f.types[0] == gguf.GGUFValueType.STRING else int(v[0])

    tokens = strings("tokenizer.ggml.tokens")
    merges = strings("tokenizer.ggml.merges")
    f = field("tokenizer.ggml.token_type")
    types = [int(f.parts[i][0]) for i in f.data] if f else [1] * len(tokens)
    return {"tokens": tokens, "merges": merges, "types": types,
            "model": scalar("tokenizer.ggml.model"), "pre": scalar("tokenizer.ggml.pre")}


def byte_symbols():
    """GPT-2's byte -> character table."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def byte_level(use_regex):
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": use_regex}


def split(pattern):
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


PRE_TOKENIZERS = {
    "smollm": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level(True)]},
    "gpt2": byte_level(True),
    "llama3": {"type": "Sequence", "pretokenizers": [split(PAT_LLAMA3), byte_level(False)]},
    "qwen2": {"type": "Sequence", "pretokenizers": [split(PAT_QWEN2), byte_level(False)]},
}


def tokenizer_json(v, family, merges_as_pairs=False):
    """A tokenizer.json as `tokenizers` writes one: CONTROL tokens (type 3) are special added
    tokens, USER_DEFINED (4) plain added tokens."""
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": ty == 4, "special": ty == 3}
             for i, (t, ty) in enumerate(zip(v["tokens"], v["types"])) if ty in (3, 4)]
    merges = [m.split(" ") for m in v["merges"]] if merges_as_pairs else v["merges"]
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": PRE_TOKENIZERS[family],
        "post_processor": None,
        "decoder": byte_level(True),
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": family == "llama3",
                  "vocab": {t: i for i, t in enumerate(v["tokens"])}, "merges": merges},
    }


# Added tokens with the matching options no real vocabulary here uses (ids past the end).
EXTRA_ADDED = [("<mask>", dict(lstrip=True, special=True)), ("[R]", dict(rstrip=True, special=False)),
               ("hello", dict(single_word=True, special=False)), ("<both>", dict(lstrip=True, rstrip=True, special=True)),
               ("ĠĠ", dict(special=False))]


def with_extra_added(j):
    """Ids as `tokenizers` itself assigns them (it ignores the file's id for a content already in
    the vocabulary and numbers new contents from the end)."""
    vocab = j["model"]["vocab"]
    n = max(vocab.values()) + 1
    for content, opts in EXTRA_ADDED:
        if content in vocab:
            tid = vocab[content]
        else:
            tid, n = n, n + 1
        tok = {"id": tid, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
               "normalized": not opts.get("special"), "special": False}
        tok.update(opts)
        j["added_tokens"].append(tok)
    return j


def write_gguf(v, pre, path):
    """A GGUF holding only the tokenizer, with another tokenizer.ggml.pre name."""
    import gguf
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(v["tokens"])
    w.add_token_types(v["types"])
    w.add_token_merges(v["merges"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_json(obj, path):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False)


# ---- 2. lines --------------------------------------------------------------------------

WORDS = ("the of and to in is was for that with as on by at from his her they we you it this be are "
         "have had not but or an which one all were their there been has will would who more when "
         "time people year good new first last long great little own other old right big high "
         "different small large next early young important few public bad same able government "
         "however because through during without against between under Tokenizer ByteLevel merges "
         "vocabulary Attention TRANSFORMER McDonald iPhone naïve café résumé façade coöperate Zürich "
         "São Paulo Ærøskøbing straße Œuvre").split()
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE", "'M", "'LL", "'D",
                "'Re", "'lL", "’s", "’ll", "'x", "''", "'"]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["...", "—", "–", "«", "»", "“", "”", "‘", "’", "¿",
                                                     "¡", "§", "¶", "•", "→", "≤", "≠", "∑", "√", "∞", "©",
                                                     "®", "™", "°", "±", "×", "÷", "€", "£", "¥", "¢", "‰"]
SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", " \n", "\n ", " \t ", "\u00a0",
          "\u3000", "\u2028", "\u2029", "\x85", "\u2003", "\u2009", "\u202f", "\u205f", "\u1680",
          "\x0b", "\x0c", "\u200b", "\ufeff", "\x1c", "\x1f", "\u180e"]
SCRIPTS = {
    "cjk": "我们今天在北京学习自然语言处理模型的分词器非常重要中文字符漢字語言東京大阪",
    "kana": "ひらがなカタカナのテキストをトークン化しますこんにちは世界ですアイウエオー",
    "hangul": "안녕하세요세계한국어텍스트토큰화테스트입니다가나다라마바사",
    "arabic": "مرحبا بالعالم هذا نص عربي للاختبار والتجزئة اللغوية ٠١٢٣٤٥٦٧٨٩",
    "hebrew": "שלום עולם זהו טקסט בעברית לבדיקה",
    "cyrillic": "Привет мир это тестовый текст для токенизации Ёжик съешь ещё этих мягких булок",
    "devanagari": "नमस्ते दुनिया यह परीक्षण के लिए हिंदी पाठ है क्षत्रिय ज्ञान ०१२३४५६७८९",
    "greek": "Γειά σου κόσμε αυτό είναι ελληνικό κείμενο ΑΒΓΔ αβγδ ϐϑϕ",
    "thai": "สวัสดีชาวโลกนี่คือข้อความภาษาไทย",
    "armenian": "Բարեւ աշխարհ",
    "georgian": "გამარჯობა მსოფლიო",
    "tamil": "வணக்கம் உலகம்",
    "ethiopic": "ሰላም ልዑል",
}
EMOJI = ["😀", "😂", "🥲", "👍", "👍🏽", "👍🏿", "❤️", "❤", "🔥", "🎉", "🚀", "🇫🇷", "🇯🇵", "🏳️‍🌈",
         "👨‍👩‍👧‍👦", "👩‍💻", "🧑🏾‍🚀", "👁️‍🗨️", "1️⃣", "#️⃣", "©️", "☺", "✔️", "🤷‍♂️", "🐈‍⬛",
         "🫠", "🫶🏻", "💁🏼‍♀️", "🙇‍♂️", "🇺🇳"]
NUMERIC = ["0", "7", "42", "2024", "3.14159", "1,234,567", "1e-9", "0x7fff", "+44 20 7946 0958",
           "2024-11-21", "12:30:59", "99.9%", "$1,000.00", "€5", "１２３", "٣٤٥", "४२", "²", "³", "½",
           "¾", "Ⅻ", "ⅷ", "①", "⑳", "𝟙𝟚", "໑໒", "፩", "〇", "一二三", "10⁶", "1/2", "-17", "007"]
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<file_sep>", "<filename>",
            "<gh_stars>", "<jupyter_code>", "<empty_output>", "<|im_start", "im_end|>", "<|im_end|",
            "<<|im_end|>>", "<|im_start|><|im_end|>", "< |im_end|>", "<|IM_END|>", "<|endoftext|>!",
            # tokens of the "+added" variant: lstrip, rstrip, single_word, both
            "  <mask>", "\t<mask>x", "a <mask> b", "[R]   x", "[R]\n\n", "hello", "say hello!", "xhello",
            "hello2", "héllo hello_", "  <both>  ", "<mask><mask>", "\u00a0<mask>\u3000"]
CODE = [
    "int main(int argc, char **argv) {\n    return 0;\n}",
    "def f(x):\n\treturn x ** 2  # square\n",
    "for (size_t i = 0; i < n; i++) sum += a[i] * b[i];",
    "const x = arr.map((v) => v * 2).filter(Boolean);",
    "if __name__ == '__main__':\n    main()",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "    let mut v: Vec<u8> = Vec::with_capacity(1024);",
    "#include <stdio.h>\n#define MAX(a,b) ((a)>(b)?(a):(b))",
    "x=1;y=2;z=x+y;print(f\"{z:08.3f}\")",
    "<div class=\"a\"><span id='b'>text</span></div>",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
    "$ ls -la | grep '\\.c$' && make -j2 2>&1",
    "fn(a,b)->c::d<e>::f()?.g!{h}[i]",
    "\t\tif (x != NULL && *x == '\\0') {",
    "arr[0x1F] = 0b1010 | ~mask << 3;",
]


def rand_word(rng):
    return rng.choice(WORDS)


def prose(rng):
    n = rng.randint(3, 25)
    out = []
    for i in range(n):
        w = rand_word(rng)
        if i == 0 or rng.random() < 0.05:
            w = w.capitalize()
        if rng.random() < 0.08:
            w += rng.choice(CONTRACTIONS)
        if rng.random() < 0.1:
            w += rng.choice([",", ";", ":", "!", "?", "...", ")", "\""])
        out.append(w)
    return " ".join(out) + rng.choice([".", "!", "?", "", ".\n", " ", "  "])


def code(rng):
    s = rng.choice(CODE)
    if rng.random() < 0.3:
        s = s.replace("    ", "\t")
    if rng.random() < 0.3:
        s = "    " * rng.randint(1, 3) + s
    return s


def numbers(rng):
    parts = []
    for _ in range(rng.randint(1, 8)):
        r = rng.random()
        if r < 0.4:
            parts.append(rng.choice(NUMERIC))
        elif r < 0.7:
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 15))))
        else:
            parts.append(rand_word(rng) + str(rng.randint(0, 999)))
    return rng.choice([" ", "", ", ", "\t", "-"]).join(parts)


def whitespace(rng):
    parts = []
    for _ in range(rng.randint(1, 10)):
        parts.append(rng.choice(SPACES) * rng.randint(1, 4))
        if rng.random() < 0.6:
            parts.append(rng.choice([rand_word(rng), rng.choice(PUNCT), rng.choice(NUMERIC), ""]))
    return "".join(parts)


def script(rng):
    name = rng.choice(list(SCRIPTS))
    src = SCRIPTS[name]
    out = []
    for _ in range(rng.randint(1, 6)):
        i = rng.randrange(len(src))
        out.append(src[i:i + rng.randint(1, 20)])
    return rng.choice([" ", "", "、", "，", "。", " - ", "\n"]).join(out)


def emoji(rng):
    out = []
    for _ in range(rng.randint(1, 8)):
        r = rng.random()
        if r < 0.6:
            out.append(rng.choice(EMOJI))
        elif r < 0.8:
            out.append(rand_word(rng))
        else:
            out.append(rng.choice(PUNCT))
    return rng.choice(["", " ", "  "]).join(out)


def punctuation(rng):
    return "".join(rng.choice(PUNCT) + (rng.choice(["", " ", ""]) if rng.random() < 0.3 else "")
                   for _ in range(rng.randint(1, 20)))


def specials(rng):
    out = []
    for _ in range(rng.randint(1, 6)):
        r = rng.random()
        if r < 0.45:
            out.append(rng.choice(SPECIALS))
        elif r < 0.8:
            out.append(prose(rng)[:40])
        else:
            out.append(rng.choice(SPACES))
    return rng.choice(["", " ", "\n"]).join(out)


def long_word(rng):
    r = rng.random()
    if r < 0.3:
        return rng.choice("ab x.-_=0 \t\n😀é中") * rng.randint(50, 3000)
    if r < 0.6:
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(30, 400)))
    if r < 0.8:
        return "".join(rng.choice(WORDS) for _ in range(rng.randint(10, 80)))
    return "pneumonoultramicroscopicsilicovolcanoconiosis" * rng.randint(1, 20)


def random_unicode(rng):
    """Assigned code points of the BMP and beyond (Python's unicodedata decides 'assigned', which
    keeps clear of characters newer than the regex engines know)."""
    out = []
    while len(out) < rng.randint(1, 30):
        cp = rng.choice([rng.randint(0x20, 0x2FFF), rng.randint(0x3000, 0xFFFD), rng.randint(0x10000, 0x1FAFF)])
        c = chr(cp)
        if unicodedata.category(c) in ("Cn", "Cs", "Co"):
            continue
        out.append(c)
    return "".join(out)


def mixed(rng):
    gens = [prose, code, numbers, whitespace, script, emoji, punctuation, random_unicode]
    return "".join(rng.choice(gens)(rng) for _ in range(rng.randint(2, 4)))


INVALID = [b"\x80", b"\xbf", b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xed\xbf\xbf",
           b"\xf0\x80\x80\x80", b"\xf4\x90\x80\x80", b"\xf5", b"\xff", b"\xfe", b"\xe2\x82", b"\xf0\x9f\x98",
           b"\xc3", b"\xe2", b"\xf0\x9f", b"\x80\x80\x80", b"\xc3\x28", b"\xa0\xa1", b"\xe2\x28\xa1",
           b"\xf0\x28\x8c\xbc", b"\xf8\x88\x80\x80\x80", b"\xfc\x84\x80\x80\x80\x80"]


def invalid(rng):
    base = rng.choice([prose, code, script, emoji, numbers])(rng).encode("utf-8")
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        if r < 0.5:
            bad = rng.choice(INVALID)
        elif r < 0.8:
            bad = bytes(rng.randrange(256) for _ in range(rng.randint(1, 6)))
        else:
            # Cut a multi-byte character in half.
            s = rng.choice(EMOJI + list(SCRIPTS["cjk"])).encode("utf-8")
            bad = s[:rng.randint(1, len(s) - 1)]
        i = rng.randint(0, len(base))
        base = base[:i] + bad + base[i:]
    return base


GENERATORS = [(prose, 14), (code, 8), (numbers, 8), (whitespace, 10), (script, 10), (emoji, 8),
              (punctuation, 6), (specials, 10), (long_word, 2), (random_unicode, 6), (mixed, 10),
              (invalid, 8)]


def make_lines(n, seed):
    rng = random.Random(seed)
    gens = [g for g, w in GENERATORS for _ in range(w)]
    lines = [
        b"", b" ", b"\n", b"\x00", b"a\x00b", bytes(range(1, 128)), bytes(range(128, 256)),
        "I'm sure they'll say we've done what you'd call 'wonderful' and it's OK, isn't it?".encode(),
        "HELLO'S AND GOODBYE'LL".encode(), "Ünïcödé ẞ ß İ ı ǅ ᾈ ﬁ".encode(),
        ("a" * 100000).encode(), (" " * 20000 + "x").encode(), ("\n" * 5000).encode(),
        ("1" * 5000).encode(), ("😀" * 3000).encode(), ("<|im_end|>" * 200).encode(),
        "e\u0301 n\u0303 \u1100\u1161\u11a8 a\u030a".encode(),   # decomposed (NFD) text
    ]
    while len(lines) < n:
        g = rng.choice(gens)
        x = g(rng)
        lines.append(x if isinstance(x, bytes) else x.encode("utf-8"))
    return lines


# ---- 3. run both sides -----------------------------------------------------------------

def build_tool(out_dir):
    cc = os.environ.get("CC", "cc")
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "libcjson", "libpcre2-8"],
                           capture_output=True, text=True, check=True).stdout.split()
    exe = os.path.join(out_dir, "tokenize")
    cmd = [cc, "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fopenmp",
           "-I" + os.path.join(ROOT, "lib/core"), "-I" + os.path.join(ROOT, "formats"),
           os.path.join(ROOT, "formats/base.c"), os.path.join(ROOT, "lib/core/tokenizer.c"),
           os.path.join(ROOT, "formats/gguf.c"), os.path.join(ROOT, "tests/tools/tokenize.c"),
           "-o", exe] + flags + ["-lm"]
    subprocess.run(cmd, check=True)
    return exe


def run_c(tool, model, lines, parse_special, decode=False):
    """ids per line (or "ERROR ..."); with decode, (ids, decoded bytes) per line."""
    flags = (1 if parse_special else 0) | (2 if decode else 0)
    data = b"".join(struct.pack("<IB", len(b), flags) + b for b in lines)
    p = subprocess.run([tool, model], input=data, capture_output=True)
    if p.returncode != 0:
        sys.exit("tokenizer_check: %s %s failed: %s" % (tool, model, p.stderr.decode(errors="replace")))
    out = p.stdout.decode().split("\n")[:len(lines)]
    if len(out) != len(lines):
        sys.exit("tokenizer_check: %s printed %d lines for %d inputs" % (tool, len(out), len(lines)))
    if decode:
        return [(o.split("\t")[0], bytes.fromhex(o.split("\t")[1])) for o in out]
    return [o if o.startswith("ERROR") else [int(x) for x in o.split()] for o in out]


def run_hf(path, texts, parse_special):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(path)
    tok.encode_special_tokens = not parse_special
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)], tok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", required=True, help="GGUF model whose tokenizer is checked")
    ap.add_argument("--json", help="where to save the tokenizer.json built from the GGUF")
    ap.add_argument("--tool", help="tests/tools/tokenize binary (built into a temp dir if absent)")
    ap.add_argument("--lines", type=int, default=12000)
    ap.add_argument("--seed", type=int, default=20241121)
    ap.add_argument("--show", type=int, default=5, help="mismatches to print")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="tokcheck.")
    try:
        v = gguf_vocab(args.gguf)
        if v["model"] != "gpt2":
            sys.exit("tokenizer_check: '%s' has tokenizer model %r, not byte-level BPE" % (args.gguf, v["model"]))
        family = {"smollm": "smollm", "llama-bpe": "llama3", "llama3": "llama3", "qwen2": "qwen2"}.get(v["pre"], "gpt2")
        main_json = args.json or os.path.join(work, "tokenizer.json")
        write_json(tokenizer_json(v, family), main_json)
        models = [("gguf", args.gguf, main_json), ("json:" + family, main_json, main_json)]
        # The other families over the same vocabulary; merges written as ["a", "b"] pairs once.
        for fam in ("gpt2", "llama3", "qwen2", "smollm"):
            if fam == family:
                fam_path = os.path.join(work, "pairs.json")
                write_json(tokenizer_json(v, fam, merges_as_pairs=True), fam_path)
                models.append(("json:%s(pairs)" % fam, fam_path, fam_path))
                continue
            fam_path = os.path.join(work, fam + ".json")
            write_json(tokenizer_json(v, fam), fam_path)
            models.append(("json:" + fam, fam_path, fam_path))

        extra_path = os.path.join(work, "added.json")
        write_json(with_extra_added(tokenizer_json(v, family)), extra_path)
        models.append(("json:%s+added" % family, extra_path, extra_path))
        # The GGUF loader's pre names, against the same references.
        for pre, fam in (("llama-bpe", "llama3"), ("qwen2", "qwen2"), ("gpt2", "gpt2")):
            if fam != family:
                g_path = os.path.join(work, pre + ".gguf")
                write_gguf(v, pre, g_path)
                models.append(("gguf:" + pre, g_path, os.path.join(work, fam + ".json")))

        tool = args.tool or build_tool(work)
        lines = make_lines(args.lines, args.seed)
        texts = [b.decode("utf-8", "replace") for b in lines]
        n_invalid = sum(1 for b, t in zip(lines, texts) if t.encode("utf-8") != b)
        print("lines: %d (%d with invalid UTF-8, %d bytes in all)" % (len(lines), n_invalid, sum(map(len, lines))))

        total = bad = 0
        shown = 0
        hf_cache = {}
        for name, model, ref in models:
            for ps in (1, 0):
                key = (ref, ps)
                if key not in hf_cache:
                    hf_cache[key] = run_hf(ref, texts, ps)
                want, hf = hf_cache[key]
                got = run_c(tool, model, lines, ps)
                nbad = 0
                for i, (w, g) in enumerate(zip(want, got)):
                    if w == g:
                        continue
                    nbad += 1
                    if shown < args.show:
                        shown += 1
                        print("MISMATCH %s parse_special=%d line %d: %r" % (name, ps, i, lines[i][:200]))
                        print("   hf: %s" % [hf.id_to_token(x) for x in w][:60])
                        print("    c: %s" % (g if isinstance(g, str) else [hf.id_to_token(x) for x in g][:60]))
                print("%-20s parse_special=%d  lines %6d  mismatches %d" % (name, ps, len(lines), nbad))
                total += len(lines)
                bad += nbad
        # Decode: the concatenated bytes of each line's ids are the line itself for valid UTF-8,
        # and what `tokenizers` decodes in any case (it returns str: compare after the same
        # lossy conversion it applies).
        # A byte whose symbol is not in the vocabulary has no token at all: both sides drop it
        # (no unk_token), so such lines cannot round-trip.
        vocab_set = set(v["tokens"])
        missing = {b for b, c in byte_symbols().items() if c not in vocab_set}
        print("bytes without a token in this vocabulary: %s" % " ".join("%02x" % b for b in sorted(missing)))
        want, hf = hf_cache[(main_json, 1)]
        dec = run_c(tool, args.gguf, lines, 1, decode=True)
        dbad = strict = 0
        for i, (b, (_, got)) in enumerate(zip(lines, dec)):
            ok = got.decode("utf-8", "replace") == hf.decode(want[i], skip_special_tokens=False)
            if b.decode("utf-8", "replace").encode("utf-8") == b and not missing & set(b):
                strict += 1
                ok = ok and got == b
            if not ok:
                dbad += 1
                if shown < args.show:
                    shown += 1
                    print("DECODE MISMATCH line %d: %r -> %r" % (i, b[:100], got[:100]))
        print("%-20s decode             lines %6d  mismatches %d  (%d of them checked byte-exact)" % (
            "gguf", len(lines), dbad, strict))
        total += len(lines)
        bad += dbad

        # Evidence that the lines reach the interesting paths.
        on, off = hf_cache[(main_json, 1)][0], hf_cache[(main_json, 0)][0]
        special_ids = {i for i, ty in enumerate(v["types"]) if ty == 3}
        print("lines with special tokens parsed: %d; lines whose ids depend on parse_special: %d; "
              "longest line: %d bytes, %d tokens" % (
                  sum(1 for x in on if special_ids & set(x)), sum(1 for a, b in zip(on, off) if a != b),
                  max(map(len, lines)), max(map(len, on))))
        print("compared %d encodings of %d lines: %d mismatches" % (total, len(lines), bad))
        return 1 if bad else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
