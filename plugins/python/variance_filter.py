"""A stowplan buffer filter written in Python (built into a component with componentize-py).

Serves first the groups whose rewards disagree (population standard deviation above
``min_std``): for GRPO-style training a group whose samples all got the same reward carries no
signal. Those groups go in buffer order (oldest first); then, if ``fill`` is true, the others,
also oldest first.

Config (JSON object, every key optional): ``min_std`` (number >= 0, default 0),
``fill`` (bool, default true).

Build (needs ``pip install componentize-py``), from the repository root::

    componentize-py -d wit/filter -w buffer-filter componentize variance_filter \\
        -p plugins/python -o target/plugins/variance_filter.wasm
"""

import json
import math

from wit_world import exports
from componentize_py_types import Err


def _config(text):
    try:
        config = json.loads(text)
    except ValueError as e:
        raise Err(f"config is not JSON: {e}")
    if not isinstance(config, dict):
        raise Err("config must be a JSON object")
    unknown = sorted(set(config) - {"min_std", "fill"})
    if unknown:
        raise Err(f"unknown config keys {unknown}; known: fill, min_std")
    min_std = config.get("min_std", 0.0)
    if isinstance(min_std, bool) or not isinstance(min_std, (int, float)) or min_std < 0:
        raise Err(f"min_std must be a number >= 0 (got {min_std!r})")
    fill = config.get("fill", True)
    if not isinstance(fill, bool):
        raise Err(f"fill must be true or false (got {fill!r})")
    return float(min_std), fill


def _std(values):
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


class Filter(exports.Filter):
    def select(self, ctx, buffer):
        min_std, fill = _config(ctx.config)
        starts, reward_start, rewards = buffer.group_start, buffer.reward_start, buffer.rewards
        informative, flat = [], []
        for g in range(len(starts) - 1):
            # The first reward of every scored sample of the group.
            values = [rewards[reward_start[i]] for i in range(starts[g], starts[g + 1])
                      if reward_start[i + 1] > reward_start[i]]
            (informative if _std(values) > min_std else flat).append(g)
        picks = informative + flat if fill else informative
        return picks[: ctx.wanted]
