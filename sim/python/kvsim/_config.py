"""Configs as Python dicts: a dict with a TOML config's structure becomes TOML text for the C++
config parser (so a dict and its TOML twin are one experiment, checked alike), and `overrides`
become `--set key=value` strings."""
import json
import math
import os


def _scalar(v, where):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, (str, os.PathLike)):
        return json.dumps(os.fspath(v), ensure_ascii=False)  # a TOML basic string: JSON escapes are TOML escapes
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_scalar(x, where) for x in v) + "]"
    if hasattr(v, "item") and callable(v.item):  # numpy scalars
        return _scalar(v.item(), where)
    raise TypeError(f"config key {where}: cannot write a {type(v).__name__} in TOML")


def _key(k):
    k = str(k)
    if k and all(c.isalnum() or c in "_-" for c in k):
        return k
    return json.dumps(k)


def _is_table_list(v):
    return isinstance(v, (list, tuple)) and len(v) > 0 and all(isinstance(x, dict) for x in v)


def _table(d, path, out):
    """Writes table `d` (its scalars, then its sub-tables and arrays of tables) under header `path`."""
    for k, v in d.items():
        if not isinstance(v, dict) and not _is_table_list(v):
            out.append(f"{_key(k)} = {_scalar(v, '.'.join(path + [str(k)]))}")
    for k, v in d.items():
        sub = path + [str(k)]
        if isinstance(v, dict):
            out.append("")
            out.append("[" + ".".join(_key(p) for p in sub) + "]")
            _table(v, sub, out)
        elif _is_table_list(v):
            for item in v:
                out.append("")
                out.append("[[" + ".".join(_key(p) for p in sub) + "]]")
                _table(item, sub, out)


def to_toml(config):
    """TOML text of a config dict: {"name": ..., "data": {...}, "eval": {...}, "policy": [{...}, ...]}."""
    if not isinstance(config, dict):
        raise TypeError("a config is a TOML path or a dict")
    out = []
    _table(config, [], out)
    return "\n".join(out) + "\n"


def to_sets(overrides):
    """`--set` strings from a dict {"eval.every": 4} or a list ["eval.every=4", ...]."""
    if overrides is None:
        return []
    if isinstance(overrides, dict):
        return [f"{k}={_scalar(v, str(k))}" for k, v in overrides.items()]
    if isinstance(overrides, str):
        return [overrides]
    return [str(s) for s in overrides]
