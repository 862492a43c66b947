"""Hypothesis strategies for any msgspec type, derived from msgspec's own type info."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import strategies as st

_text = st.text(max_size=12)


def for_type(t: msgspec.inspect.Type) -> st.SearchStrategy[Any]:
    mi = msgspec.inspect
    match t:
        case mi.IntType():
            return st.integers(-(2**63), 2**63 - 1)
        case mi.StrType():
            return _text
        case mi.BoolType():
            return st.booleans()
        case mi.NoneType():
            return st.none()
        case mi.DecimalType():
            return st.decimals(allow_nan=False, allow_infinity=False, places=18,
                               min_value=-(10**12), max_value=10**12)
        case mi.LiteralType(values=values):
            return st.sampled_from(values)
        case mi.UnionType(types=types):
            return st.one_of([for_type(x) for x in types])
        case mi.ListType(item_type=item):
            return st.lists(for_type(item), max_size=3)
        case mi.DictType(key_type=k, value_type=v):
            return st.dictionaries(for_type(k), for_type(v), max_size=3)
        case mi.StructType(cls=cls, fields=fields):
            return st.builds(cls, **{f.name: for_type(f.type) for f in fields})
    raise NotImplementedError(f"no strategy for {t}")


def for_struct(cls: type[msgspec.Struct]) -> st.SearchStrategy[Any]:
    return for_type(msgspec.inspect.type_info(cls))
