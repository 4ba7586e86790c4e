from __future__ import annotations

import os
import subprocess
import sys
from hashlib import blake2b
from pathlib import Path

import pytest

from engine.prefix_hash import DIGEST_SIZE, encode_extra_keys, hash_blocks, root_hash

BS = 4
ROOT = root_hash()
REPO = Path(__file__).resolve().parents[2]


def _hashes(token_ids: list[int], *, parent: bytes = ROOT, extra: bytes = b"") -> list[bytes]:
    return hash_blocks(token_ids, BS, parent=parent, extra=extra)


def _toks(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


# -- determinism and shape ----------------------------------------------------------------
def test_same_input_gives_the_same_hashes() -> None:
    assert _hashes(_toks(12)) == _hashes(_toks(12))
    assert root_hash("tenant") == root_hash("tenant")


def test_hashes_are_the_same_in_a_fresh_interpreter() -> None:
    # Load the module by path: importing the engine package would pull in torch (seconds).
    code = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('prefix_hash', sys.argv[1])\n"
        "ph = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(ph)\n"
        "hs = ph.hash_blocks(list(range(12)), 4, parent=ph.root_hash('t'),"
        " extra=ph.encode_extra_keys(('lora', 7)))\n"
        "print(','.join(h.hex() for h in hs))\n"
    )
    # A different hash seed: the hashes must not depend on Python's randomized hash().
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(REPO / "engine" / "prefix_hash.py")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    here = hash_blocks(_toks(12), 4, parent=root_hash("t"), extra=encode_extra_keys(("lora", 7)))
    assert out == ",".join(h.hex() for h in here)


def test_digests_are_16_bytes() -> None:
    assert DIGEST_SIZE == 16
    assert len(root_hash()) == 16
    assert len(root_hash("tenant")) == 16
    assert [len(h) for h in _hashes(_toks(12))] == [16, 16, 16]


def test_one_hash_per_full_block() -> None:
    assert len(_hashes(_toks(12))) == 3


def test_a_partial_trailing_block_is_not_hashed() -> None:
    assert len(_hashes(_toks(10))) == 2
    assert _hashes(_toks(10)) == _hashes(_toks(8))


def test_less_than_one_block_gives_no_hashes() -> None:
    assert _hashes(_toks(3)) == []
    assert _hashes([]) == []


def test_a_block_hash_is_blake2b_of_parent_ids_as_4_byte_little_endian_and_extra() -> None:
    extra = encode_extra_keys(("lora",))
    ids = b"".join(t.to_bytes(4, "little") for t in (7, 8, 9, 10))
    expected = blake2b(ROOT + ids + extra, digest_size=16, person=b"kvgov-block4").digest()
    assert _hashes([7, 8, 9, 10], extra=extra) == [expected]


def test_a_block_with_an_id_past_32_bits_hashes_as_8_byte_ids_the_rest_as_usual() -> None:
    wide = 2**32 + 5
    tokens = [*_toks(4), wide, *_toks(3, start=20), *_toks(4, start=40)]
    hashes = _hashes(tokens)
    narrow = _hashes([*_toks(4), 5, *_toks(3, start=20), *_toks(4, start=40)])
    ids = b"".join(t.to_bytes(8, "little") for t in tokens[4:8])
    block_1 = blake2b(hashes[0] + ids, digest_size=16, person=b"kvgov-block8").digest()
    assert hashes[0] == narrow[0]  # block 0 fits 4 bytes: hashed as before
    assert hashes[1] == block_1 != narrow[1]  # no wrap-around to the 32-bit id 5
    assert hashes[2] == hash_blocks(tokens, BS, parent=hashes[1], start_block=2)[0]


def test_the_two_id_widths_never_make_the_same_block_hash() -> None:
    # [1, 0] as 8-byte ids has the same bytes as [1, 0, 0, 0] as 4-byte ids.
    four = hash_blocks([1, 0, 0, 0], 4, parent=ROOT)
    eight = hash_blocks([1, 2**40], 2, parent=ROOT)
    eight_same_bytes = blake2b(
        ROOT + (1).to_bytes(8, "little") + (0).to_bytes(8, "little"),
        digest_size=16,
        person=b"kvgov-block8",
    ).digest()
    assert four[0] != eight_same_bytes
    assert eight[0] != four[0]


# -- chaining -----------------------------------------------------------------------------
def test_changing_a_token_in_block_0_changes_every_hash() -> None:
    changed = _toks(12)
    changed[1] = 999
    before, after = _hashes(_toks(12)), _hashes(changed)
    assert [b != a for b, a in zip(before, after, strict=True)] == [True, True, True]


def test_changing_block_2_leaves_blocks_0_and_1_unchanged() -> None:
    changed = _toks(12)
    changed[9] = 999
    before, after = _hashes(_toks(12)), _hashes(changed)
    assert after[:2] == before[:2]
    assert after[2] != before[2]


def test_equal_blocks_at_different_positions_hash_differently() -> None:
    hashes = _hashes([1, 2, 3, 4] * 3)
    assert len(set(hashes)) == 3


def test_start_block_continues_the_chain_like_hashing_in_one_go() -> None:
    full = _hashes(_toks(16))
    rest = hash_blocks(_toks(16), BS, parent=full[1], start_block=2)
    assert rest == full[2:]


def test_start_block_at_or_past_the_last_full_block_gives_nothing() -> None:
    assert hash_blocks(_toks(10), BS, parent=ROOT, start_block=2) == []
    assert hash_blocks(_toks(10), BS, parent=ROOT, start_block=5) == []


# -- cache salt ---------------------------------------------------------------------------
def test_no_salt_is_a_constant_root() -> None:
    assert root_hash() == root_hash(None)


def test_a_salt_changes_the_root_and_so_every_hash() -> None:
    salted = _hashes(_toks(12), parent=root_hash("tenant-a"))
    plain = _hashes(_toks(12))
    assert root_hash("tenant-a") != ROOT
    assert [s != p for s, p in zip(salted, plain, strict=True)] == [True, True, True]


def test_different_salts_never_share_a_hash() -> None:
    salts = [None, "", "a", "b", "tenant-1", "tenant-2"]
    roots = [root_hash(salt) for salt in salts]
    hashes = [h for root in roots for h in _hashes(_toks(12), parent=root)]
    assert len(set(roots)) == 6
    assert len(set(hashes)) == 6 * 3
    assert not set(roots) & set(hashes)


def test_a_salted_chain_never_equals_an_unsalted_chain() -> None:
    token = int.from_bytes(b"salt:abc", "little")  # a valid, non-negative token id
    unsalted = hash_blocks([token, 42], 1, parent=root_hash(None))
    salted = hash_blocks([42], 1, parent=root_hash("abc"))
    assert unsalted[1] != salted[0]


# -- extra keys ---------------------------------------------------------------------------
def test_no_extra_keys_encode_to_nothing() -> None:
    assert encode_extra_keys() == b""
    assert encode_extra_keys(()) == b""


def test_extra_keys_change_every_hash() -> None:
    extra = encode_extra_keys(("adapter-1",))
    with_extra = _hashes(_toks(12), extra=extra)
    plain = _hashes(_toks(12))
    assert [w != p for w, p in zip(with_extra, plain, strict=True)] == [True, True, True]


def test_extra_key_encoding_is_deterministic() -> None:
    assert encode_extra_keys(("a", 1, b"x")) == encode_extra_keys(("a", 1, b"x"))


@pytest.mark.parametrize(
    ("left", "right"),
    [
        (("ab", "c"), ("a", "bc")),
        ((1,), ("1",)),
        ((b"1",), ("1",)),
        ((b"1",), (1,)),
        ((12,), (1, 2)),
        (("a",), ("a", "")),
        (("a", "b"), ("b", "a")),
    ],
)
def test_extra_keys_are_unambiguous(left: tuple, right: tuple) -> None:
    assert encode_extra_keys(left) != encode_extra_keys(right)
    left_hashes = _hashes(_toks(4), extra=encode_extra_keys(left))
    right_hashes = _hashes(_toks(4), extra=encode_extra_keys(right))
    assert left_hashes != right_hashes


@pytest.mark.parametrize("bad", [1.5, None, True, ("a",), ["a"]])
def test_a_bad_extra_key_type_raises_type_error(bad: object) -> None:
    with pytest.raises(TypeError, match="extra keys must be str, int or bytes"):
        encode_extra_keys(("ok", bad))  # type: ignore[arg-type]
