"""Hostile input for S7: hypothesis strategies for JSON bodies, headers, query strings and path
segments, and a reader that names the traceback behind a server error in the stack's logs.

What json.dumps cannot write (nesting thousands deep, numbers of thousands of digits, `1e999`) is
carried as `Raw` JSON text; lone surrogates are written as `\\ud800` escapes (valid JSON text that
decodes to a string no codec can encode) or, in a body that is not ASCII-only, as their CESU bytes
(invalid UTF-8). A body can also be cut inside a multi-byte character (truncated UTF-8).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
# Evolution's request and response bodies, reconstructed from its source (tests/simulator/samples/README.md).
SAMPLES = ROOT / "tests" / "simulator" / "samples"
MAX_SHOWN = 300  # characters of a body shown when an example is printed


class Raw(str):
    """JSON text written as it is."""


@dataclass(frozen=True)
class Req:
    """One generated HTTP request. `base` names the pool ("web" or "webhook"), resolved at send."""

    method: str
    path: str  # with its query string, already percent-encoded
    headers: dict[str, str | bytes] = field(default_factory=dict)
    body: bytes | None = None
    base: str = "web"

    def size(self) -> int:
        return len(self.path) + len(self.body or b"") + sum(len(k) + len(v) for k, v in self.headers.items())

    def __repr__(self) -> str:
        body = self.body if self.body is None or len(self.body) <= MAX_SHOWN else \
            self.body[:MAX_SHOWN] + b"...(%d bytes in all)" % len(self.body)
        headers = {k: (v if len(v) <= 120 else v[:120] + (b"..." if isinstance(v, bytes) else "...")) for k, v in self.headers.items()}
        parts = [f"{self.method} {self.base}:{self.path[:MAX_SHOWN]}", f"headers={headers!r}"]
        if body is not None:
            parts.append(f"body={body!r}")
        return "Req(" + ", ".join(parts) + ")"


# ---- JSON text --------------------------------------------------------------------------------

def dumps(value: Any, ascii_only: bool = True) -> str:
    """JSON text of `value`, `Raw` parts verbatim (the tree itself stays shallow)."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k), ensure_ascii=ascii_only)}:{dumps(v, ascii_only)}"
                              for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dumps(v, ascii_only) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ascii_only)


def encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


ODD_STRINGS = ["\ud800", "\udfff", "a\udc00b", "\x00", "a\x00b", "²", "٣", "１２", "\u202e", "🇧🇷", "", " ",
               "\ufeff", "\\", '"', "null", "0", "-1", "9" * 50, "é" * 10, "\r\n", "\u0085", "%00", "%ff"]

surrogates = st.integers(0xD800, 0xDFFF).map(chr)
hostile_text = st.one_of(
    st.sampled_from(ODD_STRINGS),
    st.text(max_size=30),
    st.text(st.one_of(st.characters(), surrogates, st.sampled_from("\x00²٣")), max_size=12),
    # long: WhatsApp's 4,096, the bounds of names and keys, and past the 64 KB body limit
    st.sampled_from([101, 201, 4097, 5000, 60_000, 70_000]).map(lambda n: "x" * n),
)
huge_numbers = st.one_of(
    st.integers(41, 5000).map(lambda n: Raw("9" * n)),
    st.sampled_from([Raw("1e999"), Raw("-1e999"), Raw("1e-999"), Raw("-0"), Raw("1" + "0" * 400 + ".5"),
                     Raw("NaN"), Raw("Infinity")]),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=False, allow_infinity=False),
)
deep = st.tuples(st.integers(1, 3000), st.sampled_from(["list", "object", "mixed"])).map(
    lambda t: Raw("[" * t[0] + "]" * t[0]) if t[1] == "list" else
    Raw('{"a":' * t[0] + "1" + "}" * t[0]) if t[1] == "object" else
    Raw('[{"a":' * t[0] + "0" + "}]" * t[0]))
scalars = st.one_of(st.none(), st.booleans(), hostile_text, huge_numbers)
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(hostile_text, inner, max_size=4)), max_leaves=8)
hostile_values = st.one_of(json_values, deep)


# ---- mutated shapes ---------------------------------------------------------------------------

def paths_of(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a JSON tree, the root first."""
    found = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            found += paths_of(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += paths_of(v, prefix + (i,))
    return found


def _set(tree: Any, path: tuple[Any, ...], op: str, new: Any) -> Any:
    if not path:
        return new if op != "wrap" else [tree, new]
    head, rest = path[0], path[1:]
    if isinstance(tree, dict):
        tree = dict(tree)
        if not rest and op == "delete":
            tree.pop(head, None)
        else:
            tree[head] = _set(tree[head], rest, op, new)
    elif isinstance(tree, list):
        tree = list(tree)
        if not rest and op == "delete":
            del tree[head]
        else:
            tree[head] = _set(tree[head], rest, op, new)
    return tree


# (which path, what to do, the new value); a path index wraps around the sample's paths.
mutations = st.lists(st.tuples(st.integers(0, 200), st.sampled_from(["replace", "delete", "wrap", "add"]),
                               hostile_values), max_size=3)


def mutate(sample: Any, changes: list[tuple[int, str, Any]], keep: tuple[str, ...] = ()) -> Any:
    """The sample with each change applied; paths starting with a key in `keep` are left alone."""
    tree = sample
    for index, op, new in changes:
        paths = [p for p in paths_of(tree) if not (p and p[0] in keep)] or [()]
        path = paths[index % len(paths)]
        if op == "add":
            target = tree
            for step in path:
                target = target[step]
            if isinstance(target, dict):
                tree = _set(tree, path, "replace", {**target, f"k{index}": new})
            continue
        if op == "delete" and not path:
            op = "replace"
        tree = _set(tree, path, op, new)
    return tree


def cut(raw: bytes, how: str, at: int) -> bytes:
    """Byte-level damage: none, a truncated body, a body cut inside a multi-byte character, an
    invalid byte, a UTF-16 or BOM-prefixed body."""
    if how == "truncate" and raw:
        return raw[: at % len(raw)]
    if how == "mid-character":
        multibyte = [m.start() for m in re.finditer(rb"[\xc2-\xf4]", raw)]
        if not multibyte:
            raw = raw[:-1] + "é".encode() + raw[-1:] if raw.endswith(b"}") else raw + "é".encode()
            multibyte = [m.start() for m in re.finditer(rb"[\xc2-\xf4]", raw)]
        return raw[: multibyte[at % len(multibyte)] + 1]
    if how == "invalid-byte" and raw:
        i = at % len(raw)
        return raw[:i] + b"\xff" + raw[i:]
    if how == "bom":
        return b"\xef\xbb\xbf" + raw
    if how == "utf-16":
        return raw.decode("utf-8", "surrogatepass").encode("utf-16", "surrogatepass")
    return raw


damage = st.tuples(st.sampled_from(["none"] * 6 + ["truncate", "mid-character", "invalid-byte", "bom", "utf-16"]),
                   st.integers(0, 10**6))


@st.composite
def json_body(draw: Any, sample: Any, keep: tuple[str, ...] = (), extra: dict[str, Any] | None = None) -> bytes:
    """The sample mutated, written ASCII-only or not, then perhaps damaged at the byte level."""
    tree = mutate(sample, draw(mutations), keep)
    if extra and isinstance(tree, dict):
        tree = {**tree, **extra}
    how, at = draw(damage)
    return cut(encode(dumps(tree, ascii_only=draw(st.booleans()))), how, at)


# ---- headers, query strings, path segments ----------------------------------------------------

def _header_safe(value: bytes) -> bytes:
    # What an HTTP client can put on the wire at all: no CR/LF, no leading whitespace.
    return value.replace(b"\r", b"").replace(b"\n", b"").lstrip(b" \t")


hostile_header = st.one_of(
    st.sampled_from(["é", "tökén", "ünïcödé-" + "0" * 56, "\u00ff" * 64, "Bearer é", "\x00", "a\x00b"]).map(
        lambda s: s.encode("latin-1")),
    st.text(max_size=80).map(lambda s: _header_safe(s.encode("utf-8"))),  # UTF-8 bytes read as latin-1
    st.binary(max_size=80).map(_header_safe),
    st.integers(1, 9000).map(lambda n: b"t" * n),
)


def segment(text: str) -> str:
    """A path segment or query value, percent-encoded from its UTF-8 (surrogates: CESU bytes)."""
    return quote(encode(text), safe="")


def query(pairs: list[tuple[str, str]]) -> str:
    return "&".join(f"{segment(k)}={segment(v)}" for k, v in pairs)


def samples(prefix: str = "webhook.") -> list[Any]:
    return [json.loads(p.read_text()) for p in sorted(SAMPLES.glob(f"{prefix}*.json"))
            if not p.name.startswith("webhook.set")]


# ---- the server's side of a 5xx ---------------------------------------------------------------

FRAME = re.compile(r'^\s+File "([^"]+)", line (\d+), in (\S+)', re.M)


class LogTail:
    """New text of the pools' logs since the last look, and the tracebacks in it."""

    def __init__(self, paths: list[Path]):
        self.paths = paths
        self.offsets = {p: (p.stat().st_size if p.exists() else 0) for p in paths}

    def read(self) -> str:
        chunks = []
        for p in self.paths:
            if not p.exists():
                continue
            with p.open("rb") as handle:
                handle.seek(self.offsets[p])
                data = handle.read()
            self.offsets[p] += len(data)
            chunks.append(data.decode("utf-8", "replace"))
        return "".join(chunks)

    def tracebacks(self) -> list[str]:
        return summarize(self.read())


def signature(summary: str) -> str:
    """What tells two failures apart: the exception's type and where it was raised, not its message
    (which carries the input: a different surrogate or position is the same bug); for a logged line
    without a traceback, the line with its quoted values and numbers taken out."""
    exc, sep, where = summary.rpartition(" at ")
    if sep and re.match(r"^[\w.]+(:|$)", exc):
        return f"{exc.split(':', 1)[0]} at {where}"
    return re.sub(r"'[^']*'|\b\d+\b", "…", summary)


def summarize(text: str) -> list[str]:
    """One line per traceback: the exception, and the innermost frame in the project's code."""
    found = []
    for block in text.split("Traceback (most recent call last):")[1:]:
        lines = block.splitlines()
        frames = FRAME.findall(block)
        exc = next((ln.strip() for ln in lines if ln and not ln.startswith((" ", "\t")) and ":" in ln
                    and not ln.startswith(("During handling", "The above exception"))), "?")
        ours = [f for f in frames if str(ROOT) in f[0] and "/.venv/" not in f[0] and "/site-packages/" not in f[0]]
        where = ours[-1] if ours else (frames[-1] if frames else None)
        at = f" at {Path(where[0]).relative_to(ROOT) if str(ROOT) in where[0] else Path(where[0]).name}:{where[1]} " \
             f"in {where[2]}" if where else ""
        found.append(f"{exc[:200]}{at}")
    return found
