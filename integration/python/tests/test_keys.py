import json
import os

import pytest

from orbitkv import keys

_VECTORS = os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "internal", "pagekey", "testdata", "vectors.json"
)


def _load():
    with open(_VECTORS) as f:
        return json.load(f)


@pytest.mark.parametrize("vec", _load(), ids=lambda v: v["name"])
def test_vectors_match_go(vec):
    layout = keys.Layout.from_dict(vec["layout"])
    fp = layout.fingerprint()
    assert fp.hex() == vec["fingerprint"]
    got = keys.chain(fp, layout.page_tokens, vec["tokens"])
    assert [k.hex() for k in got] == vec["keys"]


def test_extend_chain_equals_chain():
    vec = _load()[0]
    layout = keys.Layout.from_dict(vec["layout"])
    fp = layout.fingerprint()
    toks = vec["tokens"]
    part = keys.chain(fp, layout.page_tokens, toks[:5])
    assert keys.extend_chain(fp, layout.page_tokens, toks, part) == keys.chain(fp, layout.page_tokens, toks)


def test_partial_page_has_no_key():
    fp = bytes(16)
    assert keys.chain(fp, 4, [1, 2, 3]) == []
    assert len(keys.chain(fp, 4, list(range(9)))) == 2
