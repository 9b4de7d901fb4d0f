"""The one format of everything fedrec writes with tensors in it: run files (`fedrec.api`),
checkpoints (`fedrec.core.checkpoint`) and the clients' private state a Flower node keeps (in
its context and under ``--client-state-dir``). Reading one never runs code.

A file is a `safetensors <https://huggingface.co/docs/safetensors>`_ file: an 8-byte header
length, a JSON header, then raw tensor bytes. Its header's metadata holds, as strings:

* ``fedrec``: this container's version (`CONTAINER`);
* ``kind`` and ``version``: what the file is (``run``, ``checkpoint``, ``node-state``) and the
  version of that kind's layout, checked by the reader;
* ``tree``: the nested structure (dicts, lists, numbers, strings) as JSON, each tensor or
  NumPy array named by reference (the tags are listed at `encode`);
* ``sha256``: a checksum of kind, version, tree and every tensor's name, dtype, shape and
  bytes, so a damaged or truncated file is refused instead of half-read.

Why not ``torch.load(..., weights_only=True)``: its unpickler still interprets a program (a
pickle) under an allow-list, and fedrec's states hold NumPy arrays, tuples and int-keyed dicts
that would each widen that list; safetensors reads tensors as bytes plus a JSON header, and
JSON cannot name a callable. The checksum is for integrity, not authenticity: anyone can
recompute it, so a file from someone else is safe to *read* but its *figures* are theirs.

Files written by older fedrec versions were pickles (``torch.save``); they are refused with a
line that says how to rebuild them or convert them (`fedrec.legacy`, ``fedrec convert``).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedrec.errors import FedrecError
from fedrec.files import atomic_write

CONTAINER = "1"
#: NumPy dtype kinds a file may hold: bool, signed and unsigned integers, floats, complex
_ARRAY_KINDS = frozenset("biufc")
_SCALAR_KINDS = frozenset("biuf")  # a scalar's value goes through JSON, which has no complex
_TAGS = frozenset({"$tensor", "$array", "$tuple", "$map", "$scalar", "$float"})
#: how torch.save's zip file and a bare pickle (protocol 2 to 5) begin
_PICKLE_MAGIC = (b"PK\x03\x04", b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")


class TensorFileError(FedrecError):
    """A file or message that is not a readable fedrec tensor file of the kind asked for."""


def encode(tree: Any) -> tuple[str, dict[str, torch.Tensor]]:
    """``tree`` as JSON text and the tensors it refers to.

    JSON values stand for themselves. What JSON lacks is a one-key object with a ``$`` tag:
    ``{"$tensor": NAME}`` (``"parameter": true`` for an `nn.Parameter`, ``"grad": true`` for
    one that requires grad), ``{"$array": NAME, "dtype": "<i8"}`` (a NumPy array),
    ``{"$tuple": [...]}``, ``{"$map": [[key, value], ...]}`` (a dict with keys other than
    strings, or a string key starting with ``$``), ``{"$scalar": v, "dtype": "float64"}`` (a
    NumPy scalar) and ``{"$float": "nan" | "inf" | "-inf"}``, so the text is strict JSON.
    """
    tensors: dict[str, torch.Tensor] = {}
    # a tensor or array of the tree met before -> its name: stored once, read back as one object
    # (keyed by the tree's own objects, which live as long as the tree)
    named: dict[int, str] = {}
    storages: set[tuple[str, int]] = set()

    def tensor(owner: torch.Tensor | np.ndarray, t: torch.Tensor) -> str:
        if t.layout != torch.strided:
            raise TypeError(f"cannot store a {t.layout} tensor")
        if id(owner) in named:
            return named[id(owner)]
        stored = t.detach().cpu().contiguous()
        if (str(stored.device), stored.untyped_storage().data_ptr()) in storages and stored.numel():
            stored = stored.clone()  # another view of a storage already stored: safetensors wants it apart
        storages.add((str(stored.device), stored.untyped_storage().data_ptr()))
        name = named[id(owner)] = f"t{len(tensors)}"
        tensors[name] = stored
        return name

    def enc(x: Any) -> Any:
        if isinstance(x, np.generic):  # before float: np.float64 is a float
            if x.dtype.kind not in _SCALAR_KINDS:
                raise TypeError(f"cannot store a NumPy scalar of dtype {x.dtype}")
            return {"$scalar": enc(x.item()), "dtype": x.dtype.name}
        if x is None or isinstance(x, (bool, int, str)):
            return x
        if isinstance(x, float):
            return x if math.isfinite(x) else {"$float": repr(x)}
        if isinstance(x, torch.Tensor):
            out: dict[str, Any] = {"$tensor": tensor(x, x)}
            if isinstance(x, torch.nn.Parameter):
                out["parameter"] = True
            if x.requires_grad:
                out["grad"] = True
            return out
        if isinstance(x, np.ndarray):
            if x.dtype.kind not in _ARRAY_KINDS:
                raise TypeError(f"cannot store a NumPy array of dtype {x.dtype}")
            native = np.require(x, dtype=x.dtype.newbyteorder("="), requirements="C")  # keeps 0-d
            return {"$array": tensor(x, torch.as_tensor(native, device="cpu")), "dtype": native.dtype.str}
        if isinstance(x, tuple):
            return {"$tuple": [enc(v) for v in x]}
        if isinstance(x, list):
            return [enc(v) for v in x]
        if isinstance(x, dict):
            if all(isinstance(k, str) and not k.startswith("$") for k in x):
                return {k: enc(v) for k, v in x.items()}
            return {"$map": [[enc(k), enc(v)] for k, v in x.items()]}
        raise TypeError(f"cannot store a {type(x).__name__}")

    text = json.dumps(enc(tree), allow_nan=False, separators=(",", ":"))
    return text, tensors


def decode(text: str, tensors: dict[str, torch.Tensor], device: str | torch.device | None = None) -> Any:
    """The tree `encode` wrote, its tensors on ``device`` (default: where they are; NumPy arrays
    stay on the host); ``ValueError`` for anything `encode` would not have written."""
    move = device is not None and torch.device(device).type != "cpu"
    used: set[str] = set()
    made: dict[str, Any] = {}

    def named(name: Any) -> torch.Tensor:
        if not isinstance(name, str) or name not in tensors:
            raise ValueError(f"tree names tensor {name!r}, which the file lacks")
        used.add(name)
        return tensors[name]

    def dec(x: Any) -> Any:
        if isinstance(x, list):
            return [dec(v) for v in x]
        if not isinstance(x, dict):
            return x
        tags = [k for k in x if k.startswith("$")]
        if not tags:
            return {k: dec(v) for k, v in x.items()}
        if len(tags) != 1 or tags[0] not in _TAGS:
            raise ValueError(f"unknown tag {tags}")
        tag, body = tags[0], x[tags[0]]
        if tag in ("$tensor", "$array"):
            t = named(body)
            if body not in made:  # one object per stored tensor, shared as the tree shared it
                made[body] = _tensor(t, x, device if move else None) if tag == "$tensor" else _array(t, x)
            return made[body]
        if tag == "$tuple":
            return tuple(dec(v) for v in _list(body))
        if tag == "$map":
            return {_key(dec(k)): dec(v) for k, v in (_pair(p) for p in _list(body))}
        if tag == "$scalar":
            dtype = np.dtype(str(x.get("dtype")))
            if dtype.kind not in _SCALAR_KINDS:
                raise ValueError(f"scalar dtype {dtype} is not allowed")
            return dtype.type(dec(body))
        if body not in ("nan", "inf", "-inf"):  # $float
            raise ValueError(f"bad float {body!r}")
        return float(body)

    out = dec(json.loads(text, parse_constant=_no_constant))
    if used != set(tensors):
        raise ValueError(f"{len(set(tensors) - used)} tensors are not named by the tree")
    return out


def _tensor(t: torch.Tensor, tag: dict[str, Any], device: str | torch.device | None) -> torch.Tensor:
    if device is not None:
        t = t.to(device)
    if tag.get("parameter"):
        return torch.nn.Parameter(t, requires_grad=bool(tag.get("grad")))
    return t.requires_grad_() if tag.get("grad") else t


def _array(t: torch.Tensor, tag: dict[str, Any]) -> np.ndarray:
    dtype = np.dtype(str(tag.get("dtype")))
    if dtype.kind not in _ARRAY_KINDS:
        raise ValueError(f"array dtype {dtype} is not allowed")
    a = t.cpu().numpy()
    if a.dtype != dtype:
        raise ValueError(f"array stored as {a.dtype}, tree says {dtype}")
    return a


def mismatch(reference: Any, tree: Any, where: str = "") -> str | None:
    """Where ``tree`` (read from a file) first differs in kind from ``reference`` (what the
    code built itself), or None: a tensor or array of another dtype, rank or shape, a table
    where a number was, a key missing whose value holds tensors, and so on. Places only ``tree`` holds are not
    compared (an optimiser's state fills in as it trains), and a tensor empty along its first dimension in ``reference``
    (a store that grows with the clients trained) may hold any number of rows."""
    if isinstance(reference, (torch.Tensor, np.ndarray)):
        if type(tree) is not type(reference) and not (isinstance(reference, torch.Tensor)
                                                      and isinstance(tree, torch.Tensor)):
            return f"{where}: a {type(tree).__name__} where a {type(reference).__name__} was"
        if tree.dtype != reference.dtype or tree.ndim != reference.ndim:
            return f"{where}: {tree.dtype} of rank {tree.ndim} where {reference.dtype} of rank {reference.ndim}"
        grows = reference.ndim > 0 and reference.shape[0] == 0
        if tuple(tree.shape[1:] if grows else tree.shape) != tuple(reference.shape[1:] if grows else reference.shape):
            return f"{where}: shape {tuple(tree.shape)} where {tuple(reference.shape)}"
        return None
    if isinstance(reference, dict):
        if not isinstance(tree, dict):
            return f"{where}: a {type(tree).__name__} where a table was"
        # a key whose tensors the model scores with, missing: a number, flag or empty table the
        # code added since (a config field, an optimiser's setting) is a default the loader fills in
        if missing := sorted(str(k) for k in reference.keys() - tree.keys() if _holds_tensor(reference[k])):
            return f"{where + ': ' if where else ''}no {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}"
        for k in reference.keys() & tree.keys():
            if found := mismatch(reference[k], tree[k], f"{where}.{k}" if where else str(k)):
                return found
        return None
    if isinstance(reference, (list, tuple)):
        if not isinstance(tree, (list, tuple)):
            return f"{where}: a {type(tree).__name__} where a list was"
        if len(tree) == len(reference):
            for i, (a, b) in enumerate(zip(reference, tree, strict=True)):
                if found := mismatch(a, b, f"{where}[{i}]"):
                    return found
        return None
    if isinstance(reference, bool) or isinstance(reference, str):
        return None if type(tree) is type(reference) else f"{where}: {tree!r} where a {type(reference).__name__} was"
    if isinstance(reference, (int, float)):
        ok = isinstance(tree, (int, float, np.integer, np.floating)) and not isinstance(tree, bool)
        return None if ok else f"{where}: {tree!r} where a number was"
    return None


def _holds_tensor(value: Any) -> bool:
    """Whether ``value`` is, or holds, a non-empty tensor or array."""
    if isinstance(value, torch.Tensor):
        return value.numel() > 0
    if isinstance(value, np.ndarray):
        return value.size > 0
    if isinstance(value, dict):
        return any(_holds_tensor(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_tensor(v) for v in value)
    return False


def entries_mismatch(shape: dict[str, Any], tree: Any) -> str | None:
    """`mismatch` for a file's top level, where every entry of ``shape`` must be present."""
    if not isinstance(tree, dict):
        return f"a {type(tree).__name__} where a table was"
    missing = sorted(shape.keys() - tree.keys())
    return f"no {', '.join(missing)}" if missing else mismatch(shape, tree)


def checksum(kind: str, version: int, text: str, tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 of kind, version, tree and every tensor (name, dtype, shape, bytes, by name)."""
    h = hashlib.sha256()
    for part in (kind, str(version), text):
        h.update(len(part.encode()).to_bytes(8, "little") + part.encode())
    for name in sorted(tensors):
        t = tensors[name]
        h.update(json.dumps([name, str(t.dtype), list(t.shape)]).encode())
        if t.numel() == 0:
            continue
        # a flat copy when the flat view's stride is not 1 (a size-1 dimension may carry any)
        flat = t.detach().cpu().reshape(-1)
        flat = flat if flat.stride(0) == 1 else flat.clone(memory_format=torch.contiguous_format)
        h.update(memoryview(flat.view(torch.uint8).cpu().numpy()))
    return h.hexdigest()


#: safetensors refuses a header over 100 MB; the tree must fit well inside
MAX_TREE_BYTES = 64 << 20


def _metadata(tree: Any, kind: str, version: int) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    text, tensors = encode(tree)
    if len(text) > MAX_TREE_BYTES:
        raise FedrecError(f"a {kind}'s structure takes {len(text):,} bytes of JSON, over the "
                          f"{MAX_TREE_BYTES:,} a file's header holds (keep large values in tensors)")
    meta = {"fedrec": CONTAINER, "kind": kind, "version": str(version), "tree": text,
            "sha256": checksum(kind, version, text, tensors)}
    return meta, tensors


def dumps(tree: Any, kind: str, version: int) -> bytes:
    """``tree`` as the bytes of a tensor file (for a message or a Flower context)."""
    from safetensors.torch import save

    meta, tensors = _metadata(tree, kind, version)
    return save(tensors, metadata=meta)


def save(path: str | Path, tree: Any, kind: str, version: int) -> Path:
    """Write ``tree`` to ``path`` atomically (`fedrec.files.atomic_write`)."""
    from safetensors.torch import save_file

    meta, tensors = _metadata(tree, kind, version)
    return atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=meta))


def loads(raw: bytes, kind: str, version: int | tuple[int, ...], *, source: str = "message", what: str | None = None,
          device: str | torch.device | None = None, legacy: str = "") -> Any:
    """The tree `dumps` wrote into ``raw``; `TensorFileError` (one line naming ``source``) for
    anything else. ``what`` names the kind in messages; ``legacy``: what to do with a file an
    older fedrec wrote as a pickle (appended to the refusal)."""
    from safetensors.torch import load as load_tensors

    what = what or kind
    _refuse_pickle(raw[:9], len(raw), source, what, legacy)
    try:
        n = int.from_bytes(raw[:8], "little")
        if len(raw) < 8 or not 2 <= n <= len(raw) - 8:
            raise ValueError("too short for its header")
        meta = json.loads(raw[8:8 + n]).get("__metadata__") or {}
        tensors = load_tensors(bytes(raw))
    except Exception as e:
        raise _not_ours(source, what, e) from None
    return _check(meta, tensors, kind, version, source, what, device)


def load(path: str | Path, kind: str, version: int | tuple[int, ...], *, what: str | None = None,
         device: str | torch.device | None = None, legacy: str = "") -> Any:
    """The tree `save` wrote to ``path``, its tensors on ``device`` (default: the CPU).
    ``version``: the kind's layout, or the layouts the caller reads (it tells them apart by
    what the tree holds)."""
    from safetensors import safe_open

    what = what or kind
    path = Path(path)
    head, size = sniff(path, what)
    _refuse_pickle(head, size, str(path), what, legacy)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            # copies: a tensor safetensors hands out may map the file, which a later write to
            # the same path (in place, not renamed) would pull from under it
            tensors = {k: f.get_tensor(k).clone() for k in f.keys()}  # noqa: SIM118 (not a dict)
    except Exception as e:
        raise _not_ours(str(path), what, e) from None
    return _check(meta, tensors, kind, version, str(path), what, device)


def _check(meta: dict[str, str], tensors: dict[str, torch.Tensor], kind: str, version: int | tuple[int, ...],
           source: str, what: str, device: str | torch.device | None) -> Any:
    if meta.get("fedrec") != CONTAINER or "tree" not in meta:
        raise TensorFileError(f"{source}: not a fedrec {what} (a safetensors file of another program)")
    if meta.get("kind") != kind:
        raise TensorFileError(f"{source}: a fedrec {meta.get('kind')!r} file, not a {what}")
    versions = version if isinstance(version, tuple) else (version,)
    if meta.get("version") not in [str(v) for v in versions]:
        readable = " or ".join(map(str, versions))
        raise TensorFileError(f"{source}: a {what} of layout version {meta.get('version')}; this "
                              f"fedrec reads version {readable} (write it again with this fedrec)")
    if meta.get("sha256") != checksum(kind, int(meta["version"]), meta["tree"], tensors):
        raise TensorFileError(f"{source}: damaged {what} (its contents do not match their checksum)")
    try:
        return decode(meta["tree"], tensors, device)
    except (ValueError, TypeError, KeyError, OverflowError, RuntimeError, RecursionError) as e:
        # RuntimeError: grad asked of an integer tensor; RecursionError: a tree nested too deep
        raise TensorFileError(f"{source}: not a fedrec {what} ({type(e).__name__}: {str(e)[:120]})") from None


def sniff(path: Path, what: str) -> tuple[bytes, int]:
    """A file's first 9 bytes and its size; one line if it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read(9), f.seek(0, 2)
    except FileNotFoundError:
        raise TensorFileError(f"{path}: no such {what}") from None
    except OSError as e:
        raise TensorFileError(f"{path}: cannot read it ({e.strerror or e})") from None


def looks_like_safetensors(head: bytes, size: int) -> bool:
    """A header length that fits the file, then ``{`` (such a file may begin like a pickle)."""
    return len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") <= size - 8


def looks_like_pickle(head: bytes, size: int) -> bool:
    """torch.save's zip file or a bare pickle, and not a safetensors file."""
    return head.startswith(_PICKLE_MAGIC) and not looks_like_safetensors(head, size)


def _refuse_pickle(head: bytes, size: int, source: str, what: str, legacy: str) -> None:
    """Refuse a pickle with a line that says what to do (``legacy``)."""
    if looks_like_pickle(head, size):
        raise TensorFileError(
            f"{source}: a pickle (the format older fedrec versions wrote), which can run code when "
            f"read; fedrec no longer reads {what}s in it" + (f". {legacy}" if legacy else ""))


def _not_ours(source: str, what: str, e: Exception) -> TensorFileError:
    reason = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
    return TensorFileError(f"{source}: not a fedrec {what} (not a safetensors file: {reason})")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _list(x: Any) -> list[Any]:
    if not isinstance(x, list):
        raise ValueError("a tag's body is not a list")
    return x


def _pair(p: Any) -> tuple[Any, Any]:
    if not isinstance(p, list) or len(p) != 2:
        raise ValueError("a $map entry is not a [key, value] pair")
    return p[0], p[1]


def _key(k: Any) -> Any:
    hash(k)  # TypeError for a list or dict key: not written by `encode`
    return k
