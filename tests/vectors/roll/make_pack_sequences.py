"""Writes the ``cz_pack_*.json`` vectors: ROLL's Megatron strategy ``_pack_sequences`` (with
``pad_packed_seq_to``) and its CP split, run on chosen inputs.

ROLL's own methods are compiled unmodified from the text of ``megatron_strategy.py``
(``_get_pad_factor``, ``_pack_sequences``, ``_get_feature_on_this_cp_rank``) and of
mcore_adapter's ``model_factory.py`` (``PretrainedModel.get_batch_on_this_cp_rank``) at the
commit below, with real torch, and bound to a stand-in strategy: an ``mpu`` stub giving the
CP/TP sizes and CP rank, a model whose ``config.context_parallel_size`` is cp, a
``PackedSeqParams`` stub that keeps its keyword arguments, ``current_platform.device_type``
"cpu", and for ``get_batch_on_this_cp_rank`` a torch whose ``tensor()`` ignores
``pin_memory`` (which needs a GPU driver; pinning changes no value). The harness builds the
padded input (token ``1000·sample + position``) and its right-padded mask.

A ``pad_packed_seq_to`` below the padded sequences before the last plus the last's tokens is
left out: ROLL returns boundaries that run backwards and a row longer than they say
(``[20, 20]`` to 24: ``cu_seqlens_padded`` [0, 32, 24], 52 tokens), which the shared
``cz_err_pad_to_too_small`` records as the ``RuntimeError`` ROLL's pipeline meets.

Run: ``python make_pack_sequences.py /path/to/ROLL.git`` (a bare repository is enough).
"""

from __future__ import annotations

import ast
import json
import math
import pathlib
import subprocess
import sys
import types

import torch

COMMIT = "8eb27cc2dc34c4d1310b169d9b86d339004d811a"
HERE = pathlib.Path(__file__).resolve().parent


def methods(git_dir: str, path: str, cls: str, names: list, env: dict) -> dict:
    text = subprocess.run(
        ["git", "--git-dir", git_dir, "show", f"{COMMIT}:{path}"], check=True, capture_output=True, text=True
    ).stdout
    tree = ast.parse(text)
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    out = {}
    for node in body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            module = ast.Module(body=[node], type_ignores=[])
            scope = dict(env)
            exec(compile(module, path, "exec"), scope)
            out[node.name] = scope[node.name]
    assert set(out) == set(names), (path, set(names) - set(out))
    return out


class PackedSeqParams:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class NoPinTorch(types.ModuleType):
    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def tensor(*args, pin_memory=False, **kwargs):
        return torch.tensor(*args, **kwargs)


def strategy(git_dir: str, cp: int, tp: int, rank: int):
    mpu = types.SimpleNamespace(
        get_context_parallel_world_size=lambda: cp,
        get_tensor_model_parallel_world_size=lambda: tp,
        get_context_parallel_rank=lambda: rank,
    )
    platform = types.SimpleNamespace(device_type="cpu")
    env = {"torch": torch, "math": math, "mpu": mpu, "current_platform": platform, "PackedSeqParams": PackedSeqParams}
    own = methods(
        git_dir,
        "roll/distributed/strategy/megatron_strategy.py",
        "MegatronInferStrategy",
        ["_get_pad_factor", "_pack_sequences", "_get_feature_on_this_cp_rank"],
        env,
    )
    model_env = {"torch": NoPinTorch("torch"), "mpu": mpu, "current_platform": platform, "Dict": dict, "List": list}
    cp_rank = methods(
        git_dir, "mcore_adapter/src/mcore_adapter/models/model_factory.py", "PretrainedModel", ["get_batch_on_this_cp_rank"], model_env
    )["get_batch_on_this_cp_rank"]
    model = types.SimpleNamespace(config=types.SimpleNamespace(context_parallel_size=cp))
    model.get_batch_on_this_cp_rank = lambda batch, dim3_keys=["attention_mask"]: cp_rank(model, batch, dim3_keys)
    s = types.SimpleNamespace(models_unwrapped=[model])
    for name, f in own.items():
        setattr(s, name, types.MethodType(f, s))
    return s


def run(git_dir: str, inp: dict) -> dict:
    lengths, cp, tp = inp["lengths"], inp["cp"], inp["tp"]
    pad_val = inp.get("pad_val", -1)
    width = max(lengths + [1])
    tokens = torch.full((len(lengths), width), pad_val, dtype=torch.int64)
    mask = torch.zeros((len(lengths), width), dtype=torch.int64)
    for i, n in enumerate(lengths):
        tokens[i, :n] = torch.arange(n) + 1000 * i
        mask[i, :n] = 1
    ranks = []
    try:
        for r in range(cp):
            row, params, cu, cu_padded = strategy(git_dir, cp, tp, r)._pack_sequences(
                tokens, mask, pad_packed_seq_to=inp.get("pad_packed_seq_to"), pad_val=pad_val
            )
            ranks.append({"tokens": row[0].tolist()})
    except Exception as e:  # ROLL's (or torch's, inside ROLL) exception
        return {"error": {"type": type(e).__name__, "message": str(e)}}
    return {
        "output": {
            "cu_seqlens": cu.tolist(),
            "cu_seqlens_padded": cu_padded.tolist(),
            "max_seqlen": params.max_seqlen_q,
            "qkv_format": params.qkv_format,
            "pad_factor": strategy(git_dir, cp, tp, 0)._get_pad_factor(),
            "ranks": ranks,
        }
    }


CASES = [
    ("cz_pack_cp2_seed001", "ROLL's own layout of [2,4,6,1] on cp=2: every sequence padded to 16", {"lengths": [2, 4, 6, 1], "cp": 2, "tp": 1}),
    ("cz_pack_cp1_tp3", "cp=1, tp=3: factor lcm(16, 3) = 48", {"lengths": [50, 3, 47], "cp": 1, "tp": 3}),
    ("cz_pack_cp3", "cp=3: factor 48, six chunks per sequence", {"lengths": [10, 50, 1], "cp": 3, "tp": 1}),
    ("cz_pack_to_cp1", "pad_packed_seq_to 64: the last sequence takes the rest", {"lengths": [5, 3], "cp": 1, "tp": 1, "pad_packed_seq_to": 64}),
    ("cz_pack_to_exact", "pad_packed_seq_to equal to the padded total: nothing changes", {"lengths": [20, 20], "cp": 1, "tp": 1, "pad_packed_seq_to": 64}),
    ("cz_pack_to_cp2", "cp=2, pad_packed_seq_to 96: the last sequence padded to 48 and split in 4 chunks", {"lengths": [2, 4, 6, 1], "cp": 2, "tp": 1, "pad_packed_seq_to": 96}),
    ("cz_pack_to_cp2_tp2", "cp=2, tp=2, pad_packed_seq_to 80", {"lengths": [30, 7], "cp": 2, "tp": 2, "pad_packed_seq_to": 80}),
    ("cz_pack_to_cp3", "cp=3, pad_packed_seq_to 192", {"lengths": [10, 50], "cp": 3, "tp": 1, "pad_packed_seq_to": 192}),
    ("cz_pack_to_single", "one sequence, cp=2, pad_packed_seq_to 32", {"lengths": [7], "cp": 2, "tp": 1, "pad_packed_seq_to": 32}),
    ("cz_pack_to_empty_last", "a zero-length last sequence takes the padding", {"lengths": [5, 0], "cp": 1, "tp": 1, "pad_packed_seq_to": 48}),
    ("cz_pack_err_to_not_multiple_of_2cp", "cp=2, the last sequence padded to 18: not 4 chunks", {"lengths": [3, 5], "cp": 2, "tp": 1, "pad_packed_seq_to": 34}),
]


def main() -> None:
    for name, description, inp in CASES:
        v = {"schema": "stowplan-peer-oracle/1", "name": name, "kind": "cp_zigzag", "description": description,
             "peer": "alibaba/ROLL", "peer_commit": COMMIT, "input": dict(inp, pad_val=-1), **run(sys.argv[1], inp)}
        (HERE / f"{name}.json").write_text(json.dumps(v, separators=(",", ":")) + "\n")
        print(name, v.get("error") or v["output"]["cu_seqlens_padded"])


if __name__ == "__main__":
    main()
