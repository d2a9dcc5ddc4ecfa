#!/usr/bin/env python3
"""Compare fasa's tokenizer (lib/core/tokenizer.c) with Hugging Face `tokenizers` and llama.cpp, line by line.

    PY=.venv/bin/python   # with `tokenizers`, `gguf`, `transformers` (+ jinja2 for --chat), llama-cpp-python
    $PY scripts/tokenizer_check.py --model FILE [--model FILE ...] [--spm-fixture] [--chat]
                                   [--json OUT.json] [--tool bin] [--lines N]

--model (repeatable; --gguf is the same) takes a GGUF or a tokenizer.json:
  * a byte-level GGUF (tokenizer.ggml.model "gpt2"): a tokenizer.json is built from its vocabulary,
    merges and token types with its family's pre-tokenizer (saved to --json), plus the other families
    over the same vocabulary and GGUFs with the other pre names; each against `tokenizers`.
  * a SentencePiece GGUF ("llama": Llama 2, Mistral, Gemma): a tokenizer.json is built the way
    transformers' converter does (merges = every split of a piece into two pieces, by the piece's
    score; types 2/3 special, 4 plain), with the GGUF's add_space_prefix as Prepend("▁"); then the
    same vocabulary as Llama-2/Mistral-style variants (legacy Prepend+Replace, Metaspace
    first with and without split, Gemma's plain Replace) and a GGUF with add_space_prefix flipped.
    Also transformers' own GGUF conversion (AutoTokenizer.from_pretrained(gguf_file=...), run on a
    copy holding only the tokenizer keys under architecture "llama", since 4.45 knows no gemma3).
  * a tokenizer.json (with tokenizer_config.json beside it, or not): fasa on the file against
    `tokenizers` on the file.
  Every GGUF is also compared with llama.cpp (llama_cpp.Llama(path, vocab_only=True).tokenize), when
  llama-cpp-python is installed.
--spm-fixture: the tiny Llama-2-style vocabulary of tests/test_tokenizer.c (scores, byte tokens,
  merges), as a GGUF and as tokenizer.json variants, against `tokenizers` and llama.cpp.
--chat: the templates of tests/test_tokenizer.c and of each --model: fasa's rendering of a few
  conversations against transformers' apply_chat_template on the same template text (the exact
  string), and the prompt ids against `tokenizers` and llama.cpp on that string.

Lines: --lines (default 12000) varied lines from a fixed seed: prose, code, numbers, whitespace runs,
many scripts, emoji and ZWJ sequences, contractions, punctuation, embedded special tokens, long
words, and lines holding invalid UTF-8. `tokenizers` takes str, so a line's bytes reach it decoded
with errors="replace"; the C side gets the raw bytes and must make the same U+FFFD substitution
itself; llama.cpp gets the replaced text's bytes (its SentencePiece path keeps invalid bytes).
parse_special off is compared with `tokenizers`' encode_special_tokens = True and llama.cpp's
special = False. No BOS on either side (add_special_tokens=False, add_bos=False).
Prints the counts and the first mismatches; exits 1 if any line differs. Differences between the
references themselves are reported as such and do not count.
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
    f = field("tokenizer.ggml.scores")
    scores = [float(f.parts[i][0]) for i in f.data] if f else [0.0] * len(tokens)
    model = scalar("tokenizer.ggml.model")
    asp = scalar("tokenizer.ggml.add_space_prefix")
    return {"tokens": tokens, "merges": merges, "types": types, "scores": scores,
            "model": model, "pre": scalar("tokenizer.ggml.pre"),
            "add_space_prefix": bool(asp) if asp is not None else model == "llama",
            "bos": scalar("tokenizer.ggml.bos_token_id"), "eos": scalar("tokenizer.ggml.eos_token_id"),
            "add_bos": scalar("tokenizer.ggml.add_bos_token"), "chat_template": scalar("tokenizer.chat_template")}


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


# ---- 1b. SentencePiece tokenizer.json and GGUF ------------------------------------------

SPM = "\u2581"


def spm_merges(tokens, scores):
    """Every split of a piece into two pieces, ranked by the piece's score (highest first), then
    by id: transformers' SentencePiece converter. llama.cpp merges any adjacent pair that spells
    a piece, by that piece's score; with distinct scores the two orders agree."""
    vocab = {}
    for i, t in enumerate(tokens):
        vocab[t] = i
    out = []
    for i, t in enumerate(tokens):
        if vocab.get(t) != i:
            continue
        for cut in range(1, len(t)):
            l, r = t[:cut], t[cut:]
            if l in vocab and r in vocab:
                out.append((-scores[i], i, vocab[l], vocab[r], l, r))
    out.sort(key=lambda x: x[:4])
    return [[x[4], x[5]] for x in out]


def spm_variant(style):
    """normalizer, pre_tokenizer, decoder of the SentencePiece-style tokenizer.json layouts."""
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": SPM}
    dec = [{"type": "Replace", "pattern": {"String": SPM}, "content": " "}, {"type": "ByteFallback"},
           {"type": "Fuse"}]
    strip = {"type": "Strip", "content": " ", "start": 1, "stop": 0}
    if style == "legacy":     # Llama 2, Mistral v0.1, TinyLlama: Prepend + Replace, Strip
        return ({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SPM}, replace]}, None,
                {"type": "Sequence", "decoders": dec + [strip]})
    if style == "gemma":      # no prefix
        return replace, None, {"type": "Sequence", "decoders": dec}
    split = style == "metaspace-split"
    meta = {"type": "Metaspace", "replacement": SPM, "prepend_scheme": "first", "split": split}
    return None, meta, {"type": "Sequence", "decoders": dec + [strip]}   # transformers' non-legacy Llama


def spm_json(v, style):
    """A SentencePiece tokenizer.json over a GGUF vocabulary: types 2 (UNKNOWN) and 3 (CONTROL)
    special, 4 (USER_DEFINED) plain, all matched on the raw text as llama.cpp does."""
    norm, pre, dec = spm_variant(style)
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": ty in (2, 3)}
             for i, (t, ty) in enumerate(zip(v["tokens"], v["types"])) if ty in (2, 3, 4)]
    unk = next((t for t, ty in zip(v["tokens"], v["types"]) if ty == 2), None)
    vocab = {}
    for i, t in enumerate(v["tokens"]):
        vocab.setdefault(t, i)
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": norm, "pre_tokenizer": pre, "post_processor": None, "decoder": dec,
        "model": {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": spm_merges(v["tokens"], v["scores"])},
    }


def write_gguf_spm(v, path, add_space_prefix, chat_template=None):
    """A GGUF holding a SentencePiece tokenizer (and the few llama.* keys llama.cpp wants to open
    a file vocab_only)."""
    import gguf
    w = gguf.GGUFWriter(path, arch="llama")
    for key, val in (("context_length", 4096), ("embedding_length", 64), ("block_count", 1),
                     ("feed_forward_length", 128), ("attention.head_count", 1)):
        w.add_uint32("llama." + key, val)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(v["tokens"])
    w.add_token_scores(v["scores"])
    w.add_token_types(v["types"])
    w.add_add_space_prefix(add_space_prefix)
    w.add_bos_token_id(v["bos"] if v.get("bos") is not None else 1)
    w.add_eos_token_id(v["eos"] if v.get("eos") is not None else 2)
    if chat_template:
        w.add_chat_template(chat_template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def spm_fixture_vocab():
    """tests/test_tokenizer.c's spm_make: <unk> <s> </s>, <0x00>..<0xFF>, then pieces."""
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    for t, sc, ty in ((SPM, -10, 1), ("a", -11, 1), ("b", -12, 1), ("c", -13, 1), ("ab", -1, 1), ("bc", -2, 1),
                      (SPM + "a", -3, 1), ("abc", -4, 1), (SPM + "ab", -5, 1), (SPM + SPM, -6, 1), ("é", -14, 1),
                      ("[INST]", 0, 3), ("<u>", 0, 4)):
        tokens.append(t)
        scores.append(float(sc))
        types.append(ty)
    return {"tokens": tokens, "types": types, "scores": scores, "merges": [], "model": "llama", "pre": "default",
            "add_space_prefix": True, "bos": 1, "eos": 2, "add_bos": True, "chat_template": None}


def transformers_json(gguf_path, v, work):
    """transformers' own conversion of the GGUF's tokenizer (its GGUF loader), saved as a
    tokenizer.json; None with the reason when it cannot."""
    try:
        import gguf
        from transformers import AutoTokenizer
    except ImportError as e:
        return None, str(e)
    d = tempfile.mkdtemp(prefix="conv.", dir=work)
    g = os.path.join(d, "tok.gguf")
    w = gguf.GGUFWriter(g, arch="llama")   # 4.45 refuses architectures it has no model for
    w.add_name("tokenizer")
    w.add_tokenizer_model(v["model"])
    w.add_tokenizer_pre(v["pre"] or "default")
    w.add_token_list(v["tokens"])
    w.add_token_types(v["types"])
    if v["model"] == "llama":
        w.add_token_scores(v["scores"])
        w.add_add_space_prefix(v["add_space_prefix"])
    if v["merges"]:
        w.add_token_merges(v["merges"])
    if v.get("bos") is not None:
        w.add_bos_token_id(v["bos"])
    if v.get("eos") is not None:
        w.add_eos_token_id(v["eos"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # Without merges in the file the converter builds them from the scores, testing membership
    # in the token list: hours for 262k tokens. A list with a set's lookup gives the same merges.
    from transformers.integrations import ggml

    class Tokens(list):
        def __init__(self, xs):
            super().__init__(xs)
            self._set = set(xs)

        def __contains__(self, x):
            return x in self._set

    init = ggml.GGUFTokenizerSkeleton.__init__

    def fast_init(self, dict_):
        if "tokens" in dict_:
            dict_ = dict(dict_, tokens=Tokens(dict_["tokens"]))
        init(self, dict_)
    ggml.GGUFTokenizerSkeleton.__init__ = fast_init
    try:
        tok = AutoTokenizer.from_pretrained(d, gguf_file="tok.gguf")
    except Exception as e:   # noqa: BLE001 - any failure of the reference is reported, not fatal
        return None, "%s: %s" % (type(e).__name__, str(e)[:200])
    finally:
        ggml.GGUFTokenizerSkeleton.__init__ = init
    out = os.path.join(d, "tokenizer.json")
    tok.backend_tokenizer.save(out)
    return out, None


def llama_cpp_open(path):
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)


def run_llama_cpp(llm, texts, parse_special):
    return [llm.tokenize(t.encode("utf-8"), add_bos=False, special=bool(parse_special)) for t in texts]


def c_templates(path):
    """The chat templates of tests/test_tokenizer.c (static const char TMPL_NAME[] = "..." "...";),
    decoded from C string literals, so both checks use the very same text."""
    import re
    src = open(path, encoding="utf-8").read()
    out = {}
    for m in re.finditer(r'static const char TMPL_(\w+)\[\] =\s*((?:"(?:[^"\\]|\\.)*"\s*)+);', src):
        raw = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(2)))
        b, i = bytearray(), 0
        while i < len(raw):
            if raw[i] == "\\":
                n = raw[i + 1]
                if n == "x":
                    j = i + 2
                    while j < len(raw) and raw[j] in "0123456789abcdefABCDEF":
                        j += 1
                    b.append(int(raw[i + 2:j], 16))
                    i = j
                    continue
                b += {"n": b"\n", "t": b"\t", "r": b"\r", "\\": b"\\", '"': b'"', "'": b"'"}[n]
                i += 2
                continue
            b += raw[i].encode("utf-8")
            i += 1
        out[m.group(1).lower()] = b.decode("utf-8")
    return out


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
            "hello2", "héllo hello_", "  <both>  ", "<mask><mask>", "\u00a0<mask>\u3000",
            # SentencePiece vocabularies' tokens (Llama 2, Mistral, Gemma) and the fixture's
            "<s>", "</s>", "<unk>", "<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>",
            "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", "[INST]", "[/INST]",
            "<s>[INST] hi [/INST]", " [INST] ", "<u>", "a<u>b", "<start_of_image>", "\u2581", "\u2581\u2581 x"]
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


class Report:
    """Counts and prints comparisons; the first --show mismatches are printed in full."""

    def __init__(self, show):
        self.total = self.bad = self.shown = 0
        self.show = show

    def compare(self, name, lines, want, got, names=None, counts=True, ref="hf"):
        nbad = 0
        for i, (w, g) in enumerate(zip(want, got)):
            if w == g:
                continue
            nbad += 1
            if self.shown < self.show:
                self.shown += 1
                print("MISMATCH %s line %d: %r" % (name, i, lines[i][:200]))
                show = (lambda ids: [names(x) for x in ids][:60]) if names else (lambda ids: ids[:60])
                print("  %4s: %s" % (ref, show(w) if not isinstance(w, str) else w))
                print("     c: %s" % (show(g) if not isinstance(g, str) else g))
        print("%-44s lines %6d  mismatches %d%s" % (name, len(lines), nbad, "" if counts else "  (references only)"))
        if counts:
            self.total += len(lines)
            self.bad += nbad
        return nbad


class Ctx:
    def __init__(self, args, work, tool, lines):
        self.args, self.work, self.tool, self.lines = args, work, tool, lines
        self.texts = [b.decode("utf-8", "replace") for b in lines]
        self.hf = {}
        self.loadable = {}

    def hf_ids(self, path, ps):
        if (path, ps) not in self.hf:
            self.hf[(path, ps)] = run_hf(path, self.texts, ps)
        return self.hf[(path, ps)]

    def tmp(self, name):
        return os.path.join(self.work, name)


def check_against_hf(ctx, rep, name, model, ref_json, names_from=None):
    """fasa on model against `tokenizers` on ref_json, parse_special on and off."""
    for ps in (1, 0):
        want, hf = ctx.hf_ids(ref_json, ps)
        rep.compare("%s parse_special=%d" % (name, ps), ctx.lines, want, run_c(ctx.tool, model, ctx.lines, ps),
                    names=hf.id_to_token)


def llama_cpp_retyped(llm, v):
    """Tokens llama.cpp treats as CONTROL though the file types them otherwise: it retypes tokens
    by their spelling (its list of end-of-generation texts, e.g. "</s>", which Gemma 3 has as a
    user-defined token and Qwen2.5 as a normal one), so it splits them out when parse_special is
    on and not when it is off. Found by asking it: a token whose text tokenizes differently with
    and without special parsing."""
    out = set()
    for t, ty in zip(v["tokens"], v["types"]):
        if ty in (2, 3) or len(t) > 32 or not any(c in t for c in "<[|"):
            continue
        b = t.encode("utf-8")
        if llm.tokenize(b, add_bos=False, special=True) != llm.tokenize(b, add_bos=False, special=False):
            out.add(t)
    return out


def check_against_llama_cpp(ctx, rep, name, gguf_path, ref_path=None, v=None, missing_chars=""):
    """fasa on gguf_path against llama.cpp on ref_path (the same file, or the original of a
    tokenizer-only copy). Two differences between the references are counted apart: lines holding
    a token llama.cpp retyped (see llama_cpp_retyped); and lines
    holding a character whose byte has no token (byte-level, no unk: `tokenizers` drops it before
    merging, llama.cpp after, so its neighbours merge in one and not in the other)."""
    llm = llama_cpp_open(ref_path or gguf_path)
    if llm is None:
        print("%-44s SKIPPED: llama_cpp is not installed" % ("llama.cpp " + name))
        return None
    retyped = llama_cpp_retyped(llm, v) if v else set()
    if retyped:
        print("llama.cpp retypes %d token(s) as control by their text: %s" % (
            len(retyped), " ".join(sorted(repr(t) for t in retyped))[:200]))
    names = lambda x: llm.detokenize([x], special=True).decode("utf-8", "replace")   # noqa: E731
    for ps in (1, 0):
        want = run_llama_cpp(llm, ctx.texts, ps)
        got = run_c(ctx.tool, gguf_path, ctx.lines, ps)
        apart = [i for i, t in enumerate(ctx.texts)
                 if any(r in t for r in retyped) or any(c in t for c in missing_chars)]
        if apart:
            keep = sorted(set(range(len(ctx.lines))) - set(apart))
            rep.compare("llama.cpp %s parse_special=%d" % (name, ps), [ctx.lines[i] for i in keep],
                        [want[i] for i in keep], [got[i] for i in keep], ref="lcpp", names=names)
            rep.compare("llama.cpp %s parse_special=%d (apart)" % (name, ps), [ctx.lines[i] for i in apart],
                        [want[i] for i in apart], [got[i] for i in apart], ref="lcpp", names=names, counts=False)
        else:
            rep.compare("llama.cpp %s parse_special=%d" % (name, ps), ctx.lines, want, got, ref="lcpp", names=names)
    return llm


def check_decode(ctx, rep, name, model, ref_json, strict_ok):
    """The text of each line's ids (tokenizer_decode_text) against `tokenizers`' decode of the
    same ids (it returns str: compared after the same lossy conversion), and byte-exact against
    the line itself where strict_ok(line) says the line survives."""
    want, hf = ctx.hf_ids(ref_json, 1)
    dec = run_c(ctx.tool, model, ctx.lines, 1, decode=True)
    dbad = strict = 0
    for i, (b, (_, got)) in enumerate(zip(ctx.lines, dec)):
        ok = got.decode("utf-8", "replace") == hf.decode(want[i], skip_special_tokens=False)
        if b.decode("utf-8", "replace").encode("utf-8") == b and strict_ok(b):
            strict += 1
            ok = ok and got == b
        if not ok:
            dbad += 1
            if rep.shown < rep.show:
                rep.shown += 1
                print("DECODE MISMATCH %s line %d: %r -> %r" % (name, i, b[:100], got[:100]))
    print("%-44s lines %6d  mismatches %d  (%d of them checked byte-exact)" % (
        name + " decode", len(ctx.lines), dbad, strict))
    rep.total += len(ctx.lines)
    rep.bad += dbad


def c_loadable(ctx, path, v):
    """path, or, when fasa's GGUF reader refuses the file for its tensors (a quantisation type it
    does not read yet), a copy holding the same tokenizer keys."""
    if path in ctx.loadable:
        return ctx.loadable[path]
    p = subprocess.run([ctx.tool, path], input=b"", capture_output=True)
    if p.returncode == 0:
        ctx.loadable[path] = path
        return path
    copy = ctx.loadable[path] = ctx.tmp("tokenizer-of-" + os.path.basename(path))
    if v["model"] == "llama":
        write_gguf_spm(v, copy, v["add_space_prefix"], v["chat_template"])
    else:
        write_gguf(v, v["pre"] or "default", copy)
    print("note: fasa cannot open %s (%s); its tokenizer keys are checked from a copy" % (
        path, p.stderr.decode(errors="replace").strip()))
    return copy


def check_byte_level_gguf(ctx, rep, path, v):
    args = ctx.args
    family = {"smollm": "smollm", "llama-bpe": "llama3", "llama3": "llama3", "qwen2": "qwen2"}.get(v["pre"], "gpt2")
    main_json = args.json or ctx.tmp("tokenizer.json")
    write_json(tokenizer_json(v, family), main_json)
    real, path = path, c_loadable(ctx, path, v)
    models = [("gguf", path, main_json), ("json:" + family, main_json, main_json)]
    # The other families over the same vocabulary; merges written as ["a", "b"] pairs once.
    for fam in ("gpt2", "llama3", "qwen2", "smollm"):
        if fam == family:
            fam_path = ctx.tmp("pairs.json")
            write_json(tokenizer_json(v, fam, merges_as_pairs=True), fam_path)
            models.append(("json:%s(pairs)" % fam, fam_path, fam_path))
            continue
        fam_path = ctx.tmp(fam + ".json")
        write_json(tokenizer_json(v, fam), fam_path)
        models.append(("json:" + fam, fam_path, fam_path))
    extra_path = ctx.tmp("added.json")
    write_json(with_extra_added(tokenizer_json(v, family)), extra_path)
    models.append(("json:%s+added" % family, extra_path, extra_path))
    # The GGUF loader's pre names, against the same references.
    for pre, fam in (("llama-bpe", "llama3"), ("qwen2", "qwen2"), ("gpt2", "gpt2")):
        if fam != family:
            g_path = ctx.tmp(pre + ".gguf")
            write_gguf(v, pre, g_path)
            models.append(("gguf:" + pre, g_path, ctx.tmp(fam + ".json")))
    for name, model, ref in models:
        check_against_hf(ctx, rep, name, model, ref)
    # A byte whose symbol is not in the vocabulary has no token at all: both sides drop it
    # (no unk_token), so such lines cannot round-trip.
    vocab_set = set(v["tokens"])
    missing = {b for b, c in byte_symbols().items() if c not in vocab_set}
    check_against_llama_cpp(ctx, rep, "gguf", path, real, v, "".join(chr(b) for b in missing if b < 0x80))
    print("bytes without a token in this vocabulary: %s" % " ".join("%02x" % b for b in sorted(missing)))
    check_decode(ctx, rep, "gguf", path, main_json, lambda b: not missing & set(b))
    on, off = ctx.hf_ids(main_json, 1)[0], ctx.hf_ids(main_json, 0)[0]
    special_ids = {i for i, ty in enumerate(v["types"]) if ty == 3}
    print("lines with special tokens parsed: %d; lines whose ids depend on parse_special: %d; "
          "longest line: %d bytes, %d tokens" % (
              sum(1 for x in on if special_ids & set(x)), sum(1 for a, b in zip(on, off) if a != b),
              max(map(len, ctx.lines)), max(map(len, on))))


def spm_strict(style, added):
    """Lines that decode back to themselves: no U+2581 (it comes back as a space); with Metaspace
    first, no leading space (not prefixed, yet stripped); with a prefix on each piece, no added
    token (the piece after one gets a space of its own)."""
    added = [a.encode() for a in added]

    def ok(b):
        if SPM.encode() in b or (style.startswith("metaspace") and b[:1] == b" "):
            return False
        return style != "legacy" or not any(a in b for a in added)
    return ok


def check_spm_gguf(ctx, rep, path, v, tag="gguf"):
    """A SentencePiece GGUF: against a tokenizer.json built like transformers' converter, the
    Llama-2/Mistral/Gemma layouts over the same vocabulary, transformers' own conversion, llama.cpp."""
    own = "legacy" if v["add_space_prefix"] else "gemma"
    real, path = path, c_loadable(ctx, path, v)
    t0 = __import__("time").time()
    jsons = {}
    for style in ("legacy", "gemma", "metaspace-first", "metaspace-split"):
        jsons[style] = ctx.tmp("%s-%s.json" % (tag, style))
        write_json(spm_json(v, style), jsons[style])
    if ctx.args.json and tag == "gguf":
        shutil.copy(jsons[own], ctx.args.json)
    print("%s: %d tokens (%d byte, %d control, %d user-defined, %d unused), add_space_prefix %d; "
          "tokenizer.json variants built in %.1f s" % (
              tag, len(v["tokens"]), v["types"].count(6), v["types"].count(3), v["types"].count(4),
              v["types"].count(5), v["add_space_prefix"], __import__("time").time() - t0))
    check_against_hf(ctx, rep, "%s vs json:%s" % (tag, own), path, jsons[own])
    for style, j in jsons.items():
        check_against_hf(ctx, rep, "json:" + style, j, j)
    flipped = ctx.tmp("%s-flipped.gguf" % tag)
    write_gguf_spm(dict(v, add_space_prefix=not v["add_space_prefix"]), flipped, not v["add_space_prefix"])
    other = "gemma" if own == "legacy" else "legacy"
    check_against_hf(ctx, rep, "%s:add_space_prefix=%d vs json:%s" % (tag, not v["add_space_prefix"], other),
                     flipped, jsons[other])
    added = [t for t, ty in zip(v["tokens"], v["types"]) if ty in (2, 3, 4)]
    check_decode(ctx, rep, tag, path, jsons[own], spm_strict(own, added))
    check_decode(ctx, rep, "json:metaspace-first", jsons["metaspace-first"], jsons["metaspace-first"],
                 spm_strict("metaspace-first", added))
    llm = check_against_llama_cpp(ctx, rep, tag, path, real, v)
    if llm is not None:
        check_against_llama_cpp(ctx, rep, "%s:add_space_prefix=%d" % (tag, not v["add_space_prefix"]), flipped,
                                v=v)
    conv, why = transformers_json(path, v, ctx.work)
    if conv is None:
        print("%-44s SKIPPED: %s" % ("transformers' GGUF conversion", why))
        return
    # fasa reads the converted file like any tokenizer.json; the conversion itself is compared
    # with the GGUF for information (transformers does not add USER_DEFINED tokens, for one).
    check_against_hf(ctx, rep, "json:transformers-conversion", conv, conv)
    user = {i for i, ty in enumerate(v["types"]) if ty == 4}
    for ps in (1, 0):
        want, hf = ctx.hf_ids(conv, ps)
        got = run_c(ctx.tool, path, ctx.lines, ps)
        n = rep.compare("%s vs transformers-conversion parse_special=%d" % (tag, ps), ctx.lines, want, got,
                        names=hf.id_to_token, counts=False)
        if n:
            ud = sum(1 for w, g in zip(want, got) if w != g and user & set(g))
            print("    %d of the %d hold a USER_DEFINED token, which transformers' converter does not add" % (ud, n))


def check_json_file(ctx, rep, path):
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    spm = j["model"].get("byte_fallback") or (j.get("pre_tokenizer") or {}).get("type") == "Metaspace"
    check_against_hf(ctx, rep, "json:" + os.path.basename(os.path.dirname(os.path.abspath(path))), path, path)
    style = "metaspace" if (j.get("pre_tokenizer") or {}).get("type") == "Metaspace" else "legacy"
    added = [a["content"] for a in j.get("added_tokens") or []]
    check_decode(ctx, rep, "json", path, path, spm_strict(style, added) if spm else (lambda b: True))


def check_spm_fixture(ctx, rep):
    v = spm_fixture_vocab()
    g = ctx.tmp("fixture.gguf")
    write_gguf_spm(v, g, True)
    print("SentencePiece fixture of tests/test_tokenizer.c: %d tokens, %d merges" % (
        len(v["tokens"]), len(spm_merges(v["tokens"], v["scores"]))))
    check_spm_gguf(ctx, rep, g, v, tag="fixture")


# ---- chat templates ----------------------------------------------------------------------

CONVERSATIONS = [
    ("Be brief.", " Hi there! "),
    (None, "What is 2+2?"),
    (None, "  leading and trailing spaces\n\n"),
    ("You are a pirate.\nSpeak like one.", "Tell me about the sea.\nIn two lines."),
    ("", "An empty system message."),
    (None, "caf\u00e9 \u65e5\u672c \U0001F600 <s> [INST] <|im_end|> <start_of_turn>"),
]


def run_chat(tool, template_path, model, convs):
    data = b""
    for system, user in convs:
        payload = (system.encode() + b"\0" + user.encode()) if system is not None else user.encode()
        data += struct.pack("<IB", len(payload), 4 if system is not None else 0) + payload
    p = subprocess.run([tool, "--chat", template_path, model], input=data, capture_output=True)
    if p.returncode != 0:
        return None, p.stderr.decode(errors="replace").strip()
    out = []
    for line in p.stdout.decode().split("\n")[:len(convs)]:
        text, ids = line.split("\t")
        out.append((bytes.fromhex(text).decode("utf-8"), [int(x) for x in ids.split()]))
    return out, None


def check_chat(ctx, rep, templates, model_json, model_file, bos, eos, llm):
    """Each template on the model: fasa's text against apply_chat_template's, fasa's ids against
    `tokenizers` (and llama.cpp) on apply_chat_template's text."""
    try:
        from transformers import PreTrainedTokenizerFast
        import jinja2  # noqa: F401 - apply_chat_template needs it
    except ImportError as e:
        print("%-44s SKIPPED: %s" % ("chat templates", e))
        return
    from tokenizers import Tokenizer
    hf = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_file(model_json), bos_token=bos, eos_token=eos)
    for name, tmpl in templates.items():
        tpath = ctx.tmp("template-%s.jinja" % name)
        with open(tpath, "w", encoding="utf-8") as f:
            f.write(tmpl)
        got, why = run_chat(ctx.tool, tpath, model_file, CONVERSATIONS)
        if got is None:
            print("%-44s FAILED: %s" % ("chat " + name, why))
            rep.total += 1
            rep.bad += 1
            continue
        want_text, want_ids, want_lcpp, refused = [], [], [], 0
        for (system, user), (text, _) in zip(CONVERSATIONS, got):
            msgs = ([{"role": "system", "content": system}] if system is not None else []) + \
                   [{"role": "user", "content": user}]
            try:
                w = hf.apply_chat_template(msgs, chat_template=tmpl, tokenize=False, add_generation_prompt=True)
            except Exception:   # noqa: BLE001 - the template refuses (e.g. no system role): fasa folds it in
                refused += 1
                w = text
            want_text.append(w)
            want_ids.append(hf.backend_tokenizer.encode(w, add_special_tokens=False).ids)
            if llm is not None:
                want_lcpp.append(llm.tokenize(w.encode(), add_bos=False, special=True))
        label = "chat %s on %s" % (name, os.path.basename(model_file))
        convs = [("%r / %r" % c).encode() for c in CONVERSATIONS]
        rep.compare(label + " text", convs, want_text, [t for t, _ in got], ref="jinja")
        rep.compare(label + " ids", convs, want_ids, [i for _, i in got], names=hf.convert_ids_to_tokens)
        if llm is not None:
            rep.compare(label + " ids (llama.cpp)", convs, want_lcpp, [i for _, i in got], ref="lcpp")
        if refused:
            print("    (%d conversations the template refuses: fasa's rendering not compared)" % refused)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", "--gguf", action="append", default=[], help="GGUF or tokenizer.json to check")
    ap.add_argument("--spm-fixture", action="store_true", help="the SentencePiece fixture of tests/test_tokenizer.c")
    ap.add_argument("--chat", action="store_true", help="chat templates against transformers' apply_chat_template")
    ap.add_argument("--json", help="where to save the tokenizer.json built from the (first) GGUF")
    ap.add_argument("--tool", help="tests/tools/tokenize binary (built into a temp dir if absent)")
    ap.add_argument("--lines", type=int, default=12000)
    ap.add_argument("--seed", type=int, default=20241121)
    ap.add_argument("--show", type=int, default=5, help="mismatches to print")
    args = ap.parse_args()
    if not args.model and not args.spm_fixture:
        ap.error("nothing to check: give --model FILE and/or --spm-fixture")

    work = tempfile.mkdtemp(prefix="tokcheck.")
    try:
        tool = args.tool or build_tool(work)
        lines = make_lines(args.lines, args.seed)
        ctx = Ctx(args, work, tool, lines)
        rep = Report(args.show)
        n_invalid = sum(1 for b, t in zip(lines, ctx.texts) if t.encode("utf-8") != b)
        print("lines: %d (%d with invalid UTF-8, %d bytes in all)" % (len(lines), n_invalid, sum(map(len, lines))))
        templates = c_templates(os.path.join(ROOT, "tests/test_tokenizer.c")) if args.chat else {}

        if args.spm_fixture:
            check_spm_fixture(ctx, rep)
            if args.chat:
                fx = ctx.tmp("fixture-legacy.json")
                check_chat(ctx, rep, templates, fx, ctx.tmp("fixture.gguf"), "<s>", "</s>",
                           llama_cpp_open(ctx.tmp("fixture.gguf")))
        for k, path in enumerate(args.model):
            print("==== %s" % path)
            ctx.work = os.path.join(work, "m%d" % k)   # file names repeat between models
            os.makedirs(ctx.work)
            ctx.hf = {}
            with open(path, "rb") as f:
                is_gguf = f.read(4) == b"GGUF"
            if not is_gguf:
                check_json_file(ctx, rep, path)
                continue
            v = gguf_vocab(path)
            if v["model"] == "gpt2":
                check_byte_level_gguf(ctx, rep, path, v)
                ref = args.json or ctx.tmp("tokenizer.json")
            elif v["model"] == "llama":
                check_spm_gguf(ctx, rep, path, v)
                ref = ctx.tmp("gguf-%s.json" % ("legacy" if v["add_space_prefix"] else "gemma"))
            else:
                print("%s: tokenizer model %r is not one fasa reads" % (path, v["model"]))
                rep.bad += 1
                continue
            if args.chat:
                own = dict(templates)
                if v["chat_template"]:
                    own = {"own": v["chat_template"], **own}
                bos = v["tokens"][v["bos"]] if v["bos"] is not None else None
                eos = v["tokens"][v["eos"]] if v["eos"] is not None else None
                check_chat(ctx, rep, own, ref, c_loadable(ctx, path, v), bos, eos, llama_cpp_open(path))
        print("compared %d encodings of %d lines: %d mismatches" % (rep.total, len(lines), rep.bad))
        return 1 if rep.bad else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
