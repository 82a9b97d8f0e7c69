"""Throwaway (2026-11-29): the door's calls on a first token's way, each timed after the caches are emptied (a matmul
and an 8 MB sweep between calls), and the alternatives: msgspec against json, a hand frame parser against
websockets' protocol object, pydantic's JSON validation. Run: python bench/results/door_client_2026_11_29/cold_calls.py"""
import time, statistics, json, sys
sys.path.insert(0, "/work/main")
import torch, msgspec
torch.set_num_threads(1)
from tokenizers import Tokenizer
from serve.request import GenerateRequest
from websockets.server import ServerProtocol
from websockets.protocol import State
from websockets.frames import Frame, Opcode
W = torch.randn(640, 1024); x = torch.randn(8, 1024); big = bytearray(8 << 20)
def thrash():
    for _ in range(4): torch.nn.functional.linear(x, W)
    big[::4096] = b'\x01' * len(range(0, len(big), 4096)); bytes(big)
p = "class Parser:\n"
ev = {"type": "response.create", "id": "ttft-3", "model": "fastmode-fast", "service_tier": None, "input": p, "max_output_tokens": 4, "ignore_eos": True, "temperature": 0}
src = json.dumps(ev).encode()
frame = Frame(Opcode.TEXT, src).serialize(mask=True, extensions=[])
proto = ServerProtocol(state=State.OPEN)
dec = msgspec.json.Decoder(); enc = msgspec.json.Encoder()
created = {"type": "response.created", "id": "ttft-3", "lane": "fast", "model": "fastmode-fast", "input_tokens": 6, "route": {"by": "model"}, "protocol": "fastmode.responses.v1"}
from websockets.speedups import apply_mask
import struct
def hand(buf):
    b1 = buf[1] & 0x7f; off = 2
    if b1 == 126: b1 = struct.unpack_from("!H", buf, 2)[0]; off = 4
    mask = buf[off:off+4]; return apply_mask(buf[off+4:off+4+b1], mask)
def t_ws(): proto.receive_data(frame); proto.events_received()[0].data
def t_hand(): hand(frame)
def t_json(): json.loads(src)
def t_msgspec(): dec.decode(src)
def t_parse(): e = json.loads(src); GenerateRequest.parse({k: v for k, v in e.items() if k != "type"}, src)
def t_parse_ms(): e = dec.decode(src); GenerateRequest.parse({k: v for k, v in e.items() if k != "type"}, src)
def t_dumps(): json.dumps(created, separators=(",", ":")).encode()
def t_enc(): enc.encode(created)
cases = [t_ws, t_hand, t_json, t_msgspec, t_parse, t_parse_ms, t_dumps, t_enc]
assert hand(frame) == src
res = {f.__name__: [] for f in cases}
for it in range(300):
    for f in cases:
        thrash()
        t = time.perf_counter_ns(); f(); res[f.__name__].append(time.perf_counter_ns() - t)
for k, v in res.items(): print(f"{k:10s} cold p50 {statistics.median(v)/1e3:6.1f} us")
from typing import Literal
from pydantic import Field
class DoorCreate(GenerateRequest):
    type: Literal["response.create"]
def t_vjson(): DoorCreate.model_validate_json(src)
def t_dec_val(): e = dec.decode(src); e.pop("type"); GenerateRequest.model_validate(e)
def t_tok(): tok.encode(p).ids
def t_tok_nospecial(): [0] + tok.encode(p, add_special_tokens=False).ids
tok = Tokenizer.from_file("/work/main/models/fast/tokenizer.json")
cases = [t_vjson, t_dec_val, t_tok, t_tok_nospecial]
res = {f.__name__: [] for f in cases}
for it in range(300):
    for f in cases:
        thrash()
        t = time.perf_counter_ns(); f(); res[f.__name__].append(time.perf_counter_ns() - t)
for k, v in res.items(): print(f"{k:10s} cold p50 {statistics.median(v)/1e3:6.1f} us")
