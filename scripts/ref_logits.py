#!/usr/bin/env python3
"""Independent reference logits for a llama- or qwen2-architecture GGUF model.

Reads the GGUF with the `gguf` package, dequantises every tensor to float32
(gguf.quants.dequantize), and runs Hugging Face transformers' LlamaForCausalLM in float32 with
eager attention. Shares no code with fasa; used only to check it (scripts/verify_logits.py).

  ref_logits.py --ids FILE --out LOGITS.f32        logits at every position, raw little-endian
                                                    float32, n_pos x n_vocab
  ref_logits.py --ids FILE --greedy N              N greedy continuation ids on stdout
  ref_logits.py --chat "What is ...?" --greedy 64 --decode
                                                    ChatML prompt (template from the GGUF
                                                    metadata), greedy ids, then the decoded text

Options: --model PATH (default models/SmolLM2-135M-Instruct.Q4_1.gguf), --stop-at-eos (greedy
stops after emitting the eos id; by default it does not), --threads N (default 1, or
FASA_REF_THREADS), --print-ids (print the prompt ids, e.g. for --chat/--text).

Speed: needs a real BLAS behind Debian's torch (scripts/setup-reference.sh installs OpenBLAS;
with Debian's reference libblas a 300-token forward takes minutes instead of seconds).
"""
import argparse
import os
import sys

# One thread by default: on this 2-core machine torch's OpenMP pool and OpenBLAS's threads
# oversubscribe the cores and run several times slower than a single thread.
# FASA_REF_THREADS=N overrides.
_THREADS = int(os.environ.get("FASA_REF_THREADS", "1") or 1)
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(_THREADS))
os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))

import numpy as np  # noqa: E402

DEFAULT_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models",
                             "SmolLM2-135M-Instruct.Q4_1.gguf")


# --------------------------------------------------------------------------------------------
# GGUF
# --------------------------------------------------------------------------------------------
class GGUFModel:
    """Metadata and float32 tensors of a GGUF file."""

    def __init__(self, path):
        import gguf
        self.path = path
        self.reader = gguf.GGUFReader(path)
        self.arch = self.meta("general.architecture")
        if self.arch not in ("llama", "qwen2"):
            raise SystemExit(f"ref_logits: architecture {self.arch!r} not supported (llama, qwen2)")

    def meta(self, key, default=None):
        f = self.reader.fields.get(key)
        return default if f is None else f.contents()

    def hp(self, key, default=None):
        return self.meta(f"{self.arch}.{key}", default)

    def tensors(self):
        """Yield (name, float32 ndarray in numpy order, i.e. shape reversed from ggml's ne)."""
        from gguf.quants import dequantize
        for t in self.reader.tensors:
            a = dequantize(t.data, t.tensor_type)
            a = np.ascontiguousarray(a, dtype=np.float32)
            want = tuple(int(x) for x in reversed(t.shape.tolist()))
            # 1-D tensors come back 1-D; everything else must match ggml's reversed ne
            a = a.reshape(want if len(want) > 1 else (-1,))
            yield t.name, a


def unpermute_rows(w, n_head):
    """Undo llama.cpp's q/k row permutation.

    The converter stores GGUF row [h*d + 2j + t] = HF row [h*d + t*d/2 + j] (d = head dim,
    j < d/2, t in {0,1}): rotary pairs interleaved instead of split in halves.
    """
    rows, cols = w.shape
    d = rows // n_head
    return w.reshape(n_head, d // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def hf_name(name):
    """GGUF tensor name -> HF LlamaForCausalLM state-dict name (None if unknown)."""
    fixed = {"token_embd.weight": "model.embed_tokens.weight",
             "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    if name in fixed:
        return fixed[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "bias" and parts[2] in ("attn_q", "attn_k", "attn_v"):
        return f"model.layers.{int(parts[1])}.self_attn.{parts[2][-1]}_proj.bias"
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight":
        per_layer = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                     "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                     "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                     "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
                     "ffn_norm": "post_attention_layernorm"}
        if parts[2] in per_layer:
            return f"model.layers.{int(parts[1])}.{per_layer[parts[2]]}.weight"
    return None


# --------------------------------------------------------------------------------------------
# transformers model
# --------------------------------------------------------------------------------------------
class Reference:
    def __init__(self, path=DEFAULT_MODEL, threads=None):
        import torch
        import transformers
        from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
        transformers.logging.set_verbosity_error()
        self.torch = torch
        torch.set_num_threads(threads or _THREADS)
        g = GGUFModel(path)
        self.gguf = g
        n_head = int(g.hp("attention.head_count"))
        n_kv = int(g.hp("attention.head_count_kv", n_head))
        hidden = int(g.hp("embedding_length"))
        head_dim = int(g.hp("attention.key_length", hidden // n_head))
        tokens = g.meta("tokenizer.ggml.tokens")

        sd = {}
        for name, a in g.tensors():
            hn = hf_name(name)
            if hn is None:
                if name.startswith("rope_freqs"):
                    raise SystemExit("ref_logits: rope_freqs (rope scaling) not supported")
                continue
            # llama.cpp interleaves llama's q/k rows; qwen2's stay in Hugging Face's order
            if g.arch == "llama" and name.endswith("attn_q.weight"):
                a = unpermute_rows(a, n_head)
            elif g.arch == "llama" and name.endswith("attn_k.weight"):
                a = unpermute_rows(a, n_kv)
            sd[hn] = torch.from_numpy(np.array(a, dtype=np.float32, copy=True))
        tied = "lm_head.weight" not in sd
        vocab = int(g.hp("vocab_size", sd["model.embed_tokens.weight"].shape[0]))

        common = dict(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=int(g.hp("feed_forward_length")),
            num_hidden_layers=int(g.hp("block_count")),
            num_attention_heads=n_head,
            num_key_value_heads=n_kv,
            max_position_embeddings=int(g.hp("context_length", 4096)),
            rms_norm_eps=float(g.hp("attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=float(g.hp("rope.freq_base", 10000.0)),
            tie_word_embeddings=tied,
            bos_token_id=g.meta("tokenizer.ggml.bos_token_id"),
            eos_token_id=g.meta("tokenizer.ggml.eos_token_id"),
            torch_dtype="float32",
        )
        if g.arch == "qwen2":   # q/k/v biases; head_dim = hidden / heads
            if head_dim * n_head != hidden:
                raise SystemExit("ref_logits: qwen2 with head_dim != hidden / heads not supported")
            cfg, cls = Qwen2Config(**common, use_sliding_window=False), Qwen2ForCausalLM
        else:
            cfg = LlamaConfig(**common, head_dim=head_dim, attention_bias=False, mlp_bias=False)
            cls = LlamaForCausalLM
        if g.hp("rope.scaling.type") not in (None, "none"):
            raise SystemExit("ref_logits: rope scaling not supported")
        cfg._attn_implementation = "eager"
        torch.manual_seed(0)
        model = cls(cfg).to(torch.float32).eval()
        missing, unexpected = model.load_state_dict(sd, strict=False)
        missing = [m for m in missing if not (tied and m == "lm_head.weight")]
        if missing or unexpected:
            raise SystemExit(f"ref_logits: state dict mismatch: missing={missing} "
                             f"unexpected={unexpected}")
        if tied:
            model.tie_weights()
            assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        assert model.config._attn_implementation == "eager"
        self.model = model
        self.config = cfg
        self.n_vocab = vocab
        self.eos_id = cfg.eos_token_id
        self.tokens = tokens

    def logits(self, ids):
        """float32 ndarray (len(ids), n_vocab): logits at every position of one sequence."""
        torch = self.torch
        with torch.no_grad():
            x = torch.tensor([list(ids)], dtype=torch.long)
            out = self.model(input_ids=x, use_cache=False).logits[0]
        return out.to(torch.float32).numpy()

    def greedy(self, ids, n, stop_at_eos=False):
        """n greedy continuation ids (argmax, first index on ties), with a KV cache."""
        torch = self.torch
        out = []
        with torch.no_grad():
            x = torch.tensor([list(ids)], dtype=torch.long)
            past = None
            for _ in range(n):
                r = self.model(input_ids=x, past_key_values=past, use_cache=True)
                past = r.past_key_values
                nxt = int(torch.argmax(r.logits[0, -1]).item())
                out.append(nxt)
                if stop_at_eos and nxt == self.eos_id:
                    break
                x = torch.tensor([[nxt]], dtype=torch.long)
        return out


# --------------------------------------------------------------------------------------------
# tokenizer (Hugging Face `tokenizers`, built from the GGUF vocab and merges)
# --------------------------------------------------------------------------------------------
def build_tokenizer(g):
    """A tokenizers.Tokenizer equivalent to the GGUF's gpt2-style BPE (smollm pre-tokenizer)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    kind = g.meta("tokenizer.ggml.model")
    pre = g.meta("tokenizer.ggml.pre", "default")
    if kind != "gpt2":
        raise SystemExit(f"ref_logits: tokenizer model {kind!r} not supported")
    tokens = g.meta("tokenizer.ggml.tokens")
    types = g.meta("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in g.meta("tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False,
                               byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "qwen2":
        # Qwen2's split (its tokenizer.json), then bytes without the GPT-2 regex
        from tokenizers import Regex
        qwen2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(qwen2), behavior="isolated", invert=False),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif pre in ("smollm", "starcoder", "refact", "olmo"):
        # llama.cpp: "\p{N}" split into single digits, then the GPT-2 regex
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in ("gpt-2", "gpt2", "default"):
        tok.pre_tokenizer = byte_level
    else:
        raise SystemExit(f"ref_logits: pre-tokenizer {pre!r} not supported")
    tok.decoder = decoders.ByteLevel()
    special = [AddedToken(tokens[i], special=True, normalized=False)
               for i, t in enumerate(types) if t in (3, 4)]  # CONTROL, USER_DEFINED
    tok.add_special_tokens(special)
    return tok


def chatml(g, messages, add_generation_prompt=True):
    """Render ChatML the way SmolLM2's template in the GGUF does (default system turn)."""
    tmpl = g.meta("tokenizer.chat_template") or ""
    out = []
    if messages and messages[0]["role"] != "system" and "You are a helpful AI assistant" in tmpl:
        out.append("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
                   "trained by Hugging Face<|im_end|>\n")
    for m in messages:
        out.append(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


def read_ids(path):
    with open(path) as f:
        return [int(x) for x in f.read().split()]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--ids", help="file of whitespace-separated prompt token ids")
    src.add_argument("--text", help="raw prompt text (tokenised with tokenizers)")
    src.add_argument("--chat", help="user message, wrapped in the ChatML template")
    ap.add_argument("--out", help="write logits of every position (n_pos x n_vocab f32 LE)")
    ap.add_argument("--greedy", type=int, default=0, metavar="N",
                    help="print N greedy continuation ids")
    ap.add_argument("--stop-at-eos", action="store_true")
    ap.add_argument("--decode", action="store_true", help="also print the decoded greedy text")
    ap.add_argument("--print-ids", action="store_true", help="print the prompt ids first")
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args(argv)
    if not a.out and not a.greedy:
        ap.error("nothing to do: give --out and/or --greedy N")

    ref = Reference(a.model, threads=a.threads)
    tok = None
    if a.ids:
        ids = read_ids(a.ids)
    else:
        tok = build_tokenizer(ref.gguf)
        text = a.text if a.text is not None else chatml(ref.gguf,
                                                         [{"role": "user", "content": a.chat}])
        ids = tok.encode(text, add_special_tokens=False).ids
    if not ids:
        raise SystemExit("ref_logits: empty prompt")
    if a.print_ids:
        print(" ".join(map(str, ids)))
    if a.out:
        lg = ref.logits(ids)
        tmp = a.out + ".tmp"
        lg.astype("<f4").tofile(tmp)
        os.replace(tmp, a.out)
        print(f"ref_logits: wrote {lg.shape[0]} x {lg.shape[1]} logits to {a.out}",
              file=sys.stderr)
    if a.greedy:
        gen = ref.greedy(ids, a.greedy, stop_at_eos=a.stop_at_eos)
        print(" ".join(map(str, gen)))
        if a.decode:
            tok = tok or build_tokenizer(ref.gguf)
            print(tok.decode(gen, skip_special_tokens=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
