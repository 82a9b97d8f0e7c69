"""Throwaway (2026-11-29): HF tokenizers encode against WordIds (serve/lanes/word_ids.py) and its parts, each call timed after
the caches are emptied (a matmul and an 8 MB sweep). Run: python bench/results/word_ids_2026_11_29/cold_tok.py"""
import time, statistics, sys, json
sys.path.insert(0, "/work/main")
import torch
torch.set_num_threads(1)
import regex
from tokenizers import Tokenizer
W = torch.randn(640, 1024); x = torch.randn(8, 1024); big = bytearray(8 << 20)
def thrash():
    for _ in range(4): torch.nn.functional.linear(x, W)
    big[::4096] = b'\x01' * len(range(0, len(big), 4096)); bytes(big)
p = "class Parser:\n"
tok = Tokenizer.from_file("/work/main/models/fast/tokenizer.json")
pat = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
cache = {}
def t_tok(): tok.encode(p).ids
def t_nospecial(): [0] + tok.encode(p, add_special_tokens=False).ids
def t_batch_fast(): [0] + tok.encode_batch_fast([p], add_special_tokens=False)[0].ids
def t_regex(): pat.findall(p)
def t_pyregex_cache():
    out = [0]
    for w in pat.findall(p):
        ids = cache.get(w)
        if ids is None:
            ids = cache[w] = tok.encode(w, add_special_tokens=False).ids
        out += ids
    return out
cases = [t_tok, t_nospecial, t_batch_fast, t_regex, t_pyregex_cache]
res = {f.__name__: [] for f in cases}
for it in range(300):
    for f in cases:
        thrash()
        t = time.perf_counter_ns(); f(); res[f.__name__].append(time.perf_counter_ns() - t)
for k, v in res.items(): print(f"{k:16s} cold p50 {statistics.median(v)/1e3:6.1f} us   warm-ish min {min(v)/1e3:6.1f}")
print(tok.encode(p).ids, t_pyregex_cache())
from serve.lanes.word_ids import WordIds
wi = WordIds(tok)
wi.encode(p)
def t_wordids(): wi.encode(p)
longp = open("/work/main/serve/lanes/door.py").read()[:2000]
wi.encode(longp)
def t_hf_long(): tok.encode(longp).ids
def t_wi_long(): wi.encode(longp)
cases = [t_tok, t_wordids, t_hf_long, t_wi_long]
res = {f.__name__: [] for f in cases}
for it in range(300):
    for f in cases:
        thrash()
        t = time.perf_counter_ns(); f(); res[f.__name__].append(time.perf_counter_ns() - t)
for k, v in res.items(): print(f"{k:16s} cold p50 {statistics.median(v)/1e3:6.1f} us   min {min(v)/1e3:6.1f}")
print(len(tok.encode(longp).ids))
