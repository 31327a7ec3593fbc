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
    got = keys.chain(fp, layout.page_tokens, vec["tokens"], extras=keys.Extras.from_dict(vec.get("extras")))
    assert [k.hex() for k in got] == vec["keys"]


def test_the_vectors_hold_extras_and_the_old_ones_kept_their_keys():
    by = {v["name"]: v for v in _load()}
    assert {"tiny-lora", "tiny-cache-salt", "tiny-mm-spanning-two-pages", "tiny-everything"} <= set(by)
    plain = by["tiny-three-pages-and-tail"]
    assert "extras" not in plain and plain["keys"][0] == "d280dfb557335d44356bfc9f5434e31c"
    assert by["tiny-mm-only-in-the-tail"]["keys"] == plain["keys"]  # an input in no whole page changes nothing
    for name in ("tiny-lora", "tiny-cache-salt"):
        assert all(a != b for a, b in zip(by[name]["keys"], plain["keys"])), name
    mm, other = by["tiny-mm-spanning-two-pages"]["keys"], by["tiny-mm-other-image"]["keys"]
    assert all(a != b for a, b in zip(mm, other))  # equal tokens, another image: no page shared


def test_extras_chain_prefix_and_salt_only_on_page_zero():
    fp = keys.Layout("m", "", "", 0, 0, 0, 0, 1, 4, "").fingerprint()
    toks = list(range(1, 13))
    x = keys.Extras(salt="s")
    ks = keys.chain(fp, 4, toks, extras=x)
    assert keys.next_key(fp, ks[0], toks[4:8]) == ks[1]  # page 1 carries no salt itself
    part = keys.chain(fp, 4, toks[:6], extras=x)
    assert keys.extend_chain(fp, 4, toks, part, extras=x) == ks
    assert keys.chain(fp, 4, toks, extras=keys.Extras()) == keys.chain(fp, 4, toks)
    img = keys.Extras(mm=(keys.MMInput("img", 5, 2),))
    base, got = keys.chain(fp, 4, toks), keys.chain(fp, 4, toks, extras=img)
    assert got[0] == base[0] and got[1] != base[1] and got[2] != base[2]  # page 1 and, by the chain, page 2


def test_extras_encoding_is_unambiguous():
    pairs = [
        (keys.Extras(lora=keys.LoRA("ab", "c")), keys.Extras(lora=keys.LoRA("a", "bc"))),
        (keys.Extras(lora=keys.LoRA("x", "")), keys.Extras(salt="x")),
        (keys.Extras(mm=(keys.MMInput("i", 1, 2),)), keys.Extras(mm=(keys.MMInput("i", 2, 1),))),
    ]
    for a, b in pairs:
        assert a.page(0, 4) != b.page(0, 4), (a, b)
    assert keys.Extras().page(0, 4) == b""


@pytest.mark.parametrize("x", [
    keys.Extras(mm=(keys.MMInput("", 0, 4),)),
    keys.Extras(mm=(keys.MMInput(None, 0, 4),)),
    keys.Extras(mm=(keys.MMInput("i", -1, 4),)),
    keys.Extras(embeds=(bytes(32),)),  # one page's hash for three pages
])
def test_unkeyable_extras_raise(x):
    with pytest.raises(keys.ExtrasError):
        keys.chain(bytes(16), 4, list(range(12)), extras=x)


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


def test_the_cli_prints_the_vectors_keys_with_extras(capsys):
    vec = next(v for v in _load() if v["name"] == "tiny-everything")
    assert keys.main(["--layout", json.dumps(vec["layout"]), "--tokens", ",".join(map(str, vec["tokens"])),
                      "--extras", json.dumps(vec["extras"])]) == 0
    assert capsys.readouterr().out.split() == vec["keys"]


def test_tail_keys_are_never_page_keys():
    """A P/D handoff's tail (orbitkv.vllm.pd) is keyed apart from the page chain:
    not the key a page of the same tokens would get, nor any page key of the
    prompt; it depends on the prefix, the tail's tokens and length, the extras."""
    fp = bytes(range(16))
    toks = list(range(100, 100 + 2 * 64 + 5))
    chain = keys.chain(fp, 64, toks)
    tail = toks[128:]
    t = keys.tail_key(fp, chain[-1], tail)
    assert len(t) == keys.KEY_SIZE and t not in chain
    assert t != keys.next_key(fp, chain[-1], tail)
    assert t == keys.tail_key(fp, chain[-1], list(tail))
    assert t != keys.tail_key(fp, chain[0], tail)  # another prefix
    assert t != keys.tail_key(fp, chain[-1], tail[:-1])  # another length
    assert t != keys.tail_key(fp, chain[-1], tail[:-1] + [tail[-1] + 1])
    assert t != keys.tail_key(fp, chain[-1], tail, keys.Extras(salt="s").page(0, 64))
    assert t != keys.tail_key(bytes(16), chain[-1], tail)  # another layout
    assert keys.tail_key(fp, keys.ZERO_KEY, [7]) != keys.next_key(fp, keys.ZERO_KEY, [7])
    with pytest.raises(ValueError):
        keys.tail_key(fp, chain[-1], [])
