"""Params back to their types: the run record stores every param as a string (experiments/store/track.py
``flatten``); the typed Hydra schema (experiments/config.py) says what each one was."""
from __future__ import annotations

import ast
import dataclasses
import enum
import re
import typing

import pandas as pd

__all__ = ["schema_types", "cast", "infer"]


def schema_types() -> dict[str, type]:
    """Dotted param name -> Python type (``tile.block`` -> List[int]), from the schema dataclasses.

    Returns {} when the schema cannot be imported: every param is then inferred from its values.
    """
    try:
        from experiments.config import Config
    except Exception:  # noqa: BLE001 - any import problem: fall back to inference
        return {}

    def walk(cls, prefix: str) -> dict:
        out = {}
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints.get(f.name, str)
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if typing.get_origin(tp) is typing.Union and len(args) == 1:     # Optional[X] -> X
                tp = args[0]
            if dataclasses.is_dataclass(tp):
                out.update(walk(tp, f"{prefix}{f.name}."))
            else:
                out[f"{prefix}{f.name}"] = tp
        return out
    return walk(Config, "")


def _tuples(v):
    return tuple(_tuples(x) for x in v) if isinstance(v, (list, tuple)) else v


def cast(value: str | None, tp) -> object:
    """One param string as its schema type; lists become tuples (hashable, so they can be grouped
    on): '[256, 128]' -> (256, 128). 'null' -> None. Enums stay their string value."""
    if value is None or value in ("null", "None"):
        return None
    if typing.get_origin(tp) in (list, tuple) or tp in (list, tuple):
        try:
            return _tuples(ast.literal_eval(value))
        except (ValueError, SyntaxError):
            return tuple(int(x) for x in re.findall(r"-?\d+", value))
    if tp is bool:
        return value.lower() == "true"
    if tp is int:
        return int(float(value))
    if tp is float:
        return float(value)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return value
    return value


def infer(series: pd.Series) -> pd.Series:
    """A param column without a schema type: nullable int, then float, else kept as strings."""
    vals = series.dropna()
    if vals.empty:
        return series
    if vals.map(lambda v: bool(re.fullmatch(r"-?\d+", str(v)))).all():
        return series.map(lambda v: None if v is None or v != v else int(v)).astype("Int64")
    try:
        return pd.to_numeric(series)
    except (ValueError, TypeError):
        return series
